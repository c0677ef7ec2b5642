//! Idefics3 / SmolVLM preprocessing: transformers' `Idefics3ImageProcessor` (its PIL backend)
//! and the prompt expansion of `Idefics3Processor`.
//!
//! Per image: resize so the longest edge is `size.longest_edge` (the other edge keeps the aspect
//! ratio, rounded up to even), then, with `do_image_splitting`, resize again so both edges are
//! multiples of `max_image_size.longest_edge`, cut that into `rows x cols` tiles of that size
//! (row-major) and append the whole image resized to one tile (the global image); without
//! splitting, only that global image. Every resize is PIL's, on 8-bit RGB, with `resample`
//! (Lanczos by default). Then rescale and normalize each tile.

use crate::decode::RgbImage;
use crate::error::MediaError;
use crate::pixels::{Normalization, PixelValues};
use crate::resample::Filter;

/// transformers' `MAX_IMAGE_SIZE` for Idefics3: no edge is resized above 4096.
const MAX_IMAGE_SIZE: u32 = 4096;

/// The placeholder a prompt carries for each image.
pub const IMAGE_TOKEN: &str = "<image>";
const FAKE_TOKEN: &str = "<fake_token_around_image>";
const GLOBAL_TAG: &str = "<global-img>";

/// The settings of `Idefics3ImageProcessor` and `Idefics3Processor` that change the output.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Idefics3Config {
    /// `size.longest_edge` (default 4 * 364).
    pub longest_edge: u32,
    /// `max_image_size.longest_edge`: the tile size (default 364). Must be non-zero, as must
    /// `longest_edge` (they come from the model's config, not from requests).
    pub tile_size: u32,
    /// `do_image_splitting` (default true).
    pub do_image_splitting: bool,
    /// `resample` (default Lanczos).
    pub resample: Filter,
    pub normalization: Normalization,
    /// `image_seq_len` of the processor: image tokens per tile (default 169).
    pub image_seq_len: usize,
}

impl Default for Idefics3Config {
    fn default() -> Self {
        Self {
            longest_edge: 4 * 364,
            tile_size: 364,
            do_image_splitting: true,
            resample: Filter::Lanczos,
            normalization: Normalization::STANDARD,
            image_seq_len: 169,
        }
    }
}

/// One image preprocessed: `pixel_values` of shape `[tiles, 3, tile_size, tile_size]` (the
/// global image last), and the tile grid (`0 x 0` when the image was not split).
#[derive(Debug, Clone, PartialEq)]
pub struct Idefics3Image {
    pub pixel_values: PixelValues,
    pub rows: usize,
    pub cols: usize,
}

/// Python's `int(x)` of a positive float: truncation.
fn trunc(x: f64) -> u32 {
    x as u32
}

fn ceil_to_multiple(x: u32, m: u32) -> u32 {
    x.div_ceil(m) * m
}

/// `get_resize_output_image_size`: longest edge to `longest_edge`, the other edge from the
/// aspect ratio (made even), then scaled below `MAX_IMAGE_SIZE`. Returns (width, height).
fn resize_output_size(width: u32, height: u32, longest_edge: u32) -> (u32, u32) {
    let aspect = f64::from(width) / f64::from(height);
    let (mut w, mut h) = if width >= height {
        let h = trunc(f64::from(longest_edge) / aspect);
        (longest_edge, h + h % 2)
    } else {
        let w = trunc(f64::from(longest_edge) * aspect);
        (w + w % 2, longest_edge)
    };
    (w, h) = (w.max(1), h.max(1));
    let aspect = f64::from(w) / f64::from(h);
    if w >= h && w > MAX_IMAGE_SIZE {
        (w, h) = (MAX_IMAGE_SIZE, trunc(f64::from(MAX_IMAGE_SIZE) / aspect));
    } else if h > w && h > MAX_IMAGE_SIZE {
        (w, h) = (trunc(f64::from(MAX_IMAGE_SIZE) * aspect), MAX_IMAGE_SIZE);
    }
    (w.max(1), h.max(1))
}

/// `resize_for_vision_encoder`: both edges up to multiples of the tile size. (width, height).
fn vision_encoder_size(width: u32, height: u32, tile: u32) -> (u32, u32) {
    let aspect = f64::from(width) / f64::from(height);
    if width >= height {
        let w = ceil_to_multiple(width, tile);
        let h = trunc(f64::from(w) / aspect);
        (w, ceil_to_multiple(h, tile))
    } else {
        let h = ceil_to_multiple(height, tile);
        let w = trunc(f64::from(h) * aspect);
        (ceil_to_multiple(w, tile), h)
    }
}

fn crop(image: &RgbImage, x: u32, y: u32, size: u32) -> RgbImage {
    let (x, y, size, stride) = (x as usize, y as usize, size as usize, image.width as usize * 3);
    let mut data = Vec::with_capacity(size * size * 3);
    for row in y..y + size {
        data.extend_from_slice(&image.data[row * stride + x * 3..][..size * 3]);
    }
    RgbImage { width: size as u32, height: size as u32, data }
}

/// `Idefics3ImageProcessor` on one decoded image.
pub fn preprocess(image: &RgbImage, config: &Idefics3Config) -> Idefics3Image {
    let tile = config.tile_size;
    let (w, h) = resize_output_size(image.width, image.height, config.longest_edge);
    let resized = image.resized(w, h, config.resample);
    let (tiles, rows, cols) = if config.do_image_splitting {
        let (w, h) = vision_encoder_size(resized.width, resized.height, tile);
        let resized = resized.resized(w, h, config.resample);
        if h > tile || w > tile {
            let (rows, cols) = (((h - tile) / tile + 1) as usize, ((w - tile) / tile + 1) as usize);
            let mut tiles = Vec::with_capacity(rows * cols + 1);
            for r in 0..rows as u32 {
                for c in 0..cols as u32 {
                    tiles.push(crop(&resized, c * tile, r * tile, tile));
                }
            }
            tiles.push(resized.resized(tile, tile, config.resample));
            (tiles, rows, cols)
        } else {
            (vec![resized], 0, 0)
        }
    } else {
        (vec![resized.resized(tile, tile, config.resample)], 0, 0)
    };
    let mut data = Vec::new();
    for t in &tiles {
        config.normalization.apply_chw(t, &mut data);
    }
    let shape = vec![tiles.len(), 3, tiles[0].height as usize, tiles[0].width as usize];
    Idefics3Image { pixel_values: PixelValues { shape, data }, rows, cols }
}

/// `Idefics3Processor.replace_image_token`: the text one image's `<image>` becomes.
pub fn image_prompt(rows: usize, cols: usize, image_seq_len: usize) -> String {
    let image_tokens = IMAGE_TOKEN.repeat(image_seq_len);
    let global = format!("{FAKE_TOKEN}{GLOBAL_TAG}{image_tokens}{FAKE_TOKEN}");
    if rows == 0 && cols == 0 {
        return global;
    }
    let mut text = String::new();
    for r in 1..=rows {
        for c in 1..=cols {
            text.push_str(&format!("{FAKE_TOKEN}<row_{r}_col_{c}>{image_tokens}"));
        }
        text.push('\n');
    }
    text.push('\n');
    text.push_str(&global);
    text
}

/// Replaces each `<image>` of `prompt`, in order, by its image's expansion, as
/// `Idefics3Processor` does; the counts must match.
pub fn expand_prompt(
    prompt: &str,
    images: &[Idefics3Image],
    image_seq_len: usize,
) -> Result<String, MediaError> {
    let expansions: Vec<String> =
        images.iter().map(|i| image_prompt(i.rows, i.cols, image_seq_len)).collect();
    crate::prompt::replace_placeholders(prompt, IMAGE_TOKEN, &expansions)
}

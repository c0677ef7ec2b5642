//! Resizing with Pillow's convolution resampler (`Image.resize` on 8-bit images), bit for bit.
//!
//! The HF image processors resize through PIL, so the pixel tensors a model was trained on are
//! PIL's. Pillow's documented algorithm (`libImaging/Resample.c`), reimplemented here:
//!
//! - Two separable passes, each skipped when that dimension does not change; the intermediate
//!   image is 8-bit (rounded and clamped). Horizontal first, except (since Pillow 13, the
//!   version transformers' reference here pins) when the height shrinks by more than twice as
//!   many pixels as the width: then vertical first. The order changes the rounding, so it is
//!   part of the result.
//! - For each output pixel `i` the source centre is `(i + 0.5) * scale` with
//!   `scale = in / out`; when downscaling the filter is stretched by `scale` (antialiasing),
//!   so its support is `filter_support * max(scale, 1)`. The taps run from
//!   `trunc(centre - support + 0.5)` to `trunc(centre + support + 0.5)`, clamped to the image,
//!   each weighted `filter((tap - centre + 0.5) / max(scale, 1))`, normalised to sum 1 (f64).
//! - The weights become fixed point with 22 fractional bits (rounded half away from zero); a
//!   pixel is `sum(weight * value) + 2^21`, shifted right by 22 and clamped to 0..=255.
//!
//! Filters: bilinear (triangle, support 1), bicubic (Keys cubic with a = -0.5, support 2) and
//! Lanczos (sinc windowed by sinc(x/3), support 3), the ones the HF processors use.

use crate::decode::RgbImage;

/// A PIL resampling filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Filter {
    /// `PIL.Image.Resampling.BILINEAR` (2).
    Bilinear,
    /// `PIL.Image.Resampling.BICUBIC` (3).
    Bicubic,
    /// `PIL.Image.Resampling.LANCZOS` (1).
    Lanczos,
}

impl Filter {
    /// The filter for a `resample` value of an HF `preprocessor_config.json` (PIL's enum), or
    /// `None` for filters not implemented (nearest, box, hamming).
    pub fn from_pil(resample: u32) -> Option<Filter> {
        match resample {
            1 => Some(Filter::Lanczos),
            2 => Some(Filter::Bilinear),
            3 => Some(Filter::Bicubic),
            _ => None,
        }
    }

    fn support(self) -> f64 {
        match self {
            Filter::Bilinear => 1.0,
            Filter::Bicubic => 2.0,
            Filter::Lanczos => 3.0,
        }
    }

    fn weight(self, x: f64) -> f64 {
        match self {
            Filter::Bilinear => {
                let x = x.abs();
                if x < 1.0 {
                    1.0 - x
                } else {
                    0.0
                }
            }
            Filter::Bicubic => {
                const A: f64 = -0.5;
                let x = x.abs();
                if x < 1.0 {
                    ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
                } else if x < 2.0 {
                    (((x - 5.0) * x + 8.0) * x - 4.0) * A
                } else {
                    0.0
                }
            }
            Filter::Lanczos => {
                if (-3.0..3.0).contains(&x) {
                    sinc(x) * sinc(x / 3.0)
                } else {
                    0.0
                }
            }
        }
    }
}

fn sinc(x: f64) -> f64 {
    if x == 0.0 {
        return 1.0;
    }
    let x = x * std::f64::consts::PI;
    x.sin() / x
}

impl RgbImage {
    /// This image resized to `width x height` as PIL resizes an RGB image.
    pub fn resized(&self, width: u32, height: u32, filter: Filter) -> RgbImage {
        let data = resize(
            &self.data,
            (self.width as usize, self.height as usize),
            3,
            (width as usize, height as usize),
            filter,
        );
        RgbImage { width, height, data }
    }
}

const PRECISION_BITS: u32 = 32 - 8 - 2;

/// The taps of every output pixel along one axis: first source index, tap count, and
/// `ksize` fixed-point weights per output pixel.
struct Taps {
    first: Vec<usize>,
    count: Vec<usize>,
    ksize: usize,
    weights: Vec<i32>,
}

fn taps(in_size: usize, out_size: usize, filter: Filter) -> Taps {
    let scale = in_size as f64 / out_size as f64;
    let filter_scale = scale.max(1.0);
    let support = filter.support() * filter_scale;
    let ksize = support.ceil() as usize * 2 + 1;
    let mut first = Vec::with_capacity(out_size);
    let mut count = Vec::with_capacity(out_size);
    let mut weights = vec![0i32; out_size * ksize];
    let mut k = vec![0f64; ksize];
    for (i, row) in weights.chunks_exact_mut(ksize).enumerate() {
        let center = (i as f64 + 0.5) * scale;
        let inv = 1.0 / filter_scale;
        // `as i64` truncates toward zero, as Pillow's `(int)` cast does.
        let lo = ((center - support + 0.5) as i64).max(0) as usize;
        let hi = ((center + support + 0.5) as i64).min(in_size as i64) as usize;
        let n = hi.saturating_sub(lo);
        let mut total = 0.0;
        for (x, w) in k.iter_mut().enumerate().take(n) {
            *w = filter.weight(((x + lo) as f64 - center + 0.5) * inv);
            total += *w;
        }
        for (x, out) in row.iter_mut().enumerate().take(n) {
            let w = if total != 0.0 { k[x] / total } else { k[x] };
            let scaled = w * f64::from(1u32 << PRECISION_BITS);
            *out = if w < 0.0 { (-0.5 + scaled) as i32 } else { (0.5 + scaled) as i32 };
        }
        first.push(lo);
        count.push(n);
    }
    Taps { first, count, ksize, weights }
}

fn clip8(v: i32) -> u8 {
    if v >= (1 << PRECISION_BITS << 8) {
        255
    } else if v <= 0 {
        0
    } else {
        (v >> PRECISION_BITS) as u8
    }
}

/// Resizes an HWC image with `channels` interleaved 8-bit channels from `width x height` to
/// `out_width x out_height`, as `PIL.Image.resize(..., resample=filter)` does. Sizes must be
/// non-zero and `src.len() == width * height * channels`.
pub fn resize(
    src: &[u8],
    (width, height): (usize, usize),
    channels: usize,
    (out_width, out_height): (usize, usize),
    filter: Filter,
) -> Vec<u8> {
    assert_eq!(src.len(), width * height * channels, "resize: buffer does not match its size");
    assert!(width > 0 && height > 0 && out_width > 0 && out_height > 0, "resize: zero size");
    if out_width == width && out_height == height {
        return src.to_vec();
    }
    let need_horizontal = out_width != width;
    let need_vertical = out_height != height;
    // Pillow 13: when the height shrinks by more than twice what the width does, the vertical
    // pass runs first (fewer rows for the horizontal pass); the 8-bit rounding in between makes
    // the order visible in the output.
    let (dh, dw) = (height as i64 - out_height as i64, width as i64 - out_width as i64);
    let horizontal_first = !(dh > 0 && dh > dw * 2);
    let vertical = taps(height, out_height, filter);
    if !horizontal_first {
        let tall = vertical_pass(src, width * channels, 0, &vertical, out_height);
        if !need_horizontal {
            return tall;
        }
        return horizontal_pass(&tall, (width, out_height), channels, 0, out_width, filter);
    }
    if !need_horizontal {
        return vertical_pass(src, width * channels, 0, &vertical, out_height);
    }
    // Horizontal first, over only the source rows the vertical pass reads.
    let (first_row, last_row) = if need_vertical {
        (vertical.first[0], vertical.first[out_height - 1] + vertical.count[out_height - 1])
    } else {
        (0, height)
    };
    let wide = horizontal_pass(src, (width, last_row - first_row), channels, first_row, out_width, filter);
    if !need_vertical {
        return wide;
    }
    vertical_pass(&wide, out_width * channels, first_row, &vertical, out_height)
}

/// The horizontal pass over `rows` rows of `src` starting at row `first_row`.
fn horizontal_pass(
    src: &[u8],
    (width, rows): (usize, usize),
    channels: usize,
    first_row: usize,
    out_width: usize,
    filter: Filter,
) -> Vec<u8> {
    let horizontal = taps(width, out_width, filter);
    let mut out = vec![0u8; rows * out_width * channels];
    for (y, out_row) in out.chunks_exact_mut(out_width * channels).enumerate() {
        let in_row = &src[(first_row + y) * width * channels..][..width * channels];
        convolve_row(in_row, out_row, channels, &horizontal);
    }
    out
}

/// The vertical pass; `input` holds source rows from `row_offset` on, `stride` bytes each.
fn vertical_pass(
    input: &[u8],
    stride: usize,
    row_offset: usize,
    vertical: &Taps,
    out_height: usize,
) -> Vec<u8> {
    let mut out = vec![0u8; out_height * stride];
    for (y, out_row) in out.chunks_exact_mut(stride).enumerate() {
        let lo = vertical.first[y] - row_offset;
        let k = &vertical.weights[y * vertical.ksize..][..vertical.count[y]];
        for (x, o) in out_row.iter_mut().enumerate() {
            let mut acc: i32 = 1 << (PRECISION_BITS - 1);
            for (t, &w) in k.iter().enumerate() {
                acc += i32::from(input[(lo + t) * stride + x]) * w;
            }
            *o = clip8(acc);
        }
    }
    out
}

fn convolve_row(in_row: &[u8], out_row: &mut [u8], channels: usize, taps: &Taps) {
    for (x, out_px) in out_row.chunks_exact_mut(channels).enumerate() {
        let lo = taps.first[x];
        let k = &taps.weights[x * taps.ksize..][..taps.count[x]];
        for (c, o) in out_px.iter_mut().enumerate() {
            let mut acc: i32 = 1 << (PRECISION_BITS - 1);
            for (t, &w) in k.iter().enumerate() {
                acc += i32::from(in_row[(lo + t) * channels + c]) * w;
            }
            *o = clip8(acc);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_size_is_identity_and_weights_sum_to_one() {
        let src: Vec<u8> = (0..5 * 4 * 3).map(|i| (i * 37 % 256) as u8).collect();
        assert_eq!(resize(&src, (5, 4), 3, (5, 4), Filter::Lanczos), src);
        for filter in [Filter::Bilinear, Filter::Bicubic, Filter::Lanczos] {
            for (i, o) in [(100, 7), (7, 100), (33, 32)] {
                let t = taps(i, o, filter);
                for row in t.weights.chunks_exact(t.ksize) {
                    let sum: i64 = row.iter().map(|&w| i64::from(w)).sum();
                    assert!(
                        (sum - (1 << PRECISION_BITS)).abs() <= t.ksize as i64,
                        "{filter:?} {i}->{o}: {sum}"
                    );
                }
            }
        }
    }

    #[test]
    fn flat_image_stays_flat() {
        let src = vec![200u8; 9 * 7 * 3];
        for filter in [Filter::Bilinear, Filter::Bicubic, Filter::Lanczos] {
            assert!(resize(&src, (9, 7), 3, (4, 13), filter).iter().all(|&v| v == 200));
        }
    }
}

//! [`VisionProcessor`]: what the server does to an image for the served vision model: decode
//! (pagoda-media, under the flags' limits), preprocess with the model's processor settings, hash
//! the resulting pixel tensor ([`ImageHash::of_pixels`], so equal pixels under equal settings
//! share encoder-cache entries and prefix-cache blocks), and say what text its placeholder
//! expands to and how many placeholder tokens that text holds.

use std::sync::Arc;

use pagoda_engine::{ImageHash, PixelTensor};
use pagoda_media::idefics3::{self, Idefics3Config};
use pagoda_media::{decode_rgb, MediaError, MediaLimits};

/// The served model's image processor and placeholder token.
#[derive(Debug, Clone, PartialEq)]
pub struct VisionProcessor {
    /// Idefics3 / SmolVLM's processor settings (the only vision architecture served so far).
    pub config: Idefics3Config,
    /// The text the template input carries per image (`<image>`).
    pub image_token: &'static str,
    /// Its token id: each encoder feature row's placeholder in the tokenized prompt.
    pub image_token_id: u32,
}

/// One image, preprocessed for the model.
#[derive(Debug, Clone)]
pub struct PreparedImage {
    pub hash: ImageHash,
    pub pixels: Arc<PixelTensor>,
    /// The text the image's placeholder becomes in the rendered prompt.
    pub expansion: String,
    /// Placeholder tokens in `expansion`: the encoder's feature rows for this image.
    pub num_placeholders: usize,
}

impl VisionProcessor {
    /// An Idefics3 processor whose placeholder is `<image>` with id `image_token_id`.
    pub fn idefics3(config: Idefics3Config, image_token_id: u32) -> Self {
        Self { config, image_token: idefics3::IMAGE_TOKEN, image_token_id }
    }

    /// The processor the runtime read from the model directory.
    pub fn of_spec(spec: &pagoda_runtime::VisionSpec) -> Self {
        match spec.processor {
            pagoda_runtime::VisionProcessor::Idefics3(config) => Self::idefics3(config, spec.image_token_id),
        }
    }

    /// Decodes and preprocesses one image's bytes.
    pub fn prepare(&self, bytes: &[u8], limits: &MediaLimits) -> Result<PreparedImage, MediaError> {
        let rgb = decode_rgb(bytes, limits)?;
        let processed = idefics3::preprocess(&rgb, &self.config);
        let tiles = processed.pixel_values.shape.first().copied().unwrap_or(0);
        let pixels = PixelTensor { shape: processed.pixel_values.shape, data: processed.pixel_values.data };
        let hash = ImageHash::of_pixels(&pixels);
        Ok(PreparedImage {
            hash,
            pixels: Arc::new(pixels),
            expansion: idefics3::image_prompt(processed.rows, processed.cols, self.config.image_seq_len),
            num_placeholders: tiles * self.config.image_seq_len,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The media crate's committed test images.
    pub(crate) const LANDSCAPE: &[u8] = include_bytes!("../../../../tests/fixtures/media/landscape.png");
    pub(crate) const PHOTO: &[u8] = include_bytes!("../../../../tests/fixtures/media/photo.jpg");

    fn tiny() -> VisionProcessor {
        let config = Idefics3Config {
            longest_edge: 128,
            tile_size: 64,
            image_seq_len: 16,
            ..Idefics3Config::default()
        };
        VisionProcessor::idefics3(config, 512)
    }

    #[test]
    fn tiles_placeholders_and_hash() {
        let p = tiny();
        let a = p.prepare(LANDSCAPE, &MediaLimits::default()).unwrap();
        // 77x45 -> 128x74 -> 128x128 for the encoder: a 2x2 split and the global tile.
        assert_eq!(a.pixels.shape, vec![5, 3, 64, 64]);
        assert_eq!(a.num_placeholders, 5 * 16);
        assert_eq!(a.expansion.matches("<image>").count(), a.num_placeholders);
        assert!(a.expansion.contains("<row_2_col_2>"));
        let again = p.prepare(LANDSCAPE, &MediaLimits::default()).unwrap();
        assert_eq!(a.hash, again.hash);
        let b = p.prepare(PHOTO, &MediaLimits::default()).unwrap();
        assert_ne!(a.hash, b.hash);
        assert_eq!(b.num_placeholders, b.pixels.shape[0] * 16);
    }

    #[test]
    fn bad_bytes_are_media_errors() {
        let p = tiny();
        assert_eq!(p.prepare(b"", &MediaLimits::default()).unwrap_err(), MediaError::Empty);
        assert!(p.prepare(&LANDSCAPE[..LANDSCAPE.len() / 2], &MediaLimits::default()).is_err());
        let limits = MediaLimits { max_pixels: 100, ..MediaLimits::default() };
        assert!(matches!(p.prepare(LANDSCAPE, &limits), Err(MediaError::TooLarge { .. })));
    }
}

//! Gemma 3 preprocessing: transformers' `Gemma3ImageProcessor` (PIL backend, without
//! pan-and-scan, which `Gemma3Processor` turns off by default) and the prompt expansion of
//! `Gemma3Processor`.
//!
//! Per image: resize to `height x width` (896 x 896 for the released models) with bilinear
//! resampling, rescale by 1/255, normalize with mean and std 0.5.

use crate::decode::RgbImage;
use crate::error::MediaError;
use crate::pixels::{Normalization, PixelValues};
use crate::resample::Filter;

/// The placeholder a prompt carries for each image (`tokenizer.boi_token`).
pub const BOI_TOKEN: &str = "<start_of_image>";
const EOI_TOKEN: &str = "<end_of_image>";
const IMAGE_SOFT_TOKEN: &str = "<image_soft_token>";

/// The settings of `Gemma3ImageProcessor` and `Gemma3Processor` that change the output.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Gemma3Config {
    /// `size.height` / `size.width` (896 each in the released configs).
    pub height: u32,
    pub width: u32,
    /// `resample` (bilinear).
    pub resample: Filter,
    pub normalization: Normalization,
    /// `mm_tokens_per_image` of the model config (`image_seq_length` of the processor, 256).
    pub mm_tokens_per_image: usize,
}

impl Default for Gemma3Config {
    fn default() -> Self {
        Self {
            height: 896,
            width: 896,
            resample: Filter::Bilinear,
            normalization: Normalization::STANDARD,
            mm_tokens_per_image: 256,
        }
    }
}

/// `Gemma3ImageProcessor` on one decoded image: `pixel_values` of shape `[3, height, width]`.
pub fn preprocess(image: &RgbImage, config: &Gemma3Config) -> PixelValues {
    let resized = image.resized(config.width, config.height, config.resample);
    let mut data = Vec::new();
    config.normalization.apply_chw(&resized, &mut data);
    PixelValues { shape: vec![3, config.height as usize, config.width as usize], data }
}

/// The text each `<start_of_image>` becomes (`Gemma3Processor.full_image_sequence`).
pub fn image_prompt(mm_tokens_per_image: usize) -> String {
    format!("\n\n{BOI_TOKEN}{}{EOI_TOKEN}\n\n", IMAGE_SOFT_TOKEN.repeat(mm_tokens_per_image))
}

/// Replaces each `<start_of_image>` of `prompt` by the image sequence, as `Gemma3Processor`
/// does; `images` is the number of images given and must equal the placeholders.
pub fn expand_prompt(prompt: &str, images: usize, mm_tokens_per_image: usize) -> Result<String, MediaError> {
    let expansions = vec![image_prompt(mm_tokens_per_image); images];
    crate::prompt::replace_placeholders(prompt, BOI_TOKEN, &expansions)
}

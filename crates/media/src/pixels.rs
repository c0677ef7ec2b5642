//! Pixel tensors: the rescale and normalize steps of the HF image processors, in their exact
//! floating-point order, and the tensor type handed to the vision encoders.

use crate::decode::RgbImage;

/// A float32 tensor in row-major order (the HF processors' `pixel_values`, one image's worth).
#[derive(Debug, Clone, PartialEq)]
pub struct PixelValues {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

/// Rescale and normalize settings of an HF image processor.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Normalization {
    /// `rescale_factor` (1/255 in every config we know), applied in f64 as numpy does.
    pub rescale_factor: f64,
    pub image_mean: [f64; 3],
    pub image_std: [f64; 3],
}

impl Normalization {
    /// `IMAGENET_STANDARD_MEAN` / `_STD` (0.5 each), used by SigLIP-based processors.
    pub const STANDARD: Normalization =
        Normalization { rescale_factor: 1.0 / 255.0, image_mean: [0.5; 3], image_std: [0.5; 3] };

    /// `image` (HWC u8) as CHW f32: `f32(v * rescale_factor)` (numpy multiplies in float64, then
    /// casts), then `(x - mean) / std` in float32 with mean and std cast to float32 first, as
    /// transformers' `rescale` and `normalize` do.
    pub fn apply_chw(&self, image: &RgbImage, out: &mut Vec<f32>) {
        let plane = image.width as usize * image.height as usize;
        out.reserve(plane * 3);
        for c in 0..3 {
            let mean = self.image_mean[c] as f32;
            let std = self.image_std[c] as f32;
            out.extend(image.data[c..].iter().step_by(3).take(plane).map(|&v| {
                let x = (f64::from(v) * self.rescale_factor) as f32;
                (x - mean) / std
            }));
        }
    }
}

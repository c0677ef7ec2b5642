//! Images of a prompt as the engine carries them: preprocessed pixel tensors, each named by a
//! content hash, whose encoder features fill the prompt's placeholder tokens in prompt order.
//!
//! The engine never decodes or resizes images (the server does, before tokenizing) and never
//! runs the encoder itself (the executor does, for the prefill chunk that first covers an
//! image's placeholders). What the scheduler and block manager see of an image is its hash and
//! which prompt positions it fills: the hash keys the encoder cache and enters the prefix-cache
//! key of every KV block holding its placeholders, so two images with equal token counts never
//! share blocks.

use std::ops::Range;
use std::sync::Arc;

/// A 128-bit content hash of an image's preprocessed pixels (and the processor settings that
/// made them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ImageHash(pub u128);

/// A float32 tensor in row-major order: a vision encoder's input for one image (for Idefics3
/// `[tiles, 3, size, size]`).
#[derive(Debug, Clone, PartialEq)]
pub struct PixelTensor {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

/// One image of a prompt.
#[derive(Debug, Clone)]
pub struct ImageInput {
    pub hash: ImageHash,
    pub pixels: Arc<PixelTensor>,
    /// The prompt positions of this image's placeholder tokens, one per encoder feature row,
    /// ascending (not necessarily contiguous: Idefics3 puts tile-position tokens between the
    /// tiles' placeholders).
    pub placeholder_positions: Arc<[u32]>,
}

impl ImageInput {
    /// The number of encoder feature rows (= placeholder tokens) this image fills.
    pub fn num_features(&self) -> usize {
        self.placeholder_positions.len()
    }

    /// The span of prompt positions from the image's first placeholder to its last, inclusive
    /// of what lies between; empty when it has no placeholder.
    pub fn span(&self) -> Range<usize> {
        match (self.placeholder_positions.first(), self.placeholder_positions.last()) {
            (Some(&a), Some(&b)) => a as usize..b as usize + 1,
            _ => 0..0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn span_covers_first_to_last_placeholder() {
        let image = ImageInput {
            hash: ImageHash(7),
            pixels: Arc::new(PixelTensor { shape: vec![1, 3, 2, 2], data: vec![0.0; 12] }),
            placeholder_positions: Arc::from(vec![4u32, 5, 9, 10]),
        };
        assert_eq!(image.num_features(), 4);
        assert_eq!(image.span(), 4..11);
        let empty = ImageInput { placeholder_positions: Arc::from(Vec::<u32>::new()), ..image };
        assert_eq!(empty.span(), 0..0);
    }
}

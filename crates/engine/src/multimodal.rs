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
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use sha2::{Digest, Sha256};

/// A 128-bit content hash of an image's preprocessed pixels (and the processor settings that
/// made them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ImageHash(pub u128);

impl ImageHash {
    /// SHA-256 (cut to 128 bits) of a pixel tensor's shape and f32 values: what the server
    /// names an image by. A cryptographic hash, because the prefix cache shares KV between
    /// requests of different users on an equal hash.
    pub fn of_pixels(pixels: &PixelTensor) -> Self {
        let mut hasher = Sha256::new();
        hasher.update((pixels.shape.len() as u64).to_le_bytes());
        for &d in &pixels.shape {
            hasher.update((d as u64).to_le_bytes());
        }
        // In chunks: one `update` per value is several times slower.
        let mut bytes = Vec::with_capacity(4096 * 4);
        for chunk in pixels.data.chunks(4096) {
            bytes.clear();
            bytes.extend(chunk.iter().flat_map(|v| v.to_bits().to_le_bytes()));
            hasher.update(&bytes);
        }
        let digest = hasher.finalize();
        let mut first = [0u8; 16];
        first.copy_from_slice(&digest[..16]);
        Self(u128::from_le_bytes(first))
    }
}

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

    /// Whether one of the image's placeholders lies in `range` of prompt positions.
    pub fn has_placeholder_in(&self, range: Range<usize>) -> bool {
        let p = &self.placeholder_positions;
        let first = p.partition_point(|&x| (x as usize) < range.start);
        p.get(first).is_some_and(|&x| (x as usize) < range.end)
    }

    /// The feature rows (a range of `0..num_features()`) whose placeholders lie in `range` of
    /// prompt positions (they are consecutive in the image's list); `None` when there are none.
    pub fn features_in(&self, range: Range<usize>) -> Option<Range<usize>> {
        let p = &self.placeholder_positions;
        let first = p.partition_point(|&x| (x as usize) < range.start);
        let end = p.partition_point(|&x| (x as usize) < range.end);
        (first < end).then_some(first..end)
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

/// Why a request's images cannot run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImageRequestError {
    #[error("this model takes no images (it has no vision encoder)")]
    NoVisionEncoder,
    #[error("image {index} has no placeholder tokens")]
    NoPlaceholders { index: usize },
    #[error("image {index}: its placeholder positions are not ascending and distinct")]
    Unordered { index: usize },
    #[error("image {index}: placeholder position {position} is outside the prompt of {prompt_len} tokens")]
    Outside { index: usize, position: u32, prompt_len: usize },
    #[error("image {index}: its placeholders overlap or precede those of the image before it")]
    OutOfOrder { index: usize },
    #[error(
        "the prompt holds {found} image placeholder tokens, but its images need {needed} \
         (one per feature row, in prompt order)"
    )]
    PlaceholderCount { found: usize, needed: usize },
    #[error("image {index}: pixels of shape {shape:?} hold {len} values")]
    PixelShape { index: usize, shape: Vec<usize>, len: usize },
    #[error("a prompt with images cannot be prefilled for remote decoding")]
    KvTransfer,
}

/// Checks a prompt's images as the engine relies on them: each has placeholders, ascending,
/// inside the prompt, each image's after the one before, and pixels matching their shape.
pub fn validate_images(images: &[ImageInput], prompt_len: usize) -> Result<(), ImageRequestError> {
    let mut end = 0usize;
    for (index, image) in images.iter().enumerate() {
        let p = &image.placeholder_positions;
        let (Some(&first), Some(&last)) = (p.first(), p.last()) else {
            return Err(ImageRequestError::NoPlaceholders { index });
        };
        if p.windows(2).any(|w| w[0] >= w[1]) {
            return Err(ImageRequestError::Unordered { index });
        }
        if last as usize >= prompt_len {
            return Err(ImageRequestError::Outside { index, position: last, prompt_len });
        }
        if index > 0 && (first as usize) < end {
            return Err(ImageRequestError::OutOfOrder { index });
        }
        end = last as usize + 1;
        let values: usize = image.pixels.shape.iter().product();
        if values != image.pixels.data.len() || image.pixels.shape.is_empty() {
            let (shape, len) = (image.pixels.shape.clone(), image.pixels.data.len());
            return Err(ImageRequestError::PixelShape { index, shape, len });
        }
    }
    Ok(())
}

/// The placeholder positions of each image of a tokenized prompt: the prompt's `placeholder`
/// tokens in order, the first `counts[0]` the first image's, the next `counts[1]` the second's,
/// and so on (the counts are each image's feature rows, e.g. Idefics3's tiles times
/// `image_seq_len`). Every placeholder token must belong to an image.
pub fn split_placeholders(
    prompt_ids: &[u32],
    placeholder: u32,
    counts: &[usize],
) -> Result<Vec<Arc<[u32]>>, ImageRequestError> {
    let positions: Vec<u32> =
        prompt_ids.iter().enumerate().filter(|&(_, &t)| t == placeholder).map(|(i, _)| i as u32).collect();
    let needed: usize = counts.iter().sum();
    if positions.len() != needed {
        return Err(ImageRequestError::PlaceholderCount { found: positions.len(), needed });
    }
    let mut rest = positions.as_slice();
    Ok(counts
        .iter()
        .map(|&n| {
            let (mine, after) = rest.split_at(n);
            rest = after;
            Arc::from(mine)
        })
        .collect())
}

/// The encoder cache's counters, shared between the executor that keeps the cache and
/// whoever reports metrics.
#[derive(Debug, Default)]
pub struct EncoderCacheStats {
    hits: AtomicU64,
    misses: AtomicU64,
    bytes: AtomicU64,
    entries: AtomicU64,
}

/// A reading of [`EncoderCacheStats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EncoderCacheSnapshot {
    /// Images whose features came from the cache.
    pub hits: u64,
    /// Images the encoder ran for.
    pub misses: u64,
    /// Bytes of features held now.
    pub bytes: u64,
    /// Images held now.
    pub entries: u64,
}

impl EncoderCacheStats {
    pub fn record_hit(&self) {
        self.hits.fetch_add(1, Ordering::Relaxed);
    }

    pub fn record_miss(&self) {
        self.misses.fetch_add(1, Ordering::Relaxed);
    }

    /// What the cache holds now.
    pub fn set_held(&self, entries: usize, bytes: usize) {
        self.entries.store(entries as u64, Ordering::Relaxed);
        self.bytes.store(bytes as u64, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> EncoderCacheSnapshot {
        EncoderCacheSnapshot {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            entries: self.entries.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(hash: u128, positions: Vec<u32>) -> ImageInput {
        ImageInput {
            hash: ImageHash(hash),
            pixels: Arc::new(PixelTensor { shape: vec![1, 3, 1, 1], data: vec![0.0; 3] }),
            placeholder_positions: Arc::from(positions),
        }
    }

    #[test]
    fn pixel_hashes_cover_values_and_shape() {
        let a = PixelTensor { shape: vec![1, 3, 1, 2], data: vec![0.5, 1.0, -1.0, 0.0, 0.25, 2.0] };
        let same = ImageHash::of_pixels(&a.clone());
        assert_eq!(ImageHash::of_pixels(&a), same);
        let mut b = a.clone();
        b.data[5] = 2.000_001;
        assert_ne!(ImageHash::of_pixels(&b), same);
        let reshaped = PixelTensor { shape: vec![1, 3, 2, 1], ..a };
        assert_ne!(ImageHash::of_pixels(&reshaped), same);
    }

    #[test]
    fn placeholders_split_in_prompt_order_and_counts_must_agree() {
        let ids = [1, 9, 9, 2, 9, 3, 9, 9, 9];
        let split = split_placeholders(&ids, 9, &[3, 3]).unwrap();
        assert_eq!(&*split[0], &[1, 2, 4]);
        assert_eq!(&*split[1], &[6, 7, 8]);
        let err = split_placeholders(&ids, 9, &[3, 2]).unwrap_err();
        assert_eq!(err, ImageRequestError::PlaceholderCount { found: 6, needed: 5 });
    }

    #[test]
    fn images_are_checked_against_the_prompt() {
        assert_eq!(validate_images(&[image(1, vec![1, 2]), image(2, vec![3, 5])], 6), Ok(()));
        let cases = [
            (vec![image(1, vec![])], ImageRequestError::NoPlaceholders { index: 0 }),
            (vec![image(1, vec![2, 2])], ImageRequestError::Unordered { index: 0 }),
            (vec![image(1, vec![2, 6])], ImageRequestError::Outside { index: 0, position: 6, prompt_len: 6 }),
            (vec![image(1, vec![2, 3]), image(2, vec![3, 4])], ImageRequestError::OutOfOrder { index: 1 }),
        ];
        for (images, err) in cases {
            assert_eq!(validate_images(&images, 6), Err(err));
        }
        let mut bad = image(1, vec![0]);
        bad.pixels = Arc::new(PixelTensor { shape: vec![1, 3, 2, 2], data: vec![0.0; 3] });
        assert!(matches!(validate_images(&[bad], 6), Err(ImageRequestError::PixelShape { len: 3, .. })));
    }

    #[test]
    fn span_covers_first_to_last_placeholder() {
        let image = ImageInput {
            hash: ImageHash(7),
            pixels: Arc::new(PixelTensor { shape: vec![1, 3, 2, 2], data: vec![0.0; 12] }),
            placeholder_positions: Arc::from(vec![4u32, 5, 9, 10]),
        };
        assert_eq!(image.num_features(), 4);
        assert_eq!(image.span(), 4..11);
        assert!(image.has_placeholder_in(5..9) && image.has_placeholder_in(9..10));
        assert!(!image.has_placeholder_in(6..9) && !image.has_placeholder_in(11..20));
        assert_eq!(image.features_in(5..10), Some(1..3));
        assert_eq!(image.features_in(0..4), None);
        assert_eq!(image.features_in(0..100), Some(0..4));
        let empty = ImageInput { placeholder_positions: Arc::from(Vec::<u32>::new()), ..image };
        assert_eq!(empty.span(), 0..0);
    }
}

//! The encoder cache: a vision encoder's features of recent images, by image hash, so that an
//! image is encoded once however many prefill chunks cover it, and again not at all when the
//! same image comes back (a repeated screenshot, a preempted request recomputed, the `n`
//! samples of one prompt). Bounded in bytes, least recently used out first; its hits and misses
//! are counted in an [`EncoderCacheStats`] the server reads for its metrics.

use std::collections::HashMap;
use std::sync::Arc;

use candle_core::Tensor;
use pagoda_engine::{EncoderCacheStats, ImageHash};

use crate::error::Result;

/// Bytes of features the cache holds unless told otherwise: about a hundred SmolVLM images of
/// 13 tiles, a few thousand single-tile ones.
pub const DEFAULT_ENCODER_CACHE_BYTES: usize = 256 << 20;

struct Entry {
    features: Tensor,
    bytes: usize,
    last_used: u64,
}

pub struct EncoderCache {
    capacity_bytes: usize,
    entries: HashMap<ImageHash, Entry>,
    held_bytes: usize,
    /// Ticks once per lookup: the entry with the smallest `last_used` is the least recent.
    clock: u64,
    stats: Arc<EncoderCacheStats>,
}

impl EncoderCache {
    /// A cache of up to `capacity_bytes` of features (0: nothing is kept, every image is
    /// encoded for every chunk that needs it) counting into `stats`.
    pub fn new(capacity_bytes: usize, stats: Arc<EncoderCacheStats>) -> Self {
        Self { capacity_bytes, entries: HashMap::new(), held_bytes: 0, clock: 0, stats }
    }

    pub fn stats(&self) -> &Arc<EncoderCacheStats> {
        &self.stats
    }

    pub fn capacity_bytes(&self) -> usize {
        self.capacity_bytes
    }

    /// The features of `hash`, from the cache or from `encode` (then kept, evicting the least
    /// recently used entries to make room; features larger than the whole cache are not kept).
    /// The tensor returned stays valid after its entry is evicted.
    pub fn get_or_encode(
        &mut self,
        hash: ImageHash,
        encode: impl FnOnce() -> Result<Tensor>,
    ) -> Result<Tensor> {
        self.clock += 1;
        if let Some(entry) = self.entries.get_mut(&hash) {
            entry.last_used = self.clock;
            self.stats.record_hit();
            return Ok(entry.features.clone());
        }
        self.stats.record_miss();
        let features = encode()?;
        let bytes = features.elem_count() * features.dtype().size_in_bytes();
        if bytes <= self.capacity_bytes {
            while self.held_bytes + bytes > self.capacity_bytes {
                self.evict_oldest();
            }
            self.held_bytes += bytes;
            let entry = Entry { features: features.clone(), bytes, last_used: self.clock };
            self.entries.insert(hash, entry);
        }
        self.stats.set_held(self.entries.len(), self.held_bytes);
        Ok(features)
    }

    /// Drops every entry (the counters stay).
    pub fn clear(&mut self) {
        self.entries.clear();
        self.held_bytes = 0;
        self.stats.set_held(0, 0);
    }

    fn evict_oldest(&mut self) {
        let oldest = self.entries.iter().min_by_key(|(_, e)| e.last_used).map(|(&h, _)| h);
        if let Some(entry) = oldest.and_then(|h| self.entries.remove(&h)) {
            self.held_bytes -= entry.bytes;
        }
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{DType, Device};

    use super::*;

    /// `rows` f32 rows of 4 values (16 bytes a row), all `value`.
    fn features(rows: usize, value: f32) -> Tensor {
        Tensor::full(value, (rows, 4), &Device::Cpu).unwrap()
    }

    #[test]
    fn hits_skip_the_encoder_and_the_least_recent_entry_goes_first() {
        let stats = Arc::new(EncoderCacheStats::default());
        // Room for two 2-row entries (32 bytes each).
        let mut cache = EncoderCache::new(64, Arc::clone(&stats));
        let (a, b, c) = (ImageHash(1), ImageHash(2), ImageHash(3));
        cache.get_or_encode(a, || Ok(features(2, 1.0))).unwrap();
        cache.get_or_encode(b, || Ok(features(2, 2.0))).unwrap();
        let again = cache.get_or_encode(a, || panic!("a is cached")).unwrap();
        assert_eq!(again.to_vec2::<f32>().unwrap()[0], vec![1.0; 4]);
        // `b` is now the least recently used: `c` pushes it out, `a` stays.
        cache.get_or_encode(c, || Ok(features(2, 3.0))).unwrap();
        cache.get_or_encode(a, || panic!("a is still cached")).unwrap();
        let mut encoded = false;
        cache
            .get_or_encode(b, || {
                encoded = true;
                Ok(features(2, 2.0))
            })
            .unwrap();
        assert!(encoded, "b was evicted");
        let s = stats.snapshot();
        assert_eq!((s.hits, s.misses, s.entries, s.bytes), (2, 4, 2, 64));
    }

    #[test]
    fn features_larger_than_the_cache_are_returned_not_kept() {
        let stats = Arc::new(EncoderCacheStats::default());
        let mut cache = EncoderCache::new(16, Arc::clone(&stats));
        let big = cache.get_or_encode(ImageHash(1), || Ok(features(2, 1.0))).unwrap();
        assert_eq!(big.dims(), &[2, 4]);
        assert_eq!(stats.snapshot().entries, 0);
        let err =
            cache.get_or_encode(ImageHash(2), || Err(crate::ModelError::ImageInput("bad pixels".into())));
        assert!(err.is_err());
        cache.get_or_encode(ImageHash(3), || Ok(Tensor::zeros((1, 4), DType::F32, &Device::Cpu)?)).unwrap();
        assert_eq!(stats.snapshot().entries, 1);
        cache.clear();
        assert_eq!((stats.snapshot().entries, stats.snapshot().bytes, stats.snapshot().misses), (0, 0, 3));
    }
}

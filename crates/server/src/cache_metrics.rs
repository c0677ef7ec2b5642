//! Prometheus counters of the caches beside the KV pool: a vision model's encoder cache and the
//! prefix cache's offload tiers (`--kv-offload`). The engine keeps the totals (atomics it only
//! adds to); each scrape brings the counters up to them.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use pagoda_engine::kv_tier::{KvTierStats, TierMedium};
use prometheus::{IntCounter, IntCounterVec, IntGaugeVec};

use crate::metrics::Builder;

#[derive(Debug, Clone)]
pub struct CacheMetrics {
    /// A vision model's encoder cache: images whose features came from it, and images encoded.
    encoder_cache_hits: IntCounter,
    encoder_cache_misses: IntCounter,
    /// The prefix cache's offload tiers, by medium.
    kv_offload_blocks: IntCounterVec,
    kv_offload_bytes: IntCounterVec,
    kv_offload_held_bytes: IntGaugeVec,
}

impl CacheMetrics {
    pub(crate) fn new(b: &Builder<'_>) -> prometheus::Result<Self> {
        Ok(Self {
        encoder_cache_hits: b.counter(
            "encoder_cache_hits_total",
            "Images whose vision-encoder features came from the encoder cache (one per prefill chunk covering the image).",
        )?,
        encoder_cache_misses: b.counter("encoder_cache_misses_total", "Images the vision encoder ran for.")?,
        kv_offload_blocks: b.register(IntCounterVec::new(
            b.opts(
                "kv_offload_blocks_total",
                "KV blocks of the prefix cache's offload tiers, by medium (CPU, DISK) and event: hit \
                 (loaded instead of recomputed), stored, refused (a foreign, cut short or changed file).",
            ),
            &["medium", "event"],
        )?)?,
        kv_offload_bytes: b.register(IntCounterVec::new(
            b.opts("kv_offload_bytes_total", "Bytes of KV pages copied to (stored) or loaded from an offload tier."),
            &["medium", "direction"],
        )?)?,
        kv_offload_held_bytes: b.register(IntGaugeVec::new(
            b.opts("kv_offload_held_bytes", "Bytes of KV pages an offload tier holds now."),
            &["medium"],
        )?)?,
        })
    }

    /// The offload tiers' totals (they only grow) and the bytes each holds now.
    pub fn record_kv_offload(&self, tiers: &KvTierStats) {
        let bump = |counter: IntCounter, total: &AtomicU64| {
            counter.inc_by(total.load(Relaxed).saturating_sub(counter.get()));
        };
        for medium in [TierMedium::Cpu, TierMedium::Disk] {
            let (c, m) = (tiers.tier(medium), medium.name());
            bump(self.kv_offload_blocks.with_label_values(&[m, "hit"]), &c.hit_blocks);
            bump(self.kv_offload_blocks.with_label_values(&[m, "stored"]), &c.stored_blocks);
            bump(self.kv_offload_blocks.with_label_values(&[m, "refused"]), &c.refused_blocks);
            bump(self.kv_offload_bytes.with_label_values(&[m, "stored"]), &c.stored_bytes);
            bump(self.kv_offload_bytes.with_label_values(&[m, "loaded"]), &c.loaded_bytes);
            self.kv_offload_held_bytes.with_label_values(&[m]).set(c.held_bytes.load(Relaxed) as i64);
        }
    }

    /// The encoder cache's totals (they only grow).
    pub fn record_encoder_cache(&self, hits: u64, misses: u64) {
        self.encoder_cache_hits.inc_by(hits.saturating_sub(self.encoder_cache_hits.get()));
        self.encoder_cache_misses.inc_by(misses.saturating_sub(self.encoder_cache_misses.get()));
    }
}

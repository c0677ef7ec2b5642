//! Sizing the KV cache from device memory (`--gpu-memory-utilization`), as vLLM does: run one
//! step of the largest shape the scheduler can produce (`max_num_batched_tokens` tokens over
//! `max_num_seqs` sequences, each sampled) with a scratch cache, measure the peak the step
//! needed beyond what was already allocated, and give the cache what is left of
//! `utilization * total` after everything in use and that peak. No later step can need more
//! than the profiled one, so the server does not run out of memory after start-up.

use std::sync::Arc;
use std::time::Instant;

use candle_core::DType;
use pagoda_engine::{
    BlockTableUpdate, ModelExecutor, SampleRequest, SamplingParams, ScheduledBatch, ScheduledSeq,
};

use crate::{KvCache, KvLayout, ModelConfig, ModelError, ModelRunner};

/// The largest step the scheduler may build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProfileShape {
    pub max_num_batched_tokens: usize,
    pub max_num_seqs: usize,
    pub block_size: usize,
}

impl ProfileShape {
    /// The profiling step: `max_num_batched_tokens` prompt tokens spread over as many sequences
    /// as may run (each gets at least one), every one sampled with top-p and logprobs so the
    /// sampler's buffers are part of the peak; and the pages its scratch cache needs. Each KV
    /// group gets pages of its own.
    pub fn batch(&self, num_kv_groups: usize, vocab: usize) -> (ScheduledBatch, usize) {
        let tokens = self.max_num_batched_tokens.max(1);
        let seqs = self.max_num_seqs.clamp(1, tokens);
        let params = Arc::new(SamplingParams {
            temperature: 1.0,
            top_p: 0.9,
            logprobs: Some(20),
            ..Default::default()
        });
        let mut next_page = 0u32;
        let batch_seqs = (0..seqs)
            .map(|i| {
                let len = tokens / seqs + usize::from(i < tokens % seqs);
                let pages = len.div_ceil(self.block_size);
                let block_tables = (0..num_kv_groups.max(1))
                    .map(|_| {
                        let table: Vec<u32> = (next_page..next_page + pages as u32).collect();
                        next_page += pages as u32;
                        table
                    })
                    .collect();
                let token_ids = (0..len).map(|t| ((i * 7919 + t) % vocab.max(1)) as u32).collect();
                let sample =
                    SampleRequest { params: params.clone(), seed: i as u64, ..SampleRequest::greedy() };
                ScheduledSeq {
                    sample: Some(sample),
                    ..ScheduledSeq::chunk(i as u64, token_ids, 0, BlockTableUpdate::replace(block_tables))
                }
            })
            .collect();
        (ScheduledBatch { seqs: batch_seqs, ..ScheduledBatch::default() }, next_page as usize)
    }
}

/// What the measurements left for the KV cache.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GpuKvBudget {
    pub total: u64,
    /// Held on the device once the profile's scratch cache is gone: weights, the CUDA context,
    /// other processes.
    pub in_use: u64,
    /// What the profiling step needed at its peak beyond what was allocated before it.
    pub activation_peak: u64,
    pub utilization: f64,
    /// `utilization * total - in_use - activation_peak`.
    pub kv_bytes: u64,
}

/// The device's memory does not leave room for a cache.
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
#[error(
    "--gpu-memory-utilization {utilization} allows {allowed} bytes of the device's {total}, but {in_use} are in use \
     (weights, CUDA context, other processes) and the largest step needs {activation_peak} more: no room for a KV \
     cache; raise --gpu-memory-utilization or lower --max-num-batched-tokens / --max-num-seqs"
)]
pub struct NoRoomForCache {
    pub utilization: f64,
    pub allowed: u64,
    pub total: u64,
    pub in_use: u64,
    pub activation_peak: u64,
}

/// Why the cache could not be sized from device memory.
#[derive(Debug, thiserror::Error)]
pub enum KvSizingError {
    #[error(transparent)]
    NoRoom(#[from] NoRoomForCache),
    #[error("profiling the largest step before sizing the KV cache: {0}")]
    Profile(String),
    #[error(transparent)]
    Model(#[from] ModelError),
}

impl From<candle_core::Error> for KvSizingError {
    fn from(e: candle_core::Error) -> Self {
        Self::Model(e.into())
    }
}

/// Profiles `shape`'s step on `runner`'s device with a scratch cache and returns what device
/// memory leaves for the KV cache at `utilization`. `runner` is left with a one-page cache for
/// the caller to replace. Logs the measurements.
pub fn size_from_device_memory(
    runner: &mut ModelRunner,
    config: &ModelConfig,
    shape: ProfileShape,
    cache_dtype: DType,
    utilization: f64,
) -> Result<GpuKvBudget, KvSizingError> {
    let device = runner.device().clone();
    let layout = KvLayout::for_config(config);
    let (batch, pages) = shape.batch(layout.num_groups(), config.vocab_size);
    runner.replace_cache(KvCache::new(config, pages, shape.block_size, cache_dtype, &device)?);
    let before = pagoda_ops::reset_peak_memory(&device)?.unwrap_or(0);
    let started = Instant::now();
    runner.execute(&batch).map_err(|e| KvSizingError::Profile(e.to_string()))?;
    let peak = pagoda_ops::peak_memory(&device)?.unwrap_or(before);
    drop(runner.replace_cache(KvCache::new(config, 1, shape.block_size, cache_dtype, &device)?));
    device.synchronize()?;
    let memory = pagoda_ops::device_memory(&device)?.ok_or_else(|| {
        KvSizingError::Profile(format!("{device:?} reports no memory to size a cache from"))
    })?;
    let budget =
        gpu_kv_budget(memory.total, memory.total - memory.free, peak.saturating_sub(before), utilization)?;
    let gib = |b: u64| format!("{:.2}", b as f64 / (1u64 << 30) as f64);
    tracing::info!(
        step_tokens = batch.num_tokens(),
        step_seqs = batch.seqs.len(),
        seconds = format!("{:.2}", started.elapsed().as_secs_f64()),
        total_gib = gib(budget.total),
        in_use_gib = gib(budget.in_use),
        activation_peak_gib = gib(budget.activation_peak),
        utilization,
        kv_gib = gib(budget.kv_bytes),
        "KV cache sized from device memory after a profiling step"
    );
    Ok(budget)
}

/// The KV budget from the device's total memory, what is in use after profiling, the
/// profiled peak and the utilization fraction.
pub fn gpu_kv_budget(
    total: u64,
    in_use: u64,
    activation_peak: u64,
    utilization: f64,
) -> Result<GpuKvBudget, NoRoomForCache> {
    let allowed = (total as f64 * utilization).floor() as u64;
    match allowed.checked_sub(in_use).and_then(|rest| rest.checked_sub(activation_peak)).filter(|&b| b > 0) {
        Some(kv_bytes) => Ok(GpuKvBudget { total, in_use, activation_peak, utilization, kv_bytes }),
        None => Err(NoRoomForCache { utilization, allowed, total, in_use, activation_peak }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn budget_is_the_allowed_share_minus_use_and_peak() {
        let b = gpu_kv_budget(80 * GIB, 17 * GIB, 3 * GIB, 0.9).unwrap();
        assert_eq!(b.kv_bytes, (80.0 * 0.9 * GIB as f64) as u64 - 20 * GIB);
        // Another process holding memory shrinks the cache instead of risking an OOM.
        let shared = gpu_kv_budget(80 * GIB, 47 * GIB, 3 * GIB, 0.9).unwrap();
        assert_eq!(b.kv_bytes - shared.kv_bytes, 30 * GIB);
        let err = gpu_kv_budget(80 * GIB, 70 * GIB, 3 * GIB, 0.9).unwrap_err();
        assert_eq!(err.allowed, (80.0 * 0.9 * GIB as f64) as u64);
        assert!(err.to_string().contains("--gpu-memory-utilization 0.9"), "{err}");
        assert!(gpu_kv_budget(GIB, GIB / 2, GIB / 2, 1.0).is_err(), "nothing left is no cache");
    }

    #[test]
    fn profile_batch_fills_the_token_budget_over_the_sequences() {
        let shape = ProfileShape { max_num_batched_tokens: 2048, max_num_seqs: 256, block_size: 16 };
        let (batch, pages) = shape.batch(2, 1000);
        assert_eq!(batch.seqs.len(), 256);
        assert_eq!(batch.num_tokens(), 2048);
        // 8 tokens each: one page per sequence and group.
        assert_eq!(pages, 512);
        let mut seen: Vec<u32> =
            batch.seqs.iter().flat_map(|s| s.block_table_update.append.concat()).collect();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), pages, "pages are distinct");
        assert!(batch.seqs.iter().all(|s| s.sample.is_some() && s.token_ids.iter().all(|&t| t < 1000)));
        // Fewer tokens than sequences: one token each.
        let (small, small_pages) =
            ProfileShape { max_num_batched_tokens: 5, max_num_seqs: 8, block_size: 4 }.batch(1, 10);
        assert_eq!((small.seqs.len(), small.num_tokens(), small_pages), (5, 5, 5));
        let (uneven, _) =
            ProfileShape { max_num_batched_tokens: 10, max_num_seqs: 4, block_size: 4 }.batch(1, 10);
        let lens: Vec<usize> = uneven.seqs.iter().map(|s| s.q_len()).collect();
        assert_eq!(lens, vec![3, 3, 2, 2]);
    }
}

//! Engine metrics: [`StepStats`] and [`RequestMetrics`] pushed to an
//! [`EngineObserver`], and live counters any [`EngineHandle`](crate::EngineHandle) can read as an
//! [`EngineStatsSnapshot`].

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::time::Duration;

use crate::event::RequestMetrics;

/// What one engine step did.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepStats {
    pub step: u64,
    pub num_seqs: usize,
    pub num_prefill_tokens: usize,
    pub num_decode_tokens: usize,
    pub num_preemptions: usize,
    pub num_block_copies: usize,
    /// Prefix-cache lookups of this step's admissions, in tokens.
    pub prefix_cache_queries: u64,
    pub prefix_cache_hits: u64,
    /// After the step.
    pub num_running_seqs: usize,
    pub num_waiting_seqs: usize,
    pub kv_blocks_used: usize,
    pub kv_blocks_total: usize,
    /// Schedule, execute and update together.
    pub duration: Duration,
    /// The executor's share of `duration`.
    pub execute_duration: Duration,
}

impl StepStats {
    pub fn kv_usage(&self) -> f64 {
        self.kv_blocks_used as f64 / self.kv_blocks_total.max(1) as f64
    }
}

/// Receives engine metrics on the engine thread; keep the callbacks cheap.
pub trait EngineObserver: Send + Sync {
    fn on_step(&self, _stats: &StepStats) {}
    fn on_request_finished(&self, _metrics: &RequestMetrics) {}
}

/// An observer that ignores everything.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoopObserver;

impl EngineObserver for NoopObserver {}

/// Counters and gauges at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineStatsSnapshot {
    pub num_requests: usize,
    pub num_running_seqs: usize,
    pub num_waiting_seqs: usize,
    pub kv_blocks_used: usize,
    pub kv_blocks_total: usize,
    /// Totals since start.
    pub prefix_cache_queries: u64,
    pub prefix_cache_hits: u64,
    pub num_preemptions: u64,
    pub num_steps: u64,
    pub num_prefill_tokens: u64,
    pub num_decode_tokens: u64,
    pub num_finished_requests: u64,
}

impl EngineStatsSnapshot {
    pub fn kv_usage(&self) -> f64 {
        self.kv_blocks_used as f64 / self.kv_blocks_total.max(1) as f64
    }

    pub fn prefix_cache_hit_rate(&self) -> f64 {
        self.prefix_cache_hits as f64 / self.prefix_cache_queries.max(1) as f64
    }
}

/// The live counters behind [`EngineStatsSnapshot`], written by the engine thread only.
#[derive(Debug, Default)]
pub(crate) struct LiveStats {
    num_requests: AtomicUsize,
    num_running_seqs: AtomicUsize,
    num_waiting_seqs: AtomicUsize,
    kv_blocks_used: AtomicUsize,
    kv_blocks_total: AtomicUsize,
    prefix_cache_queries: AtomicU64,
    prefix_cache_hits: AtomicU64,
    num_preemptions: AtomicU64,
    num_steps: AtomicU64,
    num_prefill_tokens: AtomicU64,
    num_decode_tokens: AtomicU64,
    num_finished_requests: AtomicU64,
}

impl LiveStats {
    /// Publishes the scheduler's gauges and totals.
    pub fn publish(&self, s: &crate::scheduler::Scheduler) {
        let bm = s.block_manager();
        self.num_requests.store(s.num_requests(), Relaxed);
        self.num_running_seqs.store(s.num_running_seqs(), Relaxed);
        self.num_waiting_seqs.store(s.num_waiting_seqs(), Relaxed);
        self.kv_blocks_used.store(bm.num_used_blocks(), Relaxed);
        self.kv_blocks_total.store(bm.num_total_blocks(), Relaxed);
        self.prefix_cache_queries.store(bm.prefix_cache_queries(), Relaxed);
        self.prefix_cache_hits.store(bm.prefix_cache_hits(), Relaxed);
        self.num_preemptions.store(s.num_preemptions(), Relaxed);
    }

    pub fn record_step(&self, step: &StepStats) {
        self.num_steps.fetch_add(1, Relaxed);
        self.num_prefill_tokens.fetch_add(step.num_prefill_tokens as u64, Relaxed);
        self.num_decode_tokens.fetch_add(step.num_decode_tokens as u64, Relaxed);
    }

    pub fn record_finished(&self, n: usize) {
        self.num_finished_requests.fetch_add(n as u64, Relaxed);
    }

    pub fn snapshot(&self) -> EngineStatsSnapshot {
        EngineStatsSnapshot {
            num_requests: self.num_requests.load(Relaxed),
            num_running_seqs: self.num_running_seqs.load(Relaxed),
            num_waiting_seqs: self.num_waiting_seqs.load(Relaxed),
            kv_blocks_used: self.kv_blocks_used.load(Relaxed),
            kv_blocks_total: self.kv_blocks_total.load(Relaxed),
            prefix_cache_queries: self.prefix_cache_queries.load(Relaxed),
            prefix_cache_hits: self.prefix_cache_hits.load(Relaxed),
            num_preemptions: self.num_preemptions.load(Relaxed),
            num_steps: self.num_steps.load(Relaxed),
            num_prefill_tokens: self.num_prefill_tokens.load(Relaxed),
            num_decode_tokens: self.num_decode_tokens.load(Relaxed),
            num_finished_requests: self.num_finished_requests.load(Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratios_do_not_divide_by_zero() {
        let s = EngineStatsSnapshot::default();
        assert_eq!((s.kv_usage(), s.prefix_cache_hit_rate()), (0.0, 0.0));
        let s = EngineStatsSnapshot {
            kv_blocks_used: 3,
            kv_blocks_total: 12,
            prefix_cache_queries: 8,
            prefix_cache_hits: 2,
            ..s
        };
        assert_eq!((s.kv_usage(), s.prefix_cache_hit_rate()), (0.25, 0.25));
    }

    #[test]
    fn steps_accumulate_token_counts() {
        let live = LiveStats::default();
        live.record_step(&StepStats { num_prefill_tokens: 10, num_decode_tokens: 3, ..Default::default() });
        live.record_step(&StepStats { num_decode_tokens: 4, ..Default::default() });
        live.record_finished(2);
        let s = live.snapshot();
        assert_eq!(
            (s.num_steps, s.num_prefill_tokens, s.num_decode_tokens, s.num_finished_requests),
            (2, 10, 7, 2)
        );
    }
}

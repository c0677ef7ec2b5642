//! Engine metrics: [`StepStats`] and [`RequestMetrics`] pushed to an
//! [`EngineObserver`], and live counters any [`EngineHandle`](crate::EngineHandle) can read as an
//! [`EngineStatsSnapshot`].

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::Duration;

use crate::event::RequestMetrics;
use crate::speculative::{SpecDecodeStats, MAX_SPECULATIVE_TOKENS};

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
    /// Proposals verified in this step.
    pub spec: SpecDecodeStats,
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
    /// The prefix cache's changes of one step (or flush), in order; only with
    /// `EngineConfig::kv_cache_events`.
    fn on_cache_events(&self, _events: Vec<crate::CacheEvent>) {}
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
    pub spec: SpecDecodeStats,
    /// Blocks pinned for prefill/decode transfers now.
    pub kv_held_blocks: usize,
    /// Transfer holds released unread (expired) since start.
    pub kv_expired_holds: u64,
}

impl EngineStatsSnapshot {
    pub fn kv_usage(&self) -> f64 {
        self.kv_blocks_used as f64 / self.kv_blocks_total.max(1) as f64
    }

    pub fn prefix_cache_hit_rate(&self) -> f64 {
        self.prefix_cache_hits as f64 / self.prefix_cache_queries.max(1) as f64
    }
}

/// Which LoRA adapters the scheduler's sequences use (what vLLM's `lora_requests_info`
/// reports, and routers pick servers by).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoraActivity {
    /// Adapters with a running sequence, ascending.
    pub running: Vec<crate::executor::LoraId>,
    /// Adapters with a waiting sequence, ascending.
    pub waiting: Vec<crate::executor::LoraId>,
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
    spec_num_drafts: AtomicU64,
    spec_num_draft_tokens: AtomicU64,
    spec_num_accepted_tokens: AtomicU64,
    spec_accepted_per_position: [AtomicU64; MAX_SPECULATIVE_TOKENS],
    kv_held_blocks: AtomicUsize,
    kv_expired_holds: AtomicU64,
    lora: Mutex<LoraActivity>,
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
        self.kv_held_blocks.store(s.num_held_blocks(), Relaxed);
        self.kv_expired_holds.store(s.num_expired_holds(), Relaxed);
        // Without LoRA (no `max_loras`) no sequence has an adapter: nothing to scan each step.
        if s.config().max_loras.is_some() {
            *self.lora.lock().unwrap_or_else(|p| p.into_inner()) = s.lora_activity();
        }
    }

    pub fn lora_activity(&self) -> LoraActivity {
        self.lora.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn record_step(&self, step: &StepStats) {
        self.num_steps.fetch_add(1, Relaxed);
        self.num_prefill_tokens.fetch_add(step.num_prefill_tokens as u64, Relaxed);
        self.num_decode_tokens.fetch_add(step.num_decode_tokens as u64, Relaxed);
        let spec = &step.spec;
        if spec.num_drafts > 0 {
            self.spec_num_drafts.fetch_add(spec.num_drafts, Relaxed);
            self.spec_num_draft_tokens.fetch_add(spec.num_draft_tokens, Relaxed);
            self.spec_num_accepted_tokens.fetch_add(spec.num_accepted_tokens, Relaxed);
            for (total, &n) in self.spec_accepted_per_position.iter().zip(&spec.accepted_per_position) {
                total.fetch_add(n, Relaxed);
            }
        }
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
            spec: SpecDecodeStats {
                num_drafts: self.spec_num_drafts.load(Relaxed),
                num_draft_tokens: self.spec_num_draft_tokens.load(Relaxed),
                num_accepted_tokens: self.spec_num_accepted_tokens.load(Relaxed),
                accepted_per_position: std::array::from_fn(|i| {
                    self.spec_accepted_per_position[i].load(Relaxed)
                }),
            },
            kv_held_blocks: self.kv_held_blocks.load(Relaxed),
            kv_expired_holds: self.kv_expired_holds.load(Relaxed),
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
        let mut spec = SpecDecodeStats::default();
        spec.record(4, 3);
        live.record_step(&StepStats { num_decode_tokens: 4, spec, ..Default::default() });
        live.record_step(&StepStats { spec, ..Default::default() });
        live.record_finished(2);
        let s = live.snapshot();
        assert_eq!(
            (s.num_steps, s.num_prefill_tokens, s.num_decode_tokens, s.num_finished_requests),
            (3, 10, 7, 2)
        );
        assert_eq!((s.spec.num_drafts, s.spec.num_draft_tokens, s.spec.num_accepted_tokens), (2, 8, 6));
        assert_eq!(&s.spec.accepted_per_position[..4], &[2, 2, 2, 0]);
    }
}

//! The dashboard's numbers (`GET /stats`): a sample of the metrics every second, the last five
//! minutes of them kept, and what each sample shows over the few seconds before it (rates,
//! hit rates, TTFT and ITL percentiles).
//!
//! Samples are cumulative counters and bucket counts, read from the same collectors that
//! `/metrics` renders, so a windowed value is a difference of two samples and a since-start-up
//! value is the metrics themselves. Percentiles interpolate within the histogram buckets as
//! Prometheus's `histogram_quantile` does. The history is one fixed-size ring per server, filled
//! by one task whatever the number of dashboards open; a dashboard costs one small request per
//! poll and nothing once it is closed.

use std::collections::VecDeque;
use std::sync::{Mutex, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;

use crate::metrics::{TPOT_BUCKETS, TTFT_BUCKETS};
use crate::state::AppState;

/// How often the sampler reads the metrics.
pub const SAMPLE_INTERVAL: Duration = Duration::from_secs(1);
/// Samples kept: five minutes at one a second.
pub const HISTORY_LEN: usize = 300;
/// Samples a windowed value spans: each point covers the five seconds before it.
pub const WINDOW: usize = 5;

/// A histogram's cumulative bucket counts, one per finite bound of its bucket set, as `/metrics`
/// exports them; `count` is the `+Inf` bucket.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BucketCounts {
    pub cumulative: Vec<u64>,
    pub count: u64,
    pub sum: f64,
}

/// The metrics' plain values now: counters since start-up, gauges as last recorded.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct LiveCounters {
    /// Finished requests, whatever the reason.
    pub requests: u64,
    pub prompt_tokens: u64,
    pub generation_tokens: u64,
    pub running: u64,
    pub waiting: u64,
    /// 0 to 1.
    pub kv_cache_usage: f64,
    pub preemptions: u64,
    pub prefix_cache_queries: u64,
    pub prefix_cache_hits: u64,
    pub spec_draft_tokens: u64,
    pub spec_accepted_tokens: u64,
}

/// The values the dashboard reads ([`crate::metrics::Metrics::live_totals`]): the plain ones
/// and two latency histograms.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LiveTotals {
    pub counters: LiveCounters,
    /// Time to first token, over [`TTFT_BUCKETS`].
    pub ttft: BucketCounts,
    /// Inter-token latency, over [`TPOT_BUCKETS`].
    pub itl: BucketCounts,
}

/// One reading of the metrics.
#[derive(Debug, Clone, PartialEq)]
struct Sample {
    /// Milliseconds since the Unix epoch.
    at_ms: u64,
    totals: LiveTotals,
}

/// The bounded history of samples.
#[derive(Debug, Default)]
pub struct StatsHistory {
    samples: Mutex<VecDeque<Sample>>,
}

/// p50, p90 and p99 of a histogram's observations, in seconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Percentiles {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
}

/// A histogram since start-up: its observations, their sum and percentiles (absent before the
/// first observation).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HistogramTotals {
    pub count: u64,
    pub sum: f64,
    #[serde(flatten)]
    pub percentiles: Option<Percentiles>,
}

/// What one point of the plots shows.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StatsPoint {
    /// Milliseconds since the Unix epoch.
    pub t: u64,
    pub running: u64,
    pub waiting: u64,
    /// 0 to 1.
    pub kv_cache_usage: f64,
    /// Since start-up.
    pub preemptions: u64,
    /// Over the window before this point; absent for the first sample, whose window is unknown.
    pub output_tokens_per_s: Option<f64>,
    /// Hits over queried tokens in the window; absent when nothing was queried.
    pub prefix_cache_hit_rate: Option<f64>,
    /// Accepted over proposed draft tokens in the window; absent when nothing was proposed.
    pub spec_acceptance_rate: Option<f64>,
    /// Absent when no request got its first token in the window.
    pub ttft_s: Option<Percentiles>,
    /// Absent when no token followed another in the window.
    pub itl_s: Option<Percentiles>,
}

/// The since-start-up values, as `/metrics` has them now.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StatsTotals {
    #[serde(flatten)]
    pub counters: LiveCounters,
    pub ttft_s: HistogramTotals,
    pub itl_s: HistogramTotals,
}

/// The body of `GET /stats`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StatsResponse {
    /// The served model's name.
    pub model: String,
    /// Milliseconds since the Unix epoch, when the totals were read.
    pub now: u64,
    pub interval_s: f64,
    pub window_s: f64,
    pub history_s: f64,
    /// Whether the server runs speculative decoding (its acceptance is then plotted).
    pub speculative_decoding: bool,
    pub totals: StatsTotals,
    /// Oldest first, only those after the request's `since`.
    pub samples: Vec<StatsPoint>,
}

pub fn unix_ms(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// Prometheus's `histogram_quantile`: the `q` quantile of observations counted in cumulative
/// buckets with upper `bounds` (`count` in the `+Inf` bucket), interpolated linearly within the
/// bucket it falls in; the highest finite bound when it falls in `+Inf`. `None` without
/// observations.
pub fn histogram_quantile(q: f64, bounds: &[f64], cumulative: &[u64], count: u64) -> Option<f64> {
    if count == 0 {
        return None;
    }
    let rank = q * count as f64;
    let (mut lower, mut below) = (0.0, 0.0);
    for (&upper, &c) in bounds.iter().zip(cumulative) {
        let c = c as f64;
        if c >= rank {
            return Some(lower + (upper - lower) * (rank - below) / (c - below));
        }
        (lower, below) = (upper, c);
    }
    Some(lower)
}

fn percentiles(bounds: &[f64], cumulative: &[u64], count: u64) -> Option<Percentiles> {
    let q = |q| histogram_quantile(q, bounds, cumulative, count);
    Some(Percentiles { p50: q(0.5)?, p90: q(0.9)?, p99: q(0.99)? })
}

/// Percentiles of the observations between two readings of one histogram.
fn window_percentiles(bounds: &[f64], now: &BucketCounts, then: &BucketCounts) -> Option<Percentiles> {
    let diff: Vec<u64> =
        now.cumulative.iter().zip(&then.cumulative).map(|(a, b)| a.saturating_sub(*b)).collect();
    percentiles(bounds, &diff, now.count.saturating_sub(then.count))
}

fn ratio(part: u64, whole: u64) -> Option<f64> {
    (whole > 0).then(|| part as f64 / whole as f64)
}

fn histogram_totals(bounds: &[f64], h: &BucketCounts) -> HistogramTotals {
    HistogramTotals { count: h.count, sum: h.sum, percentiles: percentiles(bounds, &h.cumulative, h.count) }
}

/// The point for `now`, its window starting at `then` (the sample `WINDOW` before, or the
/// oldest kept).
fn point(now: &Sample, then: Option<&Sample>) -> StatsPoint {
    let n = &now.totals.counters;
    let mut p = StatsPoint {
        t: now.at_ms,
        running: n.running,
        waiting: n.waiting,
        kv_cache_usage: n.kv_cache_usage,
        preemptions: n.preemptions,
        output_tokens_per_s: None,
        prefix_cache_hit_rate: None,
        spec_acceptance_rate: None,
        ttft_s: None,
        itl_s: None,
    };
    if let Some(then) = then.filter(|t| t.at_ms < now.at_ms) {
        let b = &then.totals.counters;
        let seconds = (now.at_ms - then.at_ms) as f64 / 1000.0;
        p.output_tokens_per_s =
            Some(n.generation_tokens.saturating_sub(b.generation_tokens) as f64 / seconds);
        p.prefix_cache_hit_rate = ratio(
            n.prefix_cache_hits.saturating_sub(b.prefix_cache_hits),
            n.prefix_cache_queries.saturating_sub(b.prefix_cache_queries),
        );
        p.spec_acceptance_rate = ratio(
            n.spec_accepted_tokens.saturating_sub(b.spec_accepted_tokens),
            n.spec_draft_tokens.saturating_sub(b.spec_draft_tokens),
        );
        p.ttft_s = window_percentiles(TTFT_BUCKETS, &now.totals.ttft, &then.totals.ttft);
        p.itl_s = window_percentiles(TPOT_BUCKETS, &now.totals.itl, &then.totals.itl);
    }
    p
}

pub fn totals(t: &LiveTotals) -> StatsTotals {
    StatsTotals {
        counters: t.counters.clone(),
        ttft_s: histogram_totals(TTFT_BUCKETS, &t.ttft),
        itl_s: histogram_totals(TPOT_BUCKETS, &t.itl),
    }
}

impl StatsHistory {
    /// Keeps a reading taken at `at_ms`, dropping the oldest beyond [`HISTORY_LEN`].
    pub fn record(&self, at_ms: u64, totals: LiveTotals) {
        let mut samples = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        if samples.len() == HISTORY_LEN {
            samples.pop_front();
        }
        samples.push_back(Sample { at_ms, totals });
    }

    /// The points of the samples taken after `since_ms`, oldest first.
    pub fn points_since(&self, since_ms: u64) -> Vec<StatsPoint> {
        let samples = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        let first = samples.partition_point(|s| s.at_ms <= since_ms);
        (first..samples.len())
            .map(|i| point(&samples[i], i.checked_sub(WINDOW).or(Some(0)).and_then(|j| samples.get(j))))
            .collect()
    }
}

/// Samples the metrics every [`SAMPLE_INTERVAL`] into the state's history, until the state is
/// dropped.
pub async fn run_sampler(state: Weak<AppState>) {
    let mut ticks = tokio::time::interval(SAMPLE_INTERVAL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let Some(state) = state.upgrade() else { return };
        state.refresh_engine_metrics();
        state.stats.record(unix_ms(SystemTime::now()), state.metrics.live_totals());
    }
}

#[cfg(test)]
#[path = "live_stats_tests.rs"]
mod tests;

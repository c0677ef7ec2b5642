//! Per-request results and the run's summary: throughputs and the distributions of TTFT, TPOT,
//! ITL and end-to-end latency.
//!
//! Definitions (all over successful requests only; times in milliseconds):
//! - TTFT: from sending the request to the first chunk with content.
//! - TPOT: `(e2e − TTFT) / (output_tokens − 1)` per request with at least 2 output tokens
//!   (the time per token after the first).
//! - ITL: every gap between consecutive content chunks, of all requests pooled (a chunk may
//!   carry several tokens).
//! - E2EL: from sending the request to the end of its stream.
//! - Percentiles interpolate linearly between the closest ranks (numpy's default): the p-th
//!   percentile of sorted `x[0..n]` is `x[i] + f·(x[i+1] − x[i])` with `i + f = p/100·(n−1)`.
//! - Throughputs divide successful requests and their tokens by the run's duration (first
//!   request sent to last request finished).
//! - A request sent again because the server closed its connection without answering
//!   (`connection_retries`) is timed from its first attempt.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use crate::structured::{summarize_validity, SchemaCheck, ValiditySummary};

/// One request's result, as saved by `--save-result`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RequestResult {
    /// Position in the dataset.
    pub index: usize,
    pub success: bool,
    pub error: Option<String>,
    /// Times it was sent again after the server closed its connection without answering.
    pub connection_retries: usize,
    /// Prompt tokens: the server's usage count, else the dataset's length.
    pub prompt_len: usize,
    /// Output tokens: the server's usage count, else the number of content chunks.
    pub output_len: usize,
    /// Whether `output_len` (and `prompt_len`) came from the server's `usage`.
    pub usage_reported: bool,
    /// `max_tokens` asked for.
    pub max_tokens: usize,
    /// When the request was sent, in seconds since the run started.
    pub start_s: f64,
    pub ttft_ms: Option<f64>,
    pub tpot_ms: Option<f64>,
    pub itl_ms: Vec<f64>,
    pub e2el_ms: f64,
    pub finish_reason: Option<String>,
    /// Under `--json-schema`: the schema asked for and the check of the answer (saved as the
    /// request's `schema`, `valid`, `invalid_reason` and `invalid_text`).
    #[serde(flatten)]
    pub schema_check: Option<SchemaCheck>,
    /// The answer text, under `--save-text` (for comparing servers' or configurations' outputs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
}

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// TPOT of one request, or `None` below 2 output tokens.
pub fn tpot_ms(e2el_ms: f64, ttft_ms: f64, output_tokens: usize) -> Option<f64> {
    (output_tokens > 1).then(|| (e2el_ms - ttft_ms) / (output_tokens - 1) as f64)
}

/// The `p`-th percentile (0–100) of sorted `values`, linearly interpolated; `None` if empty.
pub fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    let n = sorted.len();
    if n == 0 {
        return None;
    }
    let rank = (p.clamp(0.0, 100.0) / 100.0) * (n - 1) as f64;
    let i = rank.floor() as usize;
    let f = rank - i as f64;
    Some(match sorted.get(i + 1) {
        Some(next) => sorted[i] + f * (next - sorted[i]),
        None => sorted[i],
    })
}

/// Mean, median, standard deviation (population), extremes and the asked percentiles.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Distribution {
    pub count: usize,
    pub mean: f64,
    pub median: f64,
    pub std: f64,
    pub min: f64,
    pub max: f64,
    /// `(p, value)` for each asked percentile.
    pub percentiles: Vec<(f64, f64)>,
}

impl Distribution {
    /// `None` for no values.
    pub fn of(values: &[f64], percentiles: &[f64]) -> Option<Self> {
        if values.is_empty() {
            return None;
        }
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len() as f64;
        let mean = sorted.iter().sum::<f64>() / n;
        let var = sorted.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
        let at = |p| percentile(&sorted, p).expect("non-empty");
        Some(Self {
            count: sorted.len(),
            mean,
            median: at(50.0),
            std: var.sqrt(),
            min: sorted[0],
            max: sorted[sorted.len() - 1],
            percentiles: percentiles.iter().map(|&p| (p, at(p))).collect(),
        })
    }
}

/// The run's numbers.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    pub completed: usize,
    pub failed: usize,
    pub duration_s: f64,
    pub total_input_tokens: usize,
    pub total_output_tokens: usize,
    pub request_throughput: f64,
    pub output_throughput: f64,
    pub total_token_throughput: f64,
    /// Successful requests whose server sent no usage (output counted as content chunks).
    pub requests_without_usage: usize,
    /// Most requests in flight at once.
    pub peak_concurrency: usize,
    /// Retries of all requests, failed ones included, after the server closed a connection
    /// without answering.
    pub connection_retries: usize,
    pub ttft_ms: Option<Distribution>,
    pub tpot_ms: Option<Distribution>,
    pub itl_ms: Option<Distribution>,
    pub e2el_ms: Option<Distribution>,
    /// Failed requests by error message.
    pub errors: BTreeMap<String, usize>,
    /// Under `--json-schema` with validation: how many answers were valid.
    pub validity: Option<ValiditySummary>,
}

/// Summarizes `results` of a run that took `duration`.
pub fn summarize(results: &[RequestResult], duration: Duration, percentiles: &[f64]) -> Summary {
    let ok: Vec<&RequestResult> = results.iter().filter(|r| r.success).collect();
    let mut errors = BTreeMap::new();
    for r in results.iter().filter(|r| !r.success) {
        let e = r.error.clone().unwrap_or_else(|| "unknown error".into());
        *errors.entry(e).or_insert(0) += 1;
    }
    let total_input_tokens = ok.iter().map(|r| r.prompt_len).sum();
    let total_output_tokens = ok.iter().map(|r| r.output_len).sum();
    let secs = duration.as_secs_f64();
    let per_s = |x: usize| if secs > 0.0 { x as f64 / secs } else { 0.0 };
    let collect =
        |f: &dyn Fn(&RequestResult) -> Option<f64>| ok.iter().filter_map(|r| f(r)).collect::<Vec<_>>();
    let itls: Vec<f64> = ok.iter().flat_map(|r| r.itl_ms.iter().copied()).collect();
    Summary {
        completed: ok.len(),
        failed: results.len() - ok.len(),
        duration_s: secs,
        total_input_tokens,
        total_output_tokens,
        request_throughput: per_s(ok.len()),
        output_throughput: per_s(total_output_tokens),
        total_token_throughput: per_s(total_input_tokens + total_output_tokens),
        requests_without_usage: ok.iter().filter(|r| !r.usage_reported).count(),
        peak_concurrency: peak_concurrency(results),
        connection_retries: results.iter().map(|r| r.connection_retries).sum(),
        ttft_ms: Distribution::of(&collect(&|r| r.ttft_ms), percentiles),
        tpot_ms: Distribution::of(&collect(&|r| r.tpot_ms), percentiles),
        itl_ms: Distribution::of(&itls, percentiles),
        e2el_ms: Distribution::of(&collect(&|r| Some(r.e2el_ms)), percentiles),
        errors,
        validity: summarize_validity(results),
    }
}

/// Most requests whose `[start, start + e2el)` intervals overlap at one instant.
pub fn peak_concurrency(results: &[RequestResult]) -> usize {
    let mut edges: Vec<(f64, i32)> = Vec::with_capacity(results.len() * 2);
    for r in results {
        edges.push((r.start_s, 1));
        edges.push((r.start_s + r.e2el_ms / 1e3, -1));
    }
    // Ends before starts at the same instant: back-to-back requests do not overlap.
    edges.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let (mut now, mut peak) = (0i32, 0i32);
    for (_, d) in edges {
        now += d;
        peak = peak.max(now);
    }
    peak as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(index: usize, success: bool) -> RequestResult {
        RequestResult {
            index,
            success,
            error: (!success).then(|| "HTTP 500: boom".to_owned()),
            connection_retries: 0,
            prompt_len: 10,
            output_len: 5,
            usage_reported: true,
            max_tokens: 5,
            start_s: 0.0,
            ttft_ms: Some(100.0),
            tpot_ms: tpot_ms(500.0, 100.0, 5),
            itl_ms: vec![100.0; 4],
            e2el_ms: 500.0,
            finish_reason: Some("length".into()),
            schema_check: None,
            text: None,
        }
    }

    #[test]
    fn percentiles_interpolate_like_numpy() {
        let x = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0];
        assert_eq!(percentile(&x, 50.0), Some(5.5));
        assert_eq!(percentile(&x, 0.0), Some(1.0));
        assert_eq!(percentile(&x, 100.0), Some(10.0));
        // numpy.percentile(range(1, 11), 99) == 9.91; (…, 90) == 9.1; (…, 25) == 3.25
        assert!((percentile(&x, 99.0).unwrap() - 9.91).abs() < 1e-12);
        assert!((percentile(&x, 90.0).unwrap() - 9.1).abs() < 1e-12);
        assert!((percentile(&x, 25.0).unwrap() - 3.25).abs() < 1e-12);
        assert_eq!(percentile(&[7.0], 99.0), Some(7.0));
        assert_eq!(percentile(&[], 50.0), None);
    }

    #[test]
    fn distribution_of_known_values() {
        let d = Distribution::of(&[4.0, 1.0, 3.0, 2.0], &[50.0, 99.0]).unwrap();
        assert_eq!((d.count, d.mean, d.median, d.min, d.max), (4, 2.5, 2.5, 1.0, 4.0));
        assert!((d.std - 1.25f64.sqrt()).abs() < 1e-12);
        assert_eq!(d.percentiles[0], (50.0, 2.5));
        assert!((d.percentiles[1].1 - 3.97).abs() < 1e-12);
        assert_eq!(Distribution::of(&[], &[50.0]), None);
    }

    #[test]
    fn tpot_excludes_the_first_token() {
        assert_eq!(tpot_ms(1100.0, 100.0, 11), Some(100.0));
        assert_eq!(tpot_ms(100.0, 100.0, 1), None);
        assert_eq!(tpot_ms(100.0, 100.0, 0), None);
    }

    #[test]
    fn summary_counts_failures_and_divides_by_duration() {
        let mut results: Vec<_> = (0..4).map(|i| result(i, i != 2)).collect();
        results[3].output_len = 11;
        results[3].ttft_ms = Some(300.0);
        results[3].tpot_ms = tpot_ms(1300.0, 300.0, 11);
        results[3].e2el_ms = 1300.0;
        results[1].usage_reported = false;
        results[1].connection_retries = 1;
        results[2].connection_retries = 1;
        let s = summarize(&results, Duration::from_secs(2), &[99.0]);
        assert_eq!((s.completed, s.failed), (3, 1));
        assert_eq!((s.total_input_tokens, s.total_output_tokens), (30, 21));
        assert_eq!(s.request_throughput, 1.5);
        assert_eq!(s.output_throughput, 10.5);
        assert_eq!(s.total_token_throughput, 25.5);
        assert_eq!(s.requests_without_usage, 1);
        assert_eq!(s.connection_retries, 2, "retries of failed requests count too");
        assert_eq!(s.errors.get("HTTP 500: boom"), Some(&1));
        let ttft = s.ttft_ms.unwrap();
        assert_eq!((ttft.count, ttft.median), (3, 100.0));
        assert!((ttft.mean - 500.0 / 3.0).abs() < 1e-9);
        let tpot = s.tpot_ms.unwrap();
        assert_eq!((tpot.min, tpot.max), (100.0, 100.0));
        assert_eq!(s.itl_ms.unwrap().count, 12, "ITLs of successful requests pooled");
        assert_eq!(s.e2el_ms.unwrap().max, 1300.0);
    }

    #[test]
    fn an_all_failed_run_has_no_distributions() {
        let s = summarize(&[result(0, false)], Duration::from_secs(1), &[99.0]);
        assert_eq!((s.completed, s.failed, s.total_output_tokens), (0, 1, 0));
        assert!(s.ttft_ms.is_none() && s.tpot_ms.is_none() && s.itl_ms.is_none() && s.e2el_ms.is_none());
        assert_eq!(summarize(&[], Duration::ZERO, &[]).request_throughput, 0.0);
    }

    #[test]
    fn peak_concurrency_counts_overlaps() {
        let at = |start_s: f64, e2el_ms: f64| RequestResult { start_s, e2el_ms, ..result(0, true) };
        // [0, 1), [0.5, 1.5), [1, 2): at most two at once; [3, 4) alone.
        let rs = [at(0.0, 1000.0), at(0.5, 1000.0), at(1.0, 1000.0), at(3.0, 1000.0)];
        assert_eq!(peak_concurrency(&rs), 2);
        assert_eq!(peak_concurrency(&[at(0.0, 10.0), at(0.0, 10.0), at(0.0, 10.0)]), 3);
        assert_eq!(peak_concurrency(&[]), 0);
    }
}

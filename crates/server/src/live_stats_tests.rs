use super::*;

#[test]
fn quantiles_interpolate_within_buckets_as_prometheus_does() {
    let bounds = [1.0, 2.0, 4.0];
    // 2 observations up to 1, 4 in (1, 2], 2 in (2, 4], 2 above 4.
    let cumulative = [2, 6, 8];
    assert_eq!(histogram_quantile(0.1, &bounds, &cumulative, 10), Some(0.5));
    assert_eq!(histogram_quantile(0.5, &bounds, &cumulative, 10), Some(1.75));
    assert_eq!(histogram_quantile(0.8, &bounds, &cumulative, 10), Some(4.0));
    // In the +Inf bucket: the highest finite bound.
    assert_eq!(histogram_quantile(0.99, &bounds, &cumulative, 10), Some(4.0));
    assert_eq!(histogram_quantile(0.5, &bounds, &[0, 0, 0], 0), None);
}

fn totals_at(step: u64) -> LiveTotals {
    LiveTotals {
        counters: LiveCounters {
            requests: step,
            generation_tokens: 10 * step,
            prefix_cache_queries: 4 * step,
            prefix_cache_hits: step,
            running: step % 2,
            ..LiveCounters::default()
        },
        // One first token a step, all at 50 ms (in the bucket up to 0.06 s).
        ttft: BucketCounts {
            cumulative: TTFT_BUCKETS.iter().map(|&b| if b >= 0.06 { step } else { 0 }).collect(),
            count: step,
            sum: 0.05 * step as f64,
        },
        itl: BucketCounts { cumulative: vec![0; TPOT_BUCKETS.len()], count: 0, sum: 0.0 },
    }
}

#[test]
fn points_are_rates_and_percentiles_over_the_window_before_them() {
    let history = StatsHistory::default();
    for step in 0..8 {
        history.record(1_000 + 1_000 * step, totals_at(step));
    }
    let points = history.points_since(0);
    assert_eq!(points.len(), 8);
    // The first sample has no window before it.
    assert_eq!(points[0].output_tokens_per_s, None);
    assert_eq!(points[0].ttft_s, None);
    for p in &points[1..] {
        assert_eq!(p.output_tokens_per_s, Some(10.0), "{p:?}");
        assert_eq!(p.prefix_cache_hit_rate, Some(0.25));
        assert_eq!(p.spec_acceptance_rate, None, "nothing was drafted");
        assert_eq!(p.itl_s, None, "no token followed another");
        let ttft = p.ttft_s.expect("first tokens in the window");
        // All in (0.04, 0.06]: interpolated inside that bucket.
        assert!(ttft.p50 > 0.04 && ttft.p99 <= 0.06, "{ttft:?}");
    }
    assert_eq!(points[7].running, 1);
    assert_eq!(points[7].t, 8_000);
    // Only the samples after `since`.
    let later = history.points_since(6_000);
    assert_eq!(later.iter().map(|p| p.t).collect::<Vec<_>>(), [7_000, 8_000]);
    assert_eq!(later[0], points[6]);
}

#[test]
fn the_history_keeps_a_bounded_window() {
    let history = StatsHistory::default();
    for step in 0..(HISTORY_LEN as u64 + 25) {
        history.record(step * 1_000, totals_at(step));
    }
    let points = history.points_since(0);
    assert_eq!(points.len(), HISTORY_LEN);
    assert_eq!(points[0].t, 25_000);
}

#[test]
fn totals_carry_the_histograms_percentiles_since_start_up() {
    let t = totals(&totals_at(4));
    assert_eq!(t.counters.requests, 4);
    assert_eq!(t.ttft_s.count, 4);
    let p = t.ttft_s.percentiles.expect("observations");
    assert_eq!(Some(p.p50), histogram_quantile(0.5, TTFT_BUCKETS, &totals_at(4).ttft.cumulative, 4));
    assert_eq!(t.itl_s.percentiles, None);
    let json = serde_json::to_value(&t).unwrap();
    assert!(json["ttft_s"]["p90"].is_f64(), "{json}");
    assert!(json["itl_s"].get("p90").is_none(), "{json}");
    assert_eq!(json["requests"], 4, "the counters sit beside the histograms: {json}");
}

#[test]
fn speculative_acceptance_is_accepted_over_proposed_in_the_window() {
    let history = StatsHistory::default();
    for step in 0..3u64 {
        let mut t = totals_at(step);
        // Eight tokens drafted a second, six of them accepted.
        t.counters.spec_draft_tokens = 8 * step;
        t.counters.spec_accepted_tokens = 6 * step;
        history.record(1_000 * (step + 1), t);
    }
    let points = history.points_since(0);
    assert_eq!(points[0].spec_acceptance_rate, None);
    assert_eq!(points[2].spec_acceptance_rate, Some(0.75));
}

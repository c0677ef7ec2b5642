//! Tests of the metric names, labels, buckets and how engine snapshots advance the counters.

use super::*;

#[test]
fn cache_config_info_has_the_gateway_labels() {
    let m = Metrics::new(MetricsPrefix::Vllm, "smol", 100).unwrap();
    m.record_cache_config(16, 4096, "float16", true);
    let text = m.render();
    assert!(
        text.contains(
            "vllm:cache_config_info{block_size=\"16\",cache_dtype=\"float16\",enable_prefix_caching=\"true\",model_name=\"smol\",num_gpu_blocks=\"4096\"} 1"
        ),
        "{text}"
    );
}

#[test]
fn lora_info_keeps_one_series_of_the_latest_adapters() {
    let m = Metrics::new(MetricsPrefix::Vllm, "smol", 100).unwrap();
    assert!(!m.render().contains("lora_requests_info{"), "no series before LoRA is counted");
    m.record_lora(4, &["a".into(), "b".into()], &[]);
    m.record_lora(4, &["b".into()], &["c".into()]);
    let text = m.render();
    let series: Vec<&str> = text.lines().filter(|l| l.starts_with("vllm:lora_requests_info{")).collect();
    assert_eq!(series.len(), 1, "{text}");
    assert!(
        series[0].starts_with(
            "vllm:lora_requests_info{max_lora=\"4\",model_name=\"smol\",running_lora_adapters=\"b\",waiting_lora_adapters=\"c\"} "
        ),
        "{text}"
    );
    let stamp: f64 = series[0].rsplit(' ').next().unwrap().parse().unwrap();
    assert!(stamp > 1.7e9, "{stamp}");
}

#[test]
fn one_two_five_buckets() {
    assert_eq!(buckets_1_2_5(100), vec![1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0]);
    assert_eq!(buckets_1_2_5(1), vec![1.0]);
    assert_eq!(buckets_1_2_5(8192).last(), Some(&5000.0));
}

#[test]
fn names_prefixes_and_labels() {
    for (prefix, name) in [(MetricsPrefix::Pagoda, "pagoda"), (MetricsPrefix::Vllm, "vllm")] {
        let m = Metrics::new(prefix, "smol", 2048).unwrap();
        m.observe_prompt(3);
        m.observe_request(&RequestRecord {
            prompt_tokens: 3,
            generation_tokens: 2,
            finished_reason: "stop",
            e2e: Duration::from_millis(50),
            queue: Some(Duration::from_millis(1)),
            prefill: Some(Duration::from_millis(9)),
            decode: Some(Duration::from_millis(40)),
        });
        let text = m.render();
        for metric in [
            "num_requests_running",
            "num_requests_waiting",
            "kv_cache_usage_perc",
            "prompt_tokens_total",
            "generation_tokens_total",
            "num_preemptions_total",
            "prefix_cache_queries_total",
            "prefix_cache_hits_total",
            "time_to_first_token_seconds_bucket",
            "inter_token_latency_seconds_bucket",
            "request_time_per_output_token_seconds_bucket",
            "e2e_request_latency_seconds_bucket",
            "request_queue_time_seconds_bucket",
            "request_prefill_time_seconds_bucket",
            "request_decode_time_seconds_bucket",
            "request_prompt_tokens_bucket",
            "request_generation_tokens_bucket",
            "iteration_tokens_total_bucket",
        ] {
            assert!(text.contains(&format!("{name}:{metric}{{")), "{name}:{metric} missing in\n{text}");
        }
        assert!(text.contains(&format!("{name}:prompt_tokens_total{{model_name=\"smol\"}} 3")), "{text}");
        assert!(text.contains(&format!(
            "{name}:request_success_total{{finished_reason=\"stop\",model_name=\"smol\"}} 1"
        )));
    }
}

#[test]
fn exact_vllm_buckets_are_exported() {
    let m = Metrics::new(MetricsPrefix::Pagoda, "m", 100).unwrap();
    let text = m.render();
    let les = |metric: &str| -> Vec<String> {
        text.lines()
            .filter(|l| l.starts_with(&format!("pagoda:{metric}_bucket{{")))
            .map(|l| l.split("le=\"").nth(1).unwrap().split('"').next().unwrap().to_owned())
            .collect()
    };
    let ttft = les("time_to_first_token_seconds");
    assert_eq!(ttft.len(), TTFT_BUCKETS.len() + 1);
    assert_eq!(ttft.first().map(String::as_str), Some("0.001"));
    assert_eq!(ttft[ttft.len() - 2], "2560");
    assert_eq!(les("inter_token_latency_seconds").len(), TPOT_BUCKETS.len() + 1);
    assert_eq!(les("request_decode_time_seconds")[20], "7680");
    assert_eq!(les("request_prompt_tokens").len(), buckets_1_2_5(100).len() + 1);
}

#[test]
fn engine_counters_advance_by_difference() {
    let m = Metrics::new(MetricsPrefix::Pagoda, "m", 100).unwrap();
    let snap = |p, q, h| EngineSnapshot {
        num_running: 2,
        num_waiting: 1,
        kv_cache_usage: 0.5,
        num_preemptions: p,
        prefix_cache_queries: q,
        prefix_cache_hits: h,
        spec: {
            let mut s = pagoda_engine::SpecDecodeStats::default();
            for _ in 0..p {
                s.record(3, 2);
            }
            s
        },
    };
    m.record_engine(&snap(1, 10, 4));
    m.record_engine(&snap(3, 30, 4));
    assert_eq!(m.num_preemptions.get(), 3);
    assert_eq!(
        (
            m.spec_decode_num_drafts.get(),
            m.spec_decode_num_draft_tokens.get(),
            m.spec_decode_num_accepted_tokens.get()
        ),
        (3, 9, 6)
    );
    let text = m.render();
    assert!(
        text.contains(
            "pagoda:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"m\",position=\"1\"} 3"
        ),
        "{text}"
    );
    assert!(!text.contains("position=\"2\""), "{text}");
    assert_eq!(m.prefix_cache_queries.get(), 30);
    assert_eq!(m.prefix_cache_hits.get(), 4);
    assert_eq!(m.num_requests_running.get(), 2);
    assert!(m.render().contains("pagoda:kv_cache_usage_perc{model_name=\"m\"} 0.5"));
}

#[test]
fn http_counts_by_route_and_status() {
    let m = Metrics::new(MetricsPrefix::Pagoda, "m", 100).unwrap();
    m.observe_http("/v1/models", "GET", 200);
    m.observe_http("/v1/models", "GET", 200);
    m.observe_http("/v1/chat/completions", "POST", 400);
    let text = m.render();
    assert!(
        text.contains("http_requests_total{handler=\"/v1/models\",method=\"GET\",status=\"200\"} 2"),
        "{text}"
    );
    assert!(text.contains("status=\"400\"} 1"));
}

#[test]
fn unknown_methods_share_one_label() {
    let m = Metrics::new(MetricsPrefix::Pagoda, "m", 100).unwrap();
    for i in 0..100 {
        m.observe_http("unmatched", &format!("M{i}"), 404);
    }
    m.observe_http("unmatched", "get", 404);
    m.observe_http("unmatched", "PATCH", 404);
    let text = m.render();
    let series: Vec<&str> = text.lines().filter(|l| l.starts_with("http_requests_total{")).collect();
    assert_eq!(series.len(), 2, "{text}");
    assert!(text.contains("method=\"other\",status=\"404\"} 101"), "{text}");
}

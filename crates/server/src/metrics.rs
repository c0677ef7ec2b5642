//! Prometheus metrics under vLLM's names and bucket sets, prefixed `pagoda:` (or `vllm:` with
//! `--metrics-prefix vllm`, so that existing vLLM dashboards work unchanged), each labelled with
//! `model_name`; plus `http_requests_total{handler,method,status}`.
//!
//! Engine-side values (running/waiting counts, KV usage, preemptions, prefix-cache counters) are
//! copied from an engine snapshot at scrape time by [`Metrics::record_engine`]; per-request values
//! are observed by the handlers as tokens arrive ([`Metrics::observe_request`]).

use std::sync::Mutex;
use std::time::Duration;

use prometheus::{
    Encoder, Gauge, GaugeVec, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
    TextEncoder,
};
use serde::Deserialize;

use crate::live_stats::{BucketCounts, LiveCounters, LiveTotals};

/// The namespace in front of every model metric.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum MetricsPrefix {
    #[default]
    Pagoda,
    Vllm,
}

impl MetricsPrefix {
    pub fn as_str(self) -> &'static str {
        match self {
            MetricsPrefix::Pagoda => "pagoda",
            MetricsPrefix::Vllm => "vllm",
        }
    }
}

/// Grammar compile times: a small schema takes about a millisecond, a large one can take seconds.
const GRAMMAR_COMPILE_BUCKETS: &[f64] =
    &[0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

/// vLLM's buckets for time to first token.
pub const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
    80.0, 160.0, 640.0, 2560.0,
];
/// vLLM's buckets for inter-token latency and time per output token.
pub const TPOT_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
];
/// vLLM's buckets for whole-request phases (end-to-end, queue, prefill, decode).
pub const REQUEST_LATENCY_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
    960.0, 1920.0, 7680.0,
];
/// vLLM's buckets for tokens per engine step.
pub const ITERATION_TOKEN_BUCKETS: &[f64] =
    &[1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0];

/// 1, 2, 5, 10, 20, 50, ... up to `max` (vLLM's `build_1_2_5_buckets`), for token counts.
pub fn buckets_1_2_5(max: usize) -> Vec<f64> {
    let mut out = Vec::new();
    let mut exponent = 1usize;
    loop {
        for m in [1, 2, 5] {
            let v = m * exponent;
            if v > max {
                return out;
            }
            out.push(v as f64);
        }
        exponent = exponent.saturating_mul(10);
    }
}

/// What the engine reports about itself at scrape time.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EngineSnapshot {
    pub num_running: usize,
    pub num_waiting: usize,
    /// Fraction of KV blocks in use, 0 to 1.
    pub kv_cache_usage: f64,
    /// Cumulative counts since start-up.
    pub num_preemptions: u64,
    pub prefix_cache_queries: u64,
    pub prefix_cache_hits: u64,
    /// Speculative decoding's totals.
    pub spec: pagoda_engine::SpecDecodeStats,
}

/// How one request went, for the per-request histograms and counters.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestRecord {
    pub prompt_tokens: usize,
    pub generation_tokens: usize,
    /// `stop`, `length` or `abort`.
    pub finished_reason: &'static str,
    pub e2e: Duration,
    /// Arrival to first scheduling; `None` if never scheduled.
    pub queue: Option<Duration>,
    /// First scheduling to first token.
    pub prefill: Option<Duration>,
    /// First token to last token.
    pub decode: Option<Duration>,
}

pub struct Metrics {
    registry: Registry,
    num_requests_running: IntGauge,
    num_requests_waiting: IntGauge,
    kv_cache_usage_perc: Gauge,
    prompt_tokens: IntCounter,
    generation_tokens: IntCounter,
    request_success: IntCounterVec,
    num_preemptions: IntCounter,
    prefix_cache_queries: IntCounter,
    prefix_cache_hits: IntCounter,
    spec_decode_num_drafts: IntCounter,
    spec_decode_num_draft_tokens: IntCounter,
    spec_decode_num_accepted_tokens: IntCounter,
    spec_decode_num_accepted_tokens_per_pos: IntCounterVec,
    time_to_first_token: Histogram,
    inter_token_latency: Histogram,
    time_per_output_token: Histogram,
    e2e_latency: Histogram,
    queue_time: Histogram,
    prefill_time: Histogram,
    decode_time: Histogram,
    inference_time: Histogram,
    request_prompt_tokens: Histogram,
    request_generation_tokens: Histogram,
    iteration_tokens: Histogram,
    http_requests: IntCounterVec,
    structured_output_requests: IntCounterVec,
    grammar_compile_time: Histogram,
    lora_requests_info: GaugeVec,
    cache_config_info: GaugeVec,
    kv_events_batches: IntCounter,
    kv_events_dropped: IntCounter,
    kv_transfer_blocks: IntCounterVec,
    kv_transfer_failures: IntCounterVec,
    kv_transfer_held_blocks: IntGauge,
    kv_transfer_expired_holds: IntCounter,
    /// The encoder cache's and the KV offload tiers' counters.
    pub caches: crate::cache_metrics::CacheMetrics,
    engine_sleep_state: IntGauge,
    /// Engine counters as last copied, so that the next copy adds only the difference.
    engine_seen: Mutex<EngineSnapshot>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

pub(crate) struct Builder<'a> {
    registry: Registry,
    prefix: &'static str,
    model_name: &'a str,
}

impl Builder<'_> {
    pub(crate) fn opts(&self, name: &str, help: &str) -> Opts {
        Opts::new(format!("{}:{name}", self.prefix), help).const_label("model_name", self.model_name)
    }

    pub(crate) fn register<C: prometheus::core::Collector + Clone + 'static>(
        &self,
        c: C,
    ) -> prometheus::Result<C> {
        self.registry.register(Box::new(c.clone()))?;
        Ok(c)
    }

    fn gauge(&self, name: &str, help: &str) -> prometheus::Result<Gauge> {
        self.register(Gauge::with_opts(self.opts(name, help))?)
    }

    fn int_gauge(&self, name: &str, help: &str) -> prometheus::Result<IntGauge> {
        self.register(IntGauge::with_opts(self.opts(name, help))?)
    }

    pub(crate) fn counter(&self, name: &str, help: &str) -> prometheus::Result<IntCounter> {
        self.register(IntCounter::with_opts(self.opts(name, help))?)
    }

    fn histogram(&self, name: &str, help: &str, buckets: &[f64]) -> prometheus::Result<Histogram> {
        let opts = HistogramOpts::from(self.opts(name, help)).buckets(buckets.to_vec());
        self.register(Histogram::with_opts(opts)?)
    }
}

impl Metrics {
    pub fn new(prefix: MetricsPrefix, model_name: &str, max_model_len: usize) -> prometheus::Result<Self> {
        let b = Builder { registry: Registry::new(), prefix: prefix.as_str(), model_name };
        let token_buckets = buckets_1_2_5(max_model_len.max(1));
        let request_success = b.register(IntCounterVec::new(
            b.opts("request_success_total", "Count of successfully processed requests."),
            &["finished_reason"],
        )?)?;
        let http_requests = b.register(IntCounterVec::new(
            Opts::new("http_requests_total", "HTTP requests by route, method and status."),
            &["handler", "method", "status"],
        )?)?;
        let structured_output_requests = b.register(IntCounterVec::new(
            b.opts(
                "structured_output_requests_total",
                "Requests with a grammar (structured output), by kind and whether it was compiled already.",
            ),
            &["kind", "cached"],
        )?)?;
        let spec_decode_num_accepted_tokens_per_pos = b.register(IntCounterVec::new(
            b.opts(
                "spec_decode_num_accepted_tokens_per_pos_total",
                "Accepted proposed tokens per position (0 is the first proposed token).",
            ),
            &["position"],
        )?)?;
        Ok(Self {
            spec_decode_num_drafts: b.counter(
                "spec_decode_num_drafts_total",
                "Number of proposals (sequences carrying drafts) verified.",
            )?,
            spec_decode_num_draft_tokens: b
                .counter("spec_decode_num_draft_tokens_total", "Number of proposed tokens verified.")?,
            spec_decode_num_accepted_tokens: b
                .counter("spec_decode_num_accepted_tokens_total", "Number of proposed tokens accepted.")?,
            spec_decode_num_accepted_tokens_per_pos,
            structured_output_requests,
            lora_requests_info: b.register(GaugeVec::new(
                b.opts(
                    "lora_requests_info",
                    "Running stats on LoRA requests: the adapters of the running and waiting \
                     requests; the value is when they were counted (Unix seconds).",
                ),
                &["max_lora", "running_lora_adapters", "waiting_lora_adapters"],
            )?)?,
            cache_config_info: b.register(GaugeVec::new(
                b.opts(
                    "cache_config_info",
                    "Information of the LLMEngine CacheConfig (the KV cache's shape).",
                ),
                &["block_size", "num_gpu_blocks", "cache_dtype", "enable_prefix_caching"],
            )?)?,
            kv_events_batches: b.counter(
                "kv_events_batches_total",
                "KV-event batches published (one per engine step that changed the prefix cache).",
            )?,
            kv_events_dropped: b.counter(
                "kv_events_dropped_total",
                "KV-cache events dropped because the publisher's queue was full.",
            )?,
            kv_transfer_blocks: b.register(IntCounterVec::new(
                b.opts("kv_transfer_blocks_total", "KV blocks moved between prefill and decode instances."),
                &["direction"],
            )?)?,
            kv_transfer_failures: b.register(IntCounterVec::new(
                b.opts(
                    "kv_transfer_failures_total",
                    "Prompt KV fetches that failed (the decode instance computed the prompt itself), by reason.",
                ),
                &["reason"],
            )?)?,
            engine_sleep_state: b.int_gauge(
                "engine_sleep_state",
                "Sleep mode: 0 awake, else the level slept at (1: KV cache freed, 2: weights too).",
            )?,
            kv_transfer_held_blocks: b
                .int_gauge("kv_transfer_held_blocks", "KV blocks a prefill instance holds for decode instances.")?,
            kv_transfer_expired_holds: b.counter(
                "kv_transfer_expired_holds_total",
                "Prompts whose held KV no decode instance read in time (the blocks were released).",
            )?,
            caches: crate::cache_metrics::CacheMetrics::new(&b)?,
            grammar_compile_time: b.histogram(
                "structured_output_compile_seconds",
                "Histogram of grammar compile time in seconds (cache misses).",
                GRAMMAR_COMPILE_BUCKETS,
            )?,
            num_requests_running: b
                .int_gauge("num_requests_running", "Number of requests in model execution batches.")?,
            num_requests_waiting: b
                .int_gauge("num_requests_waiting", "Number of requests waiting to be processed.")?,
            kv_cache_usage_perc: b
                .gauge("kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")?,
            prompt_tokens: b.counter("prompt_tokens_total", "Number of prefill tokens processed.")?,
            generation_tokens: b
                .counter("generation_tokens_total", "Number of generation tokens processed.")?,
            request_success,
            num_preemptions: b.counter("num_preemptions_total", "Cumulative number of preemptions.")?,
            prefix_cache_queries: b.counter(
                "prefix_cache_queries_total",
                "Prefix cache queries, in terms of number of queried tokens.",
            )?,
            prefix_cache_hits: b.counter(
                "prefix_cache_hits_total",
                "Prefix cache hits, in terms of number of cached tokens.",
            )?,
            time_to_first_token: b.histogram(
                "time_to_first_token_seconds",
                "Histogram of time to first token in seconds.",
                TTFT_BUCKETS,
            )?,
            inter_token_latency: b.histogram(
                "inter_token_latency_seconds",
                "Histogram of inter-token latency in seconds.",
                TPOT_BUCKETS,
            )?,
            time_per_output_token: b.histogram(
                "request_time_per_output_token_seconds",
                "Histogram of time_per_output_token_seconds per request.",
                TPOT_BUCKETS,
            )?,
            e2e_latency: b.histogram(
                "e2e_request_latency_seconds",
                "Histogram of e2e request latency in seconds.",
                REQUEST_LATENCY_BUCKETS,
            )?,
            queue_time: b.histogram(
                "request_queue_time_seconds",
                "Histogram of time spent in WAITING phase for request.",
                REQUEST_LATENCY_BUCKETS,
            )?,
            prefill_time: b.histogram(
                "request_prefill_time_seconds",
                "Histogram of time spent in PREFILL phase for request.",
                REQUEST_LATENCY_BUCKETS,
            )?,
            decode_time: b.histogram(
                "request_decode_time_seconds",
                "Histogram of time spent in DECODE phase for request.",
                REQUEST_LATENCY_BUCKETS,
            )?,
            inference_time: b.histogram(
                "request_inference_time_seconds",
                "Histogram of time spent in RUNNING phase for request.",
                REQUEST_LATENCY_BUCKETS,
            )?,
            request_prompt_tokens: b.histogram(
                "request_prompt_tokens",
                "Number of prefill tokens processed.",
                &token_buckets,
            )?,
            request_generation_tokens: b.histogram(
                "request_generation_tokens",
                "Number of generation tokens processed.",
                &token_buckets,
            )?,
            iteration_tokens: b.histogram(
                "iteration_tokens_total",
                "Histogram of number of tokens per engine_step.",
                ITERATION_TOKEN_BUCKETS,
            )?,
            http_requests,
            engine_seen: Mutex::new(EngineSnapshot::default()),
            registry: b.registry,
        })
    }

    /// Copies the engine's state into the gauges and advances the engine counters.
    pub fn record_engine(&self, now: &EngineSnapshot) {
        self.num_requests_running.set(now.num_running as i64);
        self.num_requests_waiting.set(now.num_waiting as i64);
        self.kv_cache_usage_perc.set(now.kv_cache_usage);
        let mut seen = self.engine_seen.lock().unwrap_or_else(|p| p.into_inner());
        self.num_preemptions.inc_by(now.num_preemptions.saturating_sub(seen.num_preemptions));
        self.prefix_cache_queries.inc_by(now.prefix_cache_queries.saturating_sub(seen.prefix_cache_queries));
        self.prefix_cache_hits.inc_by(now.prefix_cache_hits.saturating_sub(seen.prefix_cache_hits));
        let (spec, seen_spec) = (&now.spec, &seen.spec);
        self.spec_decode_num_drafts.inc_by(spec.num_drafts.saturating_sub(seen_spec.num_drafts));
        self.spec_decode_num_draft_tokens
            .inc_by(spec.num_draft_tokens.saturating_sub(seen_spec.num_draft_tokens));
        self.spec_decode_num_accepted_tokens
            .inc_by(spec.num_accepted_tokens.saturating_sub(seen_spec.num_accepted_tokens));
        for (pos, (&n, &was)) in
            spec.accepted_per_position.iter().zip(&seen_spec.accepted_per_position).enumerate()
        {
            if n > was {
                self.spec_decode_num_accepted_tokens_per_pos
                    .with_label_values(&[&pos.to_string()])
                    .inc_by(n - was);
            }
        }
        *seen = *now;
    }

    pub fn record_kv_transfer_sent(&self, blocks: usize) {
        self.kv_transfer_blocks.with_label_values(&["sent"]).inc_by(blocks as u64);
    }

    pub fn record_kv_transfer_received(&self, blocks: usize) {
        self.kv_transfer_blocks.with_label_values(&["received"]).inc_by(blocks as u64);
    }

    pub fn record_kv_transfer_failure(&self, reason: &str) {
        self.kv_transfer_failures.with_label_values(&[reason]).inc();
    }

    /// The engine's transfer holds: blocks held now, and holds expired since start.
    pub fn record_kv_transfer_holds(&self, held_blocks: usize, expired: u64) {
        self.kv_transfer_held_blocks.set(held_blocks as i64);
        self.kv_transfer_expired_holds.inc_by(expired.saturating_sub(self.kv_transfer_expired_holds.get()));
    }

    /// The KV-event publisher's totals (they only grow).
    pub fn record_kv_events(&self, batches: u64, dropped: u64) {
        self.kv_events_batches.inc_by(batches.saturating_sub(self.kv_events_batches.get()));
        self.kv_events_dropped.inc_by(dropped.saturating_sub(self.kv_events_dropped.get()));
    }

    /// The KV cache's shape, as vLLM's `cache_config_info` (value 1): what the Gateway API
    /// Inference Extension reads to size a replica's cache. `num_gpu_blocks` counts the cache's
    /// blocks on whatever device holds them.
    pub fn record_cache_config(
        &self,
        block_size: usize,
        num_blocks: usize,
        cache_dtype: &str,
        prefix_caching: bool,
    ) {
        self.cache_config_info
            .with_label_values(&[
                &block_size.to_string(),
                &num_blocks.to_string(),
                cache_dtype,
                &prefix_caching.to_string(),
            ])
            .set(1.0);
    }

    /// The adapters of the running and waiting requests (names, comma-joined as vLLM does),
    /// with `max_lora` the most that run at once. One series, its labels replaced each time,
    /// its value the Unix time of the count (routers read the newest).
    pub fn record_lora(&self, max_lora: usize, running: &[String], waiting: &[String]) {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        self.lora_requests_info.reset();
        self.lora_requests_info
            .with_label_values(&[&max_lora.to_string(), &running.join(","), &waiting.join(",")])
            .set(now.as_secs_f64());
    }

    /// A request's grammar was compiled (`cache_hit`: taken from the cache instead).
    pub fn record_grammar_compile(&self, kind: &str, took: Duration, cache_hit: bool) {
        self.structured_output_requests
            .with_label_values(&[kind, if cache_hit { "true" } else { "false" }])
            .inc();
        if !cache_hit {
            self.grammar_compile_time.observe(took.as_secs_f64());
        }
    }

    /// One engine step computed `tokens` tokens.
    pub fn observe_iteration(&self, tokens: usize) {
        self.iteration_tokens.observe(tokens as f64);
    }

    /// A request was admitted with this many prompt tokens.
    pub fn observe_prompt(&self, prompt_tokens: usize) {
        self.prompt_tokens.inc_by(prompt_tokens as u64);
    }

    pub fn observe_first_token(&self, since_arrival: Duration) {
        self.time_to_first_token.observe(since_arrival.as_secs_f64());
    }

    /// One output token, `since_previous` after the previous one of the same sequence.
    pub fn observe_token(&self, since_previous: Option<Duration>) {
        self.generation_tokens.inc();
        if let Some(d) = since_previous {
            self.inter_token_latency.observe(d.as_secs_f64());
        }
    }

    pub fn observe_request(&self, r: &RequestRecord) {
        self.request_success.with_label_values(&[r.finished_reason]).inc();
        self.e2e_latency.observe(r.e2e.as_secs_f64());
        self.request_prompt_tokens.observe(r.prompt_tokens as f64);
        self.request_generation_tokens.observe(r.generation_tokens as f64);
        if let Some(q) = r.queue {
            self.queue_time.observe(q.as_secs_f64());
        }
        if let Some(p) = r.prefill {
            self.prefill_time.observe(p.as_secs_f64());
        }
        if let Some(d) = r.decode {
            self.decode_time.observe(d.as_secs_f64());
            if r.generation_tokens > 1 {
                self.time_per_output_token.observe(d.as_secs_f64() / (r.generation_tokens - 1) as f64);
            }
        }
        if let (Some(p), Some(d)) = (r.prefill, r.decode) {
            self.inference_time.observe((p + d).as_secs_f64());
        }
    }

    /// One HTTP request. Every label comes from a bounded set, so clients cannot mint series:
    /// `handler` is a route template or `unmatched` (the caller's side), `method` is folded by
    /// [`method_label`], and `status` is a status code the server itself chose.
    pub fn observe_http(&self, handler: &str, method: &str, status: u16) {
        self.http_requests.with_label_values(&[handler, method_label(method), &status.to_string()]).inc();
    }

    /// The values the dashboard plots, read from the same collectors `/metrics` renders (call
    /// after [`Self::record_engine`] for current engine values).
    pub fn live_totals(&self) -> LiveTotals {
        use prometheus::core::{Collector, Metric};
        let requests = self
            .request_success
            .collect()
            .iter()
            .flat_map(|family| family.get_metric())
            .map(|m| m.get_counter().get_value() as u64)
            .sum();
        let buckets = |h: &Histogram| {
            let m = h.metric();
            let h = m.get_histogram();
            BucketCounts {
                cumulative: h.get_bucket().iter().map(|b| b.cumulative_count()).collect(),
                count: h.get_sample_count(),
                sum: h.get_sample_sum(),
            }
        };
        LiveTotals {
            counters: LiveCounters {
                requests,
                prompt_tokens: self.prompt_tokens.get(),
                generation_tokens: self.generation_tokens.get(),
                running: self.num_requests_running.get().max(0) as u64,
                waiting: self.num_requests_waiting.get().max(0) as u64,
                kv_cache_usage: self.kv_cache_usage_perc.get(),
                preemptions: self.num_preemptions.get(),
                prefix_cache_queries: self.prefix_cache_queries.get(),
                prefix_cache_hits: self.prefix_cache_hits.get(),
                spec_draft_tokens: self.spec_decode_num_draft_tokens.get(),
                spec_accepted_tokens: self.spec_decode_num_accepted_tokens.get(),
            },
            ttft: buckets(&self.time_to_first_token),
            itl: buckets(&self.inter_token_latency),
        }
    }

    /// The sleep level (0: awake), see [`crate::sleep`].
    pub fn record_sleep_level(&self, level: u8) {
        self.engine_sleep_state.set(i64::from(level));
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        // Encoding into a Vec cannot fail for well-formed metrics.
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut buf) {
            tracing::error!(error = %e, "encoding metrics failed");
        }
        String::from_utf8(buf).unwrap_or_default()
    }
}

/// The `method` label of `http_requests_total`: the standard methods as they are, any other
/// (methods are any token a client likes) `other`.
pub fn method_label(method: &str) -> &'static str {
    match method {
        "GET" => "GET",
        "HEAD" => "HEAD",
        "POST" => "POST",
        "PUT" => "PUT",
        "DELETE" => "DELETE",
        "CONNECT" => "CONNECT",
        "OPTIONS" => "OPTIONS",
        "TRACE" => "TRACE",
        "PATCH" => "PATCH",
        _ => "other",
    }
}

#[cfg(test)]
#[path = "metrics_tests.rs"]
mod tests;

//! `pagoda-bench serve`: sends the dataset's requests to a server on a schedule and collects
//! one [`RequestResult`] per request.
//!
//! Arrival times are fixed before the run from the seed: with `--request-rate R` the gaps are
//! exponential with mean `1/R` (a Poisson process), with `inf` all requests arrive at once.
//! `--max-concurrency N` holds an arrived request until fewer than `N` are in flight; its clock
//! (TTFT, latency) starts when it is actually sent. Before the run one short test request checks
//! that the server, model and endpoint answer, so a misconfiguration fails at once. Under
//! `--json-schema` each request also asks for its schema and, when validating, its answer is
//! checked against it ([`crate::structured`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::bail;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::client::{Client, Outcome, RequestExtras};
use crate::dataset::{Dataset, Prompt};
use crate::metrics::{ms, tpot_ms, RequestResult};
use crate::structured::SchemaSet;

/// Mixed into the seed for the arrival times, so they do not share draws with the dataset.
const ARRIVAL_SEED_SALT: u64 = 0x5eed_a771_7a15;

/// How to send the dataset.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Requests per second; infinite for all at once.
    pub request_rate: f64,
    pub max_concurrency: Option<usize>,
    pub seed: u64,
    /// Show a progress bar on stderr.
    pub progress: bool,
    /// Send a short request first and stop if it fails.
    pub test_request: bool,
    /// `--json-schema`: request `i` asks for schema `i % n`.
    pub schemas: Option<Arc<SchemaSet>>,
    /// `--save-text`: keep every answer's text in its [`RequestResult::text`].
    pub save_text: bool,
    /// `--lora-modules`: request `i` names adapter `i % n` in `model`.
    pub lora_modules: Arc<Vec<String>>,
}

/// A finished run.
#[derive(Debug, Clone)]
pub struct ServeRun {
    /// In dataset order.
    pub results: Vec<RequestResult>,
    /// First request sent to last one finished.
    pub duration: Duration,
}

/// Offsets (seconds from the start) at which the `n` requests arrive.
pub fn arrival_offsets(n: usize, rate: f64, seed: u64) -> Vec<f64> {
    if !rate.is_finite() {
        return vec![0.0; n];
    }
    let mut rng = StdRng::seed_from_u64(seed ^ ARRIVAL_SEED_SALT);
    let mut t = 0.0;
    (0..n)
        .map(|i| {
            if i > 0 {
                let u: f64 = 1.0 - rng.random::<f64>(); // (0, 1]
                t += -u.ln() / rate;
            }
            t
        })
        .collect()
}

/// One request's result from its outcome; `sent` is when it was sent relative to the run.
pub fn to_result(index: usize, prompt: &Prompt, outcome: Outcome, sent: Duration) -> RequestResult {
    let usage_reported = outcome.completion_tokens.is_some();
    let output_len = outcome.completion_tokens.unwrap_or(outcome.content_chunks);
    let prompt_len = outcome.prompt_tokens.unwrap_or(prompt.prompt_len);
    let ttft_ms = outcome.ttft.map(ms);
    let e2el_ms = ms(outcome.latency);
    let success = outcome.error.is_none();
    RequestResult {
        index,
        success,
        error: outcome.error,
        connection_retries: outcome.connection_retries,
        prompt_len,
        output_len,
        usage_reported,
        max_tokens: prompt.output_len,
        start_s: sent.as_secs_f64(),
        tpot_ms: ttft_ms.filter(|_| success).and_then(|t| tpot_ms(e2el_ms, t, output_len)),
        ttft_ms,
        itl_ms: outcome.itl.into_iter().map(ms).collect(),
        e2el_ms,
        finish_reason: outcome.finish_reason,
        schema_check: None,
        text: None,
    }
}

/// A progress bar on stderr (hidden when `show` is false or stderr is not a terminal).
pub fn progress_bar(len: usize, show: bool) -> ProgressBar {
    let target = if show { ProgressDrawTarget::stderr() } else { ProgressDrawTarget::hidden() };
    let bar = ProgressBar::with_draw_target(Some(len as u64), target);
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} requests ({per_sec}) {msg}",
        )
        .expect("valid template"),
    );
    bar
}

/// Runs the benchmark.
pub async fn run(client: Arc<Client>, dataset: &Dataset, options: &ServeOptions) -> anyhow::Result<ServeRun> {
    if dataset.prompts.is_empty() {
        bail!("the dataset is empty");
    }
    if options.request_rate.is_nan() || options.request_rate <= 0.0 {
        bail!("--request-rate must be positive (or inf), got {}", options.request_rate);
    }
    if options.max_concurrency == Some(0) {
        bail!("--max-concurrency must be at least 1");
    }
    if options.test_request {
        let probe = client.send("Hello", 1).await;
        if let Some(error) = probe.error {
            bail!("the test request to {} failed: {error}", client.url());
        }
    }

    let offsets = arrival_offsets(dataset.prompts.len(), options.request_rate, options.seed);
    let limit = options.max_concurrency.map(|n| Arc::new(Semaphore::new(n)));
    let bar = progress_bar(dataset.prompts.len(), options.progress);
    let start = Instant::now();
    let mut tasks = JoinSet::new();
    for (index, (prompt, offset)) in dataset.prompts.iter().zip(offsets).enumerate() {
        tokio::time::sleep_until((start + Duration::from_secs_f64(offset)).into()).await;
        let client = Arc::clone(&client);
        let prompt = prompt.clone();
        let limit = limit.clone();
        let bar = bar.clone();
        let schemas = options.schemas.clone();
        let save_text = options.save_text;
        let loras = Arc::clone(&options.lora_modules);
        tasks.spawn(async move {
            let _permit = match &limit {
                Some(s) => Some(s.acquire().await.expect("the semaphore is never closed")),
                None => None,
            };
            let mut extras = match &schemas {
                Some(set) => RequestExtras {
                    response_format: Some(set.for_request(index).response_format()),
                    keep_text: set.validate || save_text,
                    ..RequestExtras::default()
                },
                None => RequestExtras { keep_text: save_text, ..RequestExtras::default() },
            };
            if !loras.is_empty() {
                extras.model = Some(loras[index % loras.len()].as_str());
            }
            let sent = start.elapsed();
            let outcome = client.send_with(&prompt.text, prompt.output_len, extras).await;
            let finished = start.elapsed();
            if outcome.error.is_some() {
                bar.set_message("(some requests failed)");
            }
            bar.inc(1);
            let schema_check = schemas.as_ref().map(|set| set.check(index, &outcome));
            let text = if save_text { outcome.text.clone() } else { None };
            let result = RequestResult { schema_check, text, ..to_result(index, &prompt, outcome, sent) };
            (result, finished)
        });
    }
    let mut results = Vec::with_capacity(dataset.prompts.len());
    let mut last_finish = Duration::ZERO;
    while let Some(joined) = tasks.join_next().await {
        let (result, finished) = joined?;
        last_finish = last_finish.max(finished);
        results.push(result);
    }
    bar.finish_and_clear();
    results.sort_by_key(|r| r.index);
    let first_sent = results.iter().map(|r| r.start_s).fold(f64::INFINITY, f64::min);
    let duration = last_finish.saturating_sub(Duration::from_secs_f64(first_sent.max(0.0)));
    Ok(ServeRun { results, duration })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn infinite_rate_sends_everything_at_once() {
        assert_eq!(arrival_offsets(4, f64::INFINITY, 1), vec![0.0; 4]);
    }

    #[test]
    fn poisson_arrivals_have_the_asked_rate_and_depend_only_on_the_seed() {
        let rate = 4.0;
        let t = arrival_offsets(20_000, rate, 9);
        assert_eq!(t[0], 0.0);
        assert!(t.windows(2).all(|w| w[1] >= w[0]));
        let gaps: Vec<f64> = t.windows(2).map(|w| w[1] - w[0]).collect();
        let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
        assert!((mean - 1.0 / rate).abs() < 0.01, "mean gap {mean}");
        // Exponential gaps: the standard deviation equals the mean.
        let var = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64;
        assert!((var.sqrt() - mean).abs() < 0.015, "std {} vs mean {mean}", var.sqrt());
        assert_eq!(t, arrival_offsets(20_000, rate, 9));
        assert_ne!(t, arrival_offsets(20_000, rate, 10));
    }

    fn prompt() -> Prompt {
        Prompt { text: "a b".into(), prompt_len: 2, output_len: 8 }
    }

    #[test]
    fn results_take_usage_counts_or_fall_back() {
        let outcome = Outcome {
            ttft: Some(Duration::from_millis(50)),
            itl: vec![Duration::from_millis(10); 3],
            latency: Duration::from_millis(120),
            content_chunks: 4,
            prompt_tokens: Some(3),
            completion_tokens: Some(8),
            ..Outcome::default()
        };
        let r = to_result(5, &prompt(), outcome.clone(), Duration::from_millis(1500));
        assert!(r.success && r.usage_reported);
        assert_eq!((r.index, r.prompt_len, r.output_len, r.max_tokens), (5, 3, 8, 8));
        assert_eq!(r.start_s, 1.5);
        assert_eq!(r.ttft_ms, Some(50.0));
        assert_eq!(r.tpot_ms, Some(10.0));
        assert_eq!(r.itl_ms, vec![10.0; 3]);

        let no_usage = Outcome { prompt_tokens: None, completion_tokens: None, ..outcome };
        let r = to_result(0, &prompt(), no_usage, Duration::ZERO);
        assert!(r.success && !r.usage_reported);
        assert_eq!((r.prompt_len, r.output_len), (2, 4));
        assert!((r.tpot_ms.unwrap() - 70.0 / 3.0).abs() < 1e-9);
    }

    #[test]
    fn failed_results_keep_their_error_and_have_no_tpot() {
        let outcome = Outcome {
            error: Some("HTTP 503: busy".into()),
            ttft: Some(Duration::from_millis(5)),
            latency: Duration::from_millis(9),
            completion_tokens: Some(3),
            ..Outcome::default()
        };
        let r = to_result(1, &prompt(), outcome, Duration::ZERO);
        assert!(!r.success);
        assert_eq!(r.error.as_deref(), Some("HTTP 503: busy"));
        assert_eq!(r.tpot_ms, None);
    }
}

//! One offline run: load the model, generate the dataset, submit everything at once, follow the
//! streams.
//!
//! The model is loaded through `pagoda_runtime`, the path `pagoda serve` takes, so the engine,
//! scheduler, kernel plan and model runner are the server's. The dataset is generated with the
//! model's own tokenizer (exact lengths), every prompt is tokenized before the clock starts, and
//! then all requests are submitted at once with `ignore_eos`, so each produces exactly its
//! output length. Per-request TTFT, ITL and latency are measured as events leave the engine
//! (token events play the role of content chunks), so the table reads like `serve`'s.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use pagoda_bench::client::Outcome;
use pagoda_bench::dataset::{generate, Dataset, DatasetSpec};
use pagoda_bench::metrics::RequestResult;
use pagoda_bench::serve::{progress_bar, to_result};
use pagoda_bench::words::TextSynth;
use pagoda_engine::{
    EngineHandle, FinishReason, NoopObserver, Request, SamplingParams, Shutdown, StopConditions,
};
use pagoda_runtime::{LoadedRuntime, RuntimeOptions, RuntimePlan};
use tokio::task::JoinSet;

/// A finished offline run.
#[derive(Debug, Clone)]
pub struct OfflineRun {
    pub dataset: Dataset,
    /// In dataset order.
    pub results: Vec<RequestResult>,
    /// First submission to last request finished.
    pub duration: Duration,
    /// Loading the model and starting the engine (not part of `duration`).
    pub startup: Duration,
    /// What the model ran on.
    pub plan: RuntimePlan,
}

/// Loads the model `runtime` names, generates `spec`'s dataset with its tokenizer and runs it.
pub fn run(runtime: &RuntimeOptions, spec: &DatasetSpec, progress: bool) -> anyhow::Result<OfflineRun> {
    let started = Instant::now();
    let loaded =
        LoadedRuntime::load(runtime).with_context(|| format!("loading {}", runtime.model.display()))?;
    let plan = loaded.plan.clone();
    eprintln!("{plan}");
    let running = loaded.start(Arc::new(NoopObserver), Shutdown::new())?;
    let startup = started.elapsed();

    let dataset = generate(spec, &TextSynth::exact(Arc::clone(&running.tokenizer)))?;
    let prompt_ids = dataset
        .prompts
        .iter()
        .map(|p| running.tokenizer.encode(&p.text, true))
        .collect::<Result<Vec<_>, _>>()
        .context("tokenizing the prompts")?;

    let rt = tokio::runtime::Builder::new_current_thread().enable_time().build()?;
    let outcome = rt.block_on(drive(&running.engine, &dataset, prompt_ids, progress));
    running.engine.shutdown().trigger();
    let joined = running.engine_thread.join();
    let (results, duration) = outcome?;
    if joined.is_err() {
        anyhow::bail!("the engine thread panicked");
    }
    Ok(OfflineRun { dataset, results, duration, startup, plan })
}

/// Submits every prompt at once and follows the streams to their ends.
async fn drive(
    engine: &EngineHandle,
    dataset: &Dataset,
    prompt_ids: Vec<Vec<u32>>,
    progress: bool,
) -> anyhow::Result<(Vec<RequestResult>, Duration)> {
    let params = Arc::new(SamplingParams::default());
    let bar = progress_bar(dataset.prompts.len(), progress);
    let start = Instant::now();
    let mut tasks = JoinSet::new();
    for (index, (prompt, ids)) in dataset.prompts.iter().zip(prompt_ids).enumerate() {
        let request = Request::new(engine.next_request_id(), ids, Arc::clone(&params))
            .with_max_tokens(prompt.output_len)
            .with_stop(StopConditions { ignore_eos: true, ..Default::default() });
        let sent = start.elapsed();
        let t0 = Instant::now();
        let submitted = engine.submit(request);
        let prompt = prompt.clone();
        let bar = bar.clone();
        tasks.spawn(async move {
            let outcome = match submitted {
                Ok(mut stream) => {
                    let mut state = EventState::new(t0);
                    while let Some(event) = stream.recv().await {
                        if state.on_event(&event, Instant::now()) {
                            break;
                        }
                    }
                    state.finish(Instant::now())
                }
                Err(e) => Outcome {
                    error: Some(format!("submit failed: {e}")),
                    latency: t0.elapsed(),
                    ..Outcome::default()
                },
            };
            let finished = start.elapsed();
            bar.inc(1);
            (to_result(index, &prompt, outcome, sent), finished)
        });
    }
    let mut results = Vec::with_capacity(dataset.prompts.len());
    let mut last = Duration::ZERO;
    while let Some(joined) = tasks.join_next().await {
        let (result, finished) = joined?;
        last = last.max(finished);
        results.push(result);
    }
    bar.finish_and_clear();
    results.sort_by_key(|r| r.index);
    Ok((results, last))
}

/// Folds one request's engine events into an [`Outcome`].
#[derive(Debug)]
struct EventState {
    start: Instant,
    last_token: Option<Instant>,
    finished: bool,
    outcome: Outcome,
}

impl EventState {
    fn new(start: Instant) -> Self {
        Self { start, last_token: None, finished: false, outcome: Outcome::default() }
    }

    /// Takes one event received at `now`; true once the request's last event arrived.
    fn on_event(&mut self, event: &pagoda_engine::TokenEvent, now: Instant) -> bool {
        let o = &mut self.outcome;
        if !event.token_ids.is_empty() {
            match self.last_token {
                None => o.ttft = Some(now.saturating_duration_since(self.start)),
                Some(last) => o.itl.push(now.saturating_duration_since(last)),
            }
            self.last_token = Some(now);
            o.content_chunks += 1;
            o.generated_chars += event.text.chars().count();
        }
        if let Some(reason) = &event.finished {
            o.finish_reason = Some(reason.as_str().to_owned());
            match reason {
                FinishReason::Error(e) => o.error = Some(format!("engine error: {e}")),
                FinishReason::Abort => o.error = Some("the request was aborted".into()),
                _ => {}
            }
        }
        if let Some(usage) = event.usage {
            o.prompt_tokens = Some(usage.prompt_tokens);
            o.completion_tokens = Some(usage.completion_tokens);
            self.finished = true;
        }
        self.finished
    }

    fn finish(mut self, end: Instant) -> Outcome {
        self.outcome.latency = end.saturating_duration_since(self.start);
        if !self.finished && self.outcome.error.is_none() {
            self.outcome.error = Some("the engine closed the stream before its last event".into());
        }
        self.outcome
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pagoda_engine::{TokenEvent, Usage};

    fn tokens(ids: &[u32]) -> TokenEvent {
        TokenEvent {
            index: 0,
            token_ids: ids.to_vec(),
            text: "x".repeat(ids.len()),
            logprobs: None,
            pooled: None,
            prompt_logprobs: None,
            finished: None,
            usage: None,
            timestamps: None,
        }
    }

    #[test]
    fn token_events_time_like_content_chunks() {
        let t0 = Instant::now();
        let at = |n: u64| t0 + Duration::from_millis(n);
        let mut s = EventState::new(t0);
        assert!(!s.on_event(&tokens(&[1]), at(40)));
        assert!(!s.on_event(&tokens(&[]), at(45)));
        assert!(!s.on_event(&tokens(&[2, 3]), at(50)));
        let mut last = TokenEvent::finish(0, FinishReason::Length);
        last.usage = Some(Usage { prompt_tokens: 7, completion_tokens: 3, cached_prompt_tokens: 0 });
        assert!(s.on_event(&last, at(51)));
        let o = s.finish(at(52));
        assert_eq!(o.error, None);
        assert_eq!(o.ttft, Some(Duration::from_millis(40)));
        assert_eq!(o.itl, [Duration::from_millis(10)]);
        assert_eq!((o.prompt_tokens, o.completion_tokens, o.content_chunks), (Some(7), Some(3), 2));
        assert_eq!(o.finish_reason.as_deref(), Some("length"));
    }

    #[test]
    fn aborts_errors_and_cut_streams_fail() {
        let t0 = Instant::now();
        let mut s = EventState::new(t0);
        let mut e = TokenEvent::finish(0, FinishReason::Error("device lost".into()));
        e.usage = Some(Usage::default());
        assert!(s.on_event(&e, t0));
        assert_eq!(s.finish(t0).error.as_deref(), Some("engine error: device lost"));

        let mut s = EventState::new(t0);
        s.on_event(&TokenEvent::finish(0, FinishReason::Abort), t0);
        assert_eq!(s.finish(t0).error.as_deref(), Some("the request was aborted"));

        let mut s = EventState::new(t0);
        s.on_event(&tokens(&[1]), t0);
        assert!(s.finish(t0).error.unwrap().contains("before its last event"));
    }
}

//! The output stage: a request's raw token events from the engine become text. It detokenizes
//! each sample incrementally and cuts it at the request's stop strings (across token
//! boundaries), as vLLM's output processor does. It runs on the caller's side of the request's
//! stream ([`crate::RequestStream`]), so the engine thread spends no step time on text.
//!
//! Token-level stops (end-of-sequence, stop token ids, `min_tokens`, length, a complete grammar)
//! are the scheduler's; a stop string is found here, one or two steps after the engine computed
//! the token. The stage then holds the sample's finishing event back, asks the engine to end
//! the sample ([`SampleStop`]), drops the tokens the engine made meanwhile, and releases the
//! held event when the engine's own end of the sample arrives, with the usage counting only the
//! tokens delivered.

use std::collections::VecDeque;
use std::sync::Arc;

use pagoda_text::{IncrementalDetokenizer, StopMatcher, TokenDecoder};

use crate::event::{FinishReason, StopReason, TokenEvent};
use crate::id_map::IdMap;
use crate::request::{Request, RequestId, StopConditions};
use crate::scheduler::{Scheduler, StepEvents};

/// A sample the engine should end: a stop string was found in its text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SampleStop {
    pub index: usize,
    pub reason: FinishReason,
}

/// One sample's text so far.
#[derive(Debug)]
struct SampleText {
    detok: IncrementalDetokenizer,
    /// Empty when the request has no stop strings.
    matcher: StopMatcher,
    /// Tokens received for this sample.
    output_len: usize,
    /// The finishing event of a sample cut by a stop string, until the engine ends the sample.
    held: Option<TokenEvent>,
    /// The sample's last event has been released.
    done: bool,
}

/// Text and stop strings for one request's samples.
pub struct RequestOutput {
    decoder: Arc<dyn TokenDecoder>,
    stop: StopConditions,
    /// A detokenizer that has seen the prompt: each sample starts from a copy.
    fresh: IncrementalDetokenizer,
    samples: Vec<Option<SampleText>>,
    ready: VecDeque<TokenEvent>,
    /// Tokens the engine made after a stop string, which the usage does not count.
    dropped_tokens: usize,
}

impl std::fmt::Debug for RequestOutput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestOutput")
            .field("stop", &self.stop)
            .field("samples", &self.samples)
            .field("ready", &self.ready)
            .finish_non_exhaustive()
    }
}

impl RequestOutput {
    pub fn new(request: &Request, decoder: Arc<dyn TokenDecoder>) -> Self {
        Self::for_prompt(
            &request.prompt_token_ids,
            request.skip_special_tokens,
            request.stop.clone(),
            decoder,
        )
    }

    pub fn for_prompt(
        prompt: &[u32],
        skip_special_tokens: bool,
        stop: StopConditions,
        decoder: Arc<dyn TokenDecoder>,
    ) -> Self {
        Self {
            decoder,
            stop,
            fresh: IncrementalDetokenizer::new(prompt, skip_special_tokens),
            samples: Vec::new(),
            ready: VecDeque::new(),
            dropped_tokens: 0,
        }
    }

    /// The next event ready for the caller.
    pub fn pop(&mut self) -> Option<TokenEvent> {
        self.ready.pop_front()
    }

    /// Events still held when the engine's stream ended without ending their samples (the
    /// engine stopped): released as they are.
    pub fn release_held(&mut self) {
        for sample in self.samples.iter_mut().flatten() {
            if let Some(event) = sample.held.take() {
                self.ready.push_back(event);
            }
        }
    }

    /// Takes one raw event from the engine; what the caller may see is then in [`pop`](Self::pop).
    /// Returns the sample to end when a stop string cut it.
    pub fn push(&mut self, mut event: TokenEvent) -> Option<SampleStop> {
        let index = event.index;
        if self.samples.len() <= index {
            self.samples.resize_with(index + 1, || None);
        }
        let fresh = &self.fresh;
        let sample = self.samples[index].get_or_insert_with(|| SampleText {
            detok: fresh.clone(),
            matcher: StopMatcher::new(self.stop.stop_strings.clone()),
            output_len: 0,
            held: None,
            done: false,
        });
        if let Some(mut held) = sample.held.take() {
            // Made after the stop string; only the engine's end of the sample matters.
            self.dropped_tokens += event.token_ids.len();
            if event.finished.is_none() {
                sample.held = Some(held);
                return None;
            }
            sample.done = true;
            held.usage = event.usage;
            held.timestamps = event.timestamps;
            self.release(held);
            return None;
        }
        if sample.done {
            return None;
        }
        let engine_finish = event.finished.take();
        let tokens = std::mem::take(&mut event.token_ids);
        let mut text = String::new();
        let mut cut = None;
        for (k, &token) in tokens.iter().enumerate() {
            sample.output_len += 1;
            // The engine's finish belongs to the event's last token.
            let finish = engine_finish.as_ref().filter(|_| k + 1 == tokens.len());
            let stop_id =
                matches!(finish, Some(FinishReason::Stop(StopReason::Eos(_) | StopReason::StopTokenId(_))));
            if !stop_id {
                // A stop token's own text is not part of the output.
                let delta = sample.detok.push(&*self.decoder, token);
                if let Some(which) = stop_text(sample, &self.stop, delta, true, &mut text) {
                    cut = Some((k, which));
                    break;
                }
            }
            if finish.is_some() {
                let tail = sample.detok.flush(&*self.decoder);
                if let Some(which) = stop_text(sample, &self.stop, tail, false, &mut text) {
                    cut = Some((k, which));
                    break;
                }
                text.push_str(&sample.matcher.flush());
            }
        }
        event.text = text;
        event.token_ids = tokens;
        let Some((k, which)) = cut else {
            sample.done = engine_finish.is_some();
            event.finished = engine_finish;
            self.release(event);
            return None;
        };
        let reason = FinishReason::Stop(StopReason::StopString(which));
        self.dropped_tokens += event.token_ids.len() - (k + 1);
        event.token_ids.truncate(k + 1);
        if let Some(logprobs) = &mut event.logprobs {
            logprobs.truncate(k + 1);
        }
        event.finished = Some(reason.clone());
        if engine_finish.is_some() {
            // The engine ended the sample at this token or a few later: its end came with
            // this event, usage included.
            sample.done = true;
            self.release(event);
            return None;
        }
        event.usage = None;
        event.timestamps = None;
        sample.held = Some(event);
        Some(SampleStop { index, reason })
    }

    /// Hands `event` to the caller, its usage (if any) less the tokens dropped so far.
    fn release(&mut self, mut event: TokenEvent) {
        if let Some(usage) = &mut event.usage {
            usage.completion_tokens = usage.completion_tokens.saturating_sub(self.dropped_tokens);
        }
        self.ready.push_back(event);
    }
}

/// The output stage for a caller that drives a [`Scheduler`] itself (tests, benchmarks): every
/// request's [`RequestOutput`] over each step's events, with a sample cut by a stop string
/// ended in the scheduler at once (where a [`crate::RequestStream`] asks the engine thread).
pub struct OutputStage {
    decoder: Arc<dyn TokenDecoder>,
    requests: IdMap<RequestId, RequestOutput>,
}

impl OutputStage {
    pub fn new(decoder: Arc<dyn TokenDecoder>) -> Self {
        Self { decoder, requests: IdMap::default() }
    }

    /// Prepares the output of `request` (before it is added to the scheduler).
    pub fn add(&mut self, request: &Request) {
        self.requests.insert(request.id, RequestOutput::new(request, Arc::clone(&self.decoder)));
    }

    /// Takes the scheduler's raw events out of `events` and returns what the requests' callers
    /// see; the metrics of requests that ended stay in `events.finished`.
    pub fn process(
        &mut self,
        scheduler: &mut Scheduler,
        events: &mut StepEvents,
    ) -> Vec<(RequestId, TokenEvent)> {
        let mut pending: VecDeque<(RequestId, TokenEvent)> = events.events.drain(..).collect();
        let mut seen = Vec::with_capacity(pending.len());
        while let Some((id, raw)) = pending.pop_front() {
            let Some(output) = self.requests.get_mut(&id) else {
                seen.push((id, raw));
                continue;
            };
            if let Some(stop) = output.push(raw) {
                scheduler.finish_sample(id, stop.index, stop.reason, events);
                pending.extend(events.events.drain(..));
            }
            let mut ended = false;
            while let Some(event) = output.pop() {
                ended |= event.is_last();
                seen.push((id, event));
            }
            if ended {
                self.requests.remove(&id);
            }
        }
        seen
    }
}

/// Runs `delta` through the sample's stop strings, appending what may be released to `text`;
/// the stop string that matched, if any. With `gated`, the first `min_tokens` tokens pass
/// unchecked (the text released when a sample ends is always checked).
fn stop_text(
    sample: &mut SampleText,
    stop: &StopConditions,
    delta: String,
    gated: bool,
    text: &mut String,
) -> Option<String> {
    if sample.matcher.is_empty() || (gated && sample.output_len <= stop.min_tokens) {
        // Most events hold one token: its text becomes the event's without a copy.
        if text.is_empty() {
            *text = delta;
        } else {
            text.push_str(&delta);
        }
        return None;
    }
    let outcome = sample.matcher.push(&delta);
    text.push_str(&outcome.emit);
    outcome.stopped.map(|i| stop.stop_strings.get(i).unwrap_or_default().to_owned())
}

#[cfg(test)]
#[path = "output_tests.rs"]
mod tests;

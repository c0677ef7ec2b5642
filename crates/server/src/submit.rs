//! Hands validated prompts to the engine: checks each prompt against the context length, builds
//! the engine [`Request`]s (no wire type crosses), submits them (admission may refuse: 429/503)
//! and merges their event streams into one stream of [`ChoiceEvent`]s, each observed by a
//! [`RequestTracker`]. Dropping the merged stream drops the engine streams, which aborts the
//! requests and frees their KV blocks.

use std::sync::Arc;
use std::time::Instant;

use futures_util::stream::{self, BoxStream, StreamExt};
use pagoda_engine::{
    FinishReason, Request, RequestStream, SeqConstraint, StopConditions, TokenConstraint, TokenEvent,
};

use crate::error::{ApiError, InvalidParam};
use crate::prompt::TokenizedPrompt;
use crate::reasoning_budget::ReasoningBudget;
use crate::state::AppState;
use crate::traces::{IncomingTrace, RequestAttributes};
use crate::tracker::RequestTracker;
use crate::validate::{resolve_max_tokens, GenerationParams};

/// One engine event, with the OpenAI choice index it belongs to (`prompt * n + sample`).
#[derive(Debug, Clone, PartialEq)]
pub struct ChoiceEvent {
    pub choice: usize,
    pub event: TokenEvent,
}

/// The requests of one API call, in flight.
pub struct Submission {
    pub prompts: Vec<TokenizedPrompt>,
    /// Choices per prompt.
    pub n: usize,
    /// Whether the client asked for logprobs.
    pub wants_logprobs: bool,
    /// A prefill for remote decoding: the `kv_transfer_params` to answer with.
    pub kv_transfer_params: Option<serde_json::Value>,
    pub events: BoxStream<'static, ChoiceEvent>,
}

impl Submission {
    pub fn num_choices(&self) -> usize {
        self.prompts.len() * self.n
    }
}

fn events_of(
    prompt: usize,
    n: usize,
    stream: RequestStream,
    tracker: RequestTracker,
) -> BoxStream<'static, ChoiceEvent> {
    stream::unfold((stream, tracker), move |(mut stream, mut tracker)| async move {
        let event = stream.recv().await?;
        tracker.observe(&event);
        let choice = prompt * n + event.index;
        Some((ChoiceEvent { choice, event }, (stream, tracker)))
    })
    .boxed()
}

/// Submits one engine request per prompt; either all are admitted or none is.
/// `prompt_param` names the prompt in errors (`messages` or `prompt`).
pub fn submit(
    state: &AppState,
    prompts: Vec<TokenizedPrompt>,
    params: &GenerationParams,
    arrival: Instant,
    prompt_param: &'static str,
) -> Result<Submission, ApiError> {
    let max_model_len = state.limits.max_model_len;
    let max_tokens = prompts
        .iter()
        .map(|p| resolve_max_tokens(p.token_ids.len(), params.max_tokens, max_model_len, prompt_param))
        .collect::<Result<Vec<_>, _>>()?;
    let sampling = Arc::new(params.sampling.clone());
    let stop = StopConditions {
        eos_token_ids: state.eos_token_ids.clone(),
        ignore_eos: params.ignore_eos,
        stop_token_ids: params.stop_token_ids.clone(),
        stop_strings: params.stop.clone(),
        min_tokens: params.min_tokens,
    };
    // The prompts of one call form one admission group: the scheduler shares sequence slots
    // between groups, so a large fan-out does not hold up everyone else.
    let group = state.engine.next_request_id();
    let mut requests: Vec<Request> = prompts
        .iter()
        .zip(&max_tokens)
        .map(|(prompt, &max_tokens)| {
            let mut request =
                Request::new(state.engine.next_request_id(), prompt.token_ids.clone(), Arc::clone(&sampling))
                    .with_max_tokens(max_tokens)
                    .with_stop(stop.clone())
                    .with_n(params.n)
                    .with_group(group)
                    .with_priority(params.priority)
                    .with_arrival(arrival);
            request.skip_special_tokens = params.skip_special_tokens;
            request.max_speculative_tokens = params.max_speculative_tokens;
            request.speculative_method = params.speculative_method;
            request.prompt_logprobs = params.prompt_logprobs;
            request.beam = params.beam;
            request.lora = params.lora;
            request.images = prompt.images.0.clone();
            let grammar = params.grammar.as_ref().map(|grammar| {
                let constraint = match params.grammar_after {
                    Some(end) => grammar.constraint().after_reasoning(end),
                    None => grammar.constraint(),
                };
                Box::new(constraint) as Box<dyn TokenConstraint>
            });
            let constraint = match (&params.reasoning_budget, grammar) {
                (Some(spec), inner) => {
                    Some(SeqConstraint::new(ReasoningBudget::new(Arc::clone(spec), inner)))
                }
                (None, Some(grammar)) => Some(SeqConstraint(grammar)),
                (None, None) => None,
            };
            if let Some(constraint) = constraint {
                request = request.with_constraint(constraint);
            }
            request
        })
        .collect();
    let kv_transfer_params = crate::disaggregation::apply_hold(
        state.disaggregation.as_ref(),
        params.kv_transfer.as_ref(),
        &mut requests,
    )?;
    let engine_ids: Vec<u64> = requests.iter().map(|r| r.id).collect();
    let engine_streams = state.engine.submit_all(requests)?;
    let mut streams = Vec::with_capacity(prompts.len());
    let incoming = IncomingTrace::current();
    for (i, (stream, prompt)) in engine_streams.into_iter().zip(&prompts).enumerate() {
        tracing::debug!(
            engine_id = engine_ids[i],
            prompt_tokens = prompt.token_ids.len(),
            max_tokens = max_tokens[i],
            n = params.n,
            "submitted"
        );
        let span = state.traces.as_ref().map(|traces| {
            let attributes = RequestAttributes {
                model: state.model.served_names[0].clone(),
                temperature: params.sampling.temperature,
                top_p: params.sampling.top_p,
                max_tokens: max_tokens[i],
                n: params.n,
                prompt_tokens: prompt.token_ids.len(),
            };
            traces.span(&incoming, arrival, &attributes)
        });
        let tracker =
            RequestTracker::new(Arc::clone(&state.metrics), arrival, prompt.token_ids.len(), params.n)
                .with_span(span);
        streams.push(events_of(i, params.n, stream, tracker));
    }
    Ok(Submission {
        prompts,
        n: params.n,
        wants_logprobs: params.sampling.logprobs.is_some(),
        kv_transfer_params,
        events: stream::select_all(streams).boxed(),
    })
}

/// The API error for a request that ended in `reason`, or `None` when it did not fail.
///
/// A rejection (the model cannot run this input) is the client's 400, with the engine's
/// message. An engine fault is a 500 (503 once the engine is gone) whose details, with internal
/// ids, stay in the server log; the client gets the request id to find them.
pub fn failure(state: &AppState, reason: &FinishReason) -> Option<ApiError> {
    match reason {
        FinishReason::Rejected(message) => {
            tracing::info!(reason = message, "the model rejected a request");
            Some(ApiError::InvalidParam(InvalidParam { param: None, message: message.clone() }))
        }
        FinishReason::Error(message) => {
            tracing::error!(error = message, "request failed in the engine");
            Some(if state.engine.is_alive() {
                ApiError::Internal(
                    "the engine failed while running this request (details are in the server log)".into(),
                )
            } else {
                ApiError::EngineUnavailable("the engine has stopped".into())
            })
        }
        _ => None,
    }
}

/// Everything one choice produced, for a non-streamed response.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChoiceOutput {
    pub text: String,
    pub num_tokens: usize,
    pub logprobs: Vec<pagoda_engine::TopLogprobs>,
    pub finish: Option<pagoda_engine::FinishReason>,
    /// The prompt's logprobs, on the choice whose first token carried them (one per prompt).
    pub prompt_logprobs: Option<Vec<pagoda_engine::TopLogprobs>>,
}

/// All choices of a submission, once every request has ended.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Collected {
    pub choices: Vec<ChoiceOutput>,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens whose KV came from the prefix cache.
    pub cached_prompt_tokens: usize,
}

impl Submission {
    /// Waits for every event. A failed request fails the whole call.
    pub async fn collect(mut self, state: &AppState) -> Result<(Vec<TokenizedPrompt>, Collected), ApiError> {
        let mut out =
            Collected { choices: vec![ChoiceOutput::default(); self.num_choices()], ..Default::default() };
        while let Some(ChoiceEvent { choice, event }) = self.events.next().await {
            if let Some(err) = event.finished.as_ref().and_then(|r| failure(state, r)) {
                return Err(err);
            }
            // A request cut short by shutdown has no complete answer to give (as in vLLM).
            if event.finished == Some(FinishReason::Abort) {
                return Err(ApiError::ShuttingDown);
            }
            if let Some(usage) = event.usage {
                out.prompt_tokens += usage.prompt_tokens;
                out.completion_tokens += usage.completion_tokens;
                out.cached_prompt_tokens += usage.cached_prompt_tokens;
            }
            let Some(c) = out.choices.get_mut(choice) else {
                return Err(ApiError::Internal(format!(
                    "the engine sent an event for unknown choice {choice}"
                )));
            };
            c.text.push_str(&event.text);
            c.num_tokens += event.token_ids.len();
            if let Some(lp) = event.logprobs {
                c.logprobs.extend(lp);
            }
            if let Some(lp) = event.prompt_logprobs {
                c.prompt_logprobs = Some(lp);
            }
            if event.finished.is_some() {
                c.finish = event.finished;
            }
        }
        Ok((self.prompts, out))
    }
}

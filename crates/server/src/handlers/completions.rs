//! `POST /v1/completions`: tokenize the prompt(s), generate, and answer with one
//! `text_completion` or a stream of them. Several prompts give `n` choices each, numbered
//! prompt by prompt.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::State;
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use futures_util::stream::{self, BoxStream, StreamExt};
use pagoda_text::Tokenizer;

use super::{finish_reason, response_id};
use crate::error::ApiError;
use crate::extract::JsonBody;
use crate::layers::Arrival;
use crate::logprobs::CompletionLogprobsBuilder;
use crate::openai::{
    unix_now, CompletionChoice, CompletionRequest, CompletionResponse, ErrorResponse, Usage,
};
use crate::sse;
use crate::state::SharedState;
use crate::submit::{failure, submit, ChoiceEvent, Submission};
use crate::validate::validate;

#[derive(Clone)]
struct Context {
    id: String,
    created: u64,
    model: String,
    tokenizer: Arc<Tokenizer>,
}

impl Context {
    fn response(&self, choices: Vec<CompletionChoice>, usage: Option<Usage>) -> CompletionResponse {
        CompletionResponse {
            id: self.id.clone(),
            object: "text_completion".to_owned(),
            created: self.created,
            model: self.model.clone(),
            choices,
            usage,
        }
    }
}

/// Text completion (OpenAI legacy). With `stream: true` the response is `text/event-stream`:
/// one `text_completion` object per event, then `data: [DONE]`.
#[utoipa::path(
    post,
    path = "/v1/completions",
    tag = "openai",
    request_body = CompletionRequest,
    responses(
        (status = 200, description = "The completion (or, with stream=true, an SSE stream of text_completion objects)",
         body = CompletionResponse),
        (status = 400, description = "Malformed JSON, a bad parameter, or a prompt too long", body = ErrorResponse),
        (status = 401, description = "Missing or wrong API key", body = ErrorResponse),
        (status = 404, description = "Unknown model", body = ErrorResponse),
        (status = 413, description = "Body over the limit", body = ErrorResponse),
        (status = 429, description = "The waiting queue is full", body = ErrorResponse),
        (status = 503, description = "The engine is not available", body = ErrorResponse),
    ),
    security((), ("api_key" = []))
)]
pub async fn completions(
    State(state): State<SharedState>,
    arrival: Option<Extension<Arrival>>,
    JsonBody(req): JsonBody<CompletionRequest>,
) -> Result<Response, ApiError> {
    let arrival = arrival.map_or_else(Instant::now, |a| a.0 .0);
    let model = state.model.resolve(req.model.as_deref())?;
    let n = req.n.unwrap_or(1);
    if let Some(best_of) = req.best_of {
        if best_of != n {
            return Err(ApiError::invalid(
                "best_of",
                format!("best_of must equal n ({n}) when given, got {best_of}"),
            ));
        }
    }
    if req.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::invalid("suffix", "suffix is not supported"));
    }
    let echo = req.echo.unwrap_or(false);
    if echo && req.logprobs.is_some() {
        return Err(ApiError::invalid(
            "echo",
            "echo together with logprobs is not supported (no prompt logprobs)",
        ));
    }
    let requested_grammar = req.grammar_fields().grammar()?;
    let mut params = validate(req.common(), &state.limits)?;
    if let Some(requested) = requested_grammar {
        params.grammar = Some(crate::structured::compile(&state, requested).await?);
    }
    let add_special_tokens = req.add_special_tokens.unwrap_or(true);
    let prompts = state.prompts.completion(req.prompt.into_inputs(), add_special_tokens).await?;
    let submission = submit(&state, prompts, &params, arrival, "prompt")?;
    let ctx = Context {
        id: response_id("cmpl"),
        created: unix_now(),
        model,
        tokenizer: Arc::clone(state.prompts.tokenizer()),
    };
    if req.stream.unwrap_or(false) {
        let include_usage = req.stream_options.and_then(|o| o.include_usage).unwrap_or(false);
        Ok(stream_response(state, ctx, submission, echo, include_usage))
    } else {
        let response = collect_response(&state, ctx, submission, echo).await?;
        Ok(Json(response).into_response())
    }
}

async fn collect_response(
    state: &SharedState,
    ctx: Context,
    submission: Submission,
    echo: bool,
) -> Result<CompletionResponse, ApiError> {
    let n = submission.n;
    let want_logprobs = submission.wants_logprobs;
    let (prompts, collected) = submission.collect(state).await?;
    let choices = collected
        .choices
        .into_iter()
        .enumerate()
        .map(|(index, c)| {
            let prefix = if echo { prompts[index / n].text.as_str() } else { "" };
            let logprobs = want_logprobs
                .then(|| CompletionLogprobsBuilder::new(prefix).push(&ctx.tokenizer, &c.logprobs));
            let (finish, stop_reason) = match &c.finish {
                Some(r) => {
                    let (f, s) = finish_reason(r);
                    (Some(f), s)
                }
                None => (None, None),
            };
            CompletionChoice {
                index,
                text: format!("{prefix}{}", c.text),
                logprobs,
                finish_reason: finish,
                stop_reason,
            }
        })
        .collect();
    Ok(ctx.response(choices, Some(Usage::new(collected.prompt_tokens, collected.completion_tokens))))
}

struct StreamState {
    state: SharedState,
    ctx: Context,
    events: BoxStream<'static, ChoiceEvent>,
    include_usage: bool,
    want_logprobs: bool,
    /// Per choice: text offsets for logprobs.
    offsets: Vec<CompletionLogprobsBuilder>,
    prompt_tokens: usize,
    completion_tokens: usize,
    done: bool,
}

impl StreamState {
    fn on_event(&mut self, ChoiceEvent { choice, event }: ChoiceEvent) -> Vec<Event> {
        if let Some(err) = event.finished.as_ref().and_then(|r| failure(&self.state, r)) {
            self.done = true;
            return vec![sse::error_event(&err), sse::done_event()];
        }
        if let Some(usage) = event.usage {
            self.prompt_tokens += usage.prompt_tokens;
            self.completion_tokens += usage.completion_tokens;
        }
        let logprobs = match (&event.logprobs, self.want_logprobs, self.offsets.get_mut(choice)) {
            (Some(lp), true, Some(builder)) if !lp.is_empty() => Some(builder.push(&self.ctx.tokenizer, lp)),
            _ => None,
        };
        if event.text.is_empty() && logprobs.is_none() && event.finished.is_none() {
            return Vec::new();
        }
        let (finish, stop_reason) = match &event.finished {
            Some(r) => {
                let (f, s) = finish_reason(r);
                (Some(f), s)
            }
            None => (None, None),
        };
        let choice = CompletionChoice {
            index: choice,
            text: event.text,
            logprobs,
            finish_reason: finish,
            stop_reason,
        };
        vec![sse::json_event(&self.ctx.response(vec![choice], None))]
    }

    fn on_end(&mut self) -> Vec<Event> {
        self.done = true;
        let mut out = Vec::with_capacity(2);
        if self.include_usage {
            let usage = Usage::new(self.prompt_tokens, self.completion_tokens);
            out.push(sse::json_event(&self.ctx.response(Vec::new(), Some(usage))));
        }
        out.push(sse::done_event());
        out
    }
}

fn stream_response(
    state: SharedState,
    ctx: Context,
    submission: Submission,
    echo: bool,
    include_usage: bool,
) -> Response {
    let n = submission.n;
    let num_choices = submission.num_choices();
    // With echo, each choice starts with its prompt.
    let head: Vec<Event> = if echo {
        (0..num_choices)
            .map(|index| {
                let text = submission.prompts[index / n].text.clone();
                let choice =
                    CompletionChoice { index, text, logprobs: None, finish_reason: None, stop_reason: None };
                sse::json_event(&ctx.response(vec![choice], None))
            })
            .collect()
    } else {
        Vec::new()
    };
    let offsets = (0..num_choices)
        .map(|index| {
            CompletionLogprobsBuilder::new(if echo { &submission.prompts[index / n].text } else { "" })
        })
        .collect();
    let st = StreamState {
        state,
        ctx,
        want_logprobs: submission.wants_logprobs,
        events: submission.events,
        include_usage,
        offsets,
        prompt_tokens: 0,
        completion_tokens: 0,
        done: false,
    };
    let body = stream::unfold(st, |mut st| async move {
        if st.done {
            return None;
        }
        let events = match st.events.next().await {
            Some(e) => st.on_event(e),
            None => st.on_end(),
        };
        Some((events, st))
    })
    .flat_map(stream::iter);
    sse::response(stream::iter(head).chain(body).map(Ok))
}

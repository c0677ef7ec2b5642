//! `POST /v1/messages` and `POST /v1/messages/count_tokens` (Anthropic's Messages API): the
//! request is translated into a chat turn ([`crate::anthropic::request`]), run on the same
//! pipeline as chat completions, and answered as one `message` or Anthropic's stream of events.
//! Errors on these routes come in Anthropic's shape ([`crate::anthropic::error`]).

use axum::extract::State;
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::{self, BoxStream, StreamExt};
use serde_json::json;

use super::generation::Generation;
use super::response_id;
use crate::anthropic::error as anthropic_error;
use crate::anthropic::reply::{blocks, stop_reason, BlockEvents, MessageHead, StreamEvent};
use crate::anthropic::request::{chat_turn, turn_of, PromptFields};
use crate::anthropic::wire::{
    AnthropicErrorResponse, CountTokensRequest, CountTokensResponse, MessagesRequest, MessagesResponse,
    MessagesUsage,
};
use crate::chat_output::{whole_message, ChoiceSplit, ChoiceText};
use crate::conversation::StartedTurn;
use crate::error::ApiError;
use crate::extract::JsonBody;
use crate::sse;
use crate::state::SharedState;
use crate::submit::{failure, ChoiceEvent};

/// Create a message (Anthropic). With `stream: true` the response is `text/event-stream` in
/// Anthropic's event protocol.
#[utoipa::path(
    post,
    path = "/v1/messages",
    tag = "anthropic",
    request_body = MessagesRequest,
    responses(
        (status = 200, description = "The message (or, with stream=true, Anthropic's SSE events)", body = MessagesResponse),
        (status = 400, description = "A bad field, block or tool", body = AnthropicErrorResponse),
        (status = 401, description = "Missing or wrong API key", body = AnthropicErrorResponse),
        (status = 404, description = "Unknown model", body = AnthropicErrorResponse),
        (status = 413, description = "Body over the limit", body = AnthropicErrorResponse),
        (status = 429, description = "The waiting queue is full", body = AnthropicErrorResponse),
        (status = 529, description = "The engine is not available", body = AnthropicErrorResponse),
    ),
    security((), ("api_key" = []))
)]
pub async fn messages(
    State(state): State<SharedState>,
    Generation { req, arrival, model, lora }: Generation<MessagesRequest>,
) -> Result<Response, ApiError> {
    let (mut turn, display) = chat_turn(&state, &req)?;
    turn.lora = lora;
    let StartedTurn { submission, split, max_tokens_clamped } = turn.start(&state, arrival).await?;
    let head = MessageHead { id: response_id("msg").replacen('-', "_", 1), model };
    let prompt_tokens = submission.prompts.first().map_or(0, |p| p.token_ids.len());
    if req.stream.unwrap_or(false) {
        let answer = AnswerShape { split, omit_thinking: display.omitted, clamped: max_tokens_clamped };
        return Ok(stream_message(state, head, answer, prompt_tokens, submission.events));
    }
    let (_, collected) = submission.collect(&state).await?;
    let choice = collected.choices.into_iter().next().unwrap_or_default();
    let message = whole_message(split, &choice.text);
    let stop = stop_reason(choice.finish.as_ref(), !message.tool_calls.is_empty(), max_tokens_clamped);
    let usage = MessagesUsage::new(
        collected.prompt_tokens,
        collected.cached_prompt_tokens,
        collected.completion_tokens,
    );
    Ok(Json(head.message(blocks(message, display.omitted), Some(stop), usage)).into_response())
}

/// Count a request's input tokens: the system prompt, messages and tools rendered as the
/// template renders them for `/v1/messages`.
#[utoipa::path(
    post,
    path = "/v1/messages/count_tokens",
    tag = "anthropic",
    request_body = CountTokensRequest,
    responses(
        (status = 200, description = "The number of input tokens", body = CountTokensResponse),
        (status = 400, description = "A bad field, block or tool", body = AnthropicErrorResponse),
        (status = 404, description = "Unknown model", body = AnthropicErrorResponse),
    ),
    security((), ("api_key" = []))
)]
pub async fn count_tokens(
    State(state): State<SharedState>,
    JsonBody(req): JsonBody<CountTokensRequest>,
) -> Result<Json<CountTokensResponse>, ApiError> {
    state.resolve_model(Some(&req.model))?;
    let (turn, _) = turn_of(&state, PromptFields::of_count(&req), None)?;
    Ok(Json(CountTokensResponse { input_tokens: turn.count(&state).await? }))
}

fn sse_event((name, data): StreamEvent) -> Event {
    sse::named_event(name, &data)
}

fn error_event(error: &ApiError) -> Event {
    sse::named_event("error", &anthropic_error::body(error))
}

/// How a streamed answer is shown.
struct AnswerShape {
    split: ChoiceSplit,
    omit_thinking: bool,
    /// `max_tokens` was cut to the context.
    clamped: bool,
}

/// A streamed answer between events.
struct MessageStream {
    state: SharedState,
    events: BoxStream<'static, ChoiceEvent>,
    text: ChoiceText,
    blocks: BlockEvents,
    stop: Option<(String, Option<String>)>,
    usage: MessagesUsage,
    clamped: bool,
    done: bool,
}

impl MessageStream {
    fn on_event(&mut self, ChoiceEvent { event, .. }: ChoiceEvent) -> Vec<Event> {
        if let Some(reason) = &event.finished {
            let error = match failure(&self.state, reason) {
                Some(e) => Some(e),
                None if *reason == pagoda_engine::FinishReason::Abort => Some(ApiError::ShuttingDown),
                None => None,
            };
            if let Some(e) = error {
                self.done = true;
                return vec![error_event(&e)];
            }
        }
        if let Some(u) = event.usage {
            self.usage = MessagesUsage::new(u.prompt_tokens, u.cached_prompt_tokens, u.completion_tokens);
        }
        let last = event.finished.is_some();
        let piece = self.text.push(&event.text, last);
        let mut out: Vec<Event> = self.blocks.push(piece).into_iter().map(sse_event).collect();
        if last {
            out.extend(self.blocks.finish().into_iter().map(sse_event));
            self.stop = Some(stop_reason(event.finished.as_ref(), self.blocks.made_calls(), self.clamped));
        }
        out
    }

    fn on_end(&mut self) -> Vec<Event> {
        self.done = true;
        let Some((stop_reason, stop_sequence)) = self.stop.take() else {
            return vec![error_event(&ApiError::Internal("the answer ended without finishing".into()))];
        };
        let delta = json!({
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
            "usage": self.usage,
        });
        vec![
            sse_event(("message_delta", delta)),
            sse_event(("message_stop", json!({"type": "message_stop"}))),
        ]
    }
}

fn stream_message(
    state: SharedState,
    head: MessageHead,
    answer: AnswerShape,
    prompt_tokens: usize,
    events: BoxStream<'static, ChoiceEvent>,
) -> Response {
    let start_usage = MessagesUsage { input_tokens: prompt_tokens, ..Default::default() };
    let start = json!({"type": "message_start", "message": head.message(Vec::new(), None, start_usage)});
    let ping = || sse_event(("ping", json!({"type": "ping"})));
    let opening = vec![sse_event(("message_start", start)), ping()];
    let st = MessageStream {
        state,
        events,
        text: ChoiceText::new(answer.split),
        blocks: BlockEvents::new(answer.omit_thinking),
        stop: None,
        usage: start_usage,
        clamped: answer.clamped,
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
    sse::response_with_keep_alive(stream::iter(opening).chain(body).map(Ok), ping())
}

//! `POST /v1/chat/completions`: render the conversation with the chat template, generate, and
//! answer with one `chat.completion` or a stream of `chat.completion.chunk` events.

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::{self, BoxStream, StreamExt};
use pagoda_text::Tokenizer;

use super::generation::{Generation, GenerationErrors};
use super::{finish_reason, response_id};
use crate::chat_output::{whole_message, ChoiceSplit, ChoiceText};
use crate::conversation::{ChatTurn, StartedTurn};
use crate::error::ApiError;
use crate::logprobs;
use crate::openai::FinishReason;
use crate::openai::{
    unix_now, ChatChoice, ChatChunkChoice, ChatCompletionChunk, ChatCompletionRequest,
    ChatCompletionResponse, ChatDelta, ResponseMessage, Usage,
};
use crate::prompt::{chat_messages_with, ChatOptions};
use crate::sse;
use crate::state::SharedState;
use crate::submit::{failure, ChoiceEvent, Submission};
use crate::tools::ToolRequest;

/// What every chunk and the response repeat.
#[derive(Clone)]
struct Context {
    id: String,
    created: u64,
    model: String,
    tokenizer: Arc<Tokenizer>,
    /// How each choice's text splits into reasoning, content and tool calls.
    split: ChoiceSplit,
}

impl Context {
    fn chunk(&self, choices: Vec<ChatChunkChoice>, usage: Option<Usage>) -> ChatCompletionChunk {
        ChatCompletionChunk {
            id: self.id.clone(),
            object: "chat.completion.chunk".to_owned(),
            created: self.created,
            model: self.model.clone(),
            choices,
            usage,
        }
    }
}

/// Chat completion (OpenAI). With `stream: true` the response is `text/event-stream`: one
/// `chat.completion.chunk` per event, then `data: [DONE]`.
#[utoipa::path(
    post,
    path = "/v1/chat/completions",
    tag = "openai",
    request_body = ChatCompletionRequest,
    responses(
        (status = 200, description = "The completion (or, with stream=true, an SSE stream of chat.completion.chunk objects)",
         body = ChatCompletionResponse),
        GenerationErrors,
    ),
    security((), ("api_key" = []))
)]
pub async fn chat_completions(
    State(state): State<SharedState>,
    Generation { req, arrival, model, lora }: Generation<ChatCompletionRequest>,
) -> Result<Response, ApiError> {
    let turn = chat_turn(&state, &req, lora)?;
    let StartedTurn { submission, split, .. } = turn.start(&state, arrival).await?;
    let ctx = Context {
        id: response_id("chatcmpl"),
        created: unix_now(),
        model,
        tokenizer: Arc::clone(state.prompts.tokenizer()),
        split,
    };
    if req.openai.streams() {
        let include_usage = req.openai.include_usage();
        Ok(stream_response(state, ctx, submission, include_usage))
    } else {
        let response = collect_response(&state, ctx, submission).await?;
        Ok(Json(response).into_response())
    }
}

/// The turn a chat request asks for, with its parameters checked (shared with its render
/// endpoint, so that a rendered prompt is exactly the one generation would run).
pub(crate) fn chat_turn(
    state: &SharedState,
    req: &ChatCompletionRequest,
    lora: Option<pagoda_engine::LoraId>,
) -> Result<ChatTurn, ApiError> {
    if req.top_logprobs.is_some() && !req.logprobs.unwrap_or(false) {
        return Err(ApiError::invalid("top_logprobs", "top_logprobs requires logprobs to be true"));
    }
    let prompt_logprobs = req.extensions.prompt_logprobs.map(|k| k as usize);
    if prompt_logprobs.is_some() && req.openai.streams() {
        return Err(ApiError::invalid("prompt_logprobs", "prompt_logprobs is not available with stream"));
    }
    if let Some(k) = prompt_logprobs.filter(|&k| k > state.limits.max_logprobs) {
        return Err(ApiError::invalid(
            "prompt_logprobs",
            format!("at most {} logprobs per token are available, got {k}", state.limits.max_logprobs),
        ));
    }
    let tools = ToolRequest::parse(req.tools.as_ref(), req.tool_choice.as_ref(), req.parallel_tool_calls)?
        .filter(ToolRequest::active);
    crate::openai::router_fields::check(&req.router_fields())?;
    let grammar = req.extensions.grammar_fields().grammar()?;
    let mut images = state.media.collector();
    let messages = chat_messages_with(&req.messages, &mut images)?;
    let options = ChatOptions::of(
        &messages,
        req.add_generation_prompt,
        req.continue_final_message,
        req.extensions.add_special_tokens,
        req.chat_template_kwargs.clone(),
    )?;
    Ok(ChatTurn {
        messages,
        images: images.into_images(),
        options,
        tools,
        grammar,
        params: req.common(),
        prompt_param: "messages",
        clamp_max_tokens: false,
        reasoning_budget: None,
        prompt_logprobs,
        lora,
        kv_transfer: crate::disaggregation::directive_of(
            state.disaggregation.as_ref(),
            req.extensions.pd_fields(req.openai.stream),
            state.engine.next_request_id(),
        )?,
    })
}

async fn collect_response(
    state: &SharedState,
    ctx: Context,
    submission: Submission,
) -> Result<ChatCompletionResponse, ApiError> {
    let want_logprobs = submission.wants_logprobs;
    let kv_transfer_params = submission.kv_transfer_params.clone();
    let (_, mut collected) = submission.collect(state).await?;
    let prompt_logprobs = collected
        .choices
        .iter_mut()
        .find_map(|c| c.prompt_logprobs.take())
        .map(|scored| logprobs::prompt_logprobs(&ctx.tokenizer, &scored));
    let choices = collected
        .choices
        .into_iter()
        .enumerate()
        .map(|(index, c)| {
            let message = whole_message(ctx.split, &c.text);
            let (finish, stop_reason) = match &c.finish {
                Some(r) => {
                    let (f, s) = finish_reason(r);
                    (Some(with_tool_calls(f, !message.tool_calls.is_empty())), s)
                }
                None => (None, None),
            };
            ChatChoice {
                index,
                message: ResponseMessage {
                    role: "assistant".to_owned(),
                    content: message.content,
                    reasoning_content: message.reasoning,
                    tool_calls: message.tool_calls,
                },
                logprobs: want_logprobs.then(|| logprobs::chat(&ctx.tokenizer, &c.logprobs)),
                finish_reason: finish,
                stop_reason,
            }
        })
        .collect();
    Ok(ChatCompletionResponse {
        id: ctx.id,
        object: "chat.completion".to_owned(),
        created: ctx.created,
        model: ctx.model,
        choices,
        usage: Usage::new(collected.prompt_tokens, collected.completion_tokens),
        prompt_logprobs,
        kv_transfer_params,
    })
}

/// State of a streamed response between events.
struct StreamState {
    state: SharedState,
    ctx: Context,
    events: BoxStream<'static, ChoiceEvent>,
    include_usage: bool,
    want_logprobs: bool,
    /// Each choice's text pipeline, by choice index.
    texts: Vec<ChoiceText>,
    prompt_tokens: usize,
    completion_tokens: usize,
    done: bool,
}

impl StreamState {
    /// The SSE events for one engine event (none when it carries nothing to show).
    fn on_event(&mut self, ChoiceEvent { choice, event }: ChoiceEvent) -> Vec<axum::response::sse::Event> {
        if let Some(err) = event.finished.as_ref().and_then(|r| failure(&self.state, r)) {
            self.done = true;
            return vec![sse::error_event(&err), sse::done_event()];
        }
        if let Some(usage) = event.usage {
            self.prompt_tokens += usage.prompt_tokens;
            self.completion_tokens += usage.completion_tokens;
        }
        let logprobs = match (&event.logprobs, self.want_logprobs) {
            (Some(lp), true) if !lp.is_empty() => Some(logprobs::chat(&self.ctx.tokenizer, lp)),
            _ => None,
        };
        let split = self.ctx.split;
        let Some(text) = self.texts.get_mut(choice) else { return Vec::new() };
        let piece = text.push(&event.text, event.finished.is_some());
        if piece.is_empty() && logprobs.is_none() && event.finished.is_none() {
            return Vec::new();
        }
        let (finish, stop_reason) = match &event.finished {
            Some(r) => {
                let (f, s) = finish_reason(r);
                (Some(with_tool_calls(f, text.made_calls())), s)
            }
            None => (None, None),
        };
        let non_empty = |s: String| (!s.is_empty()).then_some(s);
        let delta = ChatDelta {
            role: None,
            // Without a parser the text passes as it is (empty pieces included, as before).
            content: if split == ChoiceSplit::default() {
                Some(piece.content)
            } else {
                non_empty(piece.content)
            },
            reasoning_content: non_empty(piece.reasoning),
            tool_calls: (!piece.tool_calls.is_empty()).then_some(piece.tool_calls),
        };
        let choice = ChatChunkChoice { index: choice, delta, logprobs, finish_reason: finish, stop_reason };
        vec![sse::json_event(&self.ctx.chunk(vec![choice], None))]
    }

    fn on_end(&mut self) -> Vec<axum::response::sse::Event> {
        self.done = true;
        let mut out = Vec::with_capacity(2);
        if self.include_usage {
            let usage = Usage::new(self.prompt_tokens, self.completion_tokens);
            out.push(sse::json_event(&self.ctx.chunk(Vec::new(), Some(usage))));
        }
        out.push(sse::done_event());
        out
    }
}

fn stream_response(
    state: SharedState,
    ctx: Context,
    submission: Submission,
    include_usage: bool,
) -> Response {
    // The first chunk of every choice carries the role, before any token is ready.
    let head: Vec<_> = (0..submission.num_choices())
        .map(|index| {
            let choice = ChatChunkChoice {
                index,
                delta: ChatDelta {
                    role: Some("assistant".to_owned()),
                    // With tools or reasoning the message may have no content at all.
                    content: (ctx.split == ChoiceSplit::default()).then(String::new),
                    ..Default::default()
                },
                logprobs: None,
                finish_reason: None,
                stop_reason: None,
            };
            sse::json_event(&ctx.chunk(vec![choice], None))
        })
        .collect();
    let texts = (0..submission.num_choices()).map(|_| ChoiceText::new(ctx.split)).collect();
    let st = StreamState {
        state,
        texts,
        want_logprobs: submission.wants_logprobs,
        ctx,
        events: submission.events,
        include_usage,
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

/// A choice that called tools and stopped on its own finishes with `tool_calls`.
fn with_tool_calls(finish: FinishReason, made_calls: bool) -> FinishReason {
    if made_calls && finish == FinishReason::Stop {
        FinishReason::ToolCalls
    } else {
        finish
    }
}

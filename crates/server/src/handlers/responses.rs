//! `POST /v1/responses` (OpenAI's Responses API) and the stored responses' routes: the request's
//! items (after a stored conversation's, with `previous_response_id`) are translated into a chat
//! turn ([`crate::responses::request`]), run on the same pipeline as chat completions, and
//! answered as one `response` object or the typed stream events; the response is stored unless
//! `store` is false.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{RawQuery, State};
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use futures_util::stream::{self, BoxStream, StreamExt};
use pagoda_engine::FinishReason;
use pagoda_text::Tokenizer;
use serde_json::{json, Value};

use crate::chat_output::{whole_message, ChoiceSplit, ChoiceText};
use crate::conversation::{ChatTurn, StartedTurn};
use crate::error::ApiError;
use crate::extract::{JsonBody, PathParam};
use crate::layers::Arrival;
use crate::openai::{unix_now, ErrorResponse};
use crate::responses::reply::{output_items, OutputEvents};
use crate::responses::request::{chat_turn, input_items};
use crate::responses::store::{json_len, StoredResponse};
use crate::responses::wire::{
    DeletedResponse, InputItemList, InputTokensDetails, OutputTokensDetails, ResponseObject, ResponseUsage,
    ResponsesRequest,
};
use crate::sse;
use crate::state::SharedState;
use crate::submit::{failure, ChoiceEvent};

/// Checks `metadata`: at most 16 pairs of strings (keys up to 64 characters, values up to 512).
fn metadata(value: Option<&Value>) -> Result<Value, ApiError> {
    let map = match value {
        None | Some(Value::Null) => return Ok(json!({})),
        Some(Value::Object(map)) => map,
        Some(_) => return Err(ApiError::invalid("metadata", "must be an object of strings")),
    };
    if map.len() > 16 {
        return Err(ApiError::invalid("metadata", "at most 16 keys are allowed"));
    }
    for (k, v) in map {
        if k.chars().count() > 64 || v.as_str().is_none_or(|s| s.chars().count() > 512) {
            return Err(ApiError::invalid(
                format!("metadata.{k}"),
                "keys are at most 64 characters and values strings of at most 512",
            ));
        }
    }
    Ok(Value::Object(map.clone()))
}

/// The response object as it stands before any output.
fn skeleton(req: &ResponsesRequest, model: String, store: bool) -> Result<ResponseObject, ApiError> {
    Ok(ResponseObject {
        id: format!("resp_{}", uuid::Uuid::new_v4().simple()),
        object: "response".into(),
        created_at: unix_now(),
        status: "in_progress".into(),
        error: None,
        incomplete_details: None,
        instructions: req.instructions.clone(),
        max_output_tokens: req.max_output_tokens,
        model,
        output: Vec::new(),
        parallel_tool_calls: req.parallel_tool_calls.unwrap_or(true),
        previous_response_id: req.previous_response_id.clone(),
        reasoning: req
            .reasoning
            .clone()
            .filter(|r| !r.is_null())
            .unwrap_or(json!({"effort": null, "summary": null})),
        store,
        temperature: req.temperature.unwrap_or(1.0),
        text: req.text.clone().filter(|t| !t.is_null()).unwrap_or(json!({"format": {"type": "text"}})),
        tool_choice: req.tool_choice.clone().filter(|c| !c.is_null()).unwrap_or(json!("auto")),
        tools: req.tools.as_ref().and_then(Value::as_array).cloned().unwrap_or_default(),
        top_p: req.top_p.unwrap_or(1.0),
        truncation: req.truncation.clone().unwrap_or_else(|| "disabled".into()),
        usage: None,
        user: req.user.clone(),
        metadata: metadata(req.metadata.as_ref())?,
    })
}

/// Refuses, before any generation, a response to be stored whose own fields are already over
/// `--max-stored-response-bytes`, naming its largest field: storing it would be refused, and a
/// client that asked for `store` must not get an answer it cannot retrieve.
fn check_storable(
    state: &SharedState,
    response: &ResponseObject,
    input_items: &[Value],
) -> Result<(), ApiError> {
    let limit = state.responses.entry_bytes();
    let bytes = json_len(response) + json_len(input_items);
    if bytes <= limit {
        return Ok(());
    }
    let fields = [
        ("input", json_len(input_items)),
        ("instructions", json_len(&response.instructions)),
        ("user", json_len(&response.user)),
        ("metadata", json_len(&response.metadata)),
        ("tools", json_len(&response.tools)),
        ("text", json_len(&response.text)),
        ("tool_choice", json_len(&response.tool_choice)),
        ("reasoning", json_len(&response.reasoning)),
    ];
    let (field, field_bytes) = fields.into_iter().max_by_key(|&(_, b)| b).unwrap_or(("input", bytes));
    Err(ApiError::invalid(
        field,
        format!(
            "the response would be stored (`store` is true) and would take {bytes} bytes, {field_bytes} of \
             them in `{field}`; this server stores responses of at most {limit} bytes \
             (--max-stored-response-bytes). Send less, or set `store` to false."
        ),
    ))
}

/// With `truncation: auto`, drops the oldest messages (a call with its results) until the
/// prompt leaves room for the output; the last message always stays.
async fn fit(state: &SharedState, turn: &mut ChatTurn, max_output: Option<u32>) -> Result<(), ApiError> {
    let room = max_output.map_or(1, |m| m as usize);
    loop {
        let error = match turn.render(state).await {
            Ok(p) if p.token_ids.len() + room <= state.limits.max_model_len => return Ok(()),
            Ok(p) => ApiError::ContextLengthExceeded {
                prompt_tokens: p.token_ids.len(),
                max_tokens: room,
                max_model_len: state.limits.max_model_len,
            },
            Err(e @ ApiError::PromptTextTooLong { .. }) => e,
            Err(e) => return Err(e),
        };
        let messages = &mut turn.messages;
        let first = messages.iter().position(|m| m.role != "system");
        let Some(first) = first.filter(|&f| f + 1 < messages.len()) else { return Err(error) };
        messages.remove(first);
        // What answered or followed the dropped message cannot start the conversation.
        while messages.get(first).is_some_and(|m| m.role != "user" && m.role != "system")
            && first + 1 < messages.len()
        {
            messages.remove(first);
        }
    }
}

/// Create a model response (OpenAI Responses API). With `stream: true` the response is
/// `text/event-stream` of typed events, each with its `sequence_number`.
#[utoipa::path(
    post,
    path = "/v1/responses",
    tag = "openai",
    request_body = ResponsesRequest,
    responses(
        (status = 200, description = "The response (or, with stream=true, an SSE stream of typed response events)", body = ResponseObject),
        (status = 400, description = "A bad field, item or tool, or a conversation too long", body = ErrorResponse),
        (status = 401, description = "Missing or wrong API key", body = ErrorResponse),
        (status = 404, description = "Unknown model or previous response", body = ErrorResponse),
        (status = 429, description = "The waiting queue is full", body = ErrorResponse),
        (status = 503, description = "The engine is not available", body = ErrorResponse),
    ),
    security((), ("api_key" = []))
)]
pub async fn create(
    State(state): State<SharedState>,
    arrival: Option<Extension<Arrival>>,
    JsonBody(req): JsonBody<ResponsesRequest>,
) -> Result<Response, ApiError> {
    let arrival = arrival.map_or_else(Instant::now, |a| a.0 .0);
    let (model, lora) = state.resolve_model(req.model.as_deref())?;
    let store = req.store.unwrap_or(state.responses.enabled());
    if store && !state.responses.enabled() {
        return Err(ApiError::invalid(
            "store",
            "this server stores no responses (--max-stored-responses 0 or --stored-responses-memory 0)",
        ));
    }
    let mut items = match &req.previous_response_id {
        Some(id) => state.responses.history(id)?,
        None => Vec::new(),
    };
    let first_new = items.len();
    let new_items = input_items(req.input.as_ref())?;
    if new_items.is_empty() {
        return Err(ApiError::invalid("input", "input is required: a string or a list of items"));
    }
    items.extend(new_items.iter().cloned());
    let response = skeleton(&req, model, store)?;
    if store {
        check_storable(&state, &response, &new_items)?;
    }
    let (mut turn, namespaces) = chat_turn(&state, &req, &items, first_new)?;
    turn.lora = lora;
    if req.truncation.as_deref() == Some("auto") {
        fit(&state, &mut turn, req.max_output_tokens).await?;
    }
    let StartedTurn { submission, split, .. } = turn.start(&state, arrival).await?;
    let encrypted = req.include.iter().flatten().any(|i| i == "reasoning.encrypted_content");
    let finishing = Finishing { state: Arc::clone(&state), input_items: new_items, store };
    if req.stream.unwrap_or(false) {
        let items = OutputEvents::new(encrypted, namespaces);
        return Ok(stream_response(finishing, response, split, items, submission.events));
    }
    let (_, collected) = submission.collect(&state).await?;
    let choice = collected.choices.into_iter().next().unwrap_or_default();
    let message = whole_message(split, &choice.text);
    let reasoning_tokens = count_tokens(state.prompts.tokenizer(), message.reasoning.as_deref());
    let status = status_of(choice.finish.as_ref());
    let mut response = response;
    response.output = output_items(message, encrypted, status, &namespaces);
    let usage = pagoda_engine::Usage {
        prompt_tokens: collected.prompt_tokens,
        completion_tokens: collected.completion_tokens,
        cached_prompt_tokens: collected.cached_prompt_tokens,
    };
    finishing.finish(&mut response, status, usage, reasoning_tokens);
    Ok(Json(response).into_response())
}

fn status_of(finish: Option<&FinishReason>) -> &'static str {
    match finish {
        Some(FinishReason::Length) => "incomplete",
        _ => "completed",
    }
}

fn count_tokens(tokenizer: &Tokenizer, text: Option<&str>) -> usize {
    text.filter(|t| !t.is_empty()).map_or(0, |t| tokenizer.encode(t, false).map_or(0, |ids| ids.len()))
}

/// What completes a response: its usage and status, and storing it.
struct Finishing {
    state: SharedState,
    input_items: Vec<Value>,
    store: bool,
}

impl Finishing {
    fn finish(
        &self,
        response: &mut ResponseObject,
        status: &str,
        usage: pagoda_engine::Usage,
        reasoning_tokens: usize,
    ) {
        response.status = status.to_owned();
        if status == "incomplete" {
            response.incomplete_details = Some(json!({"reason": "max_output_tokens"}));
        }
        response.usage = Some(ResponseUsage {
            input_tokens: usage.prompt_tokens,
            input_tokens_details: InputTokensDetails {
                cached_tokens: usage.cached_prompt_tokens,
                cache_write_tokens: 0,
            },
            output_tokens: usage.completion_tokens,
            output_tokens_details: OutputTokensDetails {
                reasoning_tokens: reasoning_tokens.min(usage.completion_tokens),
            },
            total_tokens: usage.prompt_tokens + usage.completion_tokens,
        });
        if self.store {
            let entry = StoredResponse { response: response.clone(), input_items: self.input_items.clone() };
            if !self.state.responses.insert(entry) {
                tracing::warn!(id = %response.id, "response not stored: its output makes it larger than --max-stored-response-bytes");
            }
        }
    }
}

/// A streamed response between events.
struct ResponseStream {
    finishing: Finishing,
    response: ResponseObject,
    events: BoxStream<'static, ChoiceEvent>,
    text: ChoiceText,
    items: OutputEvents,
    reasoning: String,
    usage: pagoda_engine::Usage,
    status: Option<&'static str>,
    sequence: u64,
    done: bool,
}

impl ResponseStream {
    fn event(&mut self, name: &'static str, fields: Value) -> Event {
        let mut data = json!({"type": name});
        if let (Some(d), Value::Object(f)) = (data.as_object_mut(), fields) {
            d.extend(f);
            d.insert("sequence_number".into(), json!(self.sequence));
        }
        self.sequence += 1;
        sse::named_event(name, &data)
    }

    fn response_event(&mut self, name: &'static str) -> Event {
        let response = serde_json::to_value(&self.response).unwrap_or(Value::Null);
        self.event(name, json!({"response": response}))
    }

    fn on_event(&mut self, ChoiceEvent { event, .. }: ChoiceEvent) -> Vec<Event> {
        if let Some(reason) = &event.finished {
            let error = match failure(&self.finishing.state, reason) {
                Some(e) => Some(e),
                None if *reason == FinishReason::Abort => Some(ApiError::ShuttingDown),
                None => None,
            };
            if let Some(e) = error {
                self.done = true;
                self.response.status = "failed".into();
                let body = e.body().error;
                self.response.error = Some(json!({"code": body.code, "message": body.message}));
                return vec![self.response_event("response.failed")];
            }
        }
        if let Some(u) = event.usage {
            self.usage = u;
        }
        let last = event.finished.is_some();
        let piece = self.text.push(&event.text, last);
        self.reasoning.push_str(&piece.reasoning);
        let mut raw = self.items.push(piece);
        if last {
            let status = status_of(event.finished.as_ref());
            raw.extend(self.items.finish(status));
            self.status = Some(status);
        }
        raw.into_iter().map(|(name, fields)| self.event(name, fields)).collect()
    }

    fn on_end(&mut self) -> Vec<Event> {
        self.done = true;
        let Some(status) = self.status else {
            let e = ApiError::Internal("the response ended without finishing".into());
            self.response.status = "failed".into();
            self.response.error = Some(json!({"code": "server_error", "message": e.to_string()}));
            return vec![self.response_event("response.failed")];
        };
        self.response.output = self.items.items().to_vec();
        let reasoning_tokens = count_tokens(self.finishing.state.prompts.tokenizer(), Some(&self.reasoning));
        self.finishing.finish(&mut self.response, status, self.usage, reasoning_tokens);
        let name = if status == "incomplete" { "response.incomplete" } else { "response.completed" };
        vec![self.response_event(name)]
    }
}

fn stream_response(
    finishing: Finishing,
    response: ResponseObject,
    split: ChoiceSplit,
    items: OutputEvents,
    events: BoxStream<'static, ChoiceEvent>,
) -> Response {
    let mut st = ResponseStream {
        finishing,
        response,
        events,
        text: ChoiceText::new(split),
        items,
        reasoning: String::new(),
        usage: pagoda_engine::Usage::default(),
        status: None,
        sequence: 0,
        done: false,
    };
    let opening = vec![st.response_event("response.created"), st.response_event("response.in_progress")];
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
    sse::response(stream::iter(opening).chain(body).map(Ok))
}

/// Retrieve a stored response.
#[utoipa::path(
    get,
    path = "/v1/responses/{response_id}",
    tag = "openai",
    params(("response_id" = String, Path, description = "The response's id")),
    responses(
        (status = 200, description = "The stored response", body = ResponseObject),
        (status = 404, description = "No such stored response", body = ErrorResponse),
    ),
    security((), ("api_key" = []))
)]
pub async fn retrieve(
    State(state): State<SharedState>,
    PathParam(id): PathParam,
) -> Result<Json<ResponseObject>, ApiError> {
    state.responses.get(&id).map(|e| Json(e.response)).ok_or_else(|| not_found(&id))
}

/// Delete a stored response.
#[utoipa::path(
    delete,
    path = "/v1/responses/{response_id}",
    tag = "openai",
    params(("response_id" = String, Path, description = "The response's id")),
    responses(
        (status = 200, description = "Deleted", body = DeletedResponse),
        (status = 404, description = "No such stored response", body = ErrorResponse),
    ),
    security((), ("api_key" = []))
)]
pub async fn delete(
    State(state): State<SharedState>,
    PathParam(id): PathParam,
) -> Result<Json<DeletedResponse>, ApiError> {
    state.responses.remove(&id).ok_or_else(|| not_found(&id))?;
    Ok(Json(DeletedResponse { id, object: "response".into(), deleted: true }))
}

fn not_found(id: &str) -> ApiError {
    ApiError::ResponseNotFound { message: format!("Response with id '{id}' not found."), param: None }
}

/// The paging of `input_items`: `limit` (1 to 100, default 20), `order` (`asc` or `desc`, the
/// default) and `after` (an item id).
fn paging(query: Option<&str>) -> Result<(usize, bool, Option<String>), ApiError> {
    let (mut limit, mut descending, mut after) = (20, true, None);
    for pair in query.unwrap_or_default().split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        match key {
            "limit" => {
                limit =
                    value.parse::<usize>().ok().filter(|l| (1..=100).contains(l)).ok_or_else(|| {
                        ApiError::invalid("limit", "limit must be a whole number from 1 to 100")
                    })?
            }
            "order" => {
                descending = match value {
                    "asc" => false,
                    "desc" => true,
                    _ => return Err(ApiError::invalid("order", "order must be asc or desc")),
                }
            }
            "after" => after = Some(value.to_owned()),
            other => return Err(ApiError::invalid(other, format!("Unknown query parameter `{other}`."))),
        }
    }
    Ok((limit, descending, after))
}

/// List a stored response's input items.
#[utoipa::path(
    get,
    path = "/v1/responses/{response_id}/input_items",
    tag = "openai",
    params(
        ("response_id" = String, Path, description = "The response's id"),
        ("limit" = Option<u32>, Query, description = "1 to 100; default 20"),
        ("order" = Option<String>, Query, description = "asc or desc (the default)"),
        ("after" = Option<String>, Query, description = "List the items after this item id"),
    ),
    responses(
        (status = 200, description = "The input items", body = InputItemList),
        (status = 400, description = "A bad query parameter", body = ErrorResponse),
        (status = 404, description = "No such stored response", body = ErrorResponse),
    ),
    security((), ("api_key" = []))
)]
pub async fn input_item_list(
    State(state): State<SharedState>,
    PathParam(id): PathParam,
    RawQuery(query): RawQuery,
) -> Result<Json<InputItemList>, ApiError> {
    let (limit, descending, after) = paging(query.as_deref())?;
    let entry = state.responses.get(&id).ok_or_else(|| not_found(&id))?;
    let mut items = entry.input_items;
    if descending {
        items.reverse();
    }
    if let Some(after) = after {
        let at = items.iter().position(|i| i["id"] == after.as_str()).ok_or_else(|| {
            ApiError::invalid("after", format!("`{after}` is not an input item of this response"))
        })?;
        items.drain(..=at);
    }
    let has_more = items.len() > limit;
    items.truncate(limit);
    let id_of = |i: Option<&Value>| i.and_then(|v| v["id"].as_str()).map(str::to_owned);
    Ok(Json(InputItemList {
        object: "list".into(),
        first_id: id_of(items.first()),
        last_id: id_of(items.last()),
        has_more,
        data: items,
    }))
}

//! `POST /v1/responses` (OpenAI's Responses API) and the stored responses' routes: the request's
//! items (after a stored conversation's, with `previous_response_id`) are translated into a chat
//! turn ([`crate::responses::request`]), run on the same pipeline as chat completions, and
//! answered as one `response` object or the typed stream events; the response is stored unless
//! `store` is false. With `background: true` the generation is detached from the connection
//! ([`crate::responses::background`]): polled, replayed and cancelled through these routes.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{RawQuery, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::{self, BoxStream, StreamExt};
use serde_json::{json, Value};

use super::generation::Generation;
use crate::chat_output::whole_message;
use crate::conversation::{ChatTurn, StartedTurn};
use crate::error::ApiError;
use crate::extract::PathParam;
use crate::openai::{unix_now, ErrorResponse};
use crate::responses::background::{self, Run};
use crate::responses::reply::{output_items, OutputEvents};
use crate::responses::request::{chat_turn, input_items, ToolNamespaces};
use crate::responses::store::{json_len, Found, StoredResponse};
use crate::responses::stream::{count_tokens, finish, status_of, Responder, SeqEvent, Step};
use crate::responses::wire::{DeletedResponse, InputItemList, ResponseObject, ResponsesRequest};
use crate::sse;
use crate::state::SharedState;

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
        background: false,
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
    Generation { req, arrival, model, lora }: Generation<ResponsesRequest>,
) -> Result<Response, ApiError> {
    let background = req.background.unwrap_or(false);
    let store = req.store.unwrap_or(state.responses.enabled() || background);
    if background && !store {
        return Err(ApiError::invalid(
            "background",
            "background responses must be stored: leave `store` out or set it to true",
        ));
    }
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
    let mut response = skeleton(&req, model, store)?;
    if background {
        response.background = true;
        response.status = "queued".into();
    }
    if store {
        check_storable(&state, &response, &new_items)?;
    }
    if crate::responses::mcp::run::has_mcp_tools(&req) {
        let mcp = super::responses_mcp::McpCreate { req: &req, items, first_new, lora, arrival, store };
        return mcp.respond(&state, response, new_items).await;
    }
    let (mut turn, namespaces) = chat_turn(&state, &req, &items, first_new)?;
    turn.lora = lora;
    if req.truncation.as_deref() == Some("auto") {
        fit(&state, &mut turn, req.max_output_tokens).await?;
    }
    let encrypted = req.include.iter().flatten().any(|i| i == "reasoning.encrypted_content");
    if background {
        let stream = req.stream.unwrap_or(false);
        return start_background(&state, turn, arrival, response, new_items, encrypted, namespaces, stream)
            .await;
    }
    let StartedTurn { submission, split, .. } = turn.start(&state, arrival).await?;
    if req.stream.unwrap_or(false) {
        let responder = Responder::new(response, split, OutputEvents::new(encrypted, namespaces));
        let stored = store.then_some(new_items);
        let steps = submission.events.map(Step::Engine).boxed();
        return Ok(stream_response(state, responder, stored, steps));
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
    finish(&mut response, status, usage, reasoning_tokens);
    if store {
        keep(&state, &response, new_items);
    }
    Ok(Json(response).into_response())
}

/// Stores a finished foreground response.
pub(super) fn keep(state: &SharedState, response: &ResponseObject, input_items: Vec<Value>) {
    let entry = StoredResponse { response: response.clone(), input_items };
    if !state.responses.insert(entry) {
        tracing::warn!(id = %response.id, "response not stored: it is larger than --max-stored-response-bytes, or unfinished background responses hold the store");
    }
}

/// Admits, submits and detaches a background response; answers with it `queued`, or with its
/// event stream (`stream: true`), whose end stops the reading, not the generation.
#[allow(clippy::too_many_arguments)]
async fn start_background(
    state: &SharedState,
    turn: ChatTurn,
    arrival: Instant,
    response: ResponseObject,
    input_items: Vec<Value>,
    encrypted: bool,
    namespaces: ToolNamespaces,
    stream: bool,
) -> Result<Response, ApiError> {
    // Its place is taken before the engine sees it, so that a full store refuses it unstarted.
    let id = response.id.clone();
    let queued = response.clone();
    let run_response = response;
    state.responses.admit(&id, input_items)?;
    // Gives the place back if the turn fails to start, or if the client goes away meanwhile
    // (which drops this future).
    let admission = Admission { state, id: &id };
    let StartedTurn { submission, split, .. } = turn.start(state, arrival).await?;
    std::mem::forget(admission);
    let run = Run::new(id, Responder::new(run_response, split, OutputEvents::new(encrypted, namespaces)));
    state.responses.attach(&run);
    background::spawn(Arc::clone(state), Arc::clone(&run), submission.events.map(Step::Engine).boxed());
    if stream {
        let events = run.follow(None)?;
        return Ok(sse::response(events.map(Ok)));
    }
    Ok(Json(queued).into_response())
}

/// A background response's place in the store, until its run is attached.
pub(super) struct Admission<'a> {
    pub(super) state: &'a SharedState,
    pub(super) id: &'a str,
}

impl Drop for Admission<'_> {
    fn drop(&mut self) {
        self.state.responses.abandon(self.id);
    }
}

/// The SSE body of a foreground streamed response driven by `events`; stored at its end
/// (unless it failed) when `stored` holds its input items.
pub(super) fn stream_response(
    state: SharedState,
    responder: Responder,
    stored: Option<Vec<Value>>,
    events: BoxStream<'static, Step>,
) -> Response {
    let mut responder = responder;
    let opening = responder.opening();
    let body = stream::unfold((responder, events, stored), move |(mut r, mut events, mut stored)| {
        let state = Arc::clone(&state);
        async move {
            if r.done() {
                return None;
            }
            let out = match events.next().await {
                Some(e) => r.on_step(&state, e),
                None => r.on_end(state.prompts.tokenizer()),
            };
            if r.done() {
                let response = r.snapshot();
                if let Some(items) = stored.take().filter(|_| response.status != "failed") {
                    keep(&state, &response, items);
                }
            }
            Some((out, (r, events, stored)))
        }
    })
    .flat_map(stream::iter);
    let to_sse = |e: SeqEvent| sse::named_event(e.name, &e.data);
    sse::response(stream::iter(opening).chain(body).map(move |e| Ok(to_sse(e))))
}

/// The query of a retrieval: `stream` and `starting_after` (a background response's events);
/// `include` is accepted (what it could add is always there).
fn retrieval(query: Option<&str>) -> Result<(bool, Option<u64>), ApiError> {
    let (mut stream, mut after) = (false, None);
    for pair in query.unwrap_or_default().split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        match key {
            "stream" => {
                stream = match value {
                    "true" => true,
                    "false" => false,
                    _ => return Err(ApiError::invalid("stream", "stream must be true or false")),
                }
            }
            "starting_after" => {
                after = Some(value.parse::<u64>().map_err(|_| {
                    ApiError::invalid(
                        "starting_after",
                        format!(
                        "starting_after must be an event's sequence_number (a whole number), got `{value}`"
                    ),
                    )
                })?)
            }
            "include" | "include[]" | "include_obfuscation" => {}
            other => return Err(ApiError::invalid(other, format!("Unknown query parameter `{other}`."))),
        }
    }
    if after.is_some() && !stream {
        return Err(ApiError::invalid("starting_after", "starting_after needs stream=true"));
    }
    Ok((stream, after))
}

/// Retrieve a stored response: a background one as it stands (its output so far while it
/// runs), or, with `stream=true`, its events from `starting_after` on, following it live.
#[utoipa::path(
    get,
    path = "/v1/responses/{response_id}",
    tag = "openai",
    params(
        ("response_id" = String, Path, description = "The response's id"),
        ("stream" = Option<bool>, Query, description = "Stream a background response's events (replayed, then live)"),
        ("starting_after" = Option<u64>, Query, description = "With stream=true: the events after this sequence_number"),
    ),
    responses(
        (status = 200, description = "The stored response (or, with stream=true, an SSE stream of its events)", body = ResponseObject),
        (status = 400, description = "A bad query parameter, or stream=true for a response not run in the background", body = ErrorResponse),
        (status = 404, description = "No such stored response", body = ErrorResponse),
    ),
    security((), ("api_key" = []))
)]
pub async fn retrieve(
    State(state): State<SharedState>,
    PathParam(id): PathParam,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let (stream, after) = retrieval(query.as_deref())?;
    // A run can end between the look-up and the snapshot: it is then a finished entry.
    for _ in 0..2 {
        let (response, run) = match state.responses.find(&id).ok_or_else(|| not_found(&id))? {
            Found::Live(run) => match run.snapshot() {
                Some(response) => (response, Some(run)),
                None => continue,
            },
            Found::Done(entry, run) => (entry.response, run),
        };
        if !stream {
            return Ok(Json(response).into_response());
        }
        let run = run.ok_or_else(|| {
            ApiError::invalid("stream", format!("response '{id}' did not run in the background: its events were not kept; retrieve it without stream"))
        })?;
        return Ok(sse::response(run.follow(after)?.map(Ok)));
    }
    Err(not_found(&id))
}

/// Cancel a background response: it ends `cancelled`, with its output so far, and its engine
/// request is aborted. A response that has already ended is returned as it is.
#[utoipa::path(
    post,
    path = "/v1/responses/{response_id}/cancel",
    tag = "openai",
    params(("response_id" = String, Path, description = "The response's id")),
    responses(
        (status = 200, description = "The cancelled (or already finished) response", body = ResponseObject),
        (status = 400, description = "The response did not run in the background", body = ErrorResponse),
        (status = 404, description = "No such stored response", body = ErrorResponse),
    ),
    security((), ("api_key" = []))
)]
pub async fn cancel(
    State(state): State<SharedState>,
    PathParam(id): PathParam,
) -> Result<Json<ResponseObject>, ApiError> {
    for _ in 0..2 {
        match state.responses.find(&id).ok_or_else(|| not_found(&id))? {
            Found::Live(run) => match run.cancel(&state) {
                Some(response) => return Ok(Json(response)),
                // It ended meanwhile: answer as for a finished one.
                None => continue,
            },
            Found::Done(entry, _) if !entry.response.background => {
                return Err(ApiError::invalid(
                    "response_id",
                    format!("Response '{id}' was not created with `background: true`: only background responses can be cancelled."),
                ))
            }
            Found::Done(entry, _) => return Ok(Json(entry.response)),
        }
    }
    Err(not_found(&id))
}

/// Delete a stored response (a running background response is cancelled first).
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
    if let Some(Found::Live(run)) = state.responses.find(&id) {
        run.cancel(&state);
    }
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
    let mut items = state.responses.input_items(&id).ok_or_else(|| not_found(&id))?;
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

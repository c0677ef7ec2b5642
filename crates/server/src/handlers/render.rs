//! `POST /v1/chat/completions/render` and `POST /v1/completions/render` (vLLM's): the prompt a
//! request would run, as token ids, without running it. vllm-router's `cache_aware` and
//! `kv_aware` policies render each request on the workers and route on the ids; they are the
//! very ids generation runs, because both paths build the prompt with the same functions and
//! check the same parameters.

use axum::extract::State;
use axum::Json;

use super::chat::chat_turn;
use super::response_id;
use crate::error::ApiError;
use crate::extract::JsonBody;
use crate::openai::worker::{RenderedPrompt, RenderedSampling};
use crate::openai::{ChatCompletionRequest, CompletionRequest, ErrorResponse};
use crate::state::SharedState;
use crate::validate::{validate, GenerationParams};

fn rendered(
    prefix: &str,
    token_ids: Vec<u32>,
    params: &GenerationParams,
    model: &str,
    stream: Option<bool>,
    priority: Option<i64>,
) -> RenderedPrompt {
    RenderedPrompt {
        request_id: response_id(prefix),
        token_ids,
        features: None,
        sampling_params: RenderedSampling::of(params),
        model: model.to_owned(),
        stream: stream.unwrap_or(false),
        cache_salt: None,
        priority: priority.unwrap_or(0),
    }
}

/// The rendered conversation of a chat request (one `GenerateRequest`).
#[utoipa::path(post, path = "/v1/chat/completions/render", tag = "vllm", request_body = ChatCompletionRequest,
    responses((status = 200, body = RenderedPrompt), (status = 400, body = ErrorResponse),
              (status = 404, body = ErrorResponse)),
    security((), ("api_key" = [])))]
pub async fn render_chat(
    State(state): State<SharedState>,
    JsonBody(req): JsonBody<ChatCompletionRequest>,
) -> Result<Json<RenderedPrompt>, ApiError> {
    let (model, lora) = state.resolve_model(req.model.as_deref())?;
    let turn = chat_turn(&state, &req, lora)?;
    let params = validate(turn.params.clone(), &state.limits)?;
    let prompt = turn.render(&state).await?;
    Ok(Json(rendered(
        "chatcmpl",
        prompt.token_ids,
        &params,
        &model,
        req.openai.stream,
        req.extensions.priority,
    )))
}

/// The tokenized prompts of a completions request (one `GenerateRequest` per prompt).
#[utoipa::path(post, path = "/v1/completions/render", tag = "vllm", request_body = CompletionRequest,
    responses((status = 200, body = Vec<RenderedPrompt>), (status = 400, body = ErrorResponse),
              (status = 404, body = ErrorResponse)),
    security((), ("api_key" = [])))]
pub async fn render_completion(
    State(state): State<SharedState>,
    JsonBody(req): JsonBody<CompletionRequest>,
) -> Result<Json<Vec<RenderedPrompt>>, ApiError> {
    let (model, _) = state.resolve_model(req.model.as_deref())?;
    if req.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::invalid("suffix", "suffix is not supported"));
    }
    crate::openai::router_fields::check(&req.extensions.router_fields())?;
    req.extensions.grammar_fields().grammar()?;
    let params = validate(req.common(), &state.limits)?;
    let add_special_tokens = req.extensions.add_special_tokens.unwrap_or(true);
    let prompts = state.prompts.completion(req.prompt.clone().into_inputs(), add_special_tokens).await?;
    Ok(Json(
        prompts
            .into_iter()
            .map(|p| {
                rendered("cmpl", p.token_ids, &params, &model, req.openai.stream, req.extensions.priority)
            })
            .collect(),
    ))
}

//! `POST /tokenize` and `POST /detokenize` (vLLM's extensions).

use axum::extract::State;
use axum::Json;

use crate::error::ApiError;
use crate::extract::JsonBody;
use crate::openai::{
    DetokenizeRequest, DetokenizeResponse, ErrorResponse, TokenizeRequest, TokenizeResponse,
};
use crate::prompt::{chat_messages_with, ChatOptions};
use crate::state::SharedState;

/// Token ids of a prompt, or of a conversation rendered with the chat template.
#[utoipa::path(post, path = "/tokenize", tag = "vllm", request_body = TokenizeRequest,
    responses((status = 200, body = TokenizeResponse), (status = 400, body = ErrorResponse),
              (status = 404, body = ErrorResponse)),
    security((), ("api_key" = [])))]
pub async fn tokenize(
    State(state): State<SharedState>,
    JsonBody(req): JsonBody<TokenizeRequest>,
) -> Result<Json<TokenizeResponse>, ApiError> {
    state.resolve_model(req.model.as_deref())?;
    let tokens = match (req.prompt, req.messages) {
        (Some(prompt), None) => state.prompts.encode(prompt, req.add_special_tokens.unwrap_or(true)).await?,
        (None, Some(messages)) => {
            let mut images = state.media.collector();
            let messages = chat_messages_with(&messages, &mut images)?;
            let options = ChatOptions::of(
                &messages,
                req.add_generation_prompt,
                req.continue_final_message,
                req.add_special_tokens,
                req.chat_template_kwargs,
            )?;
            let images = images.into_images();
            crate::media::build::chat(&state.media, &state.prompts, messages, options, &images, None)
                .await?
                .token_ids
        }
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid("messages", "give either prompt or messages, not both"))
        }
        (None, None) => return Err(ApiError::invalid("prompt", "give prompt or messages")),
    };
    Ok(Json(TokenizeResponse { count: tokens.len(), max_model_len: state.limits.max_model_len, tokens }))
}

/// The text of token ids.
#[utoipa::path(post, path = "/detokenize", tag = "vllm", request_body = DetokenizeRequest,
    responses((status = 200, body = DetokenizeResponse), (status = 400, body = ErrorResponse),
              (status = 404, body = ErrorResponse)),
    security((), ("api_key" = [])))]
pub async fn detokenize(
    State(state): State<SharedState>,
    JsonBody(req): JsonBody<DetokenizeRequest>,
) -> Result<Json<DetokenizeResponse>, ApiError> {
    state.resolve_model(req.model.as_deref())?;
    let prompt = state.prompts.decode(req.tokens).await?;
    Ok(Json(DetokenizeResponse { prompt }))
}

//! `POST /v1/load_lora_adapter` and `POST /v1/unload_lora_adapter`: LoRA adapters loaded and
//! unloaded while serving, with `--allow-runtime-lora-updating` (404 otherwise). They answer
//! vLLM's plain-text success line.

use axum::extract::State;

use crate::error::ApiError;
use crate::extract::JsonBody;
use crate::openai::{ErrorResponse, LoadLoraAdapterRequest, UnloadLoraAdapterRequest};
use crate::state::SharedState;

/// Loads an adapter; it serves once this answers.
#[utoipa::path(post, path = "/v1/load_lora_adapter", tag = "vllm", request_body = LoadLoraAdapterRequest,
    responses((status = 200, body = String), (status = 400, body = ErrorResponse),
              (status = 404, body = ErrorResponse)),
    security((), ("api_key" = [])))]
pub async fn load(
    State(state): State<SharedState>,
    JsonBody(req): JsonBody<LoadLoraAdapterRequest>,
) -> Result<String, ApiError> {
    state.loras.load(&state.engine, &req.lora_name, &req.lora_path, &state.model.served_names).await?;
    Ok(format!("Success: LoRA adapter '{}' added successfully.", req.lora_name))
}

/// Unloads an adapter no request uses.
#[utoipa::path(post, path = "/v1/unload_lora_adapter", tag = "vllm", request_body = UnloadLoraAdapterRequest,
    responses((status = 200, body = String), (status = 400, body = ErrorResponse),
              (status = 404, body = ErrorResponse)),
    security((), ("api_key" = [])))]
pub async fn unload(
    State(state): State<SharedState>,
    JsonBody(req): JsonBody<UnloadLoraAdapterRequest>,
) -> Result<String, ApiError> {
    state.loras.unload(&state.engine, &req.lora_name, req.lora_int_id).await?;
    Ok(format!("Success: LoRA adapter '{}' removed successfully.", req.lora_name))
}

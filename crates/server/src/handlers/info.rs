//! `GET /v1/models`, `GET /health`, `GET /version` and `GET /metrics`.

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::error::ApiError;
use crate::extract::PathParam;
use crate::openai::{ErrorResponse, ModelCard, ModelList, VersionResponse};
use crate::state::SharedState;

/// The served model (under each of its names), with its context length.
#[utoipa::path(get, path = "/v1/models", tag = "openai",
    responses((status = 200, body = ModelList), (status = 401, body = ErrorResponse)),
    security((), ("api_key" = [])))]
pub async fn list_models(State(state): State<SharedState>) -> Json<ModelList> {
    let mut data: Vec<ModelCard> = state.model.served_names.iter().map(|name| card(&state, name)).collect();
    data.extend(state.loras.list().iter().map(|a| adapter_card(&state, a)));
    Json(ModelList { object: "list".to_owned(), data })
}

/// A LoRA adapter, its base model's first name as its `parent`.
fn adapter_card(state: &SharedState, adapter: &crate::lora::ServedAdapter) -> ModelCard {
    ModelCard {
        id: adapter.name.clone(),
        root: adapter.path.display().to_string(),
        parent: Some(state.model.served_names[0].clone()),
        ..card(state, &adapter.name)
    }
}

fn card(state: &SharedState, name: &str) -> ModelCard {
    ModelCard {
        id: name.to_owned(),
        object: "model".to_owned(),
        created: state.model.created,
        owned_by: "pagoda".to_owned(),
        root: state.model.root.clone(),
        parent: None,
        max_model_len: state.limits.max_model_len,
        architecture: state.model.architecture.clone(),
        context_length: state.model.context_length,
    }
}

/// One served model by any id `GET /v1/models` lists (ids may contain slashes, as hub ids do).
#[utoipa::path(get, path = "/v1/models/{model}", tag = "openai",
    params(("model" = String, Path, description = "A served model name")),
    responses((status = 200, body = ModelCard), (status = 404, body = ErrorResponse),
              (status = 401, body = ErrorResponse)),
    security((), ("api_key" = [])))]
pub async fn retrieve_model(
    State(state): State<SharedState>,
    PathParam(model): PathParam,
) -> Result<Json<ModelCard>, ApiError> {
    if let Some(adapter) = state.loras.get(&model) {
        return Ok(Json(adapter_card(&state, &adapter)));
    }
    match state.model.served_names.iter().find(|n| **n == model) {
        Some(name) => Ok(Json(card(&state, name))),
        None => Err(ApiError::ModelNotFound(model)),
    }
}

/// 200 while the engine runs, 503 once it has stopped.
#[utoipa::path(get, path = "/health", tag = "ops",
    responses((status = 200, description = "The engine is alive"),
              (status = 503, description = "The engine has stopped", body = ErrorResponse)))]
pub async fn health(State(state): State<SharedState>) -> Result<StatusCode, ApiError> {
    state.engine.health()?;
    Ok(StatusCode::OK)
}

/// The server's version.
#[utoipa::path(get, path = "/version", tag = "ops", responses((status = 200, body = VersionResponse)))]
pub async fn version() -> Json<VersionResponse> {
    Json(VersionResponse { version: env!("CARGO_PKG_VERSION").to_owned() })
}

/// Prometheus metrics (text exposition format).
#[utoipa::path(get, path = "/metrics", tag = "ops",
    responses((status = 200, description = "Prometheus text format", content_type = "text/plain", body = String)))]
pub async fn metrics(State(state): State<SharedState>) -> Response {
    state.refresh_engine_metrics();
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], state.metrics.render())
        .into_response()
}

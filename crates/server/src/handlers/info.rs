//! `GET /v1/models`, `GET /health`, `GET /version` and `GET /metrics`.

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::error::ApiError;
use crate::openai::{ErrorResponse, ModelCard, ModelList, VersionResponse};
use crate::state::SharedState;

/// The served model (under each of its names), with its context length.
#[utoipa::path(get, path = "/v1/models", tag = "openai",
    responses((status = 200, body = ModelList), (status = 401, body = ErrorResponse)),
    security((), ("api_key" = [])))]
pub async fn list_models(State(state): State<SharedState>) -> Json<ModelList> {
    let data = state
        .model
        .served_names
        .iter()
        .map(|name| ModelCard {
            id: name.clone(),
            object: "model".to_owned(),
            created: state.model.created,
            owned_by: "pagoda".to_owned(),
            root: state.model.root.clone(),
            max_model_len: state.limits.max_model_len,
        })
        .collect();
    Json(ModelList { object: "list".to_owned(), data })
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

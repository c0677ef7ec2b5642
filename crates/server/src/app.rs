//! The router: routes, the API-key guard on the API routes (and on `/server_info`, which names
//! the model's path and the process, and `/health_generate`, which generates), and the
//! cross-cutting layers (request ids, access log and HTTP metrics, CORS when configured, the
//! body limit). Unknown routes and methods answer in the OpenAI error shape too.

use std::sync::{Arc, LazyLock};

use axum::extract::DefaultBodyLimit;
use axum::extract::Request;
use axum::http::{Method, Uri};
use axum::middleware::{from_fn, from_fn_with_state};
use axum::response::Response;
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use tower::ServiceBuilder;
use tower_http::request_id::{PropagateRequestIdLayer, SetRequestIdLayer};

use crate::anthropic::error::{
    anthropic_errors, in_anthropic_shape, is_anthropic_route, ROUTES as ANTHROPIC_ROUTES,
};
use crate::auth::{require_api_key, ApiKey};
use crate::error::ApiError;
use crate::extract::BodyLimit;
use crate::handlers::{
    chat, completions, embeddings, info, lora, messages, render, responses, score, stats, tokenize, worker,
};
use crate::layers::{self, MakeId, X_REQUEST_ID};
use crate::state::SharedState;

/// HTTP-level settings.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct HttpOptions {
    /// Required as `Authorization: Bearer` on the API routes when set.
    pub api_key: Option<String>,
    /// CORS origins; `*` allows any; none: no CORS.
    pub allowed_origins: Vec<String>,
    /// CORS methods; `*` allows any; none: the default list.
    pub allowed_methods: Vec<String>,
    /// CORS request headers; `*` allows any; none: any.
    pub allowed_headers: Vec<String>,
    /// Serve `/health_generate` without the key.
    pub health_generate_without_key: bool,
    /// Largest accepted request body; larger ones get 413.
    pub max_request_body_bytes: usize,
    /// Serve the playground and the dashboard ([`crate::web_ui`]).
    pub web_ui: bool,
    /// Serve `/sleep`, `/wake_up` and `/is_sleeping` ([`crate::sleep`]).
    pub enable_sleep_mode: bool,
}

static OPENAPI: LazyLock<serde_json::Value> =
    LazyLock::new(|| serde_json::to_value(crate::openapi::document()).unwrap_or_default());

async fn openapi_json() -> Json<serde_json::Value> {
    Json(OPENAPI.clone())
}

async fn not_found(method: Method, uri: Uri, req: Request) -> Response {
    let error = ApiError::RouteNotFound { method: method.to_string(), path: uri.path().to_owned() };
    layers::reject_unread(req, error).await
}

async fn method_not_allowed(method: Method, uri: Uri, req: Request) -> Response {
    let error = ApiError::MethodNotAllowed { method: method.to_string(), path: uri.path().to_owned() };
    let response = layers::reject_unread(req, error).await;
    if is_anthropic_route(uri.path()) {
        in_anthropic_shape(response)
    } else {
        response
    }
}

pub fn router(state: SharedState, options: &HttpOptions) -> Router {
    router_with_batch(state, options, None)
}

/// [`router`] with the Files and Batch APIs served by `batch` (without it they answer 404).
pub fn router_with_batch(
    state: SharedState,
    options: &HttpOptions,
    batch: Option<Arc<crate::batch::BatchService>>,
) -> Router {
    let mut api = Router::new()
        .route("/v1/chat/completions", post(chat::chat_completions))
        .route("/v1/completions", post(completions::completions))
        .route("/v1/chat/completions/render", post(render::render_chat))
        .route("/v1/completions/render", post(render::render_completion))
        .route("/v1/embeddings", post(embeddings::embeddings))
        .route("/v1/score", post(score::score))
        .route("/v1/rerank", post(score::rerank))
        .route("/rerank", post(score::rerank))
        .route("/v2/rerank", post(score::rerank))
        .route("/v1/responses", post(responses::create))
        .route("/v1/responses/{response_id}", get(responses::retrieve).delete(responses::delete))
        .route("/v1/responses/{response_id}/input_items", get(responses::input_item_list))
        .route("/v1/responses/{response_id}/cancel", post(responses::cancel))
        .route("/v1/models", get(info::list_models))
        .route("/v1/models/{*model}", get(info::retrieve_model))
        .route("/v1/load_lora_adapter", post(lora::load))
        .route("/v1/unload_lora_adapter", post(lora::unload))
        .route("/tokenize", post(tokenize::tokenize))
        .route("/detokenize", post(tokenize::detokenize))
        .route("/flush_cache", post(worker::flush_cache).get(worker::flush_cache))
        .route("/reset_prefix_cache", post(worker::flush_cache))
        .merge(crate::batch::routes(batch));
    let [messages_route, count_tokens_route] = ANTHROPIC_ROUTES;
    let mut anthropic = Router::new()
        .route(messages_route, post(messages::messages))
        .route(count_tokens_route, post(messages::count_tokens));
    // /server_info names the model's path and the process; /health_generate runs the engine.
    let probe = Extension(Arc::new(worker::HealthProbe::default()));
    let health_generate = get(worker::health_generate).layer(probe);
    let mut keyed_worker = Router::new()
        .route("/server_info", get(worker::server_info))
        .route("/get_server_info", get(worker::server_info));
    if options.enable_sleep_mode {
        (api, anthropic, keyed_worker) = crate::sleep::mount(&state, api, anthropic, keyed_worker);
    }
    let mut open = Router::new();
    if options.health_generate_without_key {
        open = open.route("/health_generate", health_generate);
    } else {
        keyed_worker = keyed_worker.route("/health_generate", health_generate);
    }
    if let Some(key) = &options.api_key {
        api = api.route_layer(from_fn_with_state(ApiKey::new(key), require_api_key));
        anthropic = anthropic.route_layer(from_fn_with_state(ApiKey::new(key), require_api_key));
        keyed_worker = keyed_worker.route_layer(from_fn_with_state(ApiKey::new(key), require_api_key));
    }
    let api = api.merge(keyed_worker);
    // Outside the key check, so that its 401 is in Anthropic's shape too.
    let api = api.merge(anthropic.route_layer(from_fn(anthropic_errors)));
    // The hosted tools a request's parser left out, named in its answer's header.
    let api = api.route_layer(from_fn(crate::tools::hosted::report_ignored));
    let open = open
        .route("/health", get(info::health))
        .route("/ready", get(worker::ready))
        .route("/model_info", get(worker::model_info))
        .route("/get_model_info", get(worker::model_info))
        .route("/get_load", get(worker::get_load))
        .route("/kv_event_sources", get(worker::kv_event_sources))
        .route("/version", get(info::version))
        .route("/metrics", get(info::metrics))
        .route("/stats", get(stats::stats))
        .route("/openapi.json", get(openapi_json));
    let open = if options.web_ui { open.merge(crate::web_ui::routes()) } else { open };
    let metrics = state.metrics.clone();
    let cors = layers::cors(&options.allowed_origins, &options.allowed_methods, &options.allowed_headers);
    api.merge(open)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
        .layer(
            ServiceBuilder::new()
                .layer(from_fn(layers::sanitize_request_id))
                .layer(SetRequestIdLayer::new(X_REQUEST_ID.clone(), MakeId))
                .layer(PropagateRequestIdLayer::new(X_REQUEST_ID.clone()))
                .option_layer(cors)
                .layer(from_fn_with_state(metrics, layers::observe))
                .layer(Extension(BodyLimit(options.max_request_body_bytes)))
                .layer(DefaultBodyLimit::max(options.max_request_body_bytes)),
        )
}

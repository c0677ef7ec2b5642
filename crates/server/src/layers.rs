//! Cross-cutting HTTP layers: request ids (`x-request-id`, taken from the client or made up,
//! echoed in the response and put in every log line of the request), one access-log line per
//! request, HTTP request counts by route and status, and CORS.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::header::CONNECTION;
use axum::http::{HeaderName, HeaderValue, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tower_http::cors::{AllowHeaders, AllowMethods, AllowOrigin, CorsLayer};
use tower_http::request_id::{MakeRequestId, RequestId};
use tracing::Instrument;

use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::traces::{IncomingTrace, INCOMING_TRACE};

pub static X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Longest client-supplied request id kept as is; longer ones are replaced.
const MAX_CLIENT_REQUEST_ID: usize = 128;

/// Makes a fresh random id for requests that bring none (or an unusable one).
#[derive(Debug, Clone, Copy, Default)]
pub struct MakeId;

impl MakeRequestId for MakeId {
    fn make_request_id<B>(&mut self, _req: &axum::http::Request<B>) -> Option<RequestId> {
        let id = uuid::Uuid::new_v4().simple().to_string();
        HeaderValue::from_str(&id).ok().map(RequestId::new)
    }
}

/// Drops a client's `x-request-id` that is too long or not printable ASCII, so that
/// [`MakeId`] replaces it.
pub async fn sanitize_request_id(mut req: Request, next: Next) -> Response {
    let bad = req.headers().get(&X_REQUEST_ID).is_some_and(|v| {
        v.len() > MAX_CLIENT_REQUEST_ID || v.is_empty() || !v.as_bytes().iter().all(|b| b.is_ascii_graphic())
    });
    if bad {
        req.headers_mut().remove(&X_REQUEST_ID);
    }
    next.run(req).await
}

/// The request's id, as set by the request-id layer.
pub fn request_id_of<B>(req: &axum::http::Request<B>) -> String {
    req.headers().get(&X_REQUEST_ID).and_then(|v| v.to_str().ok()).unwrap_or("-").to_owned()
}

/// When the request reached the server (before its body was read); TTFT counts from here.
#[derive(Debug, Clone, Copy)]
pub struct Arrival(pub Instant);

/// Runs the request inside a span carrying its id, logs one line when the response head is
/// ready, and counts it by route template, method and status.
pub async fn observe(State(metrics): State<Arc<Metrics>>, mut req: Request, next: Next) -> Response {
    let started = Instant::now();
    req.extensions_mut().insert(Arrival(started));
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|m| m.as_str().to_owned())
        .unwrap_or_else(|| "unmatched".to_owned());
    let span = tracing::info_span!("request", id = %request_id_of(&req));
    let incoming = IncomingTrace::from_headers(req.headers(), request_id_of(&req));
    INCOMING_TRACE
        .scope(
            incoming,
            async move {
                let response = next.run(req).await;
                let status = response.status().as_u16();
                metrics.observe_http(&route, method.as_str(), status);
                let ms = started.elapsed().as_secs_f64() * 1e3;
                if route == "/health" || route == "/metrics" {
                    tracing::debug!(%method, path, status, ms, "http");
                } else {
                    tracing::info!(%method, path, status, ms, "http");
                }
                response
            }
            .instrument(span),
        )
        .await
}

/// Largest request body read and thrown away before an early rejection.
const DRAIN_LIMIT: usize = 64 * 1024;

/// `error` as a response to `req`, whose body no handler read. HTTP/1.1 can only reuse the
/// connection once the body is off it: a small body is read and dropped; for a larger one the
/// response says `connection: close`, so that no client sends its next request on a connection
/// the server is closing.
pub async fn reject_unread(req: Request, error: ApiError) -> Response {
    let drained = axum::body::to_bytes(req.into_body(), DRAIN_LIMIT).await.is_ok();
    let mut response = error.into_response();
    if !drained {
        response.headers_mut().insert(CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// CORS for `--allowed-origins`, `--allowed-methods` and `--allowed-headers` (`*` allows
/// any; no methods: GET, POST, DELETE, OPTIONS; no headers: any); `None` without origins, so that a browser page of another origin gets no CORS headers
/// and cannot read the answers (the web UI is served from the same origin and needs none).
pub fn cors(
    allowed_origins: &[String],
    allowed_methods: &[String],
    allowed_headers: &[String],
) -> Option<CorsLayer> {
    if allowed_origins.is_empty() {
        return None;
    }
    let origin = if allowed_origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        AllowOrigin::list(allowed_origins.iter().filter_map(|o| HeaderValue::from_str(o).ok()))
    };
    let methods = if allowed_methods.iter().any(|m| m == "*") {
        AllowMethods::any()
    } else if allowed_methods.is_empty() {
        AllowMethods::list([Method::GET, Method::POST, Method::DELETE, Method::OPTIONS])
    } else {
        AllowMethods::list(allowed_methods.iter().filter_map(|m| Method::from_bytes(m.as_bytes()).ok()))
    };
    let headers = if allowed_headers.is_empty() || allowed_headers.iter().any(|h| h == "*") {
        AllowHeaders::any()
    } else {
        AllowHeaders::list(allowed_headers.iter().filter_map(|h| HeaderName::from_bytes(h.as_bytes()).ok()))
    };
    Some(
        CorsLayer::new()
            .allow_origin(origin)
            .allow_methods(methods)
            .allow_headers(headers)
            .expose_headers([X_REQUEST_ID.clone(), crate::tools::hosted::IGNORED_TOOLS_HEADER.clone()]),
    )
}

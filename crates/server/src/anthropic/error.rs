//! Anthropic's error shape on the Messages routes. Every failure is still an [`ApiError`] with
//! the status [`ApiError::status`] gives; [`ApiError`]'s response carries the error itself, and
//! [`anthropic_errors`] re-renders such a response as `{"type": "error", "error": {"type",
//! "message"}}` with Anthropic's statuses (an unavailable engine is its 529 `overloaded_error`),
//! so that Anthropic's SDKs raise their typed exceptions.

use axum::extract::Request;
use axum::http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::wire::{AnthropicErrorDetail, AnthropicErrorResponse};
use crate::error::ApiError;

/// Anthropic's status for an overloaded service.
pub const OVERLOADED: u16 = 529;

/// Anthropic's status and error type for `error`.
pub fn status_and_type(error: &ApiError) -> (StatusCode, &'static str) {
    let status = error.status();
    match status.as_u16() {
        401 => (status, "authentication_error"),
        403 => (status, "permission_error"),
        404 => (status, "not_found_error"),
        413 => (status, "request_too_large"),
        429 => (status, "rate_limit_error"),
        503 => (StatusCode::from_u16(OVERLOADED).unwrap_or(status), "overloaded_error"),
        s if s >= 500 => (status, "api_error"),
        _ => (status, "invalid_request_error"),
    }
}

/// The Anthropic body of `error`.
pub fn body(error: &ApiError) -> AnthropicErrorResponse {
    let text = error.to_string();
    let message = match error.param() {
        // The parameter leads the sentence, as Anthropic writes it (`max_tokens: ...`).
        Some(param) if !text.contains(param) => format!("{param}: {text}"),
        _ => text,
    };
    AnthropicErrorResponse {
        r#type: "error".to_owned(),
        error: AnthropicErrorDetail { r#type: status_and_type(error).1.to_owned(), message },
    }
}

/// The Anthropic routes, whose errors (a wrong method's too) take Anthropic's shape.
pub const ROUTES: [&str; 2] = ["/v1/messages", "/v1/messages/count_tokens"];

/// Whether `path` is one of [`ROUTES`].
pub fn is_anthropic_route(path: &str) -> bool {
    ROUTES.contains(&path)
}

/// Middleware for the Anthropic routes: an error response is rendered in Anthropic's shape,
/// keeping its headers (`retry-after`).
pub async fn anthropic_errors(req: Request, next: Next) -> Response {
    in_anthropic_shape(next.run(req).await)
}

/// `response` with its error, if it carries one, in Anthropic's shape and status.
pub fn in_anthropic_shape(response: Response) -> Response {
    let Some(error) = response.extensions().get::<ApiError>().cloned() else { return response };
    let (mut parts, _) = response.into_parts();
    let (status, _) = status_and_type(&error);
    let mut rendered = (status, axum::Json(body(&error))).into_response();
    parts.headers.remove(CONTENT_LENGTH);
    parts.headers.remove(CONTENT_TYPE);
    let headers = rendered.headers_mut();
    for (name, value) in parts.headers.iter() {
        headers.insert(name.clone(), value.clone());
    }
    rendered
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_and_types_follow_anthropic() {
        let cases = [
            (ApiError::invalid("max_tokens", "too many"), 400, "invalid_request_error"),
            (ApiError::Unauthorized, 401, "authentication_error"),
            (ApiError::ModelNotFound("m".into()), 404, "not_found_error"),
            (ApiError::PayloadTooLarge { limit: 1 }, 413, "request_too_large"),
            (ApiError::QueueFull("full".into()), 429, "rate_limit_error"),
            (ApiError::EngineUnavailable("gone".into()), 529, "overloaded_error"),
            (ApiError::ShuttingDown, 529, "overloaded_error"),
            (ApiError::Internal("bug".into()), 500, "api_error"),
        ];
        for (error, status, ty) in cases {
            assert_eq!(status_and_type(&error), (StatusCode::from_u16(status).unwrap(), ty), "{error:?}");
            assert_eq!(body(&error).error.r#type, ty);
        }
        let b = body(&ApiError::invalid("messages[0].content[0]", "`image` blocks are not supported"));
        assert_eq!(b.r#type, "error");
        assert!(b.error.message.starts_with("messages[0].content[0]: "), "{}", b.error.message);
    }

    #[tokio::test]
    async fn error_responses_are_rewritten_and_keep_their_headers() {
        use axum::routing::get;
        let app = axum::Router::new()
            .route("/full", get(|| async { ApiError::QueueFull("full".into()) }))
            .route("/ok", get(|| async { "fine" }))
            .layer(axum::middleware::from_fn(anthropic_errors));
        let call = |path: &'static str| {
            let app = app.clone();
            async move {
                let req = axum::http::Request::get(path).body(axum::body::Body::empty()).unwrap();
                tower::ServiceExt::oneshot(app, req).await.unwrap()
            }
        };
        let resp = call("/full").await;
        assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(resp.headers()["retry-after"], "1");
        let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX).await.unwrap();
        let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(v["type"], "error");
        assert_eq!(v["error"]["type"], "rate_limit_error");
        let resp = call("/ok").await;
        assert_eq!(resp.status(), StatusCode::OK);
    }
}

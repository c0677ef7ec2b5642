//! Every failure a client can see, and the one place where it becomes an HTTP status and the
//! OpenAI error shape `{"error": {"message", "type", "param", "code"}}`.
//!
//! Handlers, extractors and middleware return [`ApiError`]; nothing else builds an error body.
//! A failure in the middle of a stream uses the same body ([`ApiError::body`]) inside an SSE event.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use pagoda_engine::{EngineError, RequestError};

use crate::openai::{ErrorDetail, ErrorResponse};

/// A request parameter that is missing, of the wrong type or out of range.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct InvalidParam {
    /// The parameter's name as the client spelled it (`temperature`, `messages[1].content`), or
    /// `None` when the whole body is at fault.
    pub param: Option<String>,
    pub message: String,
}

impl InvalidParam {
    pub fn new(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self { param: Some(param.into()), message: message.into() }
    }
}

/// Why a request failed, as the client learns it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ApiError {
    /// The body is not JSON at all.
    #[error("Malformed JSON in the request body: {0}")]
    MalformedJson(String),
    /// A parameter has the wrong type or an out-of-range value.
    #[error(transparent)]
    InvalidParam(#[from] InvalidParam),
    /// The prompt and the requested completion do not fit in the model's context.
    #[error(
        "This model's maximum context length is {max_model_len} tokens. However, you requested \
         {} tokens ({prompt_tokens} in the prompt, {max_tokens} in the completion). Please reduce \
         the length of the prompt or of max_tokens.",
        prompt_tokens + max_tokens
    )]
    ContextLengthExceeded { prompt_tokens: usize, max_tokens: usize, max_model_len: usize },
    /// The prompt alone fills the model's context, leaving no room for a single output token.
    #[error(
        "This model's maximum context length is {max_model_len} tokens. However, the prompt is \
         {prompt_tokens} tokens long, which leaves no room for a completion."
    )]
    PromptTooLong { prompt_tokens: usize, max_model_len: usize, param: &'static str },
    /// A prompt text refused while it was being tokenized: it is certainly over the context.
    #[error(
        "This model's maximum context length is {max_model_len} tokens. However, the prompt \
         ({bytes} bytes of text) is at least {at_least_tokens} tokens long."
    )]
    PromptTextTooLong { bytes: usize, at_least_tokens: usize, max_model_len: usize, param: &'static str },
    #[error("The model `{0}` does not exist.")]
    ModelNotFound(String),
    /// A stored response (Responses API) that does not exist or is no longer stored.
    #[error("{message}")]
    ResponseNotFound { message: String, param: Option<&'static str> },
    #[error("Invalid or missing API key. Pass it as `Authorization: Bearer <key>` (or `x-api-key: <key>`).")]
    Unauthorized,
    #[error("The request body is larger than the limit of {limit} bytes.")]
    PayloadTooLarge { limit: usize },
    #[error("No route for {method} {path}.")]
    RouteNotFound { method: String, path: String },
    /// An endpoint the server's flags leave off.
    #[error("{0}")]
    EndpointOff(String),
    #[error("Method {method} is not allowed on {path}.")]
    MethodNotAllowed { method: String, path: String },
    /// The request is fine but the server's state forbids it now (a prefix-cache flush while
    /// requests are in flight); it succeeds later.
    #[error("{0}")]
    Conflict(String),
    /// Admission refused the request: the waiting queue is full.
    #[error("The server is at capacity ({0}). Retry later.")]
    QueueFull(String),
    /// The engine has stopped or failed; nothing can be served.
    #[error("The engine is not available: {0}")]
    EngineUnavailable(String),
    /// The server is draining for shutdown and takes no new requests.
    #[error("The server is shutting down.")]
    ShuttingDown,
    /// A bug or an unexpected failure inside the server.
    #[error("Internal server error: {0}")]
    Internal(String),
}

impl ApiError {
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> Self {
        InvalidParam::new(param, message).into()
    }

    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::MalformedJson(_)
            | ApiError::InvalidParam(_)
            | ApiError::ContextLengthExceeded { .. }
            | ApiError::PromptTooLong { .. }
            | ApiError::PromptTextTooLong { .. } => StatusCode::BAD_REQUEST,
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::ModelNotFound(_)
            | ApiError::ResponseNotFound { .. }
            | ApiError::RouteNotFound { .. }
            | ApiError::EndpointOff(_) => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::Conflict(_) => StatusCode::CONFLICT,
            ApiError::QueueFull(_) => StatusCode::TOO_MANY_REQUESTS,
            ApiError::EngineUnavailable(_) | ApiError::ShuttingDown => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// OpenAI's `type` field.
    pub fn error_type(&self) -> &'static str {
        match self.status() {
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
            StatusCode::SERVICE_UNAVAILABLE => "service_unavailable_error",
            s if s.is_server_error() => "server_error",
            _ => "invalid_request_error",
        }
    }

    /// OpenAI's machine-readable `code` field.
    pub fn code(&self) -> &'static str {
        match self {
            ApiError::MalformedJson(_) => "invalid_json",
            ApiError::InvalidParam(_) => "invalid_value",
            ApiError::ContextLengthExceeded { .. }
            | ApiError::PromptTooLong { .. }
            | ApiError::PromptTextTooLong { .. } => "context_length_exceeded",
            ApiError::ModelNotFound(_) => "model_not_found",
            ApiError::ResponseNotFound { .. } => "response_not_found",
            ApiError::Unauthorized => "invalid_api_key",
            ApiError::PayloadTooLarge { .. } => "request_too_large",
            ApiError::RouteNotFound { .. } | ApiError::EndpointOff(_) => "not_found",
            ApiError::MethodNotAllowed { .. } => "method_not_allowed",
            ApiError::Conflict(_) => "conflict",
            ApiError::QueueFull(_) => "queue_full",
            ApiError::EngineUnavailable(_) => "engine_unavailable",
            ApiError::ShuttingDown => "shutting_down",
            ApiError::Internal(_) => "internal_error",
        }
    }

    /// The same error naming `prompt` where it names the chat prompt as `messages`: a prompt
    /// rendered from another API's field (the Responses API's `input`).
    pub fn naming_prompt(self, prompt: &'static str) -> Self {
        match self {
            ApiError::PromptTextTooLong { bytes, at_least_tokens, max_model_len, param: "messages" } => {
                ApiError::PromptTextTooLong { bytes, at_least_tokens, max_model_len, param: prompt }
            }
            ApiError::InvalidParam(InvalidParam { param: Some(p), message }) if p == "messages" => {
                ApiError::InvalidParam(InvalidParam { param: Some(prompt.to_owned()), message })
            }
            other => other,
        }
    }

    /// OpenAI's `param` field: which request parameter is at fault.
    pub fn param(&self) -> Option<&str> {
        match self {
            ApiError::InvalidParam(p) => p.param.as_deref(),
            ApiError::ContextLengthExceeded { .. } => Some("max_tokens"),
            ApiError::PromptTooLong { param, .. } | ApiError::PromptTextTooLong { param, .. } => Some(param),
            ApiError::ModelNotFound(_) => Some("model"),
            ApiError::ResponseNotFound { param, .. } => *param,
            _ => None,
        }
    }

    /// The OpenAI error body, for a response or an SSE `data:` event.
    pub fn body(&self) -> ErrorResponse {
        ErrorResponse {
            error: ErrorDetail {
                message: self.to_string(),
                r#type: self.error_type().to_owned(),
                param: self.param().map(str::to_owned),
                code: Some(self.code().to_owned()),
            },
        }
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::Overloaded { max_waiting } => {
                ApiError::QueueFull(format!("the queue of {max_waiting} waiting sequences is full"))
            }
            e @ EngineError::NeverFits { .. } => ApiError::invalid("n", e.to_string()),
            EngineError::InvalidRequest(r) => r.into(),
            EngineError::ShuttingDown => ApiError::ShuttingDown,
            EngineError::Dead(why) => ApiError::EngineUnavailable(why),
            e @ EngineError::Asleep => ApiError::EngineUnavailable(e.to_string()),
            e @ (EngineError::Config(_) | EngineError::Spawn(_)) => ApiError::Internal(e.to_string()),
        }
    }
}

impl From<pagoda_engine::FlushError> for ApiError {
    fn from(e: pagoda_engine::FlushError) -> Self {
        match e {
            pagoda_engine::FlushError::Busy(busy) => ApiError::Conflict(busy.to_string()),
            pagoda_engine::FlushError::Engine(e) => e.into(),
        }
    }
}

impl From<RequestError> for ApiError {
    fn from(e: RequestError) -> Self {
        match e {
            RequestError::PromptTooLong { prompt_len, max_model_len } => {
                ApiError::PromptTooLong { prompt_tokens: prompt_len, max_model_len, param: "prompt" }
            }
            RequestError::TooLong { prompt_len, max_tokens, max_model_len } => {
                ApiError::ContextLengthExceeded { prompt_tokens: prompt_len, max_tokens, max_model_len }
            }
            e @ RequestError::EmptyPrompt => ApiError::invalid("prompt", e.to_string()),
            e @ RequestError::ZeroMaxTokens => ApiError::invalid("max_tokens", e.to_string()),
            e @ RequestError::MinTokensAboveMax { .. } => ApiError::invalid("min_tokens", e.to_string()),
            e @ (RequestError::ZeroSamples | RequestError::TooManySamples { .. }) => {
                ApiError::invalid("n", e.to_string())
            }
            e @ (RequestError::NoSpeculation { .. } | RequestError::NoDraft) => {
                ApiError::invalid("speculative_method", e.to_string())
            }
            e @ RequestError::KvHoldSamples => ApiError::invalid("n", e.to_string()),
            e @ RequestError::BeamWidth { .. } => ApiError::invalid("best_of", e.to_string()),
            e @ RequestError::BeamTooLarge { .. } => ApiError::invalid("max_tokens", e.to_string()),
            RequestError::BeamUnsupported { what } => {
                let message = RequestError::BeamUnsupported { what }.to_string();
                let param = match what {
                    "grammar" => "response_format",
                    "stop strings" => "stop",
                    "a non-finite length_penalty" => "length_penalty",
                    field => field,
                };
                ApiError::invalid(param, message)
            }
            e @ RequestError::PoolingTooLong { .. } => ApiError::invalid("input", e.to_string()),
            e @ (RequestError::PoolingGenerates { .. } | RequestError::SecondSegmentOutside { .. }) => {
                ApiError::invalid("input", e.to_string())
            }
            RequestError::Sampling(s) => ApiError::invalid(s.name, s.to_string()),
            // The server builds images' placeholders itself; this is a model without an encoder.
            e @ RequestError::Image(_) => ApiError::invalid("messages", e.to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        if status.is_server_error() {
            tracing::warn!(status = status.as_u16(), error = %self, "request failed");
        } else {
            tracing::debug!(status = status.as_u16(), error = %self, "request rejected");
        }
        let mut response = (status, axum::Json(self.body())).into_response();
        // Kept so that another API's routes can render the same error in their own shape
        // (`crate::anthropic::error`).
        response.extensions_mut().insert(self.clone());
        if let ApiError::Unauthorized = self {
            response
                .headers_mut()
                .insert(axum::http::header::WWW_AUTHENTICATE, axum::http::HeaderValue::from_static("Bearer"));
        }
        if matches!(self, ApiError::QueueFull(_) | ApiError::ShuttingDown | ApiError::EngineUnavailable(_)) {
            response
                .headers_mut()
                .insert(axum::http::header::RETRY_AFTER, axum::http::HeaderValue::from_static("1"));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chat_prompt_rendered_for_another_api_names_its_field() {
        let long =
            ApiError::PromptTextTooLong { bytes: 9, at_least_tokens: 9, max_model_len: 8, param: "messages" };
        assert_eq!(long.naming_prompt("input").param(), Some("input"));
        assert_eq!(ApiError::invalid("messages", "bad").naming_prompt("input").param(), Some("input"));
        // Other parameters keep their names.
        assert_eq!(
            ApiError::invalid("messages[0]", "bad").naming_prompt("input").param(),
            Some("messages[0]")
        );
        assert_eq!(ApiError::invalid("tools", "bad").naming_prompt("input").param(), Some("tools"));
    }

    #[test]
    fn statuses_and_types() {
        let cases = [
            (ApiError::MalformedJson("eof".into()), 400, "invalid_request_error", "invalid_json"),
            (ApiError::invalid("temperature", "too hot"), 400, "invalid_request_error", "invalid_value"),
            (ApiError::ModelNotFound("gpt-9".into()), 404, "invalid_request_error", "model_not_found"),
            (ApiError::Unauthorized, 401, "authentication_error", "invalid_api_key"),
            (ApiError::PayloadTooLarge { limit: 10 }, 413, "invalid_request_error", "request_too_large"),
            (ApiError::QueueFull("8 waiting".into()), 429, "rate_limit_error", "queue_full"),
            (
                ApiError::EngineUnavailable("dead".into()),
                503,
                "service_unavailable_error",
                "engine_unavailable",
            ),
            (ApiError::ShuttingDown, 503, "service_unavailable_error", "shutting_down"),
            (ApiError::Internal("bug".into()), 500, "server_error", "internal_error"),
        ];
        for (err, status, ty, code) in cases {
            assert_eq!(err.status().as_u16(), status, "{err:?}");
            let body = err.body();
            assert_eq!(body.error.r#type, ty, "{err:?}");
            assert_eq!(body.error.code.as_deref(), Some(code), "{err:?}");
        }
    }

    #[test]
    fn engine_errors_map_to_429_503_and_400() {
        assert_eq!(
            ApiError::from(EngineError::Overloaded { max_waiting: 4 }).status(),
            StatusCode::TOO_MANY_REQUESTS
        );
        assert_eq!(
            ApiError::from(EngineError::Dead("boom".into())).status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(ApiError::from(EngineError::ShuttingDown).status(), StatusCode::SERVICE_UNAVAILABLE);
        let too_long = RequestError::TooLong { prompt_len: 10, max_tokens: 100, max_model_len: 50 };
        assert_eq!(
            ApiError::from(EngineError::InvalidRequest(too_long)),
            ApiError::ContextLengthExceeded { prompt_tokens: 10, max_tokens: 100, max_model_len: 50 }
        );
        let n = ApiError::from(RequestError::TooManySamples { n: 9, max_num_seqs: 4 });
        assert_eq!((n.status(), n.param()), (StatusCode::BAD_REQUEST, Some("n")));
    }

    #[test]
    fn context_length_message_names_both_numbers() {
        let err =
            ApiError::ContextLengthExceeded { prompt_tokens: 100, max_tokens: 8000, max_model_len: 8092 };
        let msg = err.to_string();
        assert!(
            msg.contains("8092") && msg.contains("100") && msg.contains("8000") && msg.contains("8100"),
            "{msg}"
        );
        assert_eq!(err.param(), Some("max_tokens"));
        assert_eq!(err.status(), StatusCode::BAD_REQUEST);
    }

    #[test]
    fn body_serializes_to_the_openai_shape() {
        let err = ApiError::invalid("top_p", "top_p must be in (0, 1], got 2");
        let json = serde_json::to_value(err.body()).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"error": {
                "message": "top_p must be in (0, 1], got 2",
                "type": "invalid_request_error",
                "param": "top_p",
                "code": "invalid_value"
            }})
        );
        // `param` is present (as null) even when no parameter is at fault.
        let json = serde_json::to_value(ApiError::Unauthorized.body()).unwrap();
        assert!(json["error"].as_object().unwrap().contains_key("param"));
        assert!(json["error"]["param"].is_null());
    }

    #[test]
    fn into_response_sets_status_and_headers() {
        let resp = ApiError::Unauthorized.into_response();
        assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
        assert!(resp.headers().contains_key("www-authenticate"));
        let resp = ApiError::QueueFull("full".into()).into_response();
        assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(resp.headers()["retry-after"], "1");
    }
}

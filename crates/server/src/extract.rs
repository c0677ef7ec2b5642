//! The JSON body extractor. It reads the body under the size limit (over it: 413), parses it
//! whatever the `Content-Type` (so `curl -d` works), and turns a serde failure into a 400 that
//! names the parameter at fault (`temperature`, `messages[0].role`). A top-level field the
//! request type does not know is a 400 naming it (see [`crate::openai::fields`]).

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Path, Request};
use axum::http::request::Parts;
use axum::http::StatusCode;
use serde::de::DeserializeOwned;

use crate::error::{ApiError, InvalidParam};
use crate::openai::fields::{error_position, top_level_keys, KnownFields, PathError};

/// A request body parsed as `T`; rejections are [`ApiError`]s.
#[derive(Debug, Clone)]
pub struct JsonBody<T>(pub T);

/// One path parameter as a string; a parameter that is not valid UTF-8 once decoded (`%ff`) is
/// a 400 in the API's error shape, not axum's plain-text rejection.
#[derive(Debug, Clone)]
pub struct PathParam(pub String);

impl<S: Send + Sync> FromRequestParts<S> for PathParam {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match Path::<String>::from_request_parts(parts, state).await {
            Ok(Path(value)) => Ok(PathParam(value)),
            Err(rejection) => Err(ApiError::InvalidParam(InvalidParam {
                param: None,
                message: format!("Invalid URL: {}", rejection.body_text()),
            })),
        }
    }
}

/// The body limit, stored in request extensions by the router so that the 413 message can say it.
#[derive(Debug, Clone, Copy)]
pub struct BodyLimit(pub usize);

impl<S: Send + Sync, T: DeserializeOwned + KnownFields> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let limit = req.extensions().get::<BodyLimit>().map(|l| l.0).unwrap_or(0);
        let bytes = Bytes::from_request(req, state).await.map_err(|rejection| {
            if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::PayloadTooLarge { limit }
            } else {
                ApiError::MalformedJson(rejection.body_text())
            }
        })?;
        parse(&bytes).map(JsonBody)
    }
}

/// Parses `bytes` as `T`, mapping errors to the client's terms; unknown top-level fields are
/// refused.
pub fn parse<T: DeserializeOwned + KnownFields>(bytes: &[u8]) -> Result<T, ApiError> {
    // serde would fill a struct from an array by position: only an object is a request.
    match bytes.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'{') | None => {}
        Some(_) if serde_json::from_slice::<serde::de::IgnoredAny>(bytes).is_ok() => {
            return Err(ApiError::InvalidParam(InvalidParam {
                param: None,
                message: "The request body must be a JSON object.".into(),
            }));
        }
        Some(_) => {}
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|err| {
        let err = first_in_body(err, || T::flattened_error(bytes));
        let path = err.path().to_string();
        let inner = err.into_inner();
        if inner.is_data() {
            let param = (path != ".").then_some(path);
            let message = match &param {
                Some(p) => format!("Invalid value for `{p}`: {inner}"),
                None => format!("Invalid request body: {inner}"),
            };
            ApiError::InvalidParam(InvalidParam { param, message })
        } else {
            ApiError::MalformedJson(inner.to_string())
        }
    })?;
    de.end().map_err(|e| ApiError::MalformedJson(e.to_string()))?;
    T::check_keys(&top_level_keys(bytes))?;
    Ok(value)
}

/// Of the whole parse's error and the one parsing the type's flattened parts alone, the one
/// earlier in the body: the error a parse without flatten would have stopped at, with its path
/// (flatten reports a bad flattened value at the object's end, without one).
fn first_in_body(err: PathError, flattened: impl FnOnce() -> Option<PathError>) -> PathError {
    match flattened() {
        Some(flat) if error_position(&flat) < error_position(&err) => flat,
        _ => err,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::openai::{ChatCompletionRequest, CompletionRequest};

    fn param(json: &str) -> Option<String> {
        match parse::<ChatCompletionRequest>(json.as_bytes()).unwrap_err() {
            ApiError::InvalidParam(p) => p.param,
            other => panic!("expected InvalidParam, got {other:?}"),
        }
    }

    #[test]
    fn malformed_json_is_its_own_error() {
        for body in ["", "{", "{\"messages\": [}", "not json", "{\"messages\":[]} trailing"] {
            assert!(
                matches!(parse::<ChatCompletionRequest>(body.as_bytes()), Err(ApiError::MalformedJson(_))),
                "{body:?}"
            );
        }
    }

    #[test]
    fn wrong_types_name_the_parameter() {
        assert_eq!(param(r#"{"messages":[],"temperature":"hot"}"#).as_deref(), Some("temperature"));
        assert_eq!(param(r#"{"messages":[],"max_tokens":-1}"#).as_deref(), Some("max_tokens"));
        assert_eq!(param(r#"{"messages":[],"n":1.5}"#).as_deref(), Some("n"));
        assert_eq!(
            param(r#"{"messages":[{"role":"user","content":7}]}"#).as_deref(),
            Some("messages[0].content")
        );
        assert_eq!(param(r#"{"messages":[{"content":"x"}]}"#).as_deref(), Some("messages[0]"));
        assert_eq!(param(r#"{"messages":"hi"}"#).as_deref(), Some("messages"));
        assert_eq!(param(r#"{"messages":[],"stop":5}"#).as_deref(), Some("stop"));
        assert_eq!(param(r#"{"messages":[],"logit_bias":{"5":"x"}}"#).as_deref(), Some("logit_bias.5"));
    }

    #[test]
    fn wrong_types_in_flattened_extensions_name_the_parameter() {
        assert_eq!(param(r#"{"messages":[],"top_k":"x"}"#).as_deref(), Some("top_k"));
        assert_eq!(param(r#"{"messages":[],"stop_token_ids":[-1]}"#).as_deref(), Some("stop_token_ids[0]"));
        assert_eq!(param(r#"{"messages":[],"guided_choice":"a"}"#).as_deref(), Some("guided_choice"));
        // The first bad value in the body is the one named, flattened or not, and before a
        // missing field.
        assert_eq!(param(r#"{"messages":[],"top_k":"x","n":1.5}"#).as_deref(), Some("top_k"));
        assert_eq!(param(r#"{"messages":[],"n":1.5,"top_k":"x"}"#).as_deref(), Some("n"));
        assert_eq!(param(r#"{"top_k":"x"}"#).as_deref(), Some("top_k"));
        let err = parse::<CompletionRequest>(br#"{"prompt":"a","priority":"high"}"#).unwrap_err();
        let text = err.to_string();
        assert!(
            text.starts_with(
                "Invalid value for `priority`: invalid type: string \"high\", expected i64 at line 1"
            ),
            "{text}"
        );
        // A bad value before a syntax error is still named, as without flatten.
        assert_eq!(param(r#"{"top_k":"x","messages":[}"#).as_deref(), Some("top_k"));
    }

    #[test]
    fn missing_required_field_is_a_400() {
        let err = parse::<ChatCompletionRequest>(b"{}").unwrap_err();
        assert_eq!(err.status(), StatusCode::BAD_REQUEST);
        assert!(err.to_string().contains("messages"), "{err}");
        let err = parse::<CompletionRequest>(b"{\"model\":\"m\"}").unwrap_err();
        assert!(err.to_string().contains("prompt"), "{err}");
        let err = parse::<CompletionRequest>(b"[1,2]").unwrap_err();
        assert_eq!(err.status(), StatusCode::BAD_REQUEST);
    }

    #[test]
    fn nulls_mean_absent() {
        let r: ChatCompletionRequest =
            parse(br#"{"messages":[],"temperature":null,"stop":null,"n":null,"seed":null}"#).unwrap();
        assert_eq!(r.openai.temperature, None);
        assert_eq!(r.openai.n, None);
    }

    #[test]
    fn only_an_object_is_a_request() {
        for body in [r#"["m","The capital of France is"]"#, "[1,2]", " 5", "\"x\"", "null"] {
            let err = parse::<CompletionRequest>(body.as_bytes()).unwrap_err();
            assert_eq!(err.status(), StatusCode::BAD_REQUEST, "{body}");
            assert!(err.to_string().contains("JSON object"), "{body}: {err}");
        }
    }

    #[test]
    fn unknown_top_level_fields_are_refused_by_name() {
        assert_eq!(param(r#"{"messages":[],"max_token":5}"#).as_deref(), Some("max_token"));
        assert_eq!(param(r#"{"messages":[],"guided_jsn":{}}"#).as_deref(), Some("guided_jsn"));
        let ok: ChatCompletionRequest = parse(br#"{"messages":[],"user":"u","metadata":{"a":"b"}}"#).unwrap();
        assert_eq!(ok.openai.user.as_deref(), Some("u"));
        let err = parse::<CompletionRequest>(br#"{"prompt":"x","echo_":true}"#).unwrap_err();
        assert_eq!(err.param(), Some("echo_"));
    }

    #[test]
    fn model_is_a_string_and_messages_are_objects() {
        assert_eq!(param(r#"{"model":null,"messages":[]}"#).as_deref(), Some("model"));
        assert_eq!(param(r#"{"model":5,"messages":[]}"#).as_deref(), Some("model"));
        assert_eq!(param(r#"{"messages":[["user","hi"]]}"#).as_deref(), Some("messages[0]"));
        let err = parse::<CompletionRequest>(br#"{"model":null,"prompt":"x"}"#).unwrap_err();
        assert_eq!(err.param(), Some("model"));
        let ok: ChatCompletionRequest =
            parse(br#"{"model":"m","messages":[{"role":"user","content":"x"}]}"#).unwrap();
        assert_eq!((ok.model.as_deref(), ok.messages.len()), (Some("m"), 1));
    }

    #[test]
    fn deep_nesting_does_not_overflow() {
        let body = format!("{{\"messages\":{}{}}}", "[".repeat(100_000), "]".repeat(100_000));
        assert!(parse::<ChatCompletionRequest>(body.as_bytes()).is_err());
    }
}

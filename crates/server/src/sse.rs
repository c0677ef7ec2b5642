//! Server-sent events in OpenAI's dialect: each event is `data: <json>`, the stream ends with
//! `data: [DONE]`, and a failure mid-stream is one `data: {"error": ...}` event before the end.

use std::convert::Infallible;

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::Stream;
use serde::Serialize;

use crate::error::ApiError;

/// One `data: {json}` event.
pub fn json_event<T: Serialize>(value: &T) -> Event {
    match serde_json::to_string(value) {
        Ok(json) => Event::default().data(json),
        Err(e) => error_event(&ApiError::Internal(format!("serializing a chunk failed: {e}"))),
    }
}

/// `data: {"error": {...}}`.
pub fn error_event(error: &ApiError) -> Event {
    let body = serde_json::to_string(&error.body()).unwrap_or_else(|_| "{\"error\":{}}".to_owned());
    Event::default().data(body)
}

/// `data: [DONE]`.
pub fn done_event() -> Event {
    Event::default().data("[DONE]")
}

/// `event: <name>` with `data: <json>`, as Anthropic's and the Responses API's streams send
/// every event.
pub fn named_event<T: Serialize>(name: &str, value: &T) -> Event {
    json_event(value).event(name)
}

/// The SSE response around a stream of events. Comment-only keep-alives every 15 s keep idle
/// proxies from closing a long prefill.
pub fn response<S>(events: S) -> Response
where
    S: Stream<Item = Result<Event, Infallible>> + Send + 'static,
{
    Sse::new(events).keep_alive(KeepAlive::default()).into_response()
}

/// Like [`response`], with `keep_alive` as the event sent while nothing else is (Anthropic's
/// `ping`).
pub fn response_with_keep_alive<S>(events: S, keep_alive: Event) -> Response
where
    S: Stream<Item = Result<Event, Infallible>> + Send + 'static,
{
    Sse::new(events).keep_alive(KeepAlive::new().event(keep_alive)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn render(events: Vec<Event>) -> String {
        let stream = futures_util::stream::iter(events.into_iter().map(Ok::<_, Infallible>));
        let body = response(stream).into_body();
        let bytes = axum::body::to_bytes(body, usize::MAX).await.unwrap();
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    #[tokio::test]
    async fn events_are_data_lines() {
        let text = render(vec![
            json_event(&serde_json::json!({"a": "x\ny"})),
            error_event(&ApiError::QueueFull("full".into())),
            done_event(),
        ])
        .await;
        let data: Vec<&str> = text.lines().filter(|l| !l.is_empty()).collect();
        assert_eq!(data[0], r#"data: {"a":"x\ny"}"#);
        assert!(data[1].starts_with(r#"data: {"error":{"message":"#), "{}", data[1]);
        assert_eq!(data[2], "data: [DONE]");
        assert_eq!(data.len(), 3);
    }
}

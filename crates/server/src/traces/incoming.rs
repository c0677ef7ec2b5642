//! The trace context an HTTP request brings: a W3C `traceparent` (and `tracestate`) header,
//! read once by the request layer and kept in a task-local for the handler, so that the
//! request's span becomes a child of the client's without every handler passing headers down.

use axum::http::HeaderMap;
use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::{SpanContext, TraceContextExt};
use opentelemetry_sdk::propagation::TraceContextPropagator;

tokio::task_local! {
    /// The trace context of the HTTP request whose handler is running.
    pub static INCOMING_TRACE: IncomingTrace;
}

/// What a request's span needs from its HTTP request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct IncomingTrace {
    /// The client's span, when `traceparent` named a valid one.
    pub parent: Option<SpanContext>,
    /// The request's `x-request-id`.
    pub request_id: String,
}

impl IncomingTrace {
    /// Reads `traceparent`/`tracestate` from `headers`; a missing or malformed header gives no
    /// parent (the span then starts a trace of its own, as the W3C spec asks).
    pub fn from_headers(headers: &HeaderMap, request_id: String) -> Self {
        let cx = TraceContextPropagator::new().extract(&Headers(headers));
        let span = cx.span();
        let context = span.span_context();
        let parent = context.is_valid().then(|| context.clone());
        Self { parent, request_id }
    }

    /// The running handler's, or none outside one (a request made inside the server).
    pub fn current() -> Self {
        INCOMING_TRACE.try_with(Clone::clone).unwrap_or_default()
    }
}

struct Headers<'a>(&'a HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(traceparent: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("traceparent", traceparent.parse().unwrap());
        h
    }

    #[test]
    fn a_valid_traceparent_is_the_parent() {
        let t = IncomingTrace::from_headers(
            &headers("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
            "r1".into(),
        );
        let parent = t.parent.expect("parent");
        assert_eq!(parent.trace_id().to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(parent.span_id().to_string(), "00f067aa0ba902b7");
        assert!(parent.is_sampled() && parent.is_remote());
        assert_eq!(t.request_id, "r1");
    }

    #[test]
    fn malformed_or_missing_traceparents_give_no_parent() {
        for bad in [
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "zz-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "garbage",
        ] {
            assert_eq!(IncomingTrace::from_headers(&headers(bad), "r".into()).parent, None, "{bad}");
        }
        assert_eq!(IncomingTrace::from_headers(&HeaderMap::new(), "r".into()).parent, None);
    }

    #[tokio::test]
    async fn the_task_local_is_seen_inside_its_scope_only() {
        let t = IncomingTrace { parent: None, request_id: "inside".into() };
        let seen = INCOMING_TRACE.scope(t, async { IncomingTrace::current().request_id }).await;
        assert_eq!(seen, "inside");
        assert_eq!(IncomingTrace::current().request_id, "");
    }
}

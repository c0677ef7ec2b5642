//! An embedding answer as the load generator times it: not streamed, so it arrives whole.

use std::time::Instant;

use serde_json::Value;

use crate::client::Outcome;
use crate::sse::clip;

/// The outcome of an embedding answer that arrived whole at `end`: one embedding of numbers
/// (or base64) is a success, timed to its arrival.
pub(crate) fn embedding_outcome(reply: &Value, start: Instant, end: Instant) -> Outcome {
    let latency = end.saturating_duration_since(start);
    let embedding = &reply["data"][0]["embedding"];
    let ok = embedding.as_array().is_some_and(|v| !v.is_empty())
        || embedding.as_str().is_some_and(|s| !s.is_empty());
    Outcome {
        error: (!ok).then(|| format!("no embedding in the answer: {}", clip(&reply.to_string()))),
        ttft: ok.then_some(latency),
        latency,
        prompt_tokens: reply["usage"]["prompt_tokens"].as_u64().map(|n| n as usize),
        completion_tokens: Some(0),
        finish_reason: Some("stop".into()),
        ..Outcome::default()
    }
}

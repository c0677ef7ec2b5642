//! What a request's stream carries back: [`TokenEvent`]s, why a sample finished
//! ([`FinishReason`]), token [`Usage`] and per-request timestamps and metrics.

use std::time::{Duration, Instant};

use crate::executor::TopLogprobs;
use crate::request::RequestId;

/// Which stop condition ended a sample.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopReason {
    /// The model's end-of-sequence token (this id).
    Eos(u32),
    /// One of the request's stop token ids (this one).
    StopTokenId(u32),
    /// One of the request's stop strings (this one); it is not part of the output text.
    StopString(String),
    /// The structured-output grammar is complete: nothing but end-of-sequence could follow.
    GrammarComplete,
    /// A pooling request's input was computed whole; the event carries its pooled state.
    Pooled,
}

/// Why a sample ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinishReason {
    Stop(StopReason),
    /// `max_tokens` or the model's context length was reached.
    Length,
    /// The caller aborted the request (or went away) or the engine shut down.
    Abort,
    /// The engine could not finish the request (a fault of the server, not of the request).
    Error(String),
    /// The model cannot run this request as given (the executor rejected its input); the
    /// message is meant for the client. Other requests are not affected.
    Rejected(String),
}

impl FinishReason {
    /// The OpenAI `finish_reason` string.
    pub fn as_str(&self) -> &'static str {
        match self {
            FinishReason::Stop(_) => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
            FinishReason::Error(_) | FinishReason::Rejected(_) => "error",
        }
    }

    /// Whether the request failed rather than finished (an error or a rejection).
    pub fn is_failure(&self) -> bool {
        matches!(self, FinishReason::Error(_) | FinishReason::Rejected(_))
    }
}

/// Token counts of a whole request (all samples).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: usize,
    /// Generated tokens over all samples, stop and eos tokens included.
    pub completion_tokens: usize,
    /// Prompt tokens whose KV came from the prefix cache when the request was first scheduled.
    pub cached_prompt_tokens: usize,
}

/// Milestones of one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestTimestamps {
    pub arrival: Instant,
    /// First step that computed any of its tokens.
    pub first_scheduled: Option<Instant>,
    /// First generated token of any sample.
    pub first_token: Option<Instant>,
    /// When the last sample finished.
    pub finished: Option<Instant>,
}

impl RequestTimestamps {
    pub fn new(arrival: Instant) -> Self {
        Self { arrival, first_scheduled: None, first_token: None, finished: None }
    }

    /// Time spent waiting before the first step.
    pub fn queue_time(&self) -> Option<Duration> {
        self.first_scheduled.map(|t| t.saturating_duration_since(self.arrival))
    }

    /// Time to first token.
    pub fn ttft(&self) -> Option<Duration> {
        self.first_token.map(|t| t.saturating_duration_since(self.arrival))
    }

    /// Arrival to finish.
    pub fn e2e(&self) -> Option<Duration> {
        self.finished.map(|t| t.saturating_duration_since(self.arrival))
    }
}

/// One update of one sample of a request.
///
/// Every request's stream ends with exactly one event whose `usage` is `Some`; by then every
/// sample has had an event with `finished: Some`.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenEvent {
    /// Which of the request's `n` samples this is about.
    pub index: usize,
    /// Newly generated ids (eos and stop ids included).
    pub token_ids: Vec<u32>,
    /// Newly released text; may lag the ids (incomplete characters, possible stop-string prefixes).
    pub text: String,
    /// One entry per id in `token_ids`, when the request asked for logprobs.
    pub logprobs: Option<Vec<TopLogprobs>>,
    /// A pooling request's one result (its embedding), on its finishing event.
    pub pooled: Option<Vec<f32>>,
    /// With `prompt_logprobs` asked for: the logprob of every prompt token after the first
    /// (entry `i` for token `i + 1`), on the request's first event that carries tokens.
    pub prompt_logprobs: Option<Vec<TopLogprobs>>,
    /// Set on the sample's last event.
    pub finished: Option<FinishReason>,
    /// Set on the request's last event only.
    pub usage: Option<Usage>,
    /// Set on the request's last event only.
    pub timestamps: Option<RequestTimestamps>,
}

impl TokenEvent {
    /// An event that only finishes sample `index`.
    pub fn finish(index: usize, reason: FinishReason) -> Self {
        Self {
            index,
            token_ids: Vec::new(),
            text: String::new(),
            logprobs: None,
            pooled: None,
            prompt_logprobs: None,
            finished: Some(reason),
            usage: None,
            timestamps: None,
        }
    }

    /// Whether this is the request's last event.
    pub fn is_last(&self) -> bool {
        self.usage.is_some()
    }
}

/// Summary of a finished request, for metrics.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestMetrics {
    pub request_id: RequestId,
    pub usage: Usage,
    pub timestamps: RequestTimestamps,
    /// Finish reason of each sample, by index.
    pub finish_reasons: Vec<FinishReason>,
    /// How often any of its sequences was preempted.
    pub num_preemptions: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finish_reasons_map_to_openai_strings() {
        assert_eq!(FinishReason::Stop(StopReason::Eos(2)).as_str(), "stop");
        assert_eq!(FinishReason::Stop(StopReason::StopString("x".into())).as_str(), "stop");
        assert_eq!(FinishReason::Length.as_str(), "length");
        assert_eq!(FinishReason::Abort.as_str(), "abort");
        assert_eq!(FinishReason::Error("e".into()).as_str(), "error");
    }

    #[test]
    fn durations_are_measured_from_arrival() {
        let t0 = Instant::now();
        let mut ts = RequestTimestamps::new(t0);
        assert_eq!((ts.queue_time(), ts.ttft(), ts.e2e()), (None, None, None));
        ts.first_scheduled = Some(t0 + Duration::from_millis(5));
        ts.first_token = Some(t0 + Duration::from_millis(20));
        ts.finished = Some(t0 + Duration::from_millis(50));
        assert_eq!(ts.queue_time(), Some(Duration::from_millis(5)));
        assert_eq!(ts.ttft(), Some(Duration::from_millis(20)));
        assert_eq!(ts.e2e(), Some(Duration::from_millis(50)));
    }

    #[test]
    fn only_the_event_with_usage_is_last() {
        let mut e = TokenEvent::finish(1, FinishReason::Length);
        assert!(!e.is_last());
        e.usage = Some(Usage::default());
        assert!(e.is_last());
    }
}

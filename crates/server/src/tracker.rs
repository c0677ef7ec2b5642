//! Per-request metric observations. A [`RequestTracker`] lives as long as the request's event
//! stream: it observes time to first token (from arrival at the server), inter-token latency
//! and token counts as events pass, the request's phases when it ends, and, if it is dropped
//! before the end (the client went away), counts the request as aborted.

use std::sync::Arc;
use std::time::{Duration, Instant};

use pagoda_engine::{FinishReason, RequestTimestamps, TokenEvent};

use crate::metrics::{Metrics, RequestRecord};
use crate::traces::{RequestSpan, RequestTimeline};

#[derive(Debug)]
pub struct RequestTracker {
    metrics: Arc<Metrics>,
    arrival: Instant,
    prompt_tokens: usize,
    generation_tokens: usize,
    first_token: Option<Instant>,
    /// Time of the last token of each sample.
    last_token: Vec<Option<Instant>>,
    /// The worst finish reason seen so far (abort over length over stop).
    finished_reason: &'static str,
    done: bool,
    /// Its OpenTelemetry span, ended with the request (`--otlp-traces-endpoint`).
    span: Option<RequestSpan>,
}

fn rank(reason: &str) -> u8 {
    match reason {
        "stop" => 0,
        "length" => 1,
        _ => 2,
    }
}

impl RequestTracker {
    /// Starts tracking an admitted request; counts its prompt tokens.
    pub fn new(metrics: Arc<Metrics>, arrival: Instant, prompt_tokens: usize, n: usize) -> Self {
        metrics.observe_prompt(prompt_tokens);
        Self {
            metrics,
            arrival,
            prompt_tokens,
            generation_tokens: 0,
            first_token: None,
            last_token: vec![None; n],
            finished_reason: "stop",
            done: false,
            span: None,
        }
    }

    /// Ends `span` when the request ends.
    pub fn with_span(mut self, span: Option<RequestSpan>) -> Self {
        self.span = span;
        self
    }

    /// Observes one event of the request's stream.
    pub fn observe(&mut self, event: &TokenEvent) {
        if !event.token_ids.is_empty() {
            let now = Instant::now();
            if self.first_token.is_none() {
                self.first_token = Some(now);
                self.metrics.observe_first_token(now.saturating_duration_since(self.arrival));
            }
            if event.index >= self.last_token.len() {
                self.last_token.resize(event.index + 1, None);
            }
            let previous = self.last_token[event.index].replace(now);
            for i in 0..event.token_ids.len() {
                // Tokens delivered together arrived together: only the first has a gap.
                let gap = if i == 0 {
                    previous.map(|p| now.saturating_duration_since(p))
                } else {
                    Some(Duration::ZERO)
                };
                self.metrics.observe_token(gap);
            }
            self.generation_tokens += event.token_ids.len();
        }
        if let Some(reason) = &event.finished {
            let reason = match reason {
                FinishReason::Error(_) | FinishReason::Rejected(_) => "abort",
                other => other.as_str(),
            };
            if rank(reason) > rank(self.finished_reason) {
                self.finished_reason = reason;
            }
        }
        if event.is_last() {
            self.finish(event.timestamps);
        }
    }

    fn finish(&mut self, timestamps: Option<RequestTimestamps>) {
        if self.done {
            return;
        }
        self.done = true;
        let now = Instant::now();
        let ts = timestamps.unwrap_or_else(|| RequestTimestamps::new(self.arrival));
        let first_token = ts.first_token.or(self.first_token);
        let end = ts.finished.unwrap_or(now);
        self.metrics.observe_request(&RequestRecord {
            prompt_tokens: self.prompt_tokens,
            generation_tokens: self.generation_tokens,
            finished_reason: self.finished_reason,
            e2e: now.saturating_duration_since(self.arrival),
            queue: ts.first_scheduled.map(|s| s.saturating_duration_since(self.arrival)),
            prefill: match (ts.first_scheduled, first_token) {
                (Some(s), Some(f)) => Some(f.saturating_duration_since(s)),
                _ => None,
            },
            decode: first_token.map(|f| end.saturating_duration_since(f)),
        });
        if let Some(span) = self.span.take() {
            span.finish(&RequestTimeline {
                first_scheduled: ts.first_scheduled,
                first_token,
                finished: end,
                completion_tokens: self.generation_tokens,
            });
        }
    }
}

impl Drop for RequestTracker {
    fn drop(&mut self) {
        if !self.done {
            self.finished_reason = "abort";
            self.finish(None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::MetricsPrefix;
    use pagoda_engine::{StopReason, Usage};

    fn event(index: usize, tokens: &[u32], finished: Option<FinishReason>, last: bool) -> TokenEvent {
        TokenEvent {
            index,
            token_ids: tokens.to_vec(),
            text: String::new(),
            logprobs: None,
            pooled: None,
            prompt_logprobs: None,
            finished,
            usage: last.then(Usage::default),
            timestamps: None,
        }
    }

    fn value(text: &str, line_start: &str) -> f64 {
        text.lines()
            .find(|l| l.starts_with(line_start))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(f64::NAN)
    }

    #[test]
    fn counts_tokens_and_success() {
        let m = Arc::new(Metrics::new(MetricsPrefix::Pagoda, "m", 100).unwrap());
        let mut t = RequestTracker::new(m.clone(), Instant::now(), 7, 2);
        t.observe(&event(0, &[1], None, false));
        t.observe(&event(1, &[2, 3], None, false));
        t.observe(&event(0, &[4], Some(FinishReason::Stop(StopReason::Eos(4))), false));
        t.observe(&event(1, &[], Some(FinishReason::Length), true));
        drop(t);
        let text = m.render();
        assert_eq!(value(&text, "pagoda:prompt_tokens_total"), 7.0);
        assert_eq!(value(&text, "pagoda:generation_tokens_total"), 4.0);
        assert_eq!(value(&text, "pagoda:request_success_total{finished_reason=\"length\""), 1.0);
        assert_eq!(value(&text, "pagoda:time_to_first_token_seconds_count"), 1.0);
        // Two gaps: sample 0's second event and sample 1's second token.
        assert_eq!(value(&text, "pagoda:inter_token_latency_seconds_count"), 2.0);
        assert_eq!(value(&text, "pagoda:e2e_request_latency_seconds_count"), 1.0);
    }

    #[test]
    fn dropped_early_counts_as_abort() {
        let m = Arc::new(Metrics::new(MetricsPrefix::Pagoda, "m", 100).unwrap());
        let mut t = RequestTracker::new(m.clone(), Instant::now(), 3, 1);
        t.observe(&event(0, &[1], None, false));
        drop(t);
        let text = m.render();
        assert_eq!(value(&text, "pagoda:request_success_total{finished_reason=\"abort\""), 1.0);
    }
}

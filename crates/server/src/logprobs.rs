//! Engine logprobs ([`TopLogprobs`], token ids) in OpenAI's two formats: chat's list of
//! `{token, logprob, bytes, top_logprobs}` and the legacy completions' parallel arrays.

use std::collections::HashMap;

use pagoda_engine::TopLogprobs;
use pagoda_text::Tokenizer;

use crate::openai::{ChatLogprobs, ChatTokenLogprob, ChatTopLogprob, CompletionLogprobs};

/// JSON has no infinities: a `-inf` logprob (a token that cannot be drawn) is sent as the
/// lowest finite value, as OpenAI's `-9999.0` convention does.
fn finite(logprob: f32) -> f32 {
    if logprob.is_finite() {
        logprob
    } else if logprob.is_nan() {
        0.0
    } else {
        -9999.0
    }
}

/// Chat logprobs of consecutive output tokens.
pub fn chat(tokenizer: &Tokenizer, entries: &[TopLogprobs]) -> ChatLogprobs {
    let content = entries
        .iter()
        .map(|e| {
            let id = e.sampled.token_id;
            ChatTokenLogprob {
                token: tokenizer.token_text(id),
                logprob: finite(e.sampled.logprob),
                bytes: tokenizer.token_bytes(id).unwrap_or_default(),
                top_logprobs: e
                    .top
                    .iter()
                    .map(|t| ChatTopLogprob {
                        token: tokenizer.token_text(t.token_id),
                        logprob: finite(t.logprob),
                        bytes: tokenizer.token_bytes(t.token_id).unwrap_or_default(),
                    })
                    .collect(),
            }
        })
        .collect();
    ChatLogprobs { content }
}

/// Builds completions logprobs; `text_offset` counts from the start of the choice's text.
#[derive(Debug, Clone, Default)]
pub struct CompletionLogprobsBuilder {
    offset: usize,
}

impl CompletionLogprobsBuilder {
    /// Offsets start after `prefix_len` bytes of text (the echoed prompt).
    pub fn new(prefix_len: usize) -> Self {
        Self { offset: prefix_len }
    }

    pub fn push(&mut self, tokenizer: &Tokenizer, entries: &[TopLogprobs]) -> CompletionLogprobs {
        let mut out = CompletionLogprobs::default();
        for e in entries {
            let token = tokenizer.token_text(e.sampled.token_id);
            out.text_offset.push(self.offset);
            self.offset += token.len();
            out.token_logprobs.push(Some(finite(e.sampled.logprob)));
            let mut top: HashMap<String, f32> = HashMap::with_capacity(e.top.len() + 1);
            for t in &e.top {
                top.entry(tokenizer.token_text(t.token_id)).or_insert(finite(t.logprob));
            }
            out.top_logprobs.push(Some(top));
            out.tokens.push(token);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_finite_logprobs_become_json_numbers() {
        assert_eq!(finite(-1.5), -1.5);
        assert_eq!(finite(f32::NEG_INFINITY), -9999.0);
        assert_eq!(finite(f32::NAN), 0.0);
    }
}

//! Engine logprobs ([`TopLogprobs`], token ids) in OpenAI's two formats: chat's list of
//! `{token, logprob, bytes, top_logprobs}` and the legacy completions' parallel arrays.

use std::collections::{BTreeMap, HashMap};

use pagoda_engine::TopLogprobs;
use pagoda_text::Tokenizer;

use crate::openai::{
    ChatLogprobs, ChatTokenLogprob, ChatTopLogprob, CompletionLogprobs, PromptLogprob, PromptLogprobs,
};

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

/// Builds completions logprobs; `text_offset` counts characters (as OpenAI does) from the start
/// of the choice's text.
#[derive(Debug, Clone, Default)]
pub struct CompletionLogprobsBuilder {
    /// Characters of the text before the next token.
    offset: usize,
    /// Bytes of a character that the tokens so far have only begun.
    partial: Vec<u8>,
}

impl CompletionLogprobsBuilder {
    /// Offsets start after `prefix`'s characters (the echoed prompt).
    pub fn new(prefix: &str) -> Self {
        Self { offset: prefix.chars().count(), partial: Vec::new() }
    }

    /// Advances the offset over one token's bytes: a character split across tokens counts once,
    /// at the token that completes it; bytes that can never be valid count as one U+FFFD each.
    fn advance(&mut self, bytes: &[u8]) {
        self.partial.extend_from_slice(bytes);
        let mut rest = self.partial.as_slice();
        loop {
            match std::str::from_utf8(rest) {
                Ok(text) => {
                    self.offset += text.chars().count();
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (valid, after) = rest.split_at(e.valid_up_to());
                    // Checked valid just above.
                    self.offset += std::str::from_utf8(valid).map_or(0, |t| t.chars().count());
                    match e.error_len() {
                        Some(bad) => {
                            self.offset += 1;
                            rest = &after[bad..];
                        }
                        // An incomplete character: wait for the next token's bytes.
                        None => {
                            rest = after;
                            break;
                        }
                    }
                }
            }
        }
        self.partial = rest.to_vec();
    }

    /// The echoed prompt's tokens: the first with no logprob (nothing predicts it), then each
    /// scored one (`scored[i]` for `prompt_ids[i + 1]`).
    pub fn push_prompt(
        &mut self,
        tokenizer: &Tokenizer,
        prompt_ids: &[u32],
        scored: &[TopLogprobs],
    ) -> CompletionLogprobs {
        let mut out = CompletionLogprobs::default();
        if let Some(&first) = prompt_ids.first() {
            out.text_offset.push(self.offset);
            self.advance(&tokenizer.token_bytes(first).unwrap_or_default());
            out.token_logprobs.push(None);
            out.top_logprobs.push(None);
            out.tokens.push(tokenizer.token_text(first));
        }
        out.append(self.push(tokenizer, scored));
        out
    }

    pub fn push(&mut self, tokenizer: &Tokenizer, entries: &[TopLogprobs]) -> CompletionLogprobs {
        let mut out = CompletionLogprobs::default();
        for e in entries {
            let id = e.sampled.token_id;
            out.text_offset.push(self.offset);
            self.advance(&tokenizer.token_bytes(id).unwrap_or_default());
            out.token_logprobs.push(Some(finite(e.sampled.logprob)));
            out.top_logprobs.push(Some(top_map(tokenizer, e)));
            out.tokens.push(tokenizer.token_text(id));
        }
        out
    }
}

/// vLLM's `prompt_logprobs`: `None` for the first prompt token, then per scored token a map from
/// token id to its logprob, rank and text, holding the prompt token and the alternatives.
pub fn prompt_logprobs(tokenizer: &Tokenizer, scored: &[TopLogprobs]) -> PromptLogprobs {
    let entry = |id: u32, logprob: f32, rank: Option<usize>| {
        (
            id.to_string(),
            PromptLogprob { logprob: finite(logprob), rank, decoded_token: tokenizer.token_text(id) },
        )
    };
    std::iter::once(None)
        .chain(scored.iter().map(|e| {
            let mut map: BTreeMap<String, PromptLogprob> =
                e.top.iter().enumerate().map(|(i, t)| entry(t.token_id, t.logprob, Some(i + 1))).collect();
            let rank = e.top.iter().position(|t| t.token_id == e.sampled.token_id).map(|i| i + 1);
            let (id, logprob) = entry(e.sampled.token_id, e.sampled.logprob, rank);
            map.insert(id, logprob);
            Some(map)
        }))
        .collect()
}

/// Alternatives keyed by their text. Distinct tokens can show the same text (two byte tokens
/// that are each half a character both show U+FFFD): the most likely keeps the text and the
/// others are keyed `token_id:ID` (vLLM's spelling), so that no alternative is lost.
fn top_map(tokenizer: &Tokenizer, entry: &TopLogprobs) -> HashMap<String, f32> {
    let mut top: HashMap<String, f32> = HashMap::with_capacity(entry.top.len());
    for t in &entry.top {
        let text = tokenizer.token_text(t.token_id);
        let key = if top.contains_key(&text) { format!("token_id:{}", t.token_id) } else { text };
        top.insert(key, finite(t.logprob));
    }
    top
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

    #[test]
    fn alternatives_that_render_alike_are_kept_apart() {
        let model = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
        let tok = Tokenizer::from_gguf(&model).expect("run `make model` first");
        // Bytes 0xE8 and 0xAA (è and ª in the byte-level alphabet) each begin or continue a
        // character: both render as U+FFFD.
        let (a, b) = (tok.token_to_id("è").unwrap(), tok.token_to_id("ª").unwrap());
        assert_eq!(tok.token_text(a), tok.token_text(b));
        let lp = |token_id, logprob| pagoda_engine::TokenLogprob { token_id, logprob };
        let entry = TopLogprobs { sampled: lp(a, -0.5), top: vec![lp(a, -0.5), lp(b, -1.0)] };
        let top = top_map(&tok, &entry);
        assert_eq!(top.len(), 2, "{top:?}");
        assert_eq!(top[&tok.token_text(a)], -0.5);
        assert_eq!(top[&format!("token_id:{b}")], -1.0);
    }

    #[test]
    fn offsets_count_characters_and_split_characters_once() {
        let mut b = CompletionLogprobsBuilder::new("né ");
        assert_eq!(b.offset, 3);
        b.advance("日本".as_bytes());
        assert_eq!(b.offset, 5);
        // 語 (three bytes) arriving in two tokens counts once, when complete.
        let yu = "語".as_bytes();
        b.advance(&yu[..2]);
        assert_eq!(b.offset, 5);
        b.advance(&yu[2..]);
        assert_eq!(b.offset, 6);
        // A byte that can never start a character is one replacement character.
        b.advance(&[0xFF, b'a']);
        assert_eq!(b.offset, 8);
    }
}

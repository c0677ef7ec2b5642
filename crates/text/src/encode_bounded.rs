//! Tokenizing text that may be far longer than any context, in memory bounded by the token
//! limit rather than by the text's size.
//!
//! A hostile prompt of megabytes would become millions of tokens (and a hundred bytes of
//! tokenizer state per token) before any length check could refuse it. [`Tokenizer::encode_bounded`]
//! first counts tokens piece by piece, stopping as soon as the count is certainly over the limit,
//! and only tokenizes the whole text (for exact ids) when it is not.
//!
//! Where a long text is cut rather than refused (an embedding input cut to the model's limit),
//! [`Tokenizer::encode_truncated_bounded`] tokenizes a prefix a little longer than what is kept,
//! not the whole text.

use crate::tokenizer::{Tokenizer, TokenizerError};

/// Bytes per piece when counting.
const PIECE_BYTES: usize = 16 * 1024;

/// How far past a piece's nominal end to look for whitespace to cut at.
const CUT_LOOKAHEAD: usize = 256;

/// Tokens one cut may add or remove compared with tokenizing the text whole (merges across the
/// cut, whitespace runs split differently).
const SLACK_PER_CUT: usize = 4;

/// Why [`Tokenizer::encode_bounded`] produced no ids.
#[derive(Debug, thiserror::Error)]
pub enum BoundedEncodeError {
    /// The text has more than `limit` tokens (counted up to `at_least` before stopping).
    #[error("the text has more than {limit} tokens (at least {at_least} in its first {counted_bytes} of {total_bytes} bytes)")]
    TooManyTokens { limit: usize, at_least: usize, counted_bytes: usize, total_bytes: usize },
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
}

impl Tokenizer {
    /// Token ids of `text` as [`encode`](Tokenizer::encode) gives them, or
    /// [`BoundedEncodeError::TooManyTokens`] when there are more than `limit`; the work and
    /// memory spent on a text over the limit are O(`limit`), whatever its size.
    pub fn encode_bounded(
        &self,
        text: &str,
        add_special_tokens: bool,
        limit: usize,
    ) -> Result<Vec<u32>, BoundedEncodeError> {
        if text.len() > PIECE_BYTES {
            let mut counted = 0;
            let mut cuts = 0;
            let mut rest = text;
            while !rest.is_empty() {
                let piece = &rest[..cut_point(rest, PIECE_BYTES)];
                counted += self.encode(piece, add_special_tokens && cuts == 0)?.len();
                rest = &rest[piece.len()..];
                if !rest.is_empty() {
                    cuts += 1;
                }
                // Every cut may have added a few tokens; past the limit even without them, the
                // whole text cannot fit.
                // Saturating: a limit of `usize::MAX` (a count with no limit) must not wrap.
                if counted > limit.saturating_add(cuts * SLACK_PER_CUT) {
                    return Err(BoundedEncodeError::TooManyTokens {
                        limit,
                        at_least: counted.saturating_sub(cuts * SLACK_PER_CUT),
                        counted_bytes: text.len() - rest.len(),
                        total_bytes: text.len(),
                    });
                }
            }
        }
        let ids = self.encode(text, add_special_tokens)?;
        if ids.len() > limit {
            return Err(BoundedEncodeError::TooManyTokens {
                limit,
                at_least: ids.len(),
                counted_bytes: text.len(),
                total_bytes: text.len(),
            });
        }
        Ok(ids)
    }
}

/// Tokens a prefix must have past the `max_len` kept, so that the cut's effect on the last
/// tokens (a word cut in two, merges across the cut) never reaches the kept ones.
const PREFIX_SLACK_TOKENS: usize = 16;

/// Bytes per token of the first prefix tried: above what ordinary text takes (about 4), so that
/// one try is the rule; a denser text grows the prefix.
const PREFIX_BYTES_PER_TOKEN: usize = 8;

impl Tokenizer {
    /// [`encode_truncated`](Tokenizer::encode_truncated) of `text` (at most `max_len` ids,
    /// special tokens included; whether anything was cut), tokenizing only a prefix: one cut at
    /// whitespace where there is some, with at least [`PREFIX_SLACK_TOKENS`] tokens more than
    /// are kept (the prefix grows fourfold until it has them or is the whole text). The
    /// pre-tokenizer splits at whitespace, so the kept ids are those of the whole text; the work
    /// and memory are O(`max_len`) for ordinary text, whatever its size.
    pub fn encode_truncated_bounded(
        &self,
        text: &str,
        max_len: usize,
    ) -> Result<(Vec<u32>, bool), TokenizerError> {
        let wanted = max_len.saturating_add(PREFIX_SLACK_TOKENS);
        let mut prefix_bytes = wanted.saturating_mul(PREFIX_BYTES_PER_TOKEN);
        loop {
            let end = cut_point(text, prefix_bytes);
            if end >= text.len() {
                return self.encode_truncated(text, max_len);
            }
            let prefix = &text[..end];
            if self.encode(prefix, false)?.len() >= wanted {
                // The whole text has at least as many tokens as the prefix, less the slack: it
                // is cut too.
                return self.encode_truncated(prefix, max_len).map(|(ids, _)| (ids, true));
            }
            prefix_bytes = prefix_bytes.saturating_mul(4);
        }
    }
}

/// Where to end a piece of about `target` bytes of `text`: just before whitespace when there is
/// some shortly after `target`, else at the next char boundary.
fn cut_point(text: &str, target: usize) -> usize {
    if text.len() <= target {
        return text.len();
    }
    let window_end = (target + CUT_LOOKAHEAD).min(text.len());
    let bytes = text.as_bytes();
    if let Some(offset) = bytes[target..window_end].iter().position(|b| b.is_ascii_whitespace()) {
        // ASCII whitespace is always a char boundary.
        return target + offset;
    }
    (target..=text.len()).find(|&i| text.is_char_boundary(i)).unwrap_or(text.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_prefer_whitespace_and_respect_char_boundaries() {
        let text = format!("{}é{}", "a".repeat(20), "b".repeat(20));
        // No whitespace nearby: the cut moves past the two-byte é.
        let cut = cut_point(&text, 21);
        assert!(text.is_char_boundary(cut) && cut >= 21);
        let spaced = format!("{} tail", "x".repeat(30));
        assert_eq!(cut_point(&spaced, 25), 30);
        assert_eq!(cut_point("short", 100), 5);
    }
}

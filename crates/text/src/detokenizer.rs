//! Incremental detokenization: turning generated token ids into text deltas as they arrive.
//!
//! Decoding one token at a time is wrong in two ways: a multi-byte character can be split across
//! byte-level tokens (decoding the first half alone gives U+FFFD), and some decoders render a
//! token differently at the start of a string (a sentencepiece `▁word` loses its space). So each
//! step decodes a short window of recent ids twice, once up to the last point whose text was fully
//! released (`read`) and once to the end, and releases the difference. The window keeps the tokens
//! since the previous release as context, starting with the last few prompt tokens, and is trimmed
//! every time everything in it has been released, so the cost per token stays small.
//!
//! For a decoder whose output for `a ++ b` is the output for `a` followed by the output for `b`
//! whenever `a` ends on a complete character (byte-level BPE; sentencepiece with byte fallback,
//! apart from the one leading space it strips when it adds a space prefix), the deltas of all
//! `push` calls followed by `flush` concatenate to exactly `decode(output_ids)`. (Exceptions,
//! where no text is lost but the stream can differ from that decode: a prompt that ends inside a
//! character, more than 16 tokens in a row ending in U+FFFD, and invalid UTF-8 from byte-fallback
//! tokens, which that decoder turns into one U+FFFD per byte of the whole run of byte tokens, so
//! an invalid byte can change how the already released bytes before it decode.)

/// Anything that turns token ids into text, e.g. [`crate::Tokenizer`].
pub trait TokenDecoder: Send + Sync {
    /// Decodes `ids`; bytes that are not valid UTF-8 become U+FFFD.
    fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> String;
}

/// How many prompt tokens are kept as decoding context for the first generated token.
const PROMPT_CONTEXT_TOKENS: usize = 5;

/// After this many tokens whose text still ends in U+FFFD, the replacement character is taken to
/// be real (invalid bytes, or a literal U+FFFD) and released, so a run of garbage bytes cannot make
/// the window, and with it the per-token cost, grow without bound. A UTF-8 character is at most
/// four bytes, so a genuinely split character never needs this many tokens.
const MAX_HELD_TOKENS: usize = 16;

const REPLACEMENT: char = '\u{FFFD}';

/// Turns a stream of generated token ids into text deltas. See the module docs.
#[derive(Debug, Clone)]
pub struct IncrementalDetokenizer {
    /// Context tokens followed by tokens whose text is not fully released yet.
    window: Vec<u32>,
    /// `window[..read]` is context: its text was already released (or belongs to the prompt).
    read: usize,
    /// Text of `window[read..]` released early: everything before a trailing incomplete char.
    released_tail: String,
    skip_special_tokens: bool,
}

impl IncrementalDetokenizer {
    /// A detokenizer for the output that follows `prompt_ids`. The last few prompt ids serve as
    /// context so that the first output token decodes as it would mid-text.
    pub fn new(prompt_ids: &[u32], skip_special_tokens: bool) -> Self {
        let start = prompt_ids.len().saturating_sub(PROMPT_CONTEXT_TOKENS);
        let window = prompt_ids[start..].to_vec();
        Self { read: window.len(), window, released_tail: String::new(), skip_special_tokens }
    }

    /// Adds one generated token; returns the text that became stable with it (often empty while
    /// a multi-byte character is incomplete).
    pub fn push(&mut self, decoder: &dyn TokenDecoder, token_id: u32) -> String {
        self.window.push(token_id);
        let held_tokens = self.window.len() - self.read;
        self.step(decoder, held_tokens >= MAX_HELD_TOKENS)
    }

    /// Releases whatever is still held (typically an incomplete character, decoded as U+FFFD)
    /// when the sequence ends.
    pub fn flush(&mut self, decoder: &dyn TokenDecoder) -> String {
        if self.read == self.window.len() {
            return String::new();
        }
        self.step(decoder, true)
    }

    /// Decodes the window and releases what is new. With `force`, a trailing U+FFFD is released
    /// too instead of being held for the bytes that might complete it.
    fn step(&mut self, decoder: &dyn TokenDecoder, force: bool) -> String {
        let context = decoder.decode(&self.window[..self.read], self.skip_special_tokens);
        let full = decoder.decode(&self.window, self.skip_special_tokens);

        // Where in `full` the already released text ends.
        let released_end =
            if full.starts_with(&context) && full[context.len()..].starts_with(&self.released_tail) {
                context.len() + self.released_tail.len()
            } else {
                // The decoder rendered the context differently once more tokens followed (e.g. the
                // prompt ended inside a character that this token completes). What was released cannot
                // be taken back; continue after the longest part both renderings share, so no text is
                // lost.
                let mut released = context.clone();
                released.push_str(&self.released_tail);
                common_prefix_len(&released, &full)
            };

        if !force && full.ends_with(REPLACEMENT) {
            // The end may be a multi-byte character still missing bytes: hold it, but release
            // what precedes it, which later bytes cannot change. A byte-level decoder shows the
            // incomplete character as one U+FFFD, a byte-fallback decoder (sentencepiece `<0xNN>`
            // tokens) as one per byte so far, so the whole trailing run is held.
            let stable_end = full.trim_end_matches(REPLACEMENT).len();
            if stable_end <= released_end {
                return String::new();
            }
            let delta = full[released_end..stable_end].to_owned();
            self.released_tail.push_str(&delta);
            return delta;
        }

        let delta = full[released_end..].to_owned();
        // Everything is released: the tokens since the previous release become the new context.
        self.window.drain(..self.read);
        self.read = self.window.len();
        self.released_tail.clear();
        delta
    }
}

/// Length in bytes of the longest common prefix of `a` and `b` that ends on a char boundary.
fn common_prefix_len(a: &str, b: &str) -> usize {
    a.char_indices()
        .zip(b.chars())
        .find(|((_, ca), cb)| ca != cb)
        .map(|((i, _), _)| i)
        .unwrap_or_else(|| a.len().min(b.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A byte-level decoder over a fixed table: token `i` is the bytes `table[i]`, and ids past
    /// the table are "special" tokens that decode to `<sN>` unless skipped.
    struct Bytes(Vec<Vec<u8>>);

    impl TokenDecoder for Bytes {
        fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> String {
            let mut out = Vec::new();
            for &id in ids {
                match self.0.get(id as usize) {
                    Some(bytes) => out.extend_from_slice(bytes),
                    None if skip_special_tokens => {}
                    None => out.extend_from_slice(format!("<s{id}>").as_bytes()),
                }
            }
            String::from_utf8_lossy(&out).into_owned()
        }
    }

    /// A table holding every single byte (ids 0..=255) plus a few multi-byte tokens.
    fn table() -> Bytes {
        let mut t: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
        t.push(b" hello".to_vec()); // 256
        t.push("é".as_bytes().to_vec()); // 257
        t.push(vec![0xF0, 0x9F]); // 258: first half of an emoji
        t.push(vec![0x98, 0x80, b'!']); // 259: rest of U+1F600 then '!'
        Bytes(t)
    }

    /// Like sentencepiece's byte-fallback decoder: ids below 256 are `<0xNN>` byte tokens, and a
    /// run of them that is not valid UTF-8 decodes as one U+FFFD per token; id `256 + i` is
    /// `words[i]`.
    struct ByteFallback(Vec<&'static str>);

    impl TokenDecoder for ByteFallback {
        fn decode(&self, ids: &[u32], _skip_special_tokens: bool) -> String {
            fn end_run(run: &mut Vec<u8>, out: &mut String) {
                match std::str::from_utf8(run) {
                    Ok(text) => out.push_str(text),
                    Err(_) => out.extend(std::iter::repeat_n(REPLACEMENT, run.len())),
                }
                run.clear();
            }
            let (mut out, mut run) = (String::new(), Vec::new());
            for &id in ids {
                match u8::try_from(id) {
                    Ok(byte) => run.push(byte),
                    Err(_) => {
                        end_run(&mut run, &mut out);
                        out.push_str(self.0[id as usize - 256]);
                    }
                }
            }
            end_run(&mut run, &mut out);
            out
        }
    }

    fn run(dec: &dyn TokenDecoder, prompt: &[u32], out: &[u32], skip: bool) -> Vec<String> {
        let mut d = IncrementalDetokenizer::new(prompt, skip);
        let mut deltas: Vec<String> = out.iter().map(|&id| d.push(dec, id)).collect();
        deltas.push(d.flush(dec));
        deltas
    }

    fn bytes_of(s: &str) -> Vec<u32> {
        s.bytes().map(u32::from).collect()
    }

    #[test]
    fn ascii_is_released_immediately() {
        let dec = table();
        let deltas = run(&dec, &bytes_of("prompt"), &[256, 257, b'x' as u32], false);
        assert_eq!(deltas, vec![" hello", "é", "x", ""]);
    }

    #[test]
    fn split_character_is_held_until_complete() {
        let dec = table();
        let deltas = run(&dec, &[], &bytes_of("a中b"), false);
        // 中 is three bytes: nothing for its first two, the whole char with the third.
        assert_eq!(deltas, vec!["a", "", "", "中", "b", ""]);
        let deltas = run(&dec, &bytes_of("x"), &[b'a' as u32, 258, 259], false);
        assert_eq!(deltas, vec!["a", "", "😀!", ""]);
    }

    #[test]
    fn text_before_an_incomplete_char_is_not_delayed() {
        // One token holding "a" and the first byte of "é": "a" is released at once.
        let mut t = table();
        t.0.push(vec![b'a', 0xC3]); // 260
        let deltas = run(&t, &[], &[260, 0xA9, b'z' as u32], false);
        assert_eq!(deltas, vec!["a", "é", "z", ""]);
    }

    #[test]
    fn incomplete_char_at_the_end_is_flushed_as_decode_gives_it() {
        let dec = table();
        let deltas = run(&dec, &[], &[b'o' as u32, b'k' as u32, 0xE4, 0xB8], false);
        assert_eq!(deltas, vec!["o", "k", "", "", "\u{FFFD}"]);
        assert_eq!(deltas.concat(), dec.decode(&[b'o' as u32, b'k' as u32, 0xE4, 0xB8], false));
    }

    #[test]
    fn invalid_bytes_are_released_once_known_invalid() {
        let dec = table();
        // A lone continuation byte followed by ASCII: the U+FFFD is real and goes out with 'a'.
        let deltas = run(&dec, &[], &[0x80, b'a' as u32], false);
        assert_eq!(deltas, vec!["", "\u{FFFD}a", ""]);
    }

    #[test]
    fn long_runs_of_invalid_bytes_do_not_grow_the_window() {
        let dec = table();
        let out = vec![0x80u32; 100];
        let mut d = IncrementalDetokenizer::new(&[], false);
        let mut all = String::new();
        for &id in &out {
            all.push_str(&d.push(&dec, id));
            // Context (at most one forced release) plus what is held since.
            assert!(d.window.len() <= 2 * MAX_HELD_TOKENS, "window {}", d.window.len());
        }
        all.push_str(&d.flush(&dec));
        assert_eq!(all, dec.decode(&out, false));
    }

    #[test]
    fn special_tokens_skipped_or_kept() {
        let dec = table();
        let out = [b'h' as u32, 999, b'i' as u32];
        assert_eq!(run(&dec, &[], &out, true).concat(), "hi");
        assert_eq!(run(&dec, &[], &out, false).concat(), "h<s999>i");
    }

    #[test]
    fn flush_twice_and_push_after_flush() {
        let dec = table();
        let mut d = IncrementalDetokenizer::new(&[], false);
        assert_eq!(d.push(&dec, 0xE4), "");
        assert_eq!(d.flush(&dec), "\u{FFFD}");
        assert_eq!(d.flush(&dec), "");
        assert_eq!(d.push(&dec, b'a' as u32), "a");
    }

    #[test]
    fn prompt_ending_inside_a_character_loses_no_text() {
        let dec = table();
        // The prompt stops after the first byte of 中; the output completes it.
        let deltas = run(&dec, &[b'x' as u32, 0xE4], &[0xB8, 0xAD, b'!' as u32], false);
        assert_eq!(deltas.concat(), "中!");
    }

    #[test]
    fn deltas_concatenate_to_full_decode_for_pseudo_random_streams() {
        let dec = table();
        let text = "Grüße, 世界! 😀🎉 naïve café — ok";
        // Every character's bytes go in as single-byte tokens, with multi-byte table entries
        // sprinkled between characters to vary what a window holds.
        let mut state = 0x2545_F491_u32;
        for _ in 0..50 {
            let mut out = Vec::new();
            for c in text.chars() {
                state ^= state << 13;
                state ^= state >> 17;
                state ^= state << 5;
                out.extend(bytes_of(c.encode_utf8(&mut [0; 4])));
                if state.is_multiple_of(7) {
                    out.push(256);
                }
                if state.is_multiple_of(11) {
                    out.extend_from_slice(&[258, 259]);
                }
            }
            let deltas = run(&dec, &bytes_of("ctx "), &out, false);
            for d in &deltas[..deltas.len() - 1] {
                assert!(!d.contains(REPLACEMENT), "U+FFFD mid-stream in {d:?}");
            }
            assert_eq!(deltas.concat(), dec.decode(&out, false));
        }
    }

    #[test]
    fn byte_fallback_characters_are_held_until_complete() {
        let dec = ByteFallback(vec!["a", " b"]);
        // 中 is E4 B8 AD and 😀 is F0 9F 98 80, one byte token each. A byte-fallback decoder
        // shows an incomplete character as one U+FFFD per byte: none of them may leak out.
        let out = [256, 0xE4, 0xB8, 0xAD, 0xF0, 0x9F, 0x98, 0x80, 257];
        let deltas = run(&dec, &[], &out, false);
        assert_eq!(deltas, vec!["a", "", "", "中", "", "", "", "😀", " b", ""]);
        // Cut inside a character, the flush gives what decode gives.
        let deltas = run(&dec, &[257], &out[..3], false);
        assert_eq!(deltas, vec!["a", "", "", "\u{FFFD}\u{FFFD}"]);
        assert_eq!(deltas.concat(), dec.decode(&out[..3], false));
        // Invalid bytes followed by text are released with the text, as decode renders them.
        let deltas = run(&dec, &[], &[0x80, 0xE4, 256], false);
        assert_eq!(deltas.concat(), dec.decode(&[0x80, 0xE4, 256], false));
    }

    #[test]
    fn byte_fallback_streams_match_decode_for_pseudo_random_streams() {
        let dec = ByteFallback(vec![" hello", "x"]);
        let text = "Grüße, 世界! 😀🎉 naïve café — ok";
        let mut state = 0x1234_5678_u32;
        for _ in 0..50 {
            let mut out = Vec::new();
            for c in text.chars() {
                state ^= state << 13;
                state ^= state >> 17;
                state ^= state << 5;
                out.extend(c.encode_utf8(&mut [0; 4]).bytes().map(u32::from));
                if state.is_multiple_of(5) {
                    out.push(256 + state % 2);
                }
            }
            let deltas = run(&dec, &[257, 0xC3, 0xA9], &out, false);
            for d in &deltas {
                assert!(!d.contains(REPLACEMENT), "U+FFFD in {d:?}");
            }
            assert_eq!(deltas.concat(), dec.decode(&out, false));
        }
    }

    #[test]
    fn common_prefix_respects_char_boundaries() {
        assert_eq!(common_prefix_len("abc", "abd"), 2);
        assert_eq!(common_prefix_len("aé", "aè"), 1);
        assert_eq!(common_prefix_len("ab", "abc"), 2);
        assert_eq!(common_prefix_len("", "x"), 0);
    }
}

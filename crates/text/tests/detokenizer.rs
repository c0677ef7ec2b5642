//! Streaming detokenization with the real SmolLM2 tokenizer.

mod common;

use pagoda_text::{IncrementalDetokenizer, TokenDecoder, Tokenizer};

/// Streams `out` after `prompt`; returns the deltas, the flush last.
fn stream(tok: &Tokenizer, prompt: &[u32], out: &[u32], skip: bool) -> Vec<String> {
    let mut d = IncrementalDetokenizer::new(prompt, skip);
    let mut deltas: Vec<String> = out.iter().map(|&id| d.push(tok, id)).collect();
    deltas.push(d.flush(tok));
    deltas
}

fn chat_prompt(tok: &Tokenizer) -> Vec<u32> {
    tok.encode("<|im_start|>user\nSay something.<|im_end|>\n<|im_start|>assistant\n", false).unwrap()
}

#[test]
fn multilingual_text_streams_exactly() {
    let tok = common::smollm2();
    let prompt = chat_prompt(&tok);
    for text in [
        "Plain English, with punctuation!",
        " leading space and trailing space ",
        "naïve café — résumé, Ångström, Kraków, São Paulo",
        "日本語のテキスト、中文文本。한국어 텍스트",
        "Emoji: 😀👍🏽🇫🇷 ❤️ 👨‍👩‍👧 🤗🤗",
        "mixed: x² + y² = z², ½ ⅓ — “quotes” ‘single’ …",
        "code:\n\tlet s = \"é\";\n",
    ] {
        let ids = tok.encode(text, false).unwrap();
        let deltas = stream(&tok, &prompt, &ids, false);
        for d in &deltas {
            assert!(!d.contains('\u{FFFD}'), "U+FFFD in {d:?} for {text:?}");
        }
        assert_eq!(deltas.concat(), text);
        assert_eq!(deltas.concat(), TokenDecoder::decode(&tok, &ids, false));
    }
}

#[test]
fn split_characters_are_held_back() {
    let tok = common::smollm2();
    // Each emoji here is several byte tokens: some pushes must release nothing.
    let text = "🤗🤗🤗";
    let ids = tok.encode(text, false).unwrap();
    assert!(ids.len() > 3, "expected byte tokens, got {ids:?}");
    let deltas = stream(&tok, &[], &ids, false);
    assert!(deltas[..ids.len()].iter().any(String::is_empty));
    assert_eq!(deltas.concat(), text);
}

#[test]
fn stream_cut_inside_a_character_flushes_what_decode_gives() {
    let tok = common::smollm2();
    let ids = tok.encode("ok 🤗", false).unwrap();
    let cut = &ids[..ids.len() - 1];
    let deltas = stream(&tok, &[], cut, false);
    for d in &deltas[..deltas.len() - 1] {
        assert!(!d.contains('\u{FFFD}'), "{d:?}");
    }
    assert!(deltas.last().unwrap().contains('\u{FFFD}'));
    assert_eq!(deltas.concat(), tok.decode(cut, false).unwrap());
}

#[test]
fn special_tokens_are_skipped_on_request() {
    let tok = common::smollm2();
    let mut ids = tok.encode("Paris.", false).unwrap();
    ids.push(2); // <|im_end|>
    ids.extend(tok.encode("\nmore", false).unwrap());
    assert_eq!(stream(&tok, &[], &ids, true).concat(), "Paris.\nmore");
    assert_eq!(stream(&tok, &[], &ids, false).concat(), "Paris.<|im_end|>\nmore");
}

#[test]
fn text_with_missing_byte_tokens_streams_without_panicking() {
    let tok = common::smollm2();
    let ids = tok.encode("a\x04b x\u{50000}y \u{F0000} z", false).unwrap();
    let deltas = stream(&tok, &[], &ids, false);
    assert_eq!(deltas.concat(), tok.decode(&ids, false).unwrap());
}

#[test]
fn arbitrary_id_sequences_concatenate_to_decode() {
    // Byte tokens in random order produce every kind of invalid and split UTF-8.
    let tok = common::smollm2();
    let byte_ids: Vec<u32> = (0..=255u8)
        .filter_map(|b| tok.token_to_id(&pagoda_text::byte_level::byte_to_char(b).to_string()))
        .collect();
    let mut state = 0x9E37_79B9_u32;
    for _ in 0..200 {
        let mut ids = Vec::new();
        for _ in 0..24 {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            let pick = state as usize;
            // Mostly byte tokens, sometimes ordinary or special tokens.
            ids.push(match pick % 10 {
                0 => (pick / 10 % 49152) as u32,
                1 => 2,
                _ => byte_ids[pick / 10 % byte_ids.len()],
            });
        }
        for skip in [false, true] {
            let deltas = stream(&tok, &[], &ids, skip);
            assert_eq!(deltas.concat(), tok.decode(&ids, skip).unwrap(), "{ids:?}");
        }
    }
}

//! Compares the Gemma 3 tokenizer (a SentencePiece GGUF vocabulary) with the golden fixture
//! written by `scripts/golden_gemma3.py` from Hugging Face transformers' tokenizer conversion of
//! the same GGUF file. Both the fixture and the model must be present: these tests fail, never
//! skip, without them.

mod common;

use std::path::PathBuf;

use pagoda_text::{IncrementalDetokenizer, TokenDecoder, Tokenizer};
use serde::Deserialize;

#[derive(Deserialize)]
struct Golden {
    model_file: String,
    tokenizer_cases: Vec<TokenizerCase>,
}

#[derive(Deserialize)]
struct TokenizerCase {
    text: String,
    add_special_tokens: bool,
    ids: Vec<u32>,
}

fn golden() -> Golden {
    let path = std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from)
        .join("../../tests/fixtures/golden-gemma3.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!("{}: {e}; the fixture is written by scripts/golden_gemma3.py", path.display())
    });
    let golden: Golden = serde_json::from_str(&text).expect("golden-gemma3.json parses");
    assert_eq!(golden.model_file, common::gemma3_path().file_name().unwrap().to_str().unwrap());
    assert!(!golden.tokenizer_cases.is_empty());
    golden
}

/// The case's ids without the BOS that `add_special_tokens` put in front.
fn text_ids<'a>(tok: &Tokenizer, case: &'a TokenizerCase) -> &'a [u32] {
    match (case.add_special_tokens, case.ids.split_first()) {
        (true, Some((&first, rest))) if Some(first) == tok.bos_id() && tok.add_bos() => rest,
        _ => &case.ids,
    }
}

#[test]
fn encode_matches_hugging_face() {
    let golden = golden();
    let tok = common::gemma3();
    let mut failures = Vec::new();
    for case in &golden.tokenizer_cases {
        let ids = tok.encode(&case.text, case.add_special_tokens).unwrap();
        if ids != case.ids {
            failures.push(format!(
                "{:?} (add_special_tokens={}):\n  ours {ids:?}\n  HF   {:?}",
                case.text, case.add_special_tokens, case.ids
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn decode_round_trips_like_hugging_face() {
    // Hugging Face's decode gives the text back, except that a literal "▁" comes back as a space
    // (it is the vocabulary's spelling of one).
    let golden = golden();
    let tok = common::gemma3();
    for case in &golden.tokenizer_cases {
        let decoded = tok.decode(text_ids(&tok, case), false).unwrap();
        assert_eq!(decoded, case.text.replace('\u{2581}', " "), "ids {:?}", case.ids);
    }
}

#[test]
fn streaming_gives_what_decode_gives() {
    let golden = golden();
    let tok = common::gemma3();
    let prompt = tok
        .encode("<start_of_turn>user\nRepeat after me.<end_of_turn>\n<start_of_turn>model\n", true)
        .unwrap();
    for case in &golden.tokenizer_cases {
        let ids = text_ids(&tok, case);
        for skip in [false, true] {
            let mut d = IncrementalDetokenizer::new(&prompt, skip);
            let mut streamed: String = ids.iter().map(|&id| d.push(&tok, id)).collect();
            streamed.push_str(&d.flush(&tok));
            assert_eq!(streamed, TokenDecoder::decode(&tok, ids, skip), "{:?} (skip={skip})", case.text);
        }
    }
}

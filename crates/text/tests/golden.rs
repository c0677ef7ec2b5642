//! Compares the tokenizer and the chat template with the golden fixture written by
//! `scripts/golden.py` from Hugging Face `tokenizers` / jinja2 on the same GGUF file.

mod common;

use std::path::PathBuf;

use pagoda_text::{ChatMessage, ChatTemplate, IncrementalDetokenizer};
use serde::Deserialize;

#[derive(Deserialize)]
struct Golden {
    model_file: String,
    tokenizer_cases: Vec<TokenizerCase>,
    chat_cases: Vec<ChatCase>,
    logits_cases: Vec<LogitsCase>,
    missing_byte_tokens: Vec<u8>,
}

#[derive(Deserialize)]
struct TokenizerCase {
    text: String,
    add_special_tokens: bool,
    ids: Vec<u32>,
}

#[derive(Deserialize)]
struct ChatCase {
    messages: Vec<ChatMessage>,
    add_generation_prompt: bool,
    rendered: String,
    ids: Vec<u32>,
}

#[derive(Deserialize)]
struct LogitsCase {
    name: String,
    prompt_ids: Vec<u32>,
    greedy: Vec<u32>,
    greedy_text: String,
}

fn golden() -> Golden {
    let path = std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from)
        .join("../../tests/fixtures/golden.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!("{}: {e}; the golden fixture is written by scripts/golden.py", path.display())
    });
    let golden: Golden = serde_json::from_str(&text).expect("golden.json parses");
    assert_eq!(golden.model_file, common::model_path().file_name().unwrap().to_str().unwrap());
    golden
}

#[test]
fn encode_matches_hugging_face() {
    let golden = golden();
    let tok = common::smollm2();
    assert!(!golden.tokenizer_cases.is_empty());
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
fn missing_byte_tokens_match_hugging_face() {
    let golden = golden();
    assert_eq!(common::smollm2().missing_byte_tokens(), golden.missing_byte_tokens);
}

#[test]
fn chat_template_matches_hugging_face() {
    let golden = golden();
    let tok = common::smollm2();
    let template = ChatTemplate::new(
        tok.chat_template().expect("SmolLM2 ships a chat template"),
        tok.bos_token(),
        tok.eos_token(),
    )
    .unwrap();
    assert!(!golden.chat_cases.is_empty());
    for case in &golden.chat_cases {
        let rendered = template.render(&case.messages, case.add_generation_prompt).unwrap();
        assert_eq!(rendered, case.rendered, "messages {:?}", case.messages);
        assert_eq!(tok.encode(&rendered, false).unwrap(), case.ids, "{rendered:?}");
    }
}

#[test]
fn greedy_continuations_detokenize_to_reference_text() {
    let golden = golden();
    let tok = common::smollm2();
    assert!(!golden.logits_cases.is_empty());
    for case in &golden.logits_cases {
        assert_eq!(tok.decode(&case.greedy, false).unwrap(), case.greedy_text, "{}", case.name);
        let mut detok = IncrementalDetokenizer::new(&case.prompt_ids, false);
        let mut streamed: String = case.greedy.iter().map(|&id| detok.push(&tok, id)).collect();
        streamed.push_str(&detok.flush(&tok));
        assert_eq!(streamed, case.greedy_text, "{}", case.name);
    }
}

//! Tokenizer tests: the real SmolLM2 tokenizer from its GGUF file, small synthetic GGUF
//! vocabularies for the pre-tokenizer variants and options, and Hugging Face directories.

mod common;

use pagoda_text::byte_level::byte_to_char;
use pagoda_text::{GgufError, Tokenizer, TokenizerError};

#[test]
fn smollm2_metadata() {
    let tok = common::smollm2();
    assert_eq!(tok.vocab_size(), 49152);
    assert_eq!(tok.bos_id(), Some(1));
    assert_eq!(tok.bos_token(), Some("<|im_start|>"));
    assert_eq!(tok.eos_id(), Some(2));
    assert_eq!(tok.eos_token(), Some("<|im_end|>"));
    // <|endoftext|> (0) is a control token named like an end marker; <|im_end|> is the EOS.
    assert_eq!(tok.eos_token_ids(), &[0, 2]);
    assert!(tok.is_eos(2) && tok.is_eos(0) && !tok.is_eos(1) && !tok.is_eos(4093));
    assert!(!tok.add_bos());
    assert!(tok.chat_template().unwrap().starts_with("{% for message in messages %}"));
    assert_eq!(tok.token_to_id("<|im_start|>"), Some(1));
    assert_eq!(tok.id_to_token(4093).as_deref(), Some("user"));
}

#[test]
fn special_tokens_match_whole_and_only_whole() {
    let tok = common::smollm2();
    assert_eq!(tok.encode("<|im_start|>user", false).unwrap(), vec![1, 4093]);
    let partial = tok.encode("<|im_start user", false).unwrap();
    assert!(!partial.contains(&1), "{partial:?}");
    // add_bos is off for SmolLM2, so add_special_tokens changes nothing.
    assert_eq!(tok.encode("hi", true).unwrap(), tok.encode("hi", false).unwrap());
    assert_eq!(tok.decode(&[1, 4093, 2], true).unwrap(), "user");
    assert_eq!(tok.decode(&[1, 4093, 2], false).unwrap(), "<|im_start|>user<|im_end|>");
}

#[test]
fn digits_are_split_one_by_one() {
    let tok = common::smollm2();
    let ids = tok.encode("12345", false).unwrap();
    assert_eq!(ids.len(), 5);
    assert_eq!(tok.decode(&ids, false).unwrap(), "12345");
}

#[test]
fn round_trips() {
    let tok = common::smollm2();
    for text in [
        "Hello, world!",
        "naïve café — résumé Ångström",
        "日本語のテキスト、中文文本。한국어",
        "emoji 😀🎉 👩‍👩‍👧 🇫🇷 done",
        "code:\n\tfn main() { println!(\"hi\"); }\r\n",
        "   ",
        "",
    ] {
        let ids = tok.encode(text, false).unwrap();
        assert_eq!(tok.decode(&ids, false).unwrap(), text);
    }
}

#[test]
fn token_text_and_bytes() {
    let tok = common::smollm2();
    let world = tok.token_to_id("Ġworld").unwrap();
    assert_eq!(tok.token_text(world), " world");
    assert_eq!(tok.token_bytes(world).unwrap(), b" world");
    assert_eq!(tok.token_text(1), "<|im_start|>");
    let newline = tok.token_to_id("Ċ").unwrap();
    assert_eq!(tok.token_text(newline), "\n");
    // A lone lead byte of a 4-byte character shows as U+FFFD but keeps its byte.
    let lead = tok.token_to_id(&byte_to_char(0xF0).to_string()).unwrap();
    assert_eq!(tok.token_text(lead), "\u{FFFD}");
    assert_eq!(tok.token_bytes(lead).unwrap(), vec![0xF0]);
    assert_eq!(tok.token_text(u32::MAX), "");
    assert_eq!(tok.token_bytes(49152), None);
}

#[test]
fn bytes_without_tokens_are_dropped_like_hugging_face() {
    let tok = common::smollm2();
    assert_eq!(tok.missing_byte_tokens().len(), 21);
    // \x04 and \x06 have no token: they vanish, the rest is untouched.
    let ids = tok.encode("ctrl\x04a\x06b", false).unwrap();
    assert_eq!(tok.decode(&ids, false).unwrap(), "ctrlab");
    assert!(tok.encode("\x04\x06\x13\x14\x16\x1d", false).unwrap().is_empty());
    // U+50000 starts with the missing byte 0xF1; only that byte is dropped, so its other bytes
    // decode as replacement characters.
    let ids = tok.encode("x\u{50000}y", false).unwrap();
    assert_eq!(tok.decode(&ids, false).unwrap(), "x\u{FFFD}\u{FFFD}\u{FFFD}y");
}

#[test]
fn ids_outside_the_vocabulary_do_not_panic() {
    let tok = common::smollm2();
    assert_eq!(tok.decode(&[19556, 999_999, u32::MAX], false).unwrap(), "Hello");
    assert_eq!(tok.id_to_token(999_999), None);
}

#[test]
fn load_errors_are_typed() {
    let err = Tokenizer::from_gguf("/nonexistent/model.gguf").unwrap_err();
    assert!(matches!(err, TokenizerError::Gguf(GgufError::NotFound { .. })), "{err:?}");
    let not_gguf = std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")), std::path::PathBuf::from)
        .join("Cargo.toml");
    let err = Tokenizer::from_gguf(not_gguf).unwrap_err();
    assert!(matches!(err, TokenizerError::Gguf(GgufError::BadMagic { .. })), "{err:?}");
    let dir = common::temp_dir("empty-hf-dir");
    let err = Tokenizer::from_dir(&dir).unwrap_err();
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(err.to_string().contains("tokenizer.json"), "{err}");
}

// ---- synthetic GGUF vocabularies -------------------------------------------------------------

/// 256 byte tokens (id = byte), merged tokens, then `<s>`, `</s>` (control), `<think>`
/// (user-defined) and `<|eot|>` (control).
fn synthetic_tokens() -> (Vec<String>, Vec<i32>, Vec<String>) {
    let mut tokens: Vec<String> = (0..=255u8).map(|b| byte_to_char(b).to_string()).collect();
    let mut types = vec![1; 256];
    let merges = ["1 2", "12 3", "Ġ t", "h e", "Ġt he"];
    for m in merges {
        tokens.push(m.replace(' ', ""));
        types.push(1);
    }
    for (t, ty) in [("<s>", 3), ("</s>", 3), ("<think>", 4), ("<|eot|>", 3)] {
        tokens.push(t.into());
        types.push(ty);
    }
    (tokens, types, merges.iter().map(|m| m.to_string()).collect())
}

/// Removes the temp dir holding a synthetic GGUF file.
fn remove_parent(path: &std::path::Path) {
    std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
}

fn id_of(tokens: &[String], t: &str) -> u32 {
    tokens.iter().position(|x| x == t).unwrap() as u32
}

fn synthetic(name: &str, pre: Option<&str>, add_bos: Option<bool>) -> std::path::PathBuf {
    let (tokens, types, merges) = synthetic_tokens();
    let mut w = common::GgufWriter::new()
        .str("general.architecture", "llama")
        .str("tokenizer.ggml.model", "gpt2")
        .strs("tokenizer.ggml.tokens", &tokens)
        .i32s("tokenizer.ggml.token_type", &types)
        .strs("tokenizer.ggml.merges", &merges)
        .u32("tokenizer.ggml.bos_token_id", id_of(&tokens, "<s>"))
        .u32("tokenizer.ggml.eos_token_id", id_of(&tokens, "</s>"))
        .u32("tokenizer.ggml.eot_token_id", id_of(&tokens, "<|eot|>"));
    if let Some(pre) = pre {
        w = w.str("tokenizer.ggml.pre", pre);
    }
    if let Some(add_bos) = add_bos {
        w = w.bool("tokenizer.ggml.add_bos_token", add_bos);
    }
    let path = common::temp_dir(name).join("model.gguf");
    w.write(&path);
    path
}

#[test]
fn pre_tokenizers_split_numbers_their_own_way() {
    let (tokens, ..) = synthetic_tokens();
    let space = b' ' as u32;
    let (one, two, three) = (b'1' as u32, b'2' as u32, b'3' as u32);
    let n123 = id_of(&tokens, "123");
    let cases: [(Option<&str>, Vec<u32>); 6] = [
        // GPT-2: " 123" is one piece, merged fully.
        (None, vec![space, n123]),
        (Some("gpt-2"), vec![space, n123]),
        // SmolLM: digits one by one before the GPT-2 regex.
        (Some("smollm"), vec![space, one, two, three]),
        // Llama 3: up to three digits per piece, the space on its own.
        (Some("llama-bpe"), vec![space, n123]),
        (Some("llama3"), vec![space, n123]),
        // Qwen2: digits one by one.
        (Some("qwen2"), vec![space, one, two, three]),
    ];
    for (pre, want) in cases {
        let path = synthetic(&format!("pre-{}", pre.unwrap_or("none")), pre, None);
        let tok = Tokenizer::from_gguf(&path).unwrap();
        assert_eq!(tok.encode(" 123", false).unwrap(), want, "pre {pre:?}");
        let the = id_of(&tokens, "Ġthe");
        assert_eq!(tok.encode(" the", false).unwrap(), vec![the], "pre {pre:?}");
        assert_eq!(tok.decode(&want, false).unwrap(), " 123");
        remove_parent(&path);
    }
}

#[test]
fn unknown_pre_tokenizer_is_an_error() {
    let path = synthetic("pre-unknown", Some("deepseek-coder"), None);
    let err = Tokenizer::from_gguf(&path).unwrap_err();
    assert!(
        matches!(err, TokenizerError::UnsupportedPreTokenizer { ref pre, .. } if pre == "deepseek-coder"),
        "{err:?}"
    );
    assert!(err.to_string().contains("smollm"), "{err}");
    remove_parent(&path);
}

#[test]
fn add_bos_prepends_bos_with_special_tokens_only() {
    let (tokens, ..) = synthetic_tokens();
    let bos = id_of(&tokens, "<s>");
    let path = synthetic("bos", Some("gpt-2"), Some(true));
    let tok = Tokenizer::from_gguf(&path).unwrap();
    remove_parent(&path);
    assert!(tok.add_bos());
    assert_eq!(tok.encode("he", true).unwrap(), vec![bos, id_of(&tokens, "he")]);
    assert_eq!(tok.encode("he", false).unwrap(), vec![id_of(&tokens, "he")]);
    assert_eq!(tok.bos_token(), Some("<s>"));
}

#[test]
fn control_and_user_defined_tokens() {
    let (tokens, ..) = synthetic_tokens();
    let path = synthetic("added", None, None);
    let tok = Tokenizer::from_gguf(&path).unwrap();
    remove_parent(&path);
    let think = id_of(&tokens, "<think>");
    let eot = id_of(&tokens, "<|eot|>");
    let eos = id_of(&tokens, "</s>");
    assert_eq!(tok.encode("<think>he</s>", false).unwrap(), vec![think, id_of(&tokens, "he"), eos]);
    // User-defined tokens are not special: skipping special tokens keeps them.
    assert_eq!(tok.decode(&[think, eos], true).unwrap(), "<think>");
    // EOS plus the declared end-of-turn token.
    assert_eq!(tok.eos_token_ids(), &[eos.min(eot), eos.max(eot)]);
    assert!(tok.missing_byte_tokens().is_empty());
}

#[test]
fn unsupported_model_and_inconsistent_metadata() {
    let (tokens, types, _) = synthetic_tokens();
    let path = common::temp_dir("unigram").join("model.gguf");
    common::GgufWriter::new()
        .str("tokenizer.ggml.model", "t5")
        .strs("tokenizer.ggml.tokens", &tokens)
        .write(&path);
    let err = Tokenizer::from_gguf(&path).unwrap_err();
    remove_parent(&path);
    assert!(matches!(err, TokenizerError::UnsupportedModel { ref model, .. } if model == "t5"));
    assert!(err.to_string().contains("\"llama\""), "{err}");

    let path = common::temp_dir("types-mismatch").join("model.gguf");
    common::GgufWriter::new()
        .str("tokenizer.ggml.model", "gpt2")
        .strs("tokenizer.ggml.tokens", &tokens)
        .i32s("tokenizer.ggml.token_type", &types[..10])
        .strs("tokenizer.ggml.merges", &[])
        .write(&path);
    let err = Tokenizer::from_gguf(&path).unwrap_err();
    remove_parent(&path);
    assert!(matches!(err, TokenizerError::InvalidVocab { .. }), "{err:?}");

    let path = common::temp_dir("bad-merge").join("model.gguf");
    common::GgufWriter::new()
        .str("tokenizer.ggml.model", "gpt2")
        .strs("tokenizer.ggml.tokens", &tokens)
        .strs("tokenizer.ggml.merges", &["x yz".to_string()])
        .write(&path);
    let err = Tokenizer::from_gguf(&path).unwrap_err();
    remove_parent(&path);
    assert!(matches!(err, TokenizerError::InvalidVocab { .. }), "{err:?}");

    let path = common::temp_dir("bad-eos").join("model.gguf");
    common::GgufWriter::new()
        .str("tokenizer.ggml.model", "gpt2")
        .strs("tokenizer.ggml.tokens", &tokens)
        .strs("tokenizer.ggml.merges", &[])
        .u32("tokenizer.ggml.eos_token_id", 1_000_000)
        .write(&path);
    let err = Tokenizer::from_gguf(&path).unwrap_err();
    remove_parent(&path);
    assert!(err.to_string().contains("1000000"), "{err}");

    let path = common::temp_dir("no-model-key").join("model.gguf");
    common::GgufWriter::new().write(&path);
    let err = Tokenizer::from_gguf(&path).unwrap_err();
    remove_parent(&path);
    assert!(
        matches!(err, TokenizerError::Gguf(GgufError::MissingKey { ref key, .. }) if key == "tokenizer.ggml.model"),
        "{err:?}"
    );
}

// ---- Hugging Face directories ------------------------------------------------------------------

/// A Hugging Face directory whose tokenizer.json is SmolLM2's, as built from the GGUF.
fn hf_dir(
    name: &str,
    config: serde_json::Value,
    generation: Option<serde_json::Value>,
) -> std::path::PathBuf {
    let gguf = common::smollm2();
    let dir = common::temp_dir(name);
    std::fs::write(dir.join("tokenizer.json"), gguf.inner().to_string(false).unwrap()).unwrap();
    std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
    if let Some(g) = generation {
        std::fs::write(dir.join("generation_config.json"), g.to_string()).unwrap();
    }
    dir
}

#[test]
fn hf_dir_matches_gguf_tokenizer() {
    let gguf = common::smollm2();
    let dir = hf_dir(
        "hf-plain",
        serde_json::json!({
            "bos_token": "<|im_start|>",
            "eos_token": {"content": "<|im_end|>", "special": true},
            "chat_template": gguf.chat_template().unwrap(),
        }),
        Some(serde_json::json!({"eos_token_id": [2, 5], "bos_token_id": 1})),
    );
    let tok = Tokenizer::from_dir(&dir).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    for text in ["Hello 123 world", "<|im_start|>user\nçava 😀<|im_end|>", "a\x04b"] {
        assert_eq!(tok.encode(text, true).unwrap(), gguf.encode(text, true).unwrap());
    }
    assert_eq!(tok.bos_id(), Some(1));
    assert_eq!(tok.eos_id(), Some(2));
    // 2 (EOS), 5 (generation config), 0 (<|endoftext|>, a special end marker).
    assert_eq!(tok.eos_token_ids(), &[0, 2, 5]);
    assert_eq!(tok.chat_template(), gguf.chat_template());
    assert!(!tok.add_bos());
    let world = tok.token_to_id("Ġworld").unwrap();
    assert_eq!(tok.token_text(world), " world");
    assert_eq!(tok.missing_byte_tokens(), gguf.missing_byte_tokens());
}

#[test]
fn hf_dir_explicit_add_bos_and_template_file() {
    let dir = hf_dir(
        "hf-bos",
        serde_json::json!({"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "add_bos_token": true,
                           "chat_template": "from config"}),
        None,
    );
    std::fs::write(dir.join("chat_template.jinja"), "from file").unwrap();
    let tok = Tokenizer::from_dir(&dir).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(tok.add_bos());
    assert_eq!(tok.encode("hi", true).unwrap()[0], 1);
    assert_ne!(tok.encode("hi", false).unwrap()[0], 1);
    assert_eq!(tok.chat_template(), Some("from file"));
    assert_eq!(tok.eos_token_ids(), &[0, 2]);
}

#[test]
fn hf_dir_bad_json_is_reported() {
    let dir = hf_dir("hf-bad-json", serde_json::json!({}), None);
    std::fs::write(dir.join("tokenizer_config.json"), "{not json").unwrap();
    let err = Tokenizer::from_dir(&dir).unwrap_err();
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(matches!(err, TokenizerError::Json { .. }), "{err:?}");
    assert!(err.to_string().contains("tokenizer_config.json"), "{err}");
}

#[test]
fn bounded_encoding_matches_whole_encoding_and_refuses_long_texts_early() {
    let tok = common::smollm2();
    // Long enough to be counted in pieces, with whitespace runs, digits and multibyte text at
    // the cuts.
    let unit = "The quick brown fox   jumps over 12345 lazy dogs; naïve café — 東京\n\n\t";
    let text = unit.repeat(1200);
    let whole = tok.encode(&text, true).unwrap();
    assert_eq!(tok.encode_bounded(&text, true, whole.len()).unwrap(), whole);
    match tok.encode_bounded(&text, true, whole.len() - 1) {
        Err(pagoda_text::BoundedEncodeError::TooManyTokens { limit, .. }) => {
            assert_eq!(limit, whole.len() - 1)
        }
        other => panic!("expected TooManyTokens, got {other:?}"),
    }
    // 8 MiB against an 8192-token limit: refused after the first pieces, not after tokenizing
    // millions of tokens.
    let huge = "word ".repeat(8 << 20 >> 2);
    match tok.encode_bounded(&huge, false, 8192) {
        Err(pagoda_text::BoundedEncodeError::TooManyTokens {
            counted_bytes, total_bytes, at_least, ..
        }) => {
            assert_eq!(total_bytes, huge.len());
            assert!(counted_bytes < 128 * 1024, "counted {counted_bytes} bytes");
            assert!(at_least > 8192 - 64, "{at_least}");
        }
        other => panic!("expected TooManyTokens, got {other:?}"),
    }
}

//! Grammars against the default model's real vocabulary (SmolLM2, 49,152 tokens): the token
//! trie, each grammar kind compiled and walked token by token along a valid text, refusals of
//! bad grammars, the compile cache and the reasoning gate.

use std::sync::{Arc, OnceLock};

use pagoda_engine::TokenConstraint;
use pagoda_structured::{GrammarCompiler, GrammarError, GrammarSpec, PagodaTokEnv};
use pagoda_text::Tokenizer;
use serde_json::json;
use toktrie::{TokTrie, TokenizerEnv};

fn tokenizer() -> Arc<Tokenizer> {
    static TOK: OnceLock<Arc<Tokenizer>> = OnceLock::new();
    TOK.get_or_init(|| {
        let model = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
        Arc::new(Tokenizer::from_gguf(&model).expect("run `make model` first"))
    })
    .clone()
}

fn compiler() -> &'static GrammarCompiler {
    static C: OnceLock<GrammarCompiler> = OnceLock::new();
    C.get_or_init(|| GrammarCompiler::new(tokenizer()).unwrap())
}

/// Walks `text`'s tokens through a fresh constraint of `spec`: each token must be in the mask
/// computed before it. Returns whether the grammar then is complete or allows end-of-sequence.
fn walk(spec: &GrammarSpec, text: &str) -> Result<bool, String> {
    let tok = tokenizer();
    let mut c = compiler().compile(spec).map_err(|e| e.to_string())?.constraint();
    for id in tok.encode(text, false).unwrap() {
        let mask = c.compute_mask().map_err(|e| e.0)?;
        if !mask.allows(id) {
            return Err(format!("token {id} ({:?}) is not allowed", tok.token_text(id)));
        }
        c.accept_token(id).map_err(|e| e.0)?;
    }
    if c.is_finished() {
        return Ok(true);
    }
    let mask = c.compute_mask().map_err(|e| e.0)?;
    Ok(tok.eos_token_ids().iter().any(|&e| mask.allows(e)))
}

#[test]
fn the_trie_spells_every_token_as_the_tokenizer_does() {
    let tok = tokenizer();
    let env = PagodaTokEnv::new(tok.clone());
    let trie = env.tok_trie();
    assert_eq!(trie.vocab_size(), tok.vocab_size());
    let im_end = tok.token_to_id("<|im_end|>").unwrap();
    assert_eq!(trie.token(im_end), b"\xff<|im_end|>", "special tokens carry the marker");
    let world = tok.token_to_id("Ġworld").unwrap();
    assert_eq!(trie.token(world), b" world");
    let mut plain = 0;
    for id in 0..tok.vocab_size() as u32 {
        if trie.token(id).first() != Some(&TokTrie::SPECIAL_TOKEN_MARKER) {
            assert_eq!(Some(trie.token(id).to_vec()), tok.token_bytes(id), "token {id}");
            plain += 1;
        }
    }
    assert!(plain > 49_000);
    for &eos in tok.eos_token_ids() {
        assert!(trie.eos_tokens().contains(&eos));
    }
    assert_eq!(env.tokenize_bytes(b"hello world"), tok.encode("hello world", false).unwrap());
}

#[test]
fn json_schema_accepts_valid_text_and_ends() {
    let schema = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 20},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2}
        },
        "required": ["name", "age", "tags"],
        "additionalProperties": false
    });
    let spec = GrammarSpec::JsonSchema(schema);
    assert_eq!(walk(&spec, r#"{"name": "Ada", "age": 36, "tags": ["a"]}"#), Ok(true));
    assert!(walk(&spec, r#"{"name": "Ada", "age": -3"#).is_err(), "minimum holds");
    assert!(walk(&spec, r#"{"nick": "x"#).is_err(), "additionalProperties: false holds");
    // Not complete yet: end-of-sequence must not be allowed.
    assert_eq!(walk(&spec, r#"{"name": "Ada""#), Ok(false));
}

#[test]
fn json_object_regex_choice_and_lark() {
    assert_eq!(walk(&GrammarSpec::JsonObject, r#"{"a": [1, 2, {"b": null}]}"#), Ok(true));
    assert!(walk(&GrammarSpec::JsonObject, "[1]").is_err());
    let rx = GrammarSpec::Regex(r"[A-Z]{3}-[0-9]{4}".into());
    assert_eq!(walk(&rx, "ABC-1234"), Ok(true));
    assert!(walk(&rx, "AB1").is_err());
    let choice = GrammarSpec::Choice(vec!["yes".into(), "no".into(), "maybe (a.k.a. ?)".into()]);
    assert_eq!(walk(&choice, "no"), Ok(true));
    assert_eq!(walk(&choice, "maybe (a.k.a. ?)"), Ok(true));
    assert!(walk(&choice, "nope").is_err());
    let lark = GrammarSpec::Lark(
        "start: \"SELECT \" COL \" FROM \" TABLE\nCOL: /[a-z]+/\nTABLE: \"users\" | \"orders\"\n".into(),
    );
    assert_eq!(walk(&lark, "SELECT id FROM users"), Ok(true));
    assert!(walk(&lark, "SELECT id FROM cats").is_err());
}

#[test]
fn bad_grammars_are_refused_with_a_reason() {
    let bad = [
        GrammarSpec::JsonSchema(json!({"type": "strnig"})),
        GrammarSpec::JsonSchema(json!("not a schema")),
        GrammarSpec::JsonSchema(json!({"$ref": "#/$defs/missing"})),
        GrammarSpec::Regex("[a-".into()),
        GrammarSpec::Regex(String::new()),
        GrammarSpec::Choice(vec![]),
        GrammarSpec::Lark("start: undefined_rule".into()),
    ];
    for spec in bad {
        match compiler().compile(&spec) {
            Err(GrammarError::Invalid(msg)) => assert!(!msg.is_empty() && !msg.contains('\n'), "{msg}"),
            Err(other) => panic!("{spec:?}: {other}"),
            Ok(_) => panic!("{spec:?} compiled"),
        }
    }
}

#[test]
fn a_repeated_grammar_is_a_cache_hit() {
    let spec = GrammarSpec::JsonSchema(
        json!({"type": "object", "properties": {"cache_probe": {"type": "boolean"}}}),
    );
    let first = compiler().compile(&spec).unwrap();
    let second = compiler().compile(&spec).unwrap();
    assert!(!first.cache_hit && second.cache_hit);
    // Constraints from the cached grammar are independent of each other.
    let tok = tokenizer();
    let mut a = second.constraint();
    let b = second.constraint();
    let brace = tok.encode("{", false).unwrap()[0];
    a.accept_token(brace).unwrap();
    let mut b = b;
    assert!(b.compute_mask().unwrap().allows(brace));
}

#[test]
fn the_grammar_starts_after_the_reasoning_ends() {
    let tok = tokenizer();
    let spec = GrammarSpec::Choice(vec!["yes".into(), "no".into()]);
    let mut c = compiler().compile(&spec).unwrap().constraint().after_reasoning("</think>");
    let free = tok.encode("Let me think. x = 1, so </th", false).unwrap();
    for id in free {
        assert!(c.compute_mask().unwrap().allows(id), "anything goes while reasoning");
        c.accept_token(id).unwrap();
    }
    for id in tok.encode("ink>", false).unwrap() {
        c.accept_token(id).unwrap();
    }
    let mask = c.compute_mask().unwrap();
    let yes = tok.encode("yes", false).unwrap()[0];
    let hello = tok.encode("hello", false).unwrap()[0];
    assert!(mask.allows(yes) && !mask.allows(hello), "the grammar holds after </think>");
}

/// `v` laid out as the JSON grammar writes it: `", "` between items, `": "` after keys.
fn layout(v: &serde_json::Value) -> String {
    use serde_json::Value;
    match v {
        Value::Array(items) => format!("[{}]", items.iter().map(layout).collect::<Vec<_>>().join(", ")),
        Value::Object(map) => format!(
            "{{{}}}",
            map.iter()
                .map(|(k, v)| format!("{}: {}", Value::from(k.as_str()), layout(v)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        other => other.to_string(),
    }
}

#[test]
fn every_fixture_schema_compiles_and_accepts_its_example() {
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/schemas");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|x| x != "json") {
            continue;
        }
        let schema: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let example_path = dir.join("examples").join(path.file_name().unwrap());
        let example: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&example_path).unwrap()).unwrap();
        let text = layout(&example);
        assert_eq!(walk(&GrammarSpec::JsonSchema(schema), &text), Ok(true), "{}: {text}", path.display());
        checked += 1;
    }
    assert!(checked >= 50, "{checked} schemas");
}

#[test]
fn structural_tags_hold_only_after_a_trigger() {
    use pagoda_structured::{StructuralTag, TagStructure};
    let schema = json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"], "additionalProperties": false});
    let tag = GrammarSpec::StructuralTag(StructuralTag {
        structures: vec![TagStructure {
            begin: "<function=get_weather>".into(),
            schema,
            end: "</function>".into(),
        }],
        triggers: vec!["<function=".into()],
    });
    assert_eq!(walk(&tag, "Let me check. "), Ok(true), "free text may end anywhere");
    assert_eq!(
        walk(&tag, r#"Let me check. <function=get_weather>{"city": "Paris"}</function> Done."#),
        Ok(true)
    );
    assert!(walk(&tag, "Text <function=get_time>").is_err(), "a trigger starts a known structure only");
    assert!(
        walk(&tag, r#"<function=get_weather>{"town": "Paris"}"#).is_err(),
        "the schema holds inside the tag"
    );
    assert_eq!(walk(&tag, r#"<function=get_weather>{"city": "Paris"}"#), Ok(false), "a tag must be closed");
    let bad = StructuralTag { structures: vec![], triggers: vec!["<f".into()] };
    assert!(compiler().compile(&GrammarSpec::StructuralTag(bad)).is_err());
}

//! Tests of [`super`]: loading schema files and directories, request bodies and prompts, the
//! check of answers (valid, invalid, cut off), the validity counts and the grammar's layout.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{json, Map};

use super::*;
use crate::client::{Client, ClientConfig, Endpoint};
use crate::dataset::Prompt;
use crate::serve::to_result;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/schemas")
}

/// A fresh empty directory under the system's temporary directory.
fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("pagoda-bench-schemas-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn color_schema() -> Schema {
    let schema = json!({
        "description": "A named color.",
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 10},
            "hex": {"type": "string", "pattern": "^#[0-9a-f]{6}$"},
            "contact": {"type": "string", "format": "email"}
        },
        "required": ["name", "hex"],
        "additionalProperties": false
    });
    Schema::new("39-named-color.json", schema).unwrap()
}

fn outcome(text: &str, finish_reason: &str) -> Outcome {
    Outcome { text: Some(text.into()), finish_reason: Some(finish_reason.into()), ..Outcome::default() }
}

#[test]
fn a_directory_gives_every_json_file_sorted_by_name() {
    let schemas = load_schemas(&fixtures()).unwrap();
    assert_eq!(schemas.len(), 52, "examples/ and README.md are not schemas");
    let files: Vec<&str> = schemas.iter().map(|s| s.file.as_str()).collect();
    assert!(files.windows(2).all(|w| w[0] < w[1]), "{files:?}");
    assert_eq!(
        (schemas[0].file.as_str(), schemas[0].name.as_str()),
        ("01-user-profile.json", "01_user_profile")
    );
    assert_eq!(schemas[0].description.as_deref(), Some("A user profile for a fictional person"));
    assert_eq!(schemas[51].name, "52_device_settings");
    assert!(schemas.iter().all(|s| s.description.is_some()));

    let dir = temp_dir("sorted");
    for name in ["b-two.json", "a-one.json", "notes.txt", "c.json.bak"] {
        std::fs::write(dir.join(name), r#"{"type": "integer"}"#).unwrap();
    }
    std::fs::create_dir(dir.join("d.json")).unwrap();
    let names: Vec<String> = load_schemas(&dir).unwrap().into_iter().map(|s| s.name).collect();
    assert_eq!(names, ["a_one", "b_two"]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_file_gives_one_schema() {
    let schemas = load_schemas(&fixtures().join("18-traffic-light.json")).unwrap();
    assert_eq!(schemas.len(), 1);
    assert_eq!(
        (schemas[0].file.as_str(), schemas[0].name.as_str()),
        ("18-traffic-light.json", "18_traffic_light")
    );
    assert_eq!(schema_name("my schema.v2"), "my_schema_v2");
}

#[test]
fn unreadable_empty_and_bad_schemas_are_refused() {
    let dir = temp_dir("bad");
    let empty = load_schemas(&dir).unwrap_err();
    assert!(matches!(empty, SchemaError::Empty { .. }), "{empty}");
    std::fs::write(dir.join("broken.json"), "{not json").unwrap();
    assert!(matches!(load_schemas(&dir).unwrap_err(), SchemaError::NotJson { .. }));
    std::fs::write(dir.join("broken.json"), r#"{"type": 5}"#).unwrap();
    let invalid = load_schemas(&dir).unwrap_err();
    assert!(matches!(invalid, SchemaError::Invalid { .. }), "{invalid}");
    assert!(invalid.to_string().contains("broken.json"), "{invalid}");
    assert!(matches!(load_schemas(&dir.join("missing.json")).unwrap_err(), SchemaError::Read { .. }));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bodies_carry_the_schema_as_a_strict_response_format() {
    let schema = color_schema();
    let want = json!({"type": "json_schema",
                      "json_schema": {"name": "39_named_color", "schema": schema.schema, "strict": true}});
    assert_eq!(schema.response_format(), &want);
    for endpoint in [Endpoint::Chat, Endpoint::Completions] {
        let client = Client::new(ClientConfig {
            base_url: "http://127.0.0.1:8000".into(),
            model: "m".into(),
            endpoint,
            api_key: None,
            ignore_eos: false,
            temperature: 0.0,
            extra_body: Map::new(),
            timeout: None,
        })
        .unwrap();
        let prompt = schema.prompt().unwrap();
        let body = client.body_with(&prompt, 64, Some(schema.response_format()));
        assert_eq!(body["response_format"], want);
        assert_eq!(body["max_tokens"], 64);
        let sent = match endpoint {
            Endpoint::Chat => &body["messages"][0]["content"],
            Endpoint::Completions => &body["prompt"],
            Endpoint::Embeddings => unreachable!("not among the endpoints looped over"),
        };
        assert_eq!(sent, "A named color. Answer in JSON.");
    }
}

#[test]
fn descriptions_replace_the_prompts_and_keep_the_output_lengths() {
    let undescribed = Schema::new("plain.json", json!({"type": "integer"})).unwrap();
    assert_eq!(undescribed.prompt(), None);
    let set = SchemaSet::new(vec![color_schema(), undescribed], true).unwrap();
    let prompt = |text: &str| Prompt { text: text.into(), prompt_len: 3, output_len: 50 };
    let mut dataset =
        Dataset { prompts: vec![prompt("a b c"), prompt("d e f"), prompt("g h i")], exact_lengths: false };
    use_schema_prompts(&mut dataset, &set, |t| Ok::<_, ()>(t.split_whitespace().count())).unwrap();
    let texts: Vec<&str> = dataset.prompts.iter().map(|p| p.text.as_str()).collect();
    assert_eq!(texts, ["A named color. Answer in JSON.", "d e f", "A named color. Answer in JSON."]);
    assert_eq!(
        dataset.prompts.iter().map(|p| (p.prompt_len, p.output_len)).collect::<Vec<_>>(),
        [(6, 50), (3, 50), (6, 50)]
    );
    assert!(SchemaSet::new(vec![], true).is_none());
}

#[test]
fn answers_are_parsed_and_validated_with_formats() {
    let set = SchemaSet::new(vec![color_schema()], true).unwrap();
    let valid = set.check(0, &outcome(r##"{"name": "teal", "hex": "#008080"}"##, "stop"));
    assert_eq!(
        valid,
        SchemaCheck {
            schema: "39-named-color.json".into(),
            valid: Some(true),
            invalid_reason: None,
            invalid_text: None
        }
    );

    let bad_hex = set.check(0, &outcome(r##"{"name": "teal", "hex": "teal", "contact": "nobody"}"##, "stop"));
    assert_eq!(bad_hex.valid, Some(false));
    let reason = bad_hex.invalid_reason.unwrap();
    assert!(reason.contains("at /hex") && reason.contains("at /contact"), "{reason}");
    assert_eq!(
        bad_hex.invalid_text.as_deref(),
        Some(r##"{"name": "teal", "hex": "teal", "contact": "nobody"}"##)
    );

    let cut = set.check(0, &outcome(r##"{"name": "teal", "hex": "#00"##, "length"));
    assert_eq!(cut.valid, Some(false));
    let reason = cut.invalid_reason.unwrap();
    assert!(reason.starts_with("cut off by max_tokens; not JSON: EOF"), "{reason}");

    let long = format!("[{}]", "1, ".repeat(200));
    let check = set.check(0, &outcome(&long, "stop"));
    assert_eq!(check.invalid_text.unwrap().chars().count(), INVALID_TEXT_CHARS + 1);
}

#[test]
fn failed_requests_and_validation_off_are_not_checked() {
    let on = SchemaSet::new(vec![color_schema()], true).unwrap();
    let failed = Outcome { error: Some("HTTP 500: boom".into()), ..outcome("{", "length") };
    assert_eq!(on.check(3, &failed).valid, None);
    let off = SchemaSet::new(vec![color_schema()], false).unwrap();
    let check = off.check(0, &outcome("{", "stop"));
    assert_eq!((check.schema.as_str(), check.valid), ("39-named-color.json", None));
}

#[test]
fn validity_counts_and_invalid_examples() {
    let set = SchemaSet::new(vec![color_schema()], true).unwrap();
    let prompt = Prompt { text: "x".into(), prompt_len: 1, output_len: 8 };
    let answers = [
        (r##"{"name": "teal", "hex": "#008080"}"##, "stop", None),
        (r##"{"name": "teal", "hex": "#00"##, "length", None),
        (r#"{"name": 1}"#, "stop", None),
        ("{", "length", Some("HTTP 500: boom")),
    ];
    let results: Vec<RequestResult> = answers
        .iter()
        .enumerate()
        .map(|(i, (text, finish, error))| {
            let o = Outcome { error: error.map(Into::into), ..outcome(text, finish) };
            let schema_check = Some(set.check(i, &o));
            RequestResult { schema_check, ..to_result(i, &prompt, o, Duration::ZERO) }
        })
        .collect();
    let v = summarize_validity(&results).unwrap();
    assert_eq!(v, ValiditySummary { checked: 3, valid: 1, finished_length: 1, invalid_not_cut_off: 1 });
    let examples = invalid_examples(&results, 1);
    assert_eq!(examples.len(), 1);
    assert!(
        examples[0].starts_with("39-named-color.json (request 1, finish_reason length): cut off"),
        "{}",
        examples[0]
    );
    assert!(examples[0].contains("\n    text: {\"name\""), "{}", examples[0]);
    assert_eq!(invalid_examples(&results, 10).len(), 2);

    let saved = serde_json::to_value(&results[2]).unwrap();
    assert_eq!(saved["schema"], "39-named-color.json");
    assert_eq!(saved["valid"], false);
    assert!(saved["invalid_reason"].as_str().unwrap().contains("at /name"), "{saved}");
    let plain = RequestResult { schema_check: None, ..results[0].clone() };
    assert!(serde_json::to_value(&plain).unwrap().get("valid").is_none());
    assert_eq!(summarize_validity(&[plain]), None);
}

#[test]
fn the_grammar_layout_spaces_separators_and_keeps_key_order() {
    let v: Value =
        serde_json::from_str(r#"{"b": [1, {"z": null, "a": "x\"y"}], "a": true, "e": {}}"#).unwrap();
    assert_eq!(grammar_layout(&v), r#"{"b": [1, {"z": null, "a": "x\"y"}], "a": true, "e": {}}"#);
    assert_eq!(grammar_layout(&json!([])), "[]");
    assert_eq!(grammar_layout(&json!(1.5)), "1.5");
}

//! Value-level mutations of a valid request (of any API: OpenAI's, Anthropic's Messages, the
//! Responses API): a field of the wrong type or out of range, null, removed, emptied, repeated,
//! very long, an unknown field, or raw JSON text that `Value` cannot hold (NaN, 1e400, lone
//! surrogates, invalid UTF-8, deep nesting) spliced in after serialization.

use serde_json::{json, Value};

use super::gen::{text, Endpoint, Rng, MODEL};

const CHAT_FIELDS: &[&str] = &[
    "model",
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "n",
    "stop",
    "stop_token_ids",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "logit_bias",
    "logprobs",
    "top_logprobs",
    "ignore_eos",
    "min_tokens",
    "skip_special_tokens",
    "stream",
    "stream_options",
    "user",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "response_format",
    "add_generation_prompt",
    "continue_final_message",
    "add_special_tokens",
    "chat_template_kwargs",
    "priority",
    "metadata",
];

const COMPLETION_FIELDS: &[&str] = &[
    "model",
    "prompt",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "n",
    "best_of",
    "stop",
    "stop_token_ids",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "logit_bias",
    "logprobs",
    "echo",
    "suffix",
    "ignore_eos",
    "min_tokens",
    "skip_special_tokens",
    "stream",
    "stream_options",
    "user",
    "response_format",
    "add_special_tokens",
    "priority",
    "store",
];

const TOKENIZE_FIELDS: &[&str] = &[
    "model",
    "prompt",
    "messages",
    "add_generation_prompt",
    "add_special_tokens",
    "continue_final_message",
    "chat_template_kwargs",
];
const DETOKENIZE_FIELDS: &[&str] = &["model", "tokens"];
const MESSAGES_FIELDS: &[&str] = &[
    "model",
    "max_tokens",
    "messages",
    "system",
    "stop_sequences",
    "temperature",
    "top_p",
    "top_k",
    "stream",
    "metadata",
    "tools",
    "tool_choice",
    "thinking",
    "service_tier",
    "output_config",
    "context_management",
];
const COUNT_TOKENS_FIELDS: &[&str] = &[
    "model",
    "messages",
    "system",
    "tools",
    "tool_choice",
    "thinking",
    "output_config",
    "context_management",
];
const RESPONSES_FIELDS: &[&str] = &[
    "model",
    "input",
    "instructions",
    "max_output_tokens",
    "temperature",
    "top_p",
    "stream",
    "metadata",
    "user",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "text",
    "reasoning",
    "store",
    "previous_response_id",
    "include",
    "truncation",
];
const NESTED_FIELDS: &[&str] = &[
    "role",
    "content",
    "name",
    "type",
    "text",
    "include_usage",
    "image_url",
    "tool_calls",
    // Anthropic's blocks and tools.
    "tool_use_id",
    "input",
    "input_schema",
    "cache_control",
    "is_error",
    "source",
    "user_id",
    "disable_parallel_tool_use",
    // The Responses API's items and formats.
    "call_id",
    "arguments",
    "output",
    "format",
    "id",
    "status",
    "strict",
];
const UNKNOWN_FIELDS: &[&str] = &[
    "tools",
    "functions",
    "response_format",
    "parallel_tool_calls",
    "foo",
    "",
    "MESSAGES",
    "max_tokens ",
    "__proto__",
    "logprobs\u{0}",
    "🦀",
];

/// One step of a path into a JSON value.
#[derive(Debug, Clone)]
enum Step {
    Key(String),
    Index(usize),
}

fn pointer(path: &[Step]) -> String {
    path.iter()
        .map(|s| match s {
            Step::Key(k) => format!("/{k}"),
            Step::Index(i) => format!("/{i}"),
        })
        .collect()
}

fn collect_paths(v: &Value, prefix: &mut Vec<Step>, out: &mut Vec<Vec<Step>>) {
    match v {
        Value::Object(m) => {
            for (k, child) in m {
                prefix.push(Step::Key(k.clone()));
                out.push(prefix.clone());
                collect_paths(child, prefix, out);
                prefix.pop();
            }
        }
        Value::Array(a) => {
            for (i, child) in a.iter().enumerate() {
                prefix.push(Step::Index(i));
                out.push(prefix.clone());
                collect_paths(child, prefix, out);
                prefix.pop();
            }
        }
        _ => {}
    }
}

fn node_mut<'a>(v: &'a mut Value, path: &[Step]) -> Option<&'a mut Value> {
    path.iter().try_fold(v, |v, step| match step {
        Step::Key(k) => v.get_mut(k.as_str()),
        Step::Index(i) => v.get_mut(*i),
    })
}

/// Raw JSON text (or bytes) spliced in where a placeholder string stands after serialization.
#[derive(Debug, Default)]
pub struct Raw(Vec<Vec<u8>>);

impl Raw {
    fn add(&mut self, bytes: impl Into<Vec<u8>>) -> Value {
        self.0.push(bytes.into());
        json!(format!("@@RAW{}@@", self.0.len() - 1))
    }

    /// `v` as the server will see it, cut short for the report.
    fn show(&self, v: &Value) -> String {
        let bytes = self.serialize(v);
        let text = String::from_utf8_lossy(&bytes);
        match text.char_indices().nth(60) {
            Some((at, _)) => format!("{}... ({} bytes)", &text[..at], bytes.len()),
            None => text.into_owned(),
        }
    }

    pub fn serialize(&self, v: &Value) -> Vec<u8> {
        let mut text = serde_json::to_vec(v).expect("a Value serializes");
        for (i, raw) in self.0.iter().enumerate().rev() {
            let marker = format!("\"@@RAW{i}@@\"");
            text = splice(&text, marker.as_bytes(), raw);
        }
        text
    }
}

fn splice(haystack: &[u8], needle: &[u8], with: &[u8]) -> Vec<u8> {
    match haystack.windows(needle.len()).position(|w| w == needle) {
        Some(at) => [&haystack[..at], with, &haystack[at + needle.len()..]].concat(),
        None => haystack.to_vec(),
    }
}

/// A string of about 256 to 12,000 bytes once escaped in JSON.
pub fn long_string(rng: &mut Rng) -> String {
    let unit = *rng.pick(&["a", "word ", "🦀", "日本", "\u{0}", "<|im_end|>", "\\", "é"]);
    let len = *rng.pick(&[256usize, 1024, 4096, 12_000]);
    let escaped = serde_json::to_string(unit).expect("a string serializes").len() - 2;
    unit.repeat(len / escaped)
}

fn nested(depth: usize, object: bool) -> Vec<u8> {
    let (open, close) = if object { ("{\"a\":", "}") } else { ("[", "]") };
    [open.repeat(depth), "1".to_owned(), close.repeat(depth)].concat().into_bytes()
}

/// `logit_bias` keys a token-id parser may get wrong.
const BIAS_KEYS: &[&str] = &[
    "49151",
    "49152",
    "4294967295",
    "4294967296",
    "-1",
    "-0",
    "0x10",
    " 5 ",
    "+5",
    "05",
    "5.0",
    "1e3",
    "",
    "٣",
];

/// Names a chat template sees besides the caller's kwargs.
const TEMPLATE_VARIABLES: &[&str] = &[
    "messages",
    "add_generation_prompt",
    "bos_token",
    "eos_token",
    "raise_exception",
    "tools",
    "range",
    "loop",
    "namespace",
    "strftime_now",
    "continue_final_message",
];

const RAW_TOKENS: &[&str] = &[
    "NaN",
    "-NaN",
    "Infinity",
    "-Infinity",
    "1e400",
    "-1e400",
    "1e-400",
    "01",
    "1.",
    ".5",
    "+1",
    "0x10",
    "1_000",
    "--1",
    "1e",
    "-",
    "123456789012345678901234567890",
    "18446744073709551616",
    "-9223372036854775809",
    "1E+2",
    "-0",
    "0.0000000000000000000000001",
    "nul",
    "undefined",
    "'x'",
    "\"\\ud800\"",
    "\"\\udc00\\ud800\"",
    "\"\\ud83e\\udd80\"",
    "\"\\u12\"",
    "\"\\x41\"",
    "\"\\q\"",
    "\"a\u{1}b\"",
    "\"tab\there\"",
    "[1,]",
    "{\"a\":1,}",
    "[1 2]",
];

/// A value of some other type or range than the field wants.
fn weird(rng: &mut Rng, raw: &mut Raw) -> Value {
    match rng.below(10) {
        0 | 1 => rng
            .pick(&[
                json!(0),
                json!(-1),
                json!(1),
                json!(2),
                json!(0.5),
                json!(-0.0),
                json!(1e308),
                json!(-1e308),
                json!(5e-324),
                json!(u32::MAX),
                json!(u32::MAX as u64 + 1),
                json!(i32::MAX),
                json!(i32::MAX as i64 + 1),
                json!(i32::MIN as i64 - 1),
                json!(i64::MAX),
                json!(i64::MIN),
                json!(u64::MAX),
                json!(1.5),
                json!(2.000_001),
                json!(20),
                json!(21),
                json!(100),
                json!(101),
                json!(-100.5),
                json!(128),
                json!(129),
                json!(49151),
                json!(49152),
                json!(1e20),
                json!(3.402_823_5e38),
                json!(3.5e38),
                json!(1e-46),
                json!(-1e-46),
            ])
            .clone(),
        2 | 3 => rng
            .pick(&[
                json!("1"),
                json!("NaN"),
                json!("Infinity"),
                json!("-0"),
                json!("hot"),
                json!(""),
                json!(true),
                json!(false),
                Value::Null,
                json!([]),
                json!({}),
                json!([1]),
                json!(["a"]),
                json!([[1]]),
                json!({"a": 1}),
                json!([null]),
                json!({"type": "text"}),
                json!({"role": "user"}),
                json!(MODEL),
                json!("gpt-4o"),
                json!("SMOL"),
            ])
            .clone(),
        4 => text(rng),
        5 => json!(long_string(rng)),
        6 => raw.add(*rng.pick(RAW_TOKENS)),
        7 => raw.add(nested(*rng.pick(&[2usize, 64, 127, 128, 129, 500, 5000]), rng.chance(50))),
        // An image part (fuzzed bytes or URL) wherever a value goes: the model takes no images.
        8 => super::images::chat_part(rng),
        _ => {
            let options: &[&[u8]] =
                &[b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xc0\xaf", b"\xe2\x82", b"\xfe\xfe"];
            let bad = *rng.pick(options);
            raw.add([&b"\"a"[..], bad, b"b\""].concat())
        }
    }
}

/// Applies 1 to 3 value-level mutations to `body`.
pub fn mutate_values(
    rng: &mut Rng,
    endpoint: Endpoint,
    body: &mut Value,
    raw: &mut Raw,
    what: &mut Vec<String>,
) {
    let known = match endpoint {
        Endpoint::Chat => CHAT_FIELDS,
        Endpoint::Completions => COMPLETION_FIELDS,
        Endpoint::Tokenize => TOKENIZE_FIELDS,
        Endpoint::Messages => MESSAGES_FIELDS,
        Endpoint::CountTokens => COUNT_TOKENS_FIELDS,
        Endpoint::Responses => RESPONSES_FIELDS,
        _ => DETOKENIZE_FIELDS,
    };
    let count = match rng.below(10) {
        0..=5 => 1,
        6..=8 => 2,
        _ => 3,
    };
    for _ in 0..count {
        let mut paths = Vec::new();
        collect_paths(body, &mut Vec::new(), &mut paths);
        let op = rng.below(12);
        if op == 0 || paths.is_empty() {
            // A known field, present or not, set to something odd.
            let key = *rng.pick(known);
            let v = if key == "logit_bias" && rng.chance(50) {
                json!({*rng.pick(BIAS_KEYS): *rng.pick(&[1.0, 100.0, -100.0])})
            } else if key == "chat_template_kwargs" && rng.chance(70) {
                // Variables the template itself uses, overridden.
                json!({*rng.pick(TEMPLATE_VARIABLES): weird(rng, raw)})
            } else {
                weird(rng, raw)
            };
            what.push(format!("set /{key} = {}", raw.show(&v)));
            if let Some(m) = body.as_object_mut() {
                m.insert(key.to_owned(), v);
            }
            continue;
        }
        let path = rng.pick(&paths).clone();
        let at = pointer(&path);
        match op {
            1..=5 => {
                let v = weird(rng, raw);
                what.push(format!("replace {at} with {}", raw.show(&v)));
                *node_mut(body, &path).expect("the path exists") = v;
            }
            6 | 7 => {
                what.push(format!("delete {at}"));
                let (last, parent) = path.split_last().expect("paths are not empty");
                match (node_mut(body, parent).expect("the parent exists"), last) {
                    (Value::Object(m), Step::Key(k)) => {
                        m.remove(k);
                    }
                    (Value::Array(a), Step::Index(i)) => {
                        a.remove(*i);
                    }
                    _ => unreachable!("steps match their containers"),
                }
            }
            8 => {
                // An unknown (or nested-known) field in some object.
                let key = if rng.chance(70) { *rng.pick(UNKNOWN_FIELDS) } else { *rng.pick(NESTED_FIELDS) };
                let v = weird(rng, raw);
                let target = if rng.chance(50) { Vec::new() } else { path };
                what.push(format!("add field {key:?} = {} at {}", raw.show(&v), pointer(&target)));
                if let Some(Value::Object(m)) = node_mut(body, &target) {
                    m.insert(key.to_owned(), v);
                } else if let Value::Object(m) = body {
                    m.insert(key.to_owned(), v);
                }
            }
            9 => {
                // Empty it, or repeat an array's first element many times.
                let node = node_mut(body, &path).expect("the path exists");
                match node {
                    Value::Array(a) if !a.is_empty() && rng.chance(60) => {
                        let k = *rng.pick(&[2usize, 17, 40]);
                        what.push(format!("repeat {at}[0] {k} times"));
                        let first = a[0].clone();
                        a.resize(k, first);
                    }
                    Value::Array(a) => {
                        what.push(format!("empty {at}"));
                        a.clear();
                    }
                    Value::Object(m) => {
                        what.push(format!("empty {at}"));
                        m.clear();
                    }
                    other => {
                        what.push(format!("replace {at} with \"\""));
                        *other = json!("");
                    }
                }
            }
            10 => {
                let s = long_string(rng);
                what.push(format!("replace {at} with a {}-byte string", s.len()));
                *node_mut(body, &path).expect("the path exists") = json!(s);
            }
            _ => {
                let v = rng
                    .pick(&[
                        json!([]),
                        json!("hi"),
                        json!(5),
                        Value::Null,
                        json!([{"role": "user"}]),
                        json!(true),
                    ])
                    .clone();
                what.push(format!("replace the whole body with {v}"));
                *body = v;
                return;
            }
        }
    }
}

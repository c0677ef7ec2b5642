//! The fuzz suite's request generator: valid requests for every POST endpoint built from the
//! wire types' fields (the OpenAI endpoints' here, Anthropic's Messages and OpenAI's Responses
//! in `agent_gen`), then mutated at three levels (JSON values, the body's bytes, and the HTTP
//! request around it), and calls on made-up stored responses. Each case is a pure function of
//! `(seed, index)`, so one failing case can be rebuilt alone.

use serde_json::{json, Map, Value};

use super::agent_gen;
use super::mutate::{mutate_values, Raw};
pub use super::rng::Rng;

/// The fuzz server's API key and served model name.
pub const API_KEY: &str = "fuzz-secret";
pub const MODEL: &str = "smol";
/// SmolLM2's vocabulary size.
pub const VOCAB: u64 = 49152;
/// The fuzz server's body limit (`--max-request-body-bytes`), and the size of every body but
/// the oversized ones.
pub const BODY_LIMIT: usize = 32 * 1024;

/// What the request is for, in the report's terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Endpoint {
    Chat,
    Completions,
    Tokenize,
    Detokenize,
    /// Anthropic's `POST /v1/messages`.
    Messages,
    /// Anthropic's `POST /v1/messages/count_tokens`.
    CountTokens,
    /// OpenAI's `POST /v1/responses`.
    Responses,
    /// `GET` / `DELETE /v1/responses/{id}` and `GET .../input_items` on made-up ids, and
    /// `previous_response_id` naming one.
    StoredResponses,
    /// The GET routes (`/health`, `/v1/models`, ...).
    Info,
    /// Unknown paths and methods.
    Other,
}

impl Endpoint {
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::Chat => "/v1/chat/completions",
            Endpoint::Completions => "/v1/completions",
            Endpoint::Tokenize => "/tokenize",
            Endpoint::Detokenize => "/detokenize",
            Endpoint::Messages => "/v1/messages",
            Endpoint::CountTokens => "/v1/messages/count_tokens",
            Endpoint::Responses | Endpoint::StoredResponses => "/v1/responses",
            Endpoint::Info | Endpoint::Other => "/",
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Endpoint::Chat => "chat",
            Endpoint::Completions => "completions",
            Endpoint::Tokenize => "tokenize",
            Endpoint::Detokenize => "detokenize",
            Endpoint::Messages => "messages",
            Endpoint::CountTokens => "count-tokens",
            Endpoint::Responses => "responses",
            Endpoint::StoredResponses => "stored-responses",
            Endpoint::Info => "get-routes",
            Endpoint::Other => "unknown-route-or-method",
        }
    }
}

/// The status a case must get; every case must also avoid 5xx and answer in the right shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// A valid request: 200 with the endpoint's body.
    Ok,
    Status(u16),
    /// Anything below 500.
    Any,
}

/// One HTTP request of the suite.
#[derive(Debug, Clone)]
pub struct Case {
    pub index: usize,
    pub endpoint: Endpoint,
    pub method: &'static str,
    pub path: String,
    pub content_type: Option<String>,
    /// The whole `Authorization` value; `None` sends none.
    pub auth: Option<String>,
    pub headers: Vec<(&'static str, String)>,
    pub body: Vec<u8>,
    pub expect: Expect,
    /// The mutations applied, for the report.
    pub what: Vec<String>,
    /// For valid requests: whether it streams, and how many choices it asks for.
    pub stream: Option<bool>,
    pub choices: Option<usize>,
}

impl Case {
    /// A JSON POST of `body` to `endpoint` with the suite's key and request id, expecting
    /// `expect`; the rest is filled in by the caller.
    pub fn post(seed: u64, index: usize, endpoint: Endpoint, body: Vec<u8>, expect: Expect) -> Self {
        Case {
            index,
            endpoint,
            method: "POST",
            path: endpoint.path().to_owned(),
            content_type: Some("application/json".into()),
            auth: Some(format!("Bearer {API_KEY}")),
            headers: vec![("x-request-id", format!("fuzz-{seed}-{index}"))],
            body,
            expect,
            what: Vec::new(),
            stream: None,
            choices: None,
        }
    }
}

const TEXTS: &[&str] = &[
    "Hi",
    "Hello!",
    "What is 2+2?",
    "Name a color.",
    "Say yes.",
    "The sky is",
    "Once upon a time",
    "🦀 Rust",
    "日本語で",
    "Ça va?",
    "x",
    " ",
    "\n",
    "a\tb",
    "<|im_start|>",
    "<|im_end|>user",
    "<|endoftext|>",
    "{{ messages }}",
    "{% if true %}x{% endif %}",
    "\u{200b}",
    "\u{feff}BOM",
    "\u{202e}rtl",
    "e\u{301}",
    "nul\u{0}byte",
    "\u{1}\u{1f}\u{7f}",
    "\u{fffd}",
    "\u{10ffff}",
    "\\u0000",
    "\"quoted\"",
    // Last: `prompt_text` leaves it out.
    "",
];

/// Valid but extreme values of the positive sampling parameters (temperature, top_p,
/// repetition_penalty): subnormal, tiny, and the upper bound.
const EDGES: &[f64] = &[1e-45, 1e-30, 1e-7, 1.0, 2.0];

pub const STOPS: &[&str] = &["\n", ".", "!", "the", "ab", "🦀", "<|im_end|>", " ", "\u{0}", "é"];

const ROLES: &[&str] = &["system", "developer", "user", "assistant"];

pub fn text(rng: &mut Rng) -> Value {
    json!(*rng.pick(TEXTS))
}

/// A text that tokenizes to at least one token (a completion prompt must not be empty).
pub fn prompt_text(rng: &mut Rng) -> Value {
    json!(*rng.pick(&TEXTS[..TEXTS.len() - 1]))
}

fn token_ids(rng: &mut Rng, min: i64, max: i64) -> Value {
    let len = rng.range(min, max);
    Value::Array((0..len).map(|_| json!(rng.below(VOCAB))).collect())
}

pub fn maybe_model(rng: &mut Rng, m: &mut Map<String, Value>) {
    match rng.below(4) {
        0 => {}
        1 => {
            m.insert("model".into(), json!(""));
        }
        _ => {
            m.insert("model".into(), json!(MODEL));
        }
    }
}

fn content(rng: &mut Rng, role: &str) -> Value {
    match rng.below(10) {
        0 if role == "assistant" => Value::Null,
        0..=2 => {
            let parts = (0..rng.range(1, 2)).map(|_| json!({"type": "text", "text": text(rng)})).collect();
            Value::Array(parts)
        }
        _ => text(rng),
    }
}

fn messages(rng: &mut Rng) -> Value {
    let mut out = Vec::new();
    if rng.chance(25) {
        let role = *rng.pick(&ROLES[..2]);
        out.push(json!({"role": role, "content": content(rng, role)}));
    }
    for _ in 0..rng.below(2) {
        out.push(json!({"role": "user", "content": content(rng, "user")}));
        let mut reply = json!({"role": "assistant", "content": content(rng, "assistant")});
        if rng.chance(10) {
            reply["tool_calls"] = if rng.chance(50) { json!([]) } else { Value::Null };
        }
        out.push(reply);
    }
    let mut last = json!({"role": "user", "content": content(rng, "user")});
    if rng.chance(15) {
        last["name"] = json!("alice");
    }
    out.push(last);
    Value::Array(out)
}

/// How the chat template renders `messages` (chat and tokenize): the generation prompt, or a
/// continued final assistant message, and extra template variables.
fn template_options(rng: &mut Rng, m: &mut Map<String, Value>) {
    if rng.chance(10) {
        let messages = m["messages"].as_array_mut().expect("messages were set");
        messages.push(json!({"role": "assistant", "content": prompt_text(rng)}));
        m.insert("continue_final_message".into(), json!(true));
        if rng.chance(50) {
            m.insert("add_generation_prompt".into(), json!(false));
        }
    } else {
        if rng.chance(10) {
            m.insert("add_generation_prompt".into(), json!(rng.chance(50)));
        }
        if rng.chance(5) {
            m.insert("continue_final_message".into(), json!(false));
        }
    }
    if rng.chance(8) {
        let kwargs: Map<String, Value> = (0..rng.range(0, 2))
            .map(|_| {
                let key = *rng.pick(&["enable_thinking", "date_string", "custom_instructions", "xyz"]);
                (key.to_owned(), rng.pick(&[json!(true), json!("x"), json!(3), json!({"a": [1]})]).clone())
            })
            .collect();
        m.insert("chat_template_kwargs".into(), Value::Object(kwargs));
    }
}

/// No-op values of fields that can change the output (tools, structured output, priority), and
/// bookkeeping fields the server ignores.
fn no_ops(rng: &mut Rng, m: &mut Map<String, Value>, chat: bool) {
    let mut options = vec![
        ("response_format", json!({"type": "text"})),
        ("response_format", Value::Null),
        ("priority", json!(0)),
        ("metadata", json!({"k": "v"})),
        ("store", json!(false)),
        ("service_tier", json!("auto")),
        ("safety_identifier", json!("s")),
        ("prompt_cache_key", json!("p")),
        ("request_id", json!("r-1")),
    ];
    if chat {
        options.extend([
            ("tools", json!([])),
            ("tools", Value::Null),
            ("tool_choice", json!("none")),
            ("parallel_tool_calls", json!(rng.chance(50))),
        ]);
    }
    for _ in 0..rng.below(3) {
        if rng.chance(30) {
            let (key, value) = rng.pick(&options).clone();
            m.insert(key.to_owned(), value);
        }
    }
}

/// The sampling fields both generation APIs share; returns `n`.
fn sampling(rng: &mut Rng, m: &mut Map<String, Value>, max_tokens: i64, chat: bool) -> usize {
    let set = |m: &mut Map<String, Value>, key: &str, v: Value| {
        m.insert(key.to_owned(), v);
    };
    if rng.chance(35) {
        let t = match rng.below(10) {
            0..=2 => json!(0),
            3 => json!(*rng.pick(EDGES)),
            _ => rng.hundredths(0, 200),
        };
        set(m, "temperature", t);
    }
    if rng.chance(20) {
        let p = if rng.chance(25) { json!(*rng.pick(&EDGES[..3])) } else { rng.hundredths(1, 100) };
        set(m, "top_p", p);
    }
    if rng.chance(20) {
        set(m, "top_k", json!(*rng.pick(&[-1, 0, 1, 5, 40, 49151, 49152, 100_000, i32::MAX])));
    }
    if rng.chance(15) {
        let p = if rng.chance(25) {
            json!(*rng.pick(&[0.0, 1.0, 1e-45, 0.999_999]))
        } else {
            rng.hundredths(0, 100)
        };
        set(m, "min_p", p);
    }
    let n = match rng.below(100) {
        0..=2 => 16,
        3..=19 => rng.range(1, 3) as usize,
        _ => 1,
    };
    if n > 1 || rng.chance(10) {
        set(m, "n", json!(n));
    }
    if rng.chance(20) {
        let stop = if rng.chance(50) {
            json!(*rng.pick(STOPS))
        } else {
            Value::Array((0..rng.range(1, 3)).map(|_| json!(*rng.pick(STOPS))).collect())
        };
        set(m, "stop", stop);
    }
    if rng.chance(10) {
        set(m, "stop_token_ids", token_ids(rng, 0, 3));
    }
    if rng.chance(20) {
        let seed = if rng.chance(50) {
            json!(*rng.pick(&[0, 1, 42, -1, i64::MAX, i64::MIN]))
        } else {
            json!(rng.next_u64() as i64)
        };
        set(m, "seed", seed);
    }
    for key in ["presence_penalty", "frequency_penalty"] {
        if rng.chance(10) {
            set(m, key, rng.hundredths(-200, 200));
        }
    }
    if rng.chance(10) {
        let p = if rng.chance(30) { json!(*rng.pick(EDGES)) } else { rng.hundredths(1, 200) };
        set(m, "repetition_penalty", p);
    }
    if rng.chance(10) {
        let entries = if rng.chance(20) { 300 } else { rng.range(0, 3) };
        let extreme = rng.chance(30);
        let bias: Map<String, Value> = (0..entries)
            .map(|_| {
                let v = if extreme {
                    json!(*rng.pick(&[100.0, -100.0, 1e-45, -0.0]))
                } else {
                    json!(rng.range(-100, 100))
                };
                (rng.below(VOCAB).to_string(), v)
            })
            .collect();
        set(m, "logit_bias", Value::Object(bias));
    }
    let echo = !chat && rng.chance(10);
    if rng.chance(15) {
        if chat {
            let on = rng.chance(70);
            set(m, "logprobs", json!(on));
            if on && rng.chance(60) {
                set(m, "top_logprobs", json!(*rng.pick(&[0, 1, 2, 5, 20])));
            }
        } else {
            set(m, "logprobs", json!(*rng.pick(&[0, 1, 2, 5, 20])));
        }
    }
    if echo {
        set(m, "echo", json!(true));
    }
    if rng.chance(10) {
        set(m, "ignore_eos", json!(rng.chance(50)));
    }
    if rng.chance(10) {
        set(m, "min_tokens", json!(rng.range(0, max_tokens)));
    }
    if rng.chance(5) {
        set(m, "skip_special_tokens", json!(rng.chance(50)));
    }
    if rng.chance(5) {
        set(m, "user", text(rng));
    }
    n
}

/// Sets `stream` (and sometimes `stream_options`); returns whether it streams.
fn streaming(rng: &mut Rng, m: &mut Map<String, Value>) -> bool {
    let stream = stream_flag(rng, m);
    if stream && rng.chance(50) {
        m.insert("stream_options".into(), json!({"include_usage": rng.chance(50)}));
    }
    stream
}

/// Sets `stream` alone; returns whether it streams.
pub fn stream_flag(rng: &mut Rng, m: &mut Map<String, Value>) -> bool {
    let stream = rng.chance(35);
    if stream || rng.chance(10) {
        m.insert("stream".into(), json!(stream));
    }
    stream
}

/// A valid request for `endpoint`, its stream flag and its number of choices.
fn valid(rng: &mut Rng, endpoint: Endpoint) -> (Value, Option<bool>, Option<usize>) {
    let mut m = Map::new();
    maybe_model(rng, &mut m);
    match endpoint {
        Endpoint::Chat => {
            m.insert("messages".into(), messages(rng));
            let max = rng.range(1, 4);
            match rng.below(3) {
                0 => m.insert("max_tokens".into(), json!(max)),
                1 => m.insert("max_completion_tokens".into(), json!(max)),
                _ => {
                    m.insert("max_tokens".into(), json!(rng.range(1, 4)));
                    m.insert("max_completion_tokens".into(), json!(max))
                }
            };
            let n = sampling(rng, &mut m, max, true);
            template_options(rng, &mut m);
            if rng.chance(5) {
                m.insert("add_special_tokens".into(), json!(rng.chance(50)));
            }
            no_ops(rng, &mut m, true);
            let stream = streaming(rng, &mut m);
            (Value::Object(m), Some(stream), Some(n))
        }
        Endpoint::Completions => {
            let (prompt, count) = match rng.below(4) {
                0 => (prompt_text(rng), 1),
                1 => {
                    let k = rng.range(1, 3) as usize;
                    (Value::Array((0..k).map(|_| prompt_text(rng)).collect()), k)
                }
                2 => (token_ids(rng, 1, 8), 1),
                _ => {
                    let k = rng.range(1, 3) as usize;
                    (Value::Array((0..k).map(|_| token_ids(rng, 1, 6)).collect()), k)
                }
            };
            m.insert("prompt".into(), prompt);
            let max = rng.range(1, 4);
            m.insert("max_tokens".into(), json!(max));
            let n = sampling(rng, &mut m, max, false);
            if rng.chance(10) {
                m.insert("best_of".into(), json!(n));
            }
            if rng.chance(5) {
                m.insert("suffix".into(), json!(""));
            }
            if rng.chance(5) {
                m.insert("add_special_tokens".into(), json!(rng.chance(50)));
            }
            no_ops(rng, &mut m, false);
            let stream = streaming(rng, &mut m);
            (Value::Object(m), Some(stream), Some(n * count))
        }
        Endpoint::Tokenize => {
            if rng.chance(50) {
                m.insert("prompt".into(), text(rng));
            } else {
                m.insert("messages".into(), messages(rng));
                template_options(rng, &mut m);
            }
            if rng.chance(40) {
                m.insert("add_special_tokens".into(), json!(rng.chance(50)));
            }
            (Value::Object(m), None, None)
        }
        Endpoint::Detokenize => {
            m.insert("tokens".into(), token_ids(rng, 0, 12));
            (Value::Object(m), None, None)
        }
        _ => {
            let (body, stream) = agent_gen::valid(rng, endpoint);
            (body, stream, stream.map(|_| 1))
        }
    }
}

/// How often each endpoint comes, out of 20. The generation endpoints get half (60% before the
/// agent APIs came: the server's context is longer now, for tools, so what a mutated request
/// without a token limit costs is too).
const ENDPOINTS: &[(Endpoint, u64)] = &[
    (Endpoint::Chat, 3),
    (Endpoint::Completions, 3),
    (Endpoint::Messages, 2),
    (Endpoint::Responses, 2),
    (Endpoint::Tokenize, 2),
    (Endpoint::Detokenize, 2),
    (Endpoint::CountTokens, 3),
    (Endpoint::StoredResponses, 3),
];

/// Builds case `index` of the suite under `seed`.
pub fn generate(seed: u64, index: usize) -> Case {
    if let Some(case) = super::huge_n::generate(seed, index) {
        return case;
    }
    if let Some(case) = super::deep_grammar::generate(seed, index) {
        return case;
    }
    let mut rng = Rng::for_case(seed, index);
    let endpoint = rng.weighted(ENDPOINTS);
    let mut case = Case::post(seed, index, endpoint, Vec::new(), Expect::Ok);
    if endpoint == Endpoint::StoredResponses {
        agent_gen::stored_response_call(&mut rng, &mut case);
        return case;
    }
    if endpoint == Endpoint::Responses && rng.chance(10) {
        super::mcp_gen::mcp_request(&mut rng, &mut case);
        return case;
    }
    let (mut body, stream, choices) = valid(&mut rng, endpoint);
    (case.stream, case.choices) = (stream, choices);
    if matches!(endpoint, Endpoint::Messages | Endpoint::CountTokens) {
        agent_gen::anthropic_headers(&mut rng, &mut case);
    }
    let mut raw = Raw::default();
    let kind = rng.below(100);
    if (15..70).contains(&kind) {
        mutate_values(&mut rng, endpoint, &mut body, &mut raw, &mut case.what);
        case.expect = Expect::Any;
    }
    case.body = raw.serialize(&body);
    if (70..85).contains(&kind) {
        super::bytes::mutate_bytes(&mut rng, &mut case);
    } else if kind >= 85 {
        super::bytes::mutate_http(&mut rng, &mut case);
    }
    if case.expect != Expect::Ok {
        case.stream = None;
        case.choices = None;
    }
    case
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cases_are_reproducible_and_cover_every_endpoint() {
        let mut endpoints = std::collections::BTreeSet::new();
        let mut valid = std::collections::BTreeMap::new();
        let mut features = std::collections::BTreeMap::new();
        for (seed, index) in (0..4).flat_map(|seed| (0..2000).map(move |i| (seed, i))) {
            let (a, b) = (generate(seed, index), generate(seed, index));
            assert_eq!((a.method, &a.path, &a.body, a.expect), (b.method, &b.path, &b.body, b.expect));
            assert!(a.body.len() < 64 * 1024, "case {seed}/{index} is {} bytes", a.body.len());
            if a.expect == Expect::Ok {
                *valid.entry(a.endpoint).or_insert(0) += 1;
                assert!(serde_json::from_slice::<Value>(&a.body).is_ok(), "case {seed}/{index}");
                assert!(a.body.len() <= BODY_LIMIT, "case {seed}/{index}");
                let body = String::from_utf8_lossy(&a.body);
                for feature in ["\"tools\"", "\"tool_result\"", "\"function_call_output\"", "\"stream\":true"]
                {
                    if body.contains(feature) {
                        *features.entry((a.endpoint, feature)).or_insert(0) += 1;
                    }
                }
            }
            endpoints.insert(a.endpoint);
        }
        assert_eq!(endpoints.len(), 10, "{endpoints:?}");
        assert!(valid.values().sum::<usize>() > 4 * 250, "{valid:?} valid cases");
        // Every POST endpoint has valid cases, and the agent APIs' tools, exchanges and streams.
        assert_eq!(valid.len(), 7, "{valid:?}");
        assert!(valid.values().all(|&n| n > 4 * 20), "{valid:?}");
        for (endpoint, feature) in [
            (Endpoint::Messages, "\"tools\""),
            (Endpoint::Messages, "\"tool_result\""),
            (Endpoint::Messages, "\"stream\":true"),
            (Endpoint::CountTokens, "\"tools\""),
            (Endpoint::Responses, "\"tools\""),
            (Endpoint::Responses, "\"function_call_output\""),
            (Endpoint::Responses, "\"stream\":true"),
        ] {
            assert!(
                features.get(&(endpoint, feature)).is_some_and(|&n| n >= 4 * 3),
                "{endpoint:?} {feature}: {features:?}"
            );
        }
        assert_ne!(generate(7, 1).body, generate(8, 1).body);
    }
}

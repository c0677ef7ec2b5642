//! Valid requests of the agent APIs, built from their wire types' fields: Anthropic's
//! `/v1/messages` and `/v1/messages/count_tokens` (turns of string or text-block content, a
//! system prompt, sampling, tools and a `tool_use` / `tool_result` exchange) and OpenAI's
//! `/v1/responses` (input as a string or items, function calls and their outputs, tools, JSON
//! output, `store`); hosted tools (`web_search`, Anthropic's server tools) beside the function
//! tools, which the server leaves out; and the calls on stored responses that cannot exist
//! (made-up ids), which must be 404s.

use serde_json::{json, Map, Value};

use super::gen::{
    maybe_model, prompt_text, stream_flag, text, Case, Endpoint, Expect, Rng, API_KEY, MODEL, STOPS,
};

/// What a conversation holds besides its last turn. SmolLM2's tool prompt alone is 115 to 175
/// tokens and a tool exchange in the history another 30 to 100: for a valid request to fit the
/// fuzz server's context (256 tokens), one with tools has no earlier turns and no exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    /// Earlier turns (and for Anthropic, system blocks), maybe.
    Plain,
    /// A tool call and its result in the history, maybe after earlier turns.
    Exchange,
    /// Tools in the request: a one-turn conversation.
    Tools,
}

impl Shape {
    fn pick(rng: &mut Rng) -> Shape {
        rng.weighted(&[(Shape::Plain, 50), (Shape::Exchange, 25), (Shape::Tools, 25)])
    }
}

/// Small tools: the tool prompt of SmolLM2's template is over 100 tokens already.
fn tool_schema(rng: &mut Rng) -> (&'static str, Value) {
    rng.pick(&[
        (
            "get_weather",
            json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
        ),
        ("add", json!({"type": "object", "properties": {"a": {"type": "integer"}}})),
        ("now", json!({"type": "object"})),
    ])
    .clone()
}

/// A hosted tool the server leaves out (`--hosted-tools ignore`, the default), in the shapes
/// clients send: Responses' built-in tools, or Anthropic's server tools.
fn hosted_tool(rng: &mut Rng, anthropic: bool) -> Value {
    let tools = if anthropic {
        [
            json!({"type": "web_search_20250305", "name": "web_search", "max_uses": 3}),
            json!({"type": "web_fetch_20250910", "name": "web_fetch", "allowed_domains": ["example.com"]}),
            json!({"type": "code_execution_20250825", "name": "code_execution"}),
            json!({"type": "web_search_20260209", "name": "web_search", "cache_control": {"type": "ephemeral"}}),
        ]
    } else {
        [
            json!({"type": "web_search", "external_web_access": false}),
            json!({"type": "web_search_preview_2025_03_11", "search_context_size": "low"}),
            json!({"type": "file_search", "vector_store_ids": ["vs_fuzz"]}),
            json!({"type": "code_interpreter", "container": {"type": "auto"}}),
        ]
    };
    rng.pick(&tools).clone()
}

/// The arguments of a call to the tool `name`.
fn tool_input(name: &str) -> Value {
    match name {
        "get_weather" => json!({"city": "Oslo"}),
        "add" => json!({"a": 2}),
        _ => json!({}),
    }
}

fn temperature(rng: &mut Rng, max_hundredths: i64) -> Value {
    match rng.below(10) {
        0..=2 => json!(0),
        3 => json!(*rng.pick(&[1e-45, 1e-7, 1.0])),
        _ => rng.hundredths(0, max_hundredths),
    }
}

fn top_p(rng: &mut Rng) -> Value {
    if rng.chance(25) {
        json!(*rng.pick(&[1e-45, 1e-30, 1e-7, 1.0]))
    } else {
        rng.hundredths(1, 100)
    }
}

/// A text block, sometimes with a cache breakpoint (which the server ignores).
fn text_block(text: Value, rng: &mut Rng) -> Value {
    let mut block = json!({"type": "text", "text": text});
    if rng.chance(10) {
        block["cache_control"] = json!({"type": "ephemeral"});
    }
    block
}

/// A text with more than whitespace in it (a prefill's trailing whitespace is cut, and an
/// empty one refused).
fn prefill_text(rng: &mut Rng) -> Value {
    loop {
        let t = prompt_text(rng);
        if t.as_str().is_some_and(|t| !t.trim().is_empty()) {
            return t;
        }
    }
}

/// A turn's content: a string or one or two text blocks (a prefill's: each with more than
/// whitespace).
fn anthropic_content(rng: &mut Rng, prefill: bool) -> Value {
    let pick = |rng: &mut Rng| if prefill { prefill_text(rng) } else { text(rng) };
    if rng.chance(30) {
        Value::Array((0..rng.range(1, 2)).map(|_| text_block(pick(rng), rng)).collect())
    } else {
        pick(rng)
    }
}

/// Turns of user and assistant text, sometimes a tool use and its result, ending with a user
/// turn or (a prefill) an assistant one.
fn anthropic_messages(rng: &mut Rng, tool: &str, shape: Shape) -> Value {
    let mut out = Vec::new();
    let earlier = if shape == Shape::Tools { 0 } else { rng.below(2) };
    for _ in 0..earlier {
        out.push(json!({"role": "user", "content": anthropic_content(rng, false)}));
        out.push(json!({"role": "assistant", "content": anthropic_content(rng, false)}));
    }
    out.push(json!({"role": "user", "content": anthropic_content(rng, false)}));
    if shape == Shape::Exchange {
        let mut uses = Vec::new();
        if rng.chance(40) {
            uses.push(text_block(prompt_text(rng), rng));
        }
        uses.push(json!({"type": "tool_use", "id": "toolu_fuzz1", "name": tool, "input": tool_input(tool)}));
        out.push(json!({"role": "assistant", "content": uses}));
        let mut result = json!({"type": "tool_result", "tool_use_id": "toolu_fuzz1"});
        match rng.below(4) {
            0 => {}
            1 => result["content"] = json!([{"type": "text", "text": text(rng)}]),
            _ => result["content"] = text(rng),
        }
        if rng.chance(20) {
            result["is_error"] = json!(rng.chance(50));
        }
        let mut blocks = vec![result];
        if rng.chance(30) {
            blocks.push(text_block(text(rng), rng));
        }
        out.push(json!({"role": "user", "content": blocks}));
    }
    if rng.chance(10) {
        out.push(json!({"role": "assistant", "content": anthropic_content(rng, true)}));
    }
    Value::Array(out)
}

/// The fields `/v1/messages` and `count_tokens` share: the model, the turns, the system
/// prompt, tools and the tool choice, thinking.
fn anthropic_prompt(rng: &mut Rng, m: &mut Map<String, Value>) {
    m.insert("model".into(), json!(MODEL));
    let (tool, schema) = tool_schema(rng);
    let shape = Shape::pick(rng);
    m.insert("messages".into(), anthropic_messages(rng, tool, shape));
    if rng.chance(30) {
        let system = if shape == Shape::Tools || rng.chance(50) {
            text(rng)
        } else {
            Value::Array((0..rng.range(1, 2)).map(|_| text_block(text(rng), rng)).collect())
        };
        m.insert("system".into(), system);
    }
    if shape == Shape::Tools {
        let mut first = json!({"name": tool, "input_schema": schema});
        if rng.chance(50) {
            first["description"] = json!("A tool.");
        }
        let mut tools = vec![first];
        if rng.chance(30) {
            tools.push(json!({"name": "noop", "input_schema": {"type": "object"}}));
        }
        if rng.chance(20) {
            let at = rng.below(tools.len() as u64 + 1) as usize;
            tools.insert(at, hosted_tool(rng, true));
        }
        m.insert("tools".into(), Value::Array(tools));
        if rng.chance(60) {
            let mut choice = match rng.below(4) {
                0 => json!({"type": "auto"}),
                1 => json!({"type": "any"}),
                2 => json!({"type": "tool", "name": tool}),
                _ => json!({"type": "none"}),
            };
            if rng.chance(20) {
                choice["disable_parallel_tool_use"] = json!(rng.chance(50));
            }
            m.insert("tool_choice".into(), choice);
        }
    } else if rng.chance(5) {
        let tools = if rng.chance(50) { json!([]) } else { json!([hosted_tool(rng, true)]) };
        m.insert("tools".into(), tools);
    }
    if rng.chance(5) {
        m.insert("thinking".into(), json!({"type": *rng.pick(&["disabled", "adaptive"])}));
    }
}

fn messages_request(rng: &mut Rng, m: &mut Map<String, Value>) -> bool {
    anthropic_prompt(rng, m);
    m.insert("max_tokens".into(), json!(rng.range(1, 4)));
    if rng.chance(20) {
        let stops = (0..rng.range(0, 3)).map(|_| json!(*rng.pick(STOPS))).collect();
        m.insert("stop_sequences".into(), Value::Array(stops));
    }
    if rng.chance(35) {
        m.insert("temperature".into(), temperature(rng, 100));
    }
    if rng.chance(20) {
        m.insert("top_p".into(), top_p(rng));
    }
    if rng.chance(15) {
        m.insert("top_k".into(), json!(*rng.pick(&[0, 1, 5, 40, 49152, 100_000, u32::MAX])));
    }
    if rng.chance(10) {
        let metadata = if rng.chance(80) { json!({"user_id": text(rng)}) } else { json!({}) };
        m.insert("metadata".into(), metadata);
    }
    if rng.chance(5) {
        m.insert("service_tier".into(), json!(*rng.pick(&["auto", "standard_only"])));
    }
    stream_flag(rng, m)
}

/// A message item's content: a string or parts of `part` type.
fn item_content(rng: &mut Rng, part: &str) -> Value {
    if rng.chance(40) {
        Value::Array((0..rng.range(1, 2)).map(|_| json!({"type": part, "text": text(rng)})).collect())
    } else {
        text(rng)
    }
}

fn message_item(rng: &mut Rng, role: &str) -> Value {
    let part = if role == "assistant" { "output_text" } else { "input_text" };
    let mut item = json!({"role": role, "content": item_content(rng, part)});
    if rng.chance(50) {
        item["type"] = json!("message");
    }
    if rng.chance(10) {
        item["id"] = json!(format!("msg_fuzz{}", rng.below(1000)));
        item["status"] = json!("completed");
    }
    item
}

/// Input items: a system or developer message, earlier turns, sometimes a function call and its
/// output, and a last user message (or the output).
fn input_items(rng: &mut Rng, tool: &str, shape: Shape) -> Value {
    let mut out = Vec::new();
    if rng.chance(20) {
        let role = *rng.pick(&["system", "developer"]);
        out.push(message_item(rng, role));
    }
    let earlier = if shape == Shape::Tools { 0 } else { rng.below(2) };
    for _ in 0..earlier {
        out.push(message_item(rng, "user"));
        out.push(message_item(rng, "assistant"));
    }
    out.push(message_item(rng, "user"));
    if rng.chance(5) {
        out.push(json!({"type": "reasoning", "summary": []}));
    }
    if shape == Shape::Exchange {
        let arguments = tool_input(tool).to_string();
        out.push(
            json!({"type": "function_call", "call_id": "call_fuzz1", "name": tool, "arguments": arguments}),
        );
        let output =
            if rng.chance(30) { json!([{"type": "input_text", "text": text(rng)}]) } else { text(rng) };
        out.push(json!({"type": "function_call_output", "call_id": "call_fuzz1", "output": output}));
        if rng.chance(30) {
            out.push(message_item(rng, "user"));
        }
    }
    Value::Array(out)
}

fn responses_request(rng: &mut Rng, m: &mut Map<String, Value>) -> bool {
    maybe_model(rng, m);
    let (tool, schema) = tool_schema(rng);
    let shape = Shape::pick(rng);
    let input =
        if shape != Shape::Exchange && rng.chance(40) { text(rng) } else { input_items(rng, tool, shape) };
    m.insert("input".into(), input);
    if rng.chance(25) {
        m.insert("instructions".into(), text(rng));
    }
    m.insert("max_output_tokens".into(), json!(rng.range(1, 4)));
    if rng.chance(35) {
        m.insert("temperature".into(), temperature(rng, 200));
    }
    if rng.chance(20) {
        m.insert("top_p".into(), top_p(rng));
    }
    if rng.chance(30) {
        m.insert("store".into(), json!(rng.chance(50)));
    }
    if shape == Shape::Tools {
        let mut function = json!({"type": "function", "name": tool, "parameters": schema});
        if rng.chance(50) {
            function["description"] = json!("A tool.");
        }
        if rng.chance(20) {
            function["strict"] = json!(rng.chance(50));
        }
        let mut tools = vec![function];
        if rng.chance(20) {
            let at = rng.below(2) as usize;
            tools.insert(at, hosted_tool(rng, false));
        }
        m.insert("tools".into(), Value::Array(tools));
        if rng.chance(60) {
            let choice = rng
                .pick(&[
                    json!("auto"),
                    json!("required"),
                    json!("none"),
                    json!({"type": "function", "name": tool}),
                ])
                .clone();
            m.insert("tool_choice".into(), choice);
        }
        if rng.chance(15) {
            m.insert("parallel_tool_calls".into(), json!(rng.chance(50)));
        }
    } else if rng.chance(4) {
        // Only hosted tools: none is left for the model.
        m.insert("tools".into(), json!([hosted_tool(rng, false)]));
    } else if rng.chance(12) {
        // Structured output does not go with tools.
        let format = if rng.chance(70) { "json_object" } else { "text" };
        m.insert("text".into(), json!({"format": {"type": format}}));
    }
    for (key, value) in [
        ("metadata", json!({"k": "v"})),
        ("user", json!("u-1")),
        ("truncation", json!("disabled")),
        ("truncation", json!("auto")),
        ("reasoning", json!({"effort": "none"})),
        ("include", json!([])),
    ] {
        if rng.chance(3) {
            m.insert(key.into(), value);
        }
    }
    let stream = stream_flag(rng, m);
    if !stream && rng.chance(6) {
        // Answered at once, `queued`, and run detached (a background response is stored).
        m.insert("background".into(), json!(true));
        m.insert("store".into(), json!(true));
    }
    stream
}

/// A valid request for one of the agent endpoints, and whether it streams (`None`: it cannot).
pub fn valid(rng: &mut Rng, endpoint: Endpoint) -> (Value, Option<bool>) {
    let mut m = Map::new();
    let stream = match endpoint {
        Endpoint::Messages => Some(messages_request(rng, &mut m)),
        Endpoint::CountTokens => {
            anthropic_prompt(rng, &mut m);
            None
        }
        Endpoint::Responses => Some(responses_request(rng, &mut m)),
        other => unreachable!("{other:?} is not an agent endpoint"),
    };
    (Value::Object(m), stream)
}

/// How Anthropic's clients send the key and version: sometimes `x-api-key` instead of
/// `Authorization`, and the `anthropic-version` header.
pub fn anthropic_headers(rng: &mut Rng, case: &mut Case) {
    if rng.chance(40) {
        case.auth = None;
        case.headers.push(("x-api-key", API_KEY.to_owned()));
    }
    if rng.chance(60) {
        case.headers.push(("anthropic-version", "2023-06-01".to_owned()));
    }
    if rng.chance(10) {
        case.headers.push(("anthropic-beta", "tools-2024-04-04".to_owned()));
    }
}

/// A call on a stored response that does not exist: `GET` (with a background stream's query; a
/// bad one is a 400 first) / `DELETE /v1/responses/{id}`, `POST .../cancel`, `GET
/// .../input_items` (with paging; a bad one is a 400 first), or `previous_response_id` naming
/// it. Ids that are not UTF-8 once decoded may be 400s; every answer is an error in OpenAI's
/// shape.
pub fn stored_response_call(rng: &mut Rng, case: &mut Case) {
    let hex = format!("resp_{:016x}{:016x}", rng.next_u64(), rng.next_u64());
    let long = format!("resp_{}", "9".repeat(300));
    let (id, expect) = *rng.pick(&[
        (hex.as_str(), Expect::Status(404)),
        (hex.as_str(), Expect::Status(404)),
        ("resp_unknown", Expect::Status(404)),
        ("x", Expect::Status(404)),
        ("msg_1", Expect::Status(404)),
        (long.as_str(), Expect::Status(404)),
        ("resp_%F0%9F%A6%80", Expect::Status(404)),
        ("resp%20x", Expect::Status(404)),
        ("%ff", Expect::Any),
        ("resp_%C3%28", Expect::Any),
    ]);
    let (id, mut expect) = (id.to_owned(), expect);
    case.content_type = None;
    case.body = Vec::new();
    case.method = "GET";
    match rng.below(6) {
        0 => {
            // The retrieval query is read before the id is looked up.
            let (query, status) = *rng.pick(&[
                ("", None),
                ("?stream=true&starting_after=3", None),
                ("?stream=true&starting_after=x", Some(400)),
                ("?starting_after=3", Some(400)),
                ("?stream=maybe", Some(400)),
            ]);
            case.path = format!("/v1/responses/{id}{query}");
            if let Some(status) = status {
                expect = Expect::Status(status);
            }
        }
        5 => {
            case.method = "POST";
            case.path = format!("/v1/responses/{id}/cancel");
        }
        1 => {
            case.method = "DELETE";
            case.path = format!("/v1/responses/{id}");
        }
        2 => {
            let (query, status) = *rng.pick(&[
                ("", None),
                ("?limit=5&order=asc", None),
                ("?order=desc&after=msg_1", None),
                ("?limit=0", Some(400)),
                ("?limit=101", Some(400)),
                ("?order=up", Some(400)),
                ("?foo=1", Some(400)),
            ]);
            case.path = format!("/v1/responses/{id}/input_items{query}");
            if let Some(status) = status {
                expect = Expect::Status(status);
            }
        }
        _ => {
            case.method = "POST";
            case.content_type = Some("application/json".into());
            let previous = id.replace("%20", " ");
            let body = json!({"model": MODEL, "input": text(rng), "max_output_tokens": 1, "previous_response_id": previous});
            case.body = serde_json::to_vec(&body).expect("a Value serializes");
            if expect == Expect::Any {
                // Percent escapes are no escapes in a JSON string: just an unknown id.
                expect = Expect::Status(404);
            }
        }
    }
    case.what.push(format!("{} {:.80}", case.method, case.path));
    if rng.chance(10) {
        case.auth = if rng.chance(50) { None } else { Some("Bearer wrong".into()) };
        case.what.push(format!("authorization {:?}", case.auth));
        expect = Expect::Status(401);
    }
    case.expect = expect;
}

//! Tool calling through the real server. SmolLM2's template knows no tools, so the default server
//! uses the generic format; a second server with a Hermes-style template and
//! `--tool-call-parser hermes` covers a model's own format. Every tool choice, streamed and not,
//! parallel and single calls, a multi-turn exchange, and arguments validated against the schema.

use std::sync::OnceLock;

use anyhow::{Context, Result};
use serde_json::{json, Value};

use crate::harness::{assert_error_shape, client, post_json, read_sse, shared, TestServer};

fn tools() -> Value {
    json!([
        {"type": "function", "function": {
            "name": "get_weather", "description": "Current weather in a city",
            "parameters": {"type": "object", "properties": {
                "city": {"type": "string", "maxLength": 30},
                "unit": {"enum": ["celsius", "fahrenheit"]}},
                "required": ["city", "unit"], "additionalProperties": false}}},
        {"type": "function", "function": {
            "name": "add", "description": "Adds two integers",
            "parameters": {"type": "object", "properties": {
                "a": {"type": "integer", "minimum": -1000, "maximum": 1000},
                "b": {"type": "integer", "minimum": -1000, "maximum": 1000}},
                "required": ["a", "b"], "additionalProperties": false}}}
    ])
}

fn schema_of(name: &str) -> Value {
    tools().as_array().unwrap().iter().find(|t| t["function"]["name"] == name).unwrap()["function"]
        ["parameters"]
        .clone()
}

/// Checks one call's shape and that its arguments validate; returns its name.
fn check_call(call: &Value) -> String {
    assert!(call["id"].as_str().is_some_and(|id| id.starts_with("call_")), "{call}");
    assert_eq!(call["type"], "function", "{call}");
    let name = call["function"]["name"].as_str().expect("name").to_owned();
    let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().expect("arguments string"))
        .expect("arguments are JSON");
    let validator = jsonschema::validator_for(&schema_of(&name)).unwrap();
    assert!(validator.is_valid(&args), "{name}: {args}");
    name
}

fn body(content: &str, extra: Value) -> Value {
    let mut b = json!({"model": "smol", "messages": [{"role": "user", "content": content}], "tools": tools(), "max_tokens": 150, "temperature": 0});
    b.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    b
}

async fn chat_at(server: &TestServer, body: &Value) -> Result<Value> {
    let (status, resp) = post_json(&client(), &server.url("/v1/chat/completions"), body).await?;
    assert_eq!(status, 200, "{resp}");
    Ok(resp)
}

#[tokio::test]
async fn required_named_and_single_calls() -> Result<()> {
    let s = shared();
    let resp = chat_at(s, &body("What is the weather in Paris?", json!({"tool_choice": "required"}))).await?;
    let choice = &resp["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{resp}");
    assert!(choice["message"]["content"].is_null(), "{resp}");
    let calls = choice["message"]["tool_calls"].as_array().context("tool_calls")?;
    assert!(!calls.is_empty());
    calls.iter().for_each(|c| {
        check_call(c);
    });

    let named = json!({"tool_choice": {"type": "function", "function": {"name": "add"}}});
    let resp = chat_at(s, &body("What is 2 plus 3?", named)).await?;
    let calls = resp["choices"][0]["message"]["tool_calls"].as_array().context("tool_calls")?;
    assert_eq!(calls.len(), 1, "{resp}");
    assert_eq!(check_call(&calls[0]), "add");

    let single =
        json!({"tool_choice": "required", "parallel_tool_calls": false, "temperature": 1.0, "seed": 4});
    let resp = chat_at(s, &body("Weather in Oslo and in Rome?", single)).await?;
    assert_eq!(resp["choices"][0]["message"]["tool_calls"].as_array().context("calls")?.len(), 1, "{resp}");
    Ok(())
}

#[tokio::test]
async fn auto_none_and_no_markup_in_content() -> Result<()> {
    let s = shared();
    for (i, prompt) in
        ["What is the weather in Paris?", "Tell me a joke about cats.", "Add 7 and 8."].iter().enumerate()
    {
        // One call at most: a small model asked for parallel calls may list them until
        // `max_tokens`, and a cut-off answer is plain content by design.
        let extra = json!({"temperature": 1.0, "seed": i, "parallel_tool_calls": false, "max_tokens": 200});
        let resp = chat_at(s, &body(prompt, extra)).await?;
        assert_ne!(resp["choices"][0]["finish_reason"], "length", "{resp}");
        let choice = &resp["choices"][0];
        match choice["message"]["tool_calls"].as_array() {
            Some(calls) => {
                assert_eq!(choice["finish_reason"], "tool_calls");
                calls.iter().for_each(|c| {
                    check_call(c);
                });
            }
            None => {
                let content = choice["message"]["content"].as_str().context("content")?;
                assert!(!content.contains("\"response\"") && !content.contains("tool_calls"), "{content}");
            }
        }
    }
    // With `none` the tools are not shown and nothing is parsed.
    let resp = chat_at(s, &body("Say hello.", json!({"tool_choice": "none", "max_tokens": 12}))).await?;
    assert!(resp["choices"][0]["message"]["tool_calls"].is_null(), "{resp}");
    assert!(resp["choices"][0]["message"]["content"].is_string());
    Ok(())
}

#[tokio::test]
async fn streamed_calls_reassemble() -> Result<()> {
    let s = shared();
    let req = body(
        "What is the weather in Berlin, and 4 plus 5?",
        json!({"tool_choice": "required", "stream": true}),
    );
    let resp = client().post(s.url("/v1/chat/completions")).json(&req).send().await?;
    assert_eq!(resp.status(), 200);
    let (events, done) = read_sse(resp).await?;
    assert!(done);
    let mut calls: Vec<Value> = Vec::new();
    let mut finish = None;
    for e in &events {
        let Some(ch) = e["choices"].get(0) else { continue };
        if let Some(f) = ch["finish_reason"].as_str() {
            finish = Some(f.to_owned());
        }
        let content = ch["delta"]["content"].as_str().unwrap_or("");
        assert!(content.is_empty(), "content leaked: {content:?}");
        for d in ch["delta"]["tool_calls"].as_array().into_iter().flatten() {
            let index = d["index"].as_u64().context("index")? as usize;
            if index == calls.len() {
                // The first delta of a call names it.
                assert!(d["id"].is_string() && d["function"]["name"].is_string(), "{d}");
                calls.push(json!({"id": d["id"], "type": d["type"], "function": {"name": d["function"]["name"], "arguments": ""}}));
            }
            let call = calls.get_mut(index).context("delta for an unknown call")?;
            let piece = d["function"]["arguments"].as_str().unwrap_or("");
            let args = format!("{}{piece}", call["function"]["arguments"].as_str().unwrap());
            call["function"]["arguments"] = json!(args);
        }
    }
    assert_eq!(finish.as_deref(), Some("tool_calls"));
    assert!(!calls.is_empty());
    calls.iter().for_each(|c| {
        check_call(c);
    });
    Ok(())
}

#[tokio::test]
async fn a_multi_turn_exchange_with_tool_results() -> Result<()> {
    let s = shared();
    let messages = json!([
        {"role": "user", "content": "What is 2 plus 3?"},
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": "{\"a\": 2, \"b\": 3}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "5"}
    ]);
    let mut req = body("", json!({"messages": messages, "max_tokens": 60}));
    req["messages"] = messages.clone();
    let resp = chat_at(s, &req).await?;
    let message = &resp["choices"][0]["message"];
    assert!(message["content"].is_string() || message["tool_calls"].is_array(), "{resp}");
    // Bad history is a 400 that names the field.
    let mut bad = req.clone();
    bad["messages"][1]["tool_calls"][0]["function"]["arguments"] = json!("not json");
    let (status, err) = post_json(&client(), &s.url("/v1/chat/completions"), &bad).await?;
    assert_eq!(status, 400);
    assert_eq!(assert_error_shape(&err)["param"], "messages[1].tool_calls[0].function.arguments");
    Ok(())
}

#[tokio::test]
async fn bad_tool_requests_are_400s() -> Result<()> {
    let s = shared();
    let cases = [
        (
            json!({"tools": [{"type": "function", "function": {"name": "has space"}}]}),
            "tools[0].function.name",
        ),
        (json!({"tool_choice": {"type": "function", "function": {"name": "missing"}}}), "tool_choice"),
        (json!({"tool_choice": "sometimes"}), "tool_choice"),
        (json!({"response_format": {"type": "json_object"}}), "response_format"),
        (
            json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "strnig"}}}], "tool_choice": "required"}),
            "tools[0].function.parameters",
        ),
        // Arguments are an object: a schema of another type is refused, as OpenAI refuses it.
        (
            json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]}),
            "tools[0].function.parameters",
        ),
    ];
    for (extra, param) in cases {
        let (status, resp) =
            post_json(&client(), &s.url("/v1/chat/completions"), &body("hi", extra.clone())).await?;
        assert_eq!(status, 400, "{extra}: {resp}");
        assert_eq!(assert_error_shape(&resp)["param"], param, "{extra}: {resp}");
    }
    Ok(())
}

/// A ChatML template that renders tools the Hermes way (as Qwen 2.5's does).
const HERMES_TEMPLATE: &str = r#"{%- if tools %}<|im_start|>system
You may call functions. Signatures:
<tools>
{%- for tool in tools %}
{{ tool.function | tojson }}
{%- endfor %}
</tools>
Return each call as <tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
{% endif %}
{%- for message in messages %}<|im_start|>{{ message.role }}
{% if message.tool_calls %}{% for call in message.tool_calls %}<tool_call>
{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}
</tool_call>{% endfor %}{% else %}{{ message.content }}{% endif %}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"#;

fn hermes_server() -> &'static TestServer {
    static SERVER: OnceLock<TestServer> = OnceLock::new();
    SERVER.get_or_init(|| {
        TestServer::start_with_template(
            "hermes",
            HERMES_TEMPLATE,
            &["--tool-call-parser", "hermes", "--max-num-seqs", "8"],
        )
    })
}

#[tokio::test]
async fn hermes_format_required_and_streamed() -> Result<()> {
    let s = hermes_server();
    let resp = chat_at(s, &body("What is the weather in Paris?", json!({"tool_choice": "required"}))).await?;
    let choice = &resp["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{resp}");
    let calls = choice["message"]["tool_calls"].as_array().context("tool_calls")?;
    calls.iter().for_each(|c| {
        check_call(c);
    });
    assert!(choice["message"]["content"].is_null(), "{resp}");
    let req = body(
        "Add 1 and 2.",
        json!({"tool_choice": {"type": "function", "function": {"name": "add"}}, "stream": true}),
    );
    let resp = client().post(s.url("/v1/chat/completions")).json(&req).send().await?;
    let (events, done) = read_sse(resp).await?;
    assert!(done);
    let text: String = events
        .iter()
        .filter_map(|e| e["choices"][0]["delta"]["content"].as_str().map(str::to_owned))
        .collect();
    assert!(!text.contains("<tool_call>"), "markup leaked: {text}");
    let args: String = events
        .iter()
        .flat_map(|e| e["choices"][0]["delta"]["tool_calls"].as_array().cloned().unwrap_or_default())
        .filter_map(|d| d["function"]["arguments"].as_str().map(str::to_owned))
        .collect();
    let parsed: Value = serde_json::from_str(&args)?;
    assert!(jsonschema::validator_for(&schema_of("add")).unwrap().is_valid(&parsed), "{parsed}");
    Ok(())
}

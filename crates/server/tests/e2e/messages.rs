//! Anthropic's Messages API through the real server, spoken as raw HTTP: a message whole and
//! streamed (the event protocol, event names matching their data, the stream adding up to the
//! whole answer), tool use under each choice and a tool-result turn, a stop sequence, a prefill,
//! `count_tokens`, `x-api-key`, and errors in Anthropic's shape. The SDK's view is in
//! tests/sdk/check_agent_apis.py (run by `sdk.rs`).

use anyhow::{Context, Result};
use serde_json::{json, Value};

use crate::harness::{client, metric, metrics_text, shared, SseReader, API_KEY};

fn anthropic_client(key: &str) -> reqwest::Client {
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert("x-api-key", key.parse().unwrap());
    headers.insert("anthropic-version", "2023-06-01".parse().unwrap());
    headers.insert("anthropic-beta", "tools-2024-04-04".parse().unwrap());
    reqwest::Client::builder().default_headers(headers).build().unwrap()
}

async fn post(body: &Value) -> Result<(u16, Value)> {
    let resp = anthropic_client(API_KEY).post(shared().url("/v1/messages")).json(body).send().await?;
    let status = resp.status().as_u16();
    let text = resp.text().await?;
    Ok((status, serde_json::from_str(&text).with_context(|| format!("not JSON ({status}): {text}"))?))
}

fn body(content: &str, extra: Value) -> Value {
    let mut b = json!({"model": "smol", "max_tokens": 40, "temperature": 0,
                       "messages": [{"role": "user", "content": content}]});
    b.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    b
}

/// Asserts Anthropic's error shape and returns the error's type.
fn anthropic_error(body: &Value) -> String {
    assert_eq!(body["type"], "error", "{body}");
    assert!(body["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{body}");
    body["error"]["type"].as_str().expect("error.type").to_owned()
}

/// `(event name, data)` of every event of a stream.
async fn events(body: &Value) -> Result<Vec<(String, Value)>> {
    let resp = anthropic_client(API_KEY).post(shared().url("/v1/messages")).json(body).send().await?;
    assert_eq!(resp.status(), 200);
    let mut reader = SseReader::new(resp);
    let mut out = Vec::new();
    while let Some(data) = reader.next_data().await? {
        let data: Value = serde_json::from_str(&data)?;
        let name = data["type"].as_str().context("type")?.to_owned();
        out.push((name, data));
    }
    Ok(out)
}

/// The message a stream describes, put together as the SDK does.
fn assemble(events: &[(String, Value)]) -> Value {
    let mut message = Value::Null;
    let mut partial: Vec<String> = Vec::new();
    for (name, e) in events {
        match name.as_str() {
            "message_start" => message = e["message"].clone(),
            "content_block_start" => {
                message["content"].as_array_mut().unwrap().push(e["content_block"].clone());
                partial.push(String::new());
            }
            "content_block_delta" => {
                let i = e["index"].as_u64().unwrap() as usize;
                let block = &mut message["content"][i];
                let d = &e["delta"];
                match d["type"].as_str().unwrap() {
                    "text_delta" => {
                        block["text"] = json!(format!(
                            "{}{}",
                            block["text"].as_str().unwrap(),
                            d["text"].as_str().unwrap()
                        ))
                    }
                    "thinking_delta" => {
                        block["thinking"] = json!(format!(
                            "{}{}",
                            block["thinking"].as_str().unwrap(),
                            d["thinking"].as_str().unwrap()
                        ))
                    }
                    "signature_delta" => block["signature"] = d["signature"].clone(),
                    "input_json_delta" => partial[i].push_str(d["partial_json"].as_str().unwrap()),
                    other => panic!("unknown delta {other}"),
                }
            }
            "content_block_stop" => {
                let i = e["index"].as_u64().unwrap() as usize;
                if message["content"][i]["type"] == "tool_use" {
                    message["content"][i]["input"] =
                        serde_json::from_str(&partial[i]).expect("tool input JSON");
                }
            }
            "message_delta" => {
                message["stop_reason"] = e["delta"]["stop_reason"].clone();
                message["stop_sequence"] = e["delta"]["stop_sequence"].clone();
                message["usage"]["output_tokens"] = e["usage"]["output_tokens"].clone();
            }
            _ => {}
        }
    }
    message
}

#[tokio::test]
async fn a_message_whole_and_streamed() -> Result<()> {
    let b = body(
        "What is the capital of France?",
        json!({"system": [{"type": "text", "text": "Answer briefly.", "cache_control": {"type": "ephemeral"}}], "metadata": {"user_id": "u1"}}),
    );
    let (status, whole) = post(&b).await?;
    assert_eq!(status, 200, "{whole}");
    assert!(whole["id"].as_str().is_some_and(|id| id.starts_with("msg_")), "{whole}");
    assert_eq!(
        (whole["type"].as_str(), whole["role"].as_str(), whole["model"].as_str()),
        (Some("message"), Some("assistant"), Some("smol"))
    );
    assert_eq!(whole["content"][0]["type"], "text");
    assert!(!whole["content"][0]["text"].as_str().unwrap().is_empty(), "{whole}");
    assert!(matches!(whole["stop_reason"].as_str(), Some("end_turn" | "max_tokens")), "{whole}");
    assert!(whole["usage"]["input_tokens"].as_u64().unwrap() > 0);
    assert!(whole["usage"]["output_tokens"].as_u64().unwrap() > 0);

    let mut streamed = b.clone();
    streamed["stream"] = json!(true);
    let events = events(&streamed).await?;
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).filter(|n| *n != "ping").collect();
    assert_eq!(names.first(), Some(&"message_start"));
    assert_eq!(&names[names.len() - 2..], ["message_delta", "message_stop"]);
    assert_eq!(names[1], "content_block_start");
    let message = assemble(&events);
    assert_eq!(message["content"], whole["content"]);
    assert_eq!(message["stop_reason"], whole["stop_reason"]);
    assert_eq!(message["usage"]["output_tokens"], whole["usage"]["output_tokens"]);
    // A second identical prompt reads its prefix from the cache.
    let (_, again) = post(&b).await?;
    assert!(again["usage"]["cache_read_input_tokens"].as_u64().unwrap() > 0, "{again}");
    assert_eq!(
        again["usage"]["cache_read_input_tokens"].as_u64().unwrap()
            + again["usage"]["input_tokens"].as_u64().unwrap(),
        whole["usage"]["input_tokens"].as_u64().unwrap()
            + whole["usage"]["cache_read_input_tokens"].as_u64().unwrap()
    );
    Ok(())
}

#[tokio::test]
async fn stop_sequences_max_tokens_and_prefill() -> Result<()> {
    // A max_tokens beyond the context is cut to what the context leaves, as Claude Code's
    // 32000 needs; running into the context's end is its own stop reason.
    let (status, m) = post(&body("Say hi.", json!({"max_tokens": 100000}))).await?;
    assert_eq!(status, 200, "{m}");
    assert!(matches!(m["stop_reason"].as_str(), Some("end_turn" | "model_context_window_exceeded")), "{m}");
    let (_, free) = post(&body("Count from one to ten in words.", json!({}))).await?;
    let text = free["content"][0]["text"].as_str().unwrap().to_owned();
    let word = text
        .split_whitespace()
        .nth(2)
        .context("three words")?
        .trim_matches(|c: char| !c.is_alphanumeric())
        .to_owned();
    let (_, stopped) =
        post(&body("Count from one to ten in words.", json!({"stop_sequences": [word]}))).await?;
    assert_eq!(stopped["stop_reason"], "stop_sequence", "{stopped}");
    assert_eq!(stopped["stop_sequence"], word.as_str());
    let (_, short) = post(&body("Write a long story.", json!({"max_tokens": 3}))).await?;
    assert_eq!(
        (short["stop_reason"].as_str(), short["usage"]["output_tokens"].as_u64()),
        (Some("max_tokens"), Some(3))
    );
    // A final assistant turn is continued.
    let prefill = json!({"model": "smol", "max_tokens": 8, "temperature": 0, "messages": [
        {"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "My favourite colour is "}]});
    let (status, cont) = post(&prefill).await?;
    assert_eq!(status, 200, "{cont}");
    assert!(!cont["content"][0]["text"].as_str().unwrap().starts_with("My favourite"), "{cont}");
    Ok(())
}

fn weather_tools() -> Value {
    json!([{"name": "get_weather", "description": "Current weather in a city",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
                             "required": ["city"], "additionalProperties": false}},
           {"name": "add", "description": "Adds two integers",
            "input_schema": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                             "required": ["a", "b"]}}])
}

#[tokio::test]
async fn tool_use_under_each_choice_and_a_result_turn() -> Result<()> {
    let ask = |choice: Value| {
        body(
            "What is the weather in Paris?",
            json!({"tools": weather_tools(), "tool_choice": choice, "max_tokens": 120}),
        )
    };
    for choice in [
        json!({"type": "any", "disable_parallel_tool_use": true}),
        json!({"type": "tool", "name": "get_weather"}),
    ] {
        let (status, m) = post(&ask(choice.clone())).await?;
        assert_eq!(status, 200, "{m}");
        assert_eq!(m["stop_reason"], "tool_use", "{choice}: {m}");
        let uses: Vec<&Value> =
            m["content"].as_array().unwrap().iter().filter(|b| b["type"] == "tool_use").collect();
        assert_eq!(uses.len(), 1, "{m}");
        assert!(uses[0]["id"].as_str().unwrap().starts_with("toolu_"));
        assert!(uses[0]["input"].is_object(), "{m}");
    }
    let (_, none) = post(&ask(json!({"type": "none"}))).await?;
    assert!(none["content"].as_array().unwrap().iter().all(|b| b["type"] == "text"), "{none}");

    // Streamed, the forced call's input arrives as input_json_delta pieces and equals the whole.
    let (_, whole) = post(&ask(json!({"type": "tool", "name": "get_weather"}))).await?;
    let mut streamed = ask(json!({"type": "tool", "name": "get_weather"}));
    streamed["stream"] = json!(true);
    let evs = events(&streamed).await?;
    assert!(evs.iter().any(|(_, e)| e["delta"]["type"] == "input_json_delta"));
    let message = assemble(&evs);
    let input_of = |m: &Value| {
        m["content"].as_array().unwrap().iter().find(|b| b["type"] == "tool_use").unwrap()["input"].clone()
    };
    assert_eq!(input_of(&message), input_of(&whole));
    assert_eq!(message["stop_reason"], "tool_use");

    // The result goes back and the model answers.
    let tool_use =
        whole["content"].as_array().unwrap().iter().find(|b| b["type"] == "tool_use").unwrap().clone();
    let follow = json!({"model": "smol", "max_tokens": 40, "temperature": 0, "tools": weather_tools(), "messages": [
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": whole["content"]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_use["id"], "content": "Sunny, 24 C"}]}]});
    let (status, answer) = post(&follow).await?;
    assert_eq!(status, 200, "{answer}");
    assert!(answer["stop_reason"].is_string());
    Ok(())
}

#[tokio::test]
async fn count_tokens_counts_what_the_template_renders() -> Result<()> {
    let c = anthropic_client(API_KEY);
    let count = |b: Value| {
        let c = c.clone();
        async move {
            let resp = c.post(shared().url("/v1/messages/count_tokens")).json(&b).send().await?;
            assert_eq!(resp.status(), 200);
            let v: Value = resp.json().await?;
            anyhow::Ok(v["input_tokens"].as_u64().context("input_tokens")?)
        }
    };
    let messages = json!([{"role": "user", "content": "What is the capital of France?"}]);
    let plain = count(json!({"model": "smol", "messages": messages})).await?;
    let system = count(json!({"model": "smol", "messages": messages, "system": "Be brief."})).await?;
    let tools = count(json!({"model": "smol", "messages": messages, "tools": weather_tools()})).await?;
    // SmolLM2's template has a default system prompt, longer than "Be brief.".
    assert!(plain > 5 && system != plain && tools > plain, "{plain} {system} {tools}");
    // A deferred tool (`defer_loading`, as Claude Code sends a placeholder) stays out of the
    // prompt until a search loads it: the count is that of the other tools alone.
    let mut with_deferred = weather_tools();
    with_deferred.as_array_mut().unwrap().push(json!({"name": "later", "description": "Loaded by search",
        "input_schema": {"type": "object", "properties": {}}, "defer_loading": true}));
    let deferred = count(json!({"model": "smol", "messages": messages, "tools": with_deferred})).await?;
    assert_eq!(deferred, tools);
    let mut b = body("What is the capital of France?", json!({"tools": with_deferred}));
    b["max_tokens"] = json!(1);
    let (status, m) = post(&b).await?;
    assert_eq!(status, 200, "{m}");
    // A count may exceed the context (1024 here); only a message must fit.
    let long = "The quick brown fox jumps over the lazy dog. ".repeat(150);
    let over = count(json!({"model": "smol", "messages": [{"role": "user", "content": long}]})).await?;
    assert!(over > 1024, "{over}");
    // Each count is the prompt a message with the same fields has.
    for (extra, counted) in [
        (json!({}), plain),
        (json!({"system": "Be brief."}), system),
        (json!({"tools": weather_tools()}), tools),
    ] {
        let mut b = body("What is the capital of France?", extra);
        b["max_tokens"] = json!(1);
        let (_, m) = post(&b).await?;
        let used = m["usage"]["input_tokens"].as_u64().unwrap()
            + m["usage"]["cache_read_input_tokens"].as_u64().unwrap();
        assert_eq!(used, counted, "{m}");
    }
    Ok(())
}

#[tokio::test]
async fn errors_come_in_anthropic_shape() -> Result<()> {
    let cases = [
        (body("hi", json!({"bogus_field": 1})), 400, "invalid_request_error", "bogus_field"),
        (
            json!({"model": "smol", "messages": [{"role": "user", "content": "hi"}]}),
            400,
            "invalid_request_error",
            "max_tokens",
        ),
        (
            json!({"model": 5, "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}),
            400,
            "invalid_request_error",
            "model",
        ),
        (
            json!({"model": null, "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}),
            400,
            "invalid_request_error",
            "model",
        ),
        (
            body(
                "hi",
                json!({"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}]}),
            ),
            400,
            "invalid_request_error",
            "image",
        ),
        (
            body(
                "hi",
                json!({"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]}),
            ),
            400,
            "invalid_request_error",
            "document",
        ),
        (
            body(
                "hi",
                json!({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_nope", "content": "x"}]}]}),
            ),
            400,
            "invalid_request_error",
            "toolu_nope",
        ),
        (body("hi", json!({"messages": [["user", "hi"]]})), 400, "invalid_request_error", "messages[0]"),
        (body("hi", json!({"temperature": 1.5})), 400, "invalid_request_error", "temperature"),
        (
            body("hi", json!({"thinking": {"type": "enabled", "budget_tokens": 2048}})),
            400,
            "invalid_request_error",
            "thinking",
        ),
        (
            body("hi", json!({"tools": [{"name": "f", "input_schema": {"type": "string"}}]})),
            400,
            "invalid_request_error",
            "input_schema",
        ),
        (body("hi", json!({"model": "claude-9"})), 404, "not_found_error", "claude-9"),
    ];
    for (b, status, ty, needle) in cases {
        let (got, resp) = post(&b).await?;
        assert_eq!(got, status, "{b}: {resp}");
        assert_eq!(anthropic_error(&resp), ty, "{b}");
        assert!(resp["error"]["message"].as_str().unwrap().contains(needle), "{needle}: {resp}");
    }
    let c = anthropic_client("wrong-key");
    let resp = c.post(shared().url("/v1/messages")).json(&body("hi", json!({}))).send().await?;
    assert_eq!(resp.status(), 401);
    assert_eq!(anthropic_error(&resp.json().await?), "authentication_error");
    let resp = anthropic_client(API_KEY).post(shared().url("/v1/messages")).body("{not json").send().await?;
    assert_eq!(resp.status(), 400);
    assert_eq!(anthropic_error(&resp.json().await?), "invalid_request_error");
    // A wrong method on a Messages route is Anthropic's error too.
    let resp = anthropic_client(API_KEY).get(shared().url("/v1/messages")).send().await?;
    assert_eq!(resp.status(), 405);
    assert_eq!(anthropic_error(&resp.json().await?), "invalid_request_error");
    let big = "x".repeat(70 * 1024);
    let resp = anthropic_client(API_KEY)
        .post(shared().url("/v1/messages"))
        .json(&body(&big, json!({})))
        .send()
        .await?;
    assert_eq!(resp.status(), 413);
    assert_eq!(anthropic_error(&resp.json().await?), "request_too_large");
    Ok(())
}

#[tokio::test]
async fn metrics_count_both_new_apis_with_ttft() -> Result<()> {
    let ttft = |text: &str| metric(text, "pagoda:time_to_first_token_seconds_count", "").unwrap_or(0.0);
    let before = metrics_text(&client(), shared()).await?;
    let (status, _) = post(&body("Hi", json!({"max_tokens": 2}))).await?;
    assert_eq!(status, 200);
    let resp = client()
        .post(shared().url("/v1/responses"))
        .json(&json!({"model": "smol", "input": "Hi", "max_output_tokens": 2, "store": false}))
        .send()
        .await?;
    assert_eq!(resp.status(), 200);
    let after = metrics_text(&client(), shared()).await?;
    assert!(ttft(&after) >= ttft(&before) + 2.0, "{} -> {}", ttft(&before), ttft(&after));
    for handler in ["/v1/messages", "/v1/responses"] {
        let labels = format!("handler=\"{handler}\",method=\"POST\",status=\"200\"");
        assert!(metric(&after, "http_requests_total", &labels).is_some_and(|n| n >= 1.0), "{handler}");
    }
    Ok(())
}

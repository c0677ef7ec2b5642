//! OpenAI's Responses API through the real server, spoken as raw HTTP: a response whole and
//! streamed (typed events with increasing sequence numbers adding up to the whole), function
//! calls and their outputs, JSON-schema output, stored responses (retrieve, input items, delete,
//! `store: false`), `previous_response_id` chains (and one longer than the context, with and
//! without `truncation: auto`), and errors in OpenAI's shape. The SDK's view is in
//! tests/sdk/check_agent_apis.py (run by `sdk.rs`).

use anyhow::{Context, Result};
use serde_json::{json, Value};

use crate::harness::{assert_error_shape, client, post_json, shared, SseReader};

async fn create(body: &Value) -> Result<(u16, Value)> {
    post_json(&client(), &shared().url("/v1/responses"), body).await
}

fn body(input: Value, extra: Value) -> Value {
    let mut b = json!({"model": "smol", "input": input, "max_output_tokens": 40, "temperature": 0});
    b.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    b
}

/// The text of a response's message items, in order.
pub(crate) fn output_text(r: &Value) -> String {
    r["output"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["type"] == "message")
        .flat_map(|i| i["content"].as_array().unwrap().iter())
        .filter_map(|p| p["text"].as_str())
        .collect()
}

#[tokio::test]
async fn a_response_whole_and_streamed() -> Result<()> {
    let b = body(
        json!("What is the capital of France?"),
        json!({"instructions": "Answer briefly.", "metadata": {"k": "v"}}),
    );
    let (status, whole) = create(&b).await?;
    assert_eq!(status, 200, "{whole}");
    assert!(whole["id"].as_str().unwrap().starts_with("resp_"));
    assert_eq!(whole["object"], "response");
    assert!(matches!(whole["status"].as_str(), Some("completed" | "incomplete")), "{whole}");
    assert_eq!(whole["metadata"], json!({"k": "v"}));
    assert!(!output_text(&whole).is_empty(), "{whole}");
    let usage = &whole["usage"];
    assert!(usage["input_tokens"].as_u64().unwrap() > 0 && usage["output_tokens"].as_u64().unwrap() > 0);
    assert!(
        usage["input_tokens_details"]["cached_tokens"].is_u64()
            && usage["output_tokens_details"]["reasoning_tokens"].is_u64()
    );

    let mut streamed = b.clone();
    streamed["stream"] = json!(true);
    let resp = client().post(shared().url("/v1/responses")).json(&streamed).send().await?;
    assert_eq!(resp.status(), 200);
    let mut reader = SseReader::new(resp);
    let mut events = Vec::new();
    while let Some(data) = reader.next_data().await? {
        events.push(serde_json::from_str::<Value>(&data)?);
    }
    let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        &types[..4],
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added"
        ]
    );
    let end = format!("response.{}", whole["status"].as_str().unwrap());
    assert_eq!(types.last().copied(), Some(end.as_str()));
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e["sequence_number"], i, "{e}");
    }
    let deltas: String = events
        .iter()
        .filter(|e| e["type"] == "response.output_text.delta")
        .map(|e| e["delta"].as_str().unwrap())
        .collect();
    let last = &events.last().unwrap()["response"];
    assert_eq!(deltas, output_text(last));
    assert_eq!(output_text(last), output_text(&whole));
    // Too few tokens: incomplete, with the reason.
    let (_, short) =
        create(&body(json!("Write a long story about a dragon."), json!({"max_output_tokens": 4}))).await?;
    assert_eq!(short["status"], "incomplete", "{short}");
    assert_eq!(short["incomplete_details"]["reason"], "max_output_tokens");
    Ok(())
}

fn weather_tool() -> Value {
    json!([{"type": "function", "name": "get_weather", "description": "Current weather in a city", "strict": true,
            "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
                           "required": ["city"], "additionalProperties": false}}])
}

#[tokio::test]
async fn function_calls_round_trip_and_json_schema_output() -> Result<()> {
    let ask = body(
        json!("What is the weather in Paris?"),
        json!({"tools": weather_tool(), "tool_choice": {"type": "function", "name": "get_weather"}, "max_output_tokens": 100}),
    );
    let (status, r) = create(&ask).await?;
    assert_eq!(status, 200, "{r}");
    let call = r["output"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["type"] == "function_call")
        .context("a call")?
        .clone();
    assert_eq!(call["name"], "get_weather");
    assert!(call["call_id"].as_str().unwrap().starts_with("call_"));
    let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap())?;
    assert!(args["city"].is_string(), "{args}");
    // The output goes back through previous_response_id.
    let output =
        json!([{"type": "function_call_output", "call_id": call["call_id"], "output": "Sunny, 24 C"}]);
    let (status, next) =
        create(&body(output.clone(), json!({"previous_response_id": r["id"], "tools": weather_tool()})))
            .await?;
    assert_eq!(status, 200, "{next}");
    assert_eq!(next["status"], "completed");
    assert!(next["usage"]["input_tokens"].as_u64() > r["usage"]["input_tokens"].as_u64());
    // And as explicit items.
    let items = json!([{"role": "user", "content": "What is the weather in Paris?"}, call, output[0]]);
    let (status, explicit) = create(&body(items, json!({"tools": weather_tool(), "store": false}))).await?;
    assert_eq!(status, 200, "{explicit}");

    let format = json!({"format": {"type": "json_schema", "name": "city", "strict": true, "schema": {
        "type": "object", "properties": {"name": {"type": "string", "maxLength": 20}, "country": {"type": "string", "maxLength": 20}},
        "required": ["name", "country"], "additionalProperties": false}}});
    let (status, j) =
        create(&body(json!("Name a city in Italy."), json!({"text": format, "max_output_tokens": 60})))
            .await?;
    assert_eq!(status, 200, "{j}");
    let parsed: Value = serde_json::from_str(&output_text(&j))?;
    assert!(parsed["name"].is_string() && parsed["country"].is_string(), "{parsed}");
    Ok(())
}

#[tokio::test]
async fn stored_responses_are_retrieved_listed_and_deleted() -> Result<()> {
    let c = client();
    let (_, r) = create(&body(
        json!([{"role": "user", "content": [{"type": "input_text", "text": "Hello!"}]}]),
        json!({}),
    ))
    .await?;
    let id = r["id"].as_str().unwrap();
    let got: Value = c.get(shared().url(&format!("/v1/responses/{id}"))).send().await?.json().await?;
    assert_eq!(got, r);
    let items: Value = c
        .get(shared().url(&format!("/v1/responses/{id}/input_items?limit=5&order=asc")))
        .send()
        .await?
        .json()
        .await?;
    assert_eq!(items["object"], "list");
    assert_eq!(items["data"][0]["content"][0]["text"], "Hello!");
    assert_eq!(items["has_more"], false);
    let deleted: Value = c.delete(shared().url(&format!("/v1/responses/{id}"))).send().await?.json().await?;
    assert_eq!(deleted, json!({"id": id, "object": "response", "deleted": true}));
    for path in [format!("/v1/responses/{id}"), format!("/v1/responses/{id}/input_items")] {
        let resp = c.get(shared().url(&path)).send().await?;
        assert_eq!(resp.status(), 404, "{path}");
        assert_error_shape(&resp.json().await?);
    }
    let (_, unstored) = create(&body(json!("Hi"), json!({"store": false}))).await?;
    let resp =
        c.get(shared().url(&format!("/v1/responses/{}", unstored["id"].as_str().unwrap()))).send().await?;
    assert_eq!(resp.status(), 404);
    // An id that is not UTF-8 once decoded is a 400 in OpenAI's shape.
    for path in ["/v1/responses/%ff", "/v1/responses/resp_%C3%28/input_items", "/v1/models/%ff"] {
        let resp = c.get(shared().url(path)).send().await?;
        assert_eq!(resp.status(), 400, "{path}");
        assert_error_shape(&resp.json().await?);
    }
    let (status, e) = create(&body(json!("Hi"), json!({"previous_response_id": "resp_unknown"}))).await?;
    assert_eq!(status, 404, "{e}");
    assert_eq!(assert_error_shape(&e)["param"], "previous_response_id");
    Ok(())
}

#[tokio::test]
async fn a_chain_longer_than_the_context_is_a_400_or_truncated() -> Result<()> {
    // The shared server's context is 1024 tokens: a few turns of 300 overflow it.
    let c = client();
    let url = shared().url("/v1/responses");
    let long = "The quick brown fox jumps over the lazy dog. ".repeat(30);
    let mut previous: Option<String> = None;
    let mut overflowed = None;
    for _ in 0..8 {
        let mut b = json!({"model": "smol", "input": long, "max_output_tokens": 16, "temperature": 0});
        if let Some(p) = &previous {
            b["previous_response_id"] = json!(p);
        }
        let (status, r) = post_json(&c, &url, &b).await?;
        if status != 200 {
            assert_eq!(status, 400, "{r}");
            assert!(assert_error_shape(&r)["message"].as_str().unwrap().contains("context length"), "{r}");
            // The Responses API has no `messages`: the error names its own fields.
            assert_ne!(r["error"]["param"], "messages", "{r}");
            overflowed = previous.clone();
            break;
        }
        previous = r["id"].as_str().map(str::to_owned);
    }
    let chain = overflowed.context("the chain never outgrew the context")?;
    let b = json!({"model": "smol", "input": long, "max_output_tokens": 16, "temperature": 0,
                   "previous_response_id": chain, "truncation": "auto"});
    let (status, r) = post_json(&c, &url, &b).await?;
    assert_eq!(status, 200, "{r}");
    assert!(r["usage"]["input_tokens"].as_u64().unwrap() + 16 <= 1024, "{r}");
    Ok(())
}

#[tokio::test]
async fn errors_come_in_openai_shape() -> Result<()> {
    let cases = [
        // MCP tools are not hosted tools that could be left out (docs/api.md).
        (body(json!("hi"), json!({"tools": [{"type": "mcp", "server_label": "x"}]})), "tools[0].server_url"),
        (
            body(
                json!("hi"),
                json!({"tools": [{"type": "function", "name": "f", "parameters": {"type": "string"}}]}),
            ),
            "tools[0].parameters",
        ),
        (body(json!("hi"), json!({"bogus": 1})), "bogus"),
        (
            body(json!([{"type": "function_call_output", "call_id": "call_x", "output": "1"}]), json!({})),
            "input[0].call_id",
        ),
        (
            body(
                json!([{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}]),
                json!({}),
            ),
            "input[0].content[0]",
        ),
        (body(json!([["user", "hi"]]), json!({})), "input[0]"),
        (body(json!("hi"), json!({"model": 7})), "model"),
        (body(json!("hi"), json!({"model": null})), "model"),
        (
            body(json!("hi"), json!({"text": {"format": {"type": "json_schema", "schema": {}}}})),
            "text.format.name",
        ),
        (body(json!("hi"), json!({"include": ["file_search_call.results"]})), "include"),
        (body(json!("hi"), json!({"truncation": "sometimes"})), "truncation"),
        (body(json!("hi"), json!({"reasoning": {"effort": "high"}})), "reasoning.effort"),
        (body(json!("hi"), json!({"reasoning": {"summary": "concise"}})), "reasoning.summary"),
        (json!({"model": "smol"}), "input"),
    ];
    for (b, param) in cases {
        let (status, e) = create(&b).await?;
        assert_eq!(status, 400, "{b}: {e}");
        assert_eq!(assert_error_shape(&e)["param"], param, "{b}: {e}");
    }
    Ok(())
}

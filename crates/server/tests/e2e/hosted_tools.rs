//! Hosted tools (`web_search` and the like, which a vendor runs on its side) through the real
//! server. By default (`--hosted-tools ignore`) a request that lists them is served without them:
//! the answer carries `x-pagoda-ignored-tools` naming them, whole and streamed, on
//! `/v1/responses` and `/v1/messages`, and the prompt is the one the request makes without them
//! (the same input tokens and, greedy, the same answer: on a `--batch-invariant` server, where a
//! prefix-cache hit or the batch cannot change the logits' low bits). A `tool_choice` forcing one
//! is a 400 naming it, and so are tools the client would run and MCP tools. A server started
//! with `--hosted-tools reject` refuses them all.

use std::sync::OnceLock;

use anyhow::{Context, Result};
use serde_json::{json, Value};

use crate::harness::{assert_error_shape, SseReader, TestServer, API_KEY};

const HEADER: &str = "x-pagoda-ignored-tools";

/// A server with the default `--hosted-tools ignore`, batch-invariant: the same prompt gives the
/// same greedy answer.
fn ignoring() -> &'static TestServer {
    static SERVER: OnceLock<TestServer> = OnceLock::new();
    SERVER.get_or_init(|| TestServer::start(&["--api-key", API_KEY, "--batch-invariant"]))
}

/// The server started with `--hosted-tools reject`.
fn rejecting() -> &'static TestServer {
    static SERVER: OnceLock<TestServer> = OnceLock::new();
    SERVER.get_or_init(|| TestServer::start(&["--api-key", API_KEY, "--hosted-tools", "reject"]))
}

/// Sends both keys' forms, so that one client serves both APIs.
fn client() -> reqwest::Client {
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(reqwest::header::AUTHORIZATION, format!("Bearer {API_KEY}").parse().unwrap());
    headers.insert("anthropic-version", "2023-06-01".parse().unwrap());
    reqwest::Client::builder()
        .default_headers(headers)
        .timeout(std::time::Duration::from_secs(300))
        .build()
        .unwrap()
}

/// An answer's status, its `x-pagoda-ignored-tools` header and its JSON body.
async fn post(server: &TestServer, path: &str, body: &Value) -> Result<(u16, Option<String>, Value)> {
    let resp = client().post(server.url(path)).json(body).send().await?;
    let status = resp.status().as_u16();
    let header = resp.headers().get(HEADER).map(|v| v.to_str().unwrap().to_owned());
    let text = resp.text().await?;
    let json = serde_json::from_str(&text).with_context(|| format!("not JSON ({status}): {text}"))?;
    Ok((status, header, json))
}

/// A streamed answer's header and its events' data, checked to be SSE.
async fn stream(server: &TestServer, path: &str, body: &Value) -> Result<(Option<String>, Vec<Value>)> {
    let mut body = body.clone();
    body["stream"] = json!(true);
    let resp = client().post(server.url(path)).json(&body).send().await?;
    assert_eq!(resp.status(), 200);
    let content_type = resp.headers().get("content-type").unwrap().to_str()?.to_owned();
    assert!(content_type.starts_with("text/event-stream"), "{content_type}");
    let header = resp.headers().get(HEADER).map(|v| v.to_str().unwrap().to_owned());
    let mut reader = SseReader::new(resp);
    let mut events = Vec::new();
    while let Some(data) = reader.next_data().await? {
        events.push(serde_json::from_str(&data)?);
    }
    Ok((header, events))
}

fn weather_function() -> Value {
    json!({"type": "function", "name": "get_weather", "description": "Current weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}})
}

fn response_body(tools: Value, extra: Value) -> Value {
    let mut b = json!({"model": "smol", "input": "Say hello in one word.", "tools": tools,
                       "max_output_tokens": 12, "temperature": 0, "store": false});
    b.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    b
}

/// Output items or content blocks without the ids made afresh for each answer.
fn without_ids(list: &Value) -> Vec<Value> {
    let mut list = list.as_array().expect("a list").clone();
    for item in &mut list {
        let item = item.as_object_mut().expect("an object");
        item.remove("id");
        item.remove("call_id");
    }
    list
}

#[tokio::test]
async fn responses_are_made_without_hosted_tools_and_say_so() -> Result<()> {
    let server = ignoring();
    let search = json!({"type": "web_search", "external_web_access": false});
    let with = response_body(json!([weather_function(), search]), json!({}));
    let without = response_body(json!([weather_function()]), json!({}));
    let (status, header, r) = post(server, "/v1/responses", &with).await?;
    assert_eq!(status, 200, "{r}");
    assert_eq!(header.as_deref(), Some("web_search"));
    let (status, plain_header, plain) = post(server, "/v1/responses", &without).await?;
    assert_eq!(status, 200, "{plain}");
    assert_eq!(plain_header, None, "nothing was left out");
    // The same prompt: the hosted tool is not in it.
    assert_eq!(r["usage"]["input_tokens"], plain["usage"]["input_tokens"], "{r}\n{plain}");
    assert_eq!(without_ids(&r["output"]), without_ids(&plain["output"]), "{r}\n{plain}");
    // The tools the response echoes are the request's.
    assert_eq!(r["tools"].as_array().map(Vec::len), Some(2), "{r}");

    let (header, events) = stream(server, "/v1/responses", &with).await?;
    assert_eq!(header.as_deref(), Some("web_search"));
    let last = events.last().context("no events")?;
    assert!(matches!(last["type"].as_str(), Some("response.completed" | "response.incomplete")), "{last}");
    assert_eq!(last["response"]["usage"]["input_tokens"], plain["usage"]["input_tokens"]);

    // Several hosted tools, one named twice; no function tool at all.
    let only_hosted = response_body(
        json!([{"type": "web_search_preview"}, {"type": "file_search", "vector_store_ids": ["vs_1"]},
               {"type": "code_interpreter", "container": {"type": "auto"}}, {"type": "web_search_preview"}]),
        json!({"tool_choice": "auto"}),
    );
    let (status, header, r) = post(server, "/v1/responses", &only_hosted).await?;
    assert_eq!(status, 200, "{r}");
    assert_eq!(header.as_deref(), Some("web_search_preview,file_search,code_interpreter"));
    let bare = response_body(json!([]), json!({}));
    let (_, _, plain) = post(server, "/v1/responses", &bare).await?;
    assert_eq!(r["usage"]["input_tokens"], plain["usage"]["input_tokens"], "{r}\n{plain}");
    Ok(())
}

/// A request shaped as Codex CLI 0.171.0 sends its first one with no configuration beyond the
/// provider (docs/agent-clients.md), cut down: it must complete, streamed.
#[tokio::test]
async fn a_codex_shaped_request_completes() -> Result<()> {
    let body = json!({
        "model": "smol",
        "input": [
            {"type": "message", "id": "msg_1", "role": "developer",
             "content": [{"type": "input_text", "text": "You are a coding agent. Be brief."}]},
            {"type": "message", "id": "msg_2", "role": "user",
             "content": [{"type": "input_text", "text": "Say hello in one word."}]}],
        "tools": [
            {"type": "function", "name": "exec_command", "description": "Runs a command", "strict": false,
             "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}},
            {"type": "namespace", "name": "multi_agent_v1", "description": "Agents", "tools": [
                {"type": "function", "name": "spawn_agent", "description": "Spawns", "strict": false,
                 "parameters": {"type": "object", "properties": {}}}]},
            {"type": "web_search", "external_web_access": false}],
        "tool_choice": "auto",
        "parallel_tool_calls": true,
        "reasoning": {"summary": "auto"},
        "store": false,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "00000000-0000-0000-0000-000000000000",
        "client_metadata": {"session_id": "s", "turn_id": "t"},
        "max_output_tokens": 24,
        "temperature": 0
    });
    let (header, events) = stream(ignoring(), "/v1/responses", &body).await?;
    assert_eq!(header.as_deref(), Some("web_search"));
    let last = events.last().context("no events")?;
    assert!(matches!(last["type"].as_str(), Some("response.completed" | "response.incomplete")), "{last}");
    Ok(())
}

#[tokio::test]
async fn responses_refuse_forced_hosted_tools_and_tools_the_client_runs() -> Result<()> {
    let search = json!({"type": "web_search"});
    let cases = [
        (
            response_body(
                json!([weather_function(), search]),
                json!({"tool_choice": {"type": "web_search"}}),
            ),
            "tool_choice.type",
            "web_search",
        ),
        (response_body(json!([search]), json!({"tool_choice": "required"})), "tool_choice", "web_search"),
        // MCP tools run on the server only for the servers --allow-mcp-servers lists (none here).
        (
            response_body(
                json!([{"type": "mcp", "server_label": "docs", "server_url": "http://127.0.0.1:1/mcp"}]),
                json!({}),
            ),
            "tools[0].server_url",
            "mcp",
        ),
        (response_body(json!([{"type": "local_shell"}]), json!({})), "tools[0].type", "local_shell"),
        (
            response_body(json!([search, {"type": "search_the_web"}]), json!({})),
            "tools[1].type",
            "search_the_web",
        ),
    ];
    for (body, param, named) in cases {
        let (status, header, e) = post(ignoring(), "/v1/responses", &body).await?;
        assert_eq!(status, 400, "{body}: {e}");
        assert_eq!(header, None, "an error names no ignored tools: {body}");
        let error = assert_error_shape(&e);
        assert_eq!(error["param"], param, "{body}: {e}");
        assert!(error["message"].as_str().unwrap().contains(named), "{e}");
    }
    Ok(())
}

fn message_body(tools: Value, extra: Value) -> Value {
    let mut b = json!({"model": "smol", "max_tokens": 12, "temperature": 0, "tools": tools,
                       "messages": [{"role": "user", "content": "Say hello in one word."}]});
    b.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    b
}

/// A message's prompt length: Anthropic counts prefix-cache hits apart from `input_tokens`.
fn prompt_tokens(m: &Value) -> u64 {
    let usage = &m["usage"];
    ["input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"]
        .iter()
        .map(|k| usage[k].as_u64().unwrap_or(0))
        .sum()
}

fn client_tool() -> Value {
    json!({"name": "get_weather", "description": "Current weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}})
}

fn server_tools() -> Value {
    json!([
        {"type": "web_search_20250305", "name": "web_search", "max_uses": 3, "allowed_domains": ["example.com"]},
        {"type": "web_fetch_20250910", "name": "web_fetch", "max_uses": 2},
        {"type": "code_execution_20250825", "name": "code_execution"}
    ])
}

#[tokio::test]
async fn messages_are_made_without_server_tools_and_say_so() -> Result<()> {
    let server = ignoring();
    let mut tools = vec![client_tool()];
    tools.extend(server_tools().as_array().unwrap().iter().cloned());
    let with = message_body(Value::Array(tools), json!({}));
    let without = message_body(json!([client_tool()]), json!({}));
    let named = "web_search_20250305,web_fetch_20250910,code_execution_20250825";
    let (status, header, m) = post(server, "/v1/messages", &with).await?;
    assert_eq!(status, 200, "{m}");
    assert_eq!(header.as_deref(), Some(named));
    let (status, plain_header, plain) = post(server, "/v1/messages", &without).await?;
    assert_eq!(status, 200, "{plain}");
    assert_eq!(plain_header, None);
    assert_eq!(prompt_tokens(&m), prompt_tokens(&plain), "{m}\n{plain}");
    assert_eq!(without_ids(&m["content"]), without_ids(&plain["content"]), "{m}\n{plain}");
    assert_eq!(m["stop_reason"], plain["stop_reason"]);

    let (header, events) = stream(server, "/v1/messages", &with).await?;
    assert_eq!(header.as_deref(), Some(named));
    assert_eq!(events.last().context("no events")?["type"], "message_stop");

    // count_tokens counts the prompt without them too (a client tool does count).
    let count = |body: &Value| {
        let mut b = body.clone();
        for key in ["max_tokens", "temperature"] {
            b.as_object_mut().unwrap().remove(key);
        }
        b
    };
    let (status, header, counted) = post(server, "/v1/messages/count_tokens", &count(&with)).await?;
    assert_eq!(status, 200, "{counted}");
    assert_eq!(header.as_deref(), Some(named));
    assert_eq!(counted["input_tokens"].as_u64(), Some(prompt_tokens(&plain)));
    let (_, _, no_tools) =
        post(server, "/v1/messages/count_tokens", &count(&message_body(json!([]), json!({})))).await?;
    assert!(no_tools["input_tokens"].as_u64() < counted["input_tokens"].as_u64(), "{no_tools} {counted}");
    Ok(())
}

#[tokio::test]
async fn messages_refuse_forced_server_tools_and_client_run_ones() -> Result<()> {
    let mut both = vec![client_tool()];
    both.extend(server_tools().as_array().unwrap().iter().cloned());
    let cases = [
        (
            message_body(Value::Array(both), json!({"tool_choice": {"type": "tool", "name": "web_search"}})),
            "web_search",
        ),
        (message_body(server_tools(), json!({"tool_choice": {"type": "any"}})), "web_search_20250305"),
        (message_body(json!([{"type": "bash_20250124", "name": "bash"}]), json!({})), "bash_20250124"),
        (message_body(json!([{"type": "web_search_2025", "name": "w"}]), json!({})), "web_search_2025"),
    ];
    for (body, named) in cases {
        let (status, header, e) = post(ignoring(), "/v1/messages", &body).await?;
        assert_eq!(status, 400, "{body}: {e}");
        assert_eq!(header, None);
        assert_eq!(e["type"], "error", "{e}");
        assert_eq!(e["error"]["type"], "invalid_request_error", "{e}");
        assert!(e["error"]["message"].as_str().unwrap().contains(named), "{e}");
    }
    Ok(())
}

#[tokio::test]
async fn hosted_tools_reject_refuses_them_all() -> Result<()> {
    let server = rejecting();
    let search = json!({"type": "web_search", "external_web_access": false});
    let (status, header, e) =
        post(server, "/v1/responses", &response_body(json!([weather_function(), search]), json!({}))).await?;
    assert_eq!(status, 400, "{e}");
    assert_eq!(header, None);
    assert_eq!(assert_error_shape(&e)["param"], "tools[1].type", "{e}");
    assert!(e["error"]["message"].as_str().unwrap().contains("web_search"), "{e}");
    let (status, _, e) = post(server, "/v1/messages", &message_body(server_tools(), json!({}))).await?;
    assert_eq!(status, 400, "{e}");
    assert!(e["error"]["message"].as_str().unwrap().contains("web_search_20250305"), "{e}");
    // Function and client tools are served as ever.
    let (status, header, r) =
        post(server, "/v1/responses", &response_body(json!([weather_function()]), json!({}))).await?;
    assert_eq!((status, header), (200, None), "{r}");
    let (status, _, m) =
        post(server, "/v1/messages", &message_body(json!([client_tool()]), json!({}))).await?;
    assert_eq!(status, 200, "{m}");
    Ok(())
}

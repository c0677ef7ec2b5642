//! The fuzz suite's checks of the agent APIs' answers: errors on the Messages routes in
//! Anthropic's shape with the type its status calls for, a `message` with well-formed content
//! blocks and a stop reason, `count_tokens`' `input_tokens`, a `response` object with its status
//! and output items; Anthropic's streams (each event's name its data's `type`, `message_start`
//! first, blocks started, delta'd and stopped in order, ending with `message_stop` or an `error`
//! event) and the Responses API's (`sequence_number` 0, 1, 2, ..., `response.created` first,
//! items added and done in order, each text's deltas adding up to its `.done`, ending with
//! `response.completed`, `.incomplete` or `.failed`, no `[DONE]`).

use serde_json::Value;

use super::check::{excerpt, sse_events};
use super::gen::{Case, Endpoint, Expect};

/// Whose error shape a path's errors come in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    Anthropic,
    OpenAi,
    /// An unknown path under `/v1/messages`: either will do.
    Either,
}

pub fn route_api(path: &str) -> Api {
    let path = path.split('?').next().unwrap_or_default();
    match path {
        "/v1/messages" | "/v1/messages/count_tokens" => Api::Anthropic,
        p if p.starts_with("/v1/messages") => Api::Either,
        _ => Api::OpenAi,
    }
}

/// Anthropic's error type for a status, as its SDKs map them.
fn anthropic_type(status: u16) -> &'static str {
    match status {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        529 => "overloaded_error",
        s if s >= 500 => "api_error",
        _ => "invalid_request_error",
    }
}

/// `{"type": "error", "error": {"type": ..., "message": non-empty}}`, the type the status's
/// (`status` 0: any known type, as in a stream's error event).
pub fn anthropic_error(status: u16, v: &Value) -> Result<(), String> {
    if v["type"] != "error" {
        return Err(format!("not Anthropic's error shape (`type` is not \"error\"): {v}"));
    }
    let error = v.get("error").and_then(Value::as_object).ok_or("no `error` object")?;
    if error.get("message").and_then(Value::as_str).is_none_or(str::is_empty) {
        return Err(format!("`error.message` is not a non-empty string: {v}"));
    }
    let ty = error.get("type").and_then(Value::as_str).unwrap_or_default();
    let known = [401, 403, 404, 413, 429, 400, 500, 529].map(anthropic_type);
    let fits = if status == 0 { known.contains(&ty) } else { ty == anthropic_type(status) };
    if !fits {
        return Err(format!("`error.type` {ty:?} for status {status}: {v}"));
    }
    Ok(())
}

fn requested(case: &Case, field: &str) -> Option<u64> {
    let body: Value = serde_json::from_slice(&case.body).ok()?;
    body[field].as_u64()
}

/// Whether the request's body sets `field` to `true`.
fn requested_flag(case: &Case, field: &str) -> bool {
    serde_json::from_slice::<Value>(&case.body).is_ok_and(|body| body[field] == true)
}

const STOP_REASONS: &[&str] =
    &["end_turn", "max_tokens", "stop_sequence", "tool_use", "model_context_window_exceeded"];

fn content_block(b: &Value) -> Result<(), String> {
    let string = |key: &str| b[key].is_string();
    let ok = match b["type"].as_str() {
        Some("text") => string("text"),
        Some("thinking") => string("thinking") && string("signature"),
        Some("tool_use") => {
            b["id"].as_str().is_some_and(|id| id.starts_with("toolu_"))
                && string("name")
                && b["input"].is_object()
        }
        _ => false,
    };
    ok.then_some(()).ok_or_else(|| format!("bad content block {b}"))
}

fn message_body(case: &Case, v: &Value) -> Result<(), String> {
    if v["type"] != "message"
        || v["role"] != "assistant"
        || !v["id"].as_str().is_some_and(|i| i.starts_with("msg_"))
    {
        return Err("not an assistant message".into());
    }
    let content = v["content"].as_array().filter(|c| !c.is_empty()).ok_or("no content blocks")?;
    content.iter().try_for_each(content_block)?;
    let reason = v["stop_reason"].as_str().unwrap_or_default();
    if !STOP_REASONS.contains(&reason) {
        return Err("bad stop_reason".into());
    }
    if (reason == "stop_sequence") != v["stop_sequence"].is_string() {
        return Err("stop_sequence does not go with stop_reason".into());
    }
    if reason == "tool_use" && !content.iter().any(|b| b["type"] == "tool_use") {
        return Err("stop_reason tool_use without a tool_use block".into());
    }
    let usage = |key: &str| v["usage"][key].as_u64().ok_or(format!("no usage.{key}"));
    let output = usage("output_tokens")?;
    usage("input_tokens")?;
    usage("cache_read_input_tokens")?;
    match requested(case, "max_tokens") {
        Some(max) if case.expect == Expect::Ok && output > max => {
            Err(format!("{output} tokens, max_tokens {max}"))
        }
        _ => Ok(()),
    }
}

fn output_item(item: &Value) -> Result<(), String> {
    let string = |key: &str| item[key].is_string();
    let ok = string("id")
        && match item["type"].as_str() {
            Some("message") => {
                item["role"] == "assistant"
                    && item["content"].as_array().is_some_and(|parts| {
                        parts.iter().all(|p| p["type"] == "output_text" && p["text"].is_string())
                    })
            }
            Some("function_call") => string("call_id") && string("name") && string("arguments"),
            Some("reasoning") => item["summary"].is_array(),
            _ => false,
        };
    ok.then_some(()).ok_or_else(|| format!("bad output item {item}"))
}

/// A `response` object whose status is `status` (or, `None`, a finished one).
fn response_object(case: &Case, v: &Value, status: Option<&str>) -> Result<(), String> {
    if v["object"] != "response" || !v["id"].as_str().is_some_and(|i| i.starts_with("resp_")) {
        return Err("not a response object".into());
    }
    let got = v["status"].as_str().unwrap_or_default();
    let fits = match status {
        Some(s) => got == s,
        None => matches!(got, "completed" | "incomplete"),
    };
    if !fits {
        return Err(format!("status {got:?}, expected {status:?}"));
    }
    let output = v["output"].as_array().ok_or("no output")?;
    output.iter().try_for_each(output_item)?;
    match got {
        "in_progress" | "queued" => return Ok(()),
        "failed" => {
            let message = v["error"]["message"].as_str().unwrap_or_default();
            return if message.is_empty() {
                Err("a failed response without error.message".into())
            } else {
                Ok(())
            };
        }
        "incomplete" if !v["incomplete_details"]["reason"].is_string() => {
            return Err("incomplete without incomplete_details.reason".into())
        }
        _ => {}
    }
    if output.is_empty() {
        return Err("a finished response without output".into());
    }
    let usage = |key: &str| v["usage"][key].as_u64().ok_or(format!("no usage.{key}"));
    let (input, out) = (usage("input_tokens")?, usage("output_tokens")?);
    if input + out != usage("total_tokens")? {
        return Err("usage does not add up".into());
    }
    match requested(case, "max_output_tokens") {
        Some(max) if case.expect == Expect::Ok && out > max => {
            Err(format!("{out} tokens, max_output_tokens {max}"))
        }
        _ => Ok(()),
    }
}

/// A 2xx answer's `x-pagoda-ignored-tools`: the request's hosted tools, each once, in order (the
/// answer was made, so every tool that is neither a function nor a client tool was one the
/// server left out); no header when it had none.
pub fn ignored_tools(case: &Case, header: Option<&str>) -> Result<(), String> {
    // A body that is not JSON was mended by no one: it got no 2xx, or names no tools.
    let Ok(body) = serde_json::from_slice::<Value>(&case.body) else { return Ok(()) };
    let client_run: &[Option<&str>] = match case.endpoint {
        Endpoint::Responses => &[Some("function"), Some("namespace")],
        _ => &[None, Some("custom")],
    };
    let mut hosted: Vec<&str> = Vec::new();
    for tool in body["tools"].as_array().into_iter().flatten() {
        match tool["type"].as_str() {
            ty if client_run.contains(&ty) => {}
            Some(ty) if !hosted.contains(&ty) => hosted.push(ty),
            _ => {}
        }
    }
    let expected = (!hosted.is_empty()).then(|| hosted.join(","));
    if header != expected.as_deref() {
        return Err(format!("x-pagoda-ignored-tools {header:?}, expected {expected:?}"));
    }
    Ok(())
}

/// A 2xx body of an agent endpoint.
pub fn agent_body(case: &Case, v: &Value) -> Result<(), String> {
    let checked = match case.endpoint {
        Endpoint::Messages => message_body(case, v),
        Endpoint::CountTokens => match v["input_tokens"].as_u64() {
            Some(n) if n > 0 => Ok(()),
            _ => Err("no input_tokens".into()),
        },
        // A background response is answered before it runs.
        Endpoint::Responses if requested_flag(case, "background") => response_object(case, v, Some("queued")),
        Endpoint::Responses => response_object(case, v, None),
        // Nothing is stored under a made-up id, but whatever answers must be of its route.
        _ => match v["object"].as_str() {
            Some("response" | "list") => Ok(()),
            _ => Err("neither a response nor a list".into()),
        },
    };
    checked.map_err(|e| format!("{e}: {}", excerpt(v.to_string().as_bytes())))
}

/// The events of a stream as `(name, data)`, each data a JSON object with a `type`.
fn typed_events(body: &[u8]) -> Result<Vec<(Option<String>, Value)>, String> {
    let events = sse_events(body)?;
    if events.is_empty() {
        return Err("empty stream".into());
    }
    events
        .into_iter()
        .enumerate()
        .map(|(i, (name, data))| {
            let v: Value =
                serde_json::from_str(&data).map_err(|e| format!("event {i} is not JSON ({e}): {data}"))?;
            if !v["type"].is_string() {
                return Err(format!("event {i} has no `type`: {data}"));
            }
            Ok((name, v))
        })
        .collect()
}

/// Anthropic's stream: see the module docs.
pub fn anthropic_stream(case: &Case, body: &[u8]) -> Result<(), String> {
    let bad = |why: String| Err(format!("{why}; stream: {}", excerpt(body)));
    let events = match typed_events(body) {
        Ok(events) => events,
        Err(e) => return bad(e),
    };
    let (mut started, mut open, mut delta, mut end) = (0u64, None, false, None);
    for (i, (name, v)) in events.iter().enumerate() {
        let ty = v["type"].as_str().unwrap_or_default();
        if name.as_deref() != Some(ty) {
            return bad(format!("event {i} is named {name:?} but its type is {ty:?}"));
        }
        if let Some(end) = end {
            return bad(format!("event {i} ({ty}) after {end}"));
        }
        if i == 0 && !matches!(ty, "message_start" | "error") {
            return bad(format!("the stream starts with {ty}"));
        }
        let index = v["index"].as_u64();
        match ty {
            "error" => {
                if let Err(e) = anthropic_error(0, v) {
                    return bad(format!("error event {i}: {e}"));
                }
                end = Some("an error event");
            }
            "message_start" if i == 0 => {
                let m = &v["message"];
                if m["type"] != "message" || m["role"] != "assistant" || m["content"] != Value::Array(vec![])
                {
                    return bad(format!("bad message_start {v}"));
                }
            }
            "ping" => {}
            "content_block_start" if open.is_none() && !delta && index == Some(started) => {
                if content_block(&v["content_block"]).is_err() {
                    return bad(format!("bad block in event {i}: {v}"));
                }
                (open, started) = (index, started + 1);
            }
            "content_block_delta" if open.is_some() && index == open => {
                let d = &v["delta"];
                let ok = match d["type"].as_str() {
                    Some("text_delta") => d["text"].is_string(),
                    Some("thinking_delta") => d["thinking"].is_string(),
                    Some("signature_delta") => d["signature"].is_string(),
                    Some("input_json_delta") => d["partial_json"].is_string(),
                    _ => false,
                };
                if !ok {
                    return bad(format!("bad delta in event {i}: {v}"));
                }
            }
            "content_block_stop" if open.is_some() && index == open => open = None,
            "message_delta" if open.is_none() && started > 0 && !delta => {
                let reason = v["delta"]["stop_reason"].as_str().unwrap_or_default();
                if !STOP_REASONS.contains(&reason) || !v["usage"]["output_tokens"].is_u64() {
                    return bad(format!("bad message_delta {v}"));
                }
                delta = true;
            }
            "message_stop" if delta => end = Some("message_stop"),
            _ => {
                return bad(format!("event {i} ({ty}) out of place (open block {open:?}, {started} started)"))
            }
        }
    }
    match end {
        None => bad("the stream ends with neither message_stop nor an error event".into()),
        Some("an error event") if case.expect == Expect::Ok => {
            bad("a valid request's stream has an error event".into())
        }
        _ => Ok(()),
    }
}

/// The open output item of a Responses stream: its index, id and the text its deltas make.
struct OpenItem {
    index: u64,
    id: String,
    text: String,
}

/// The Responses API's stream: see the module docs.
pub fn responses_stream(case: &Case, body: &[u8]) -> Result<(), String> {
    let bad = |why: String| Err(format!("{why}; stream: {}", excerpt(body)));
    if sse_events(body).is_ok_and(|events| events.iter().any(|(_, data)| data == "[DONE]")) {
        return bad("a [DONE] in a Responses stream".into());
    }
    let events = match typed_events(body) {
        Ok(events) => events,
        Err(e) => return bad(e),
    };
    let (mut added, mut done, mut open, mut end): (u64, u64, Option<OpenItem>, Option<&str>) =
        (0, 0, None, None);
    for (i, (name, v)) in events.iter().enumerate() {
        let ty = v["type"].as_str().unwrap_or_default();
        if name.as_deref().is_some_and(|n| n != ty) {
            return bad(format!("event {i} is named {name:?} but its type is {ty:?}"));
        }
        if v["sequence_number"].as_u64() != Some(i as u64) {
            return bad(format!("event {i} ({ty}) has sequence_number {}", v["sequence_number"]));
        }
        if let Some(end) = end {
            return bad(format!("event {i} ({ty}) after {end}"));
        }
        let first = match i {
            0 => Some("response.created"),
            1 => Some("response.in_progress"),
            _ => None,
        };
        if first.is_some_and(|f| f != ty) {
            return bad(format!("event {i} is {ty}, not {first:?}"));
        }
        let in_open = open.as_ref().is_some_and(|o| {
            v["output_index"].as_u64() == Some(o.index)
                && v.get("item_id").is_none_or(|id| id == o.id.as_str())
        });
        match ty {
            "response.created" | "response.in_progress" if first.is_some() => {
                if let Err(e) = response_object(case, &v["response"], Some("in_progress")) {
                    return bad(format!("event {i}: {e}"));
                }
            }
            "response.output_item.added" if open.is_none() && v["output_index"].as_u64() == Some(added) => {
                let id = v["item"]["id"].as_str().unwrap_or_default().to_owned();
                open = Some(OpenItem { index: added, id, text: String::new() });
                added += 1;
            }
            "response.content_part.added"
            | "response.content_part.done"
            | "response.function_call_arguments.delta"
                if in_open => {}
            "response.output_text.delta" | "response.reasoning_text.delta" if in_open => {
                if let (Some(o), Some(d)) = (open.as_mut(), v["delta"].as_str()) {
                    o.text.push_str(d);
                } else {
                    return bad(format!("event {i} has no delta: {v}"));
                }
            }
            "response.output_text.done"
            | "response.reasoning_text.done"
            | "response.function_call_arguments.done"
                if in_open =>
            {
                let key = if ty.ends_with("arguments.done") { "arguments" } else { "text" };
                let o = open.as_mut().expect("in_open");
                if ty.ends_with("text.done") && v[key].as_str() != Some(o.text.as_str()) {
                    return bad(format!(
                        "event {i}: the deltas make {:?}, the .done says {}",
                        o.text, v[key]
                    ));
                }
                o.text.clear();
            }
            "response.output_item.done" if in_open => {
                if let Err(e) = output_item(&v["item"]) {
                    return bad(format!("event {i}: {e}"));
                }
                (open, done) = (None, done + 1);
            }
            "response.completed" | "response.incomplete" | "response.failed" if i >= 2 => {
                let status = ty.trim_start_matches("response.");
                if let Err(e) = response_object(case, &v["response"], Some(status)) {
                    return bad(format!("event {i}: {e}"));
                }
                let items = v["response"]["output"].as_array().map_or(0, Vec::len) as u64;
                if status != "failed" && (open.is_some() || items != done) {
                    return bad(format!("{ty} with {items} output items, {done} done"));
                }
                end = Some(ty);
            }
            _ => return bad(format!("event {i} ({ty}) out of place")),
        }
    }
    match end {
        None => bad("the stream ends without response.completed, .incomplete or .failed".into()),
        Some("response.failed") if case.expect == Expect::Ok => {
            bad("a valid request's response failed".into())
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn case(endpoint: Endpoint) -> Case {
        Case {
            index: 0,
            endpoint,
            method: "POST",
            path: endpoint.path().to_owned(),
            content_type: None,
            auth: None,
            headers: Vec::new(),
            body: br#"{"max_tokens": 2, "max_output_tokens": 2}"#.to_vec(),
            expect: Expect::Ok,
            what: Vec::new(),
            stream: None,
            choices: None,
        }
    }

    fn sse(events: &[(&str, &str)]) -> Vec<u8> {
        events
            .iter()
            .map(|(name, data)| format!("event: {name}\ndata: {data}\n\n"))
            .collect::<String>()
            .into_bytes()
    }

    #[test]
    fn anthropic_errors_and_routes() {
        let e = serde_json::json!({"type": "error", "error": {"type": "not_found_error", "message": "m"}});
        assert!(anthropic_error(404, &e).is_ok());
        assert!(anthropic_error(400, &e).is_err());
        assert!(anthropic_error(0, &e).is_ok());
        let openai = serde_json::json!({"error": {"type": "not_found_error", "message": "m"}});
        assert!(anthropic_error(404, &openai).is_err());
        assert_eq!(route_api("/v1/messages?x=1"), Api::Anthropic);
        assert_eq!(route_api("/v1/messages/batches"), Api::Either);
        assert_eq!(route_api("/v1/responses"), Api::OpenAi);
    }

    #[test]
    fn anthropic_streams_follow_the_protocol() {
        let start =
            r#"{"type":"message_start","message":{"type":"message","role":"assistant","content":[]}}"#;
        let block = r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#;
        let delta = r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"x"}}"#;
        let stop = r#"{"type":"content_block_stop","index":0}"#;
        let mdelta =
            r#"{"type":"message_delta","delta":{"stop_reason":"max_tokens"},"usage":{"output_tokens":1}}"#;
        let end = r#"{"type":"message_stop"}"#;
        let error = r#"{"type":"error","error":{"type":"overloaded_error","message":"m"}}"#;
        let ok = [("message_start", start), ("ping", r#"{"type":"ping"}"#), ("content_block_start", block)];
        let ok = [&ok[..], &[("content_block_delta", delta), ("content_block_stop", stop)]].concat();
        let whole = [&ok[..], &[("message_delta", mdelta), ("message_stop", end)]].concat();
        let c = case(Endpoint::Messages);
        assert!(anthropic_stream(&c, &sse(&whole)).is_ok());
        let errored = [&ok[..], &[("error", error)]].concat();
        assert!(anthropic_stream(&Case { expect: Expect::Any, ..c.clone() }, &sse(&errored)).is_ok());
        assert!(anthropic_stream(&c, &sse(&errored)).is_err());
        let renamed = [&ok[..], &[("message_delta", mdelta), ("stop", end)]].concat();
        assert!(anthropic_stream(&c, &sse(&renamed)).is_err());
        assert!(anthropic_stream(&c, &sse(&ok)).is_err(), "no message_stop");
        let unstopped = [&ok[..4], &[("message_delta", mdelta), ("message_stop", end)]].concat();
        assert!(anthropic_stream(&c, &sse(&unstopped)).is_err(), "a block left open");
    }

    #[test]
    fn responses_streams_count_and_end() {
        let response = |status: &str, output: &str| {
            let usage = r#""usage":{"input_tokens":3,"output_tokens":1,"total_tokens":4}"#;
            let details = r#""incomplete_details":{"reason":"max_output_tokens"}"#;
            format!(
                r#"{{"object":"response","id":"resp_1","status":"{status}","output":[{output}],{details},{usage}}}"#
            )
        };
        let item = r#"{"type":"message","id":"msg_1","role":"assistant","content":[{"type":"output_text","text":"x"}]}"#;
        let event =
            |seq: usize, ty: &str, rest: &str| format!(r#"{{"type":"{ty}","sequence_number":{seq}{rest}}}"#);
        let events = [
            event(0, "response.created", &format!(r#","response":{}"#, response("in_progress", ""))),
            event(1, "response.in_progress", &format!(r#","response":{}"#, response("in_progress", ""))),
            event(2, "response.output_item.added", r#","output_index":0,"item":{"id":"msg_1"}"#),
            event(3, "response.output_text.delta", r#","output_index":0,"item_id":"msg_1","delta":"x""#),
            event(4, "response.output_text.done", r#","output_index":0,"item_id":"msg_1","text":"x""#),
            event(5, "response.output_item.done", &format!(r#","output_index":0,"item":{item}"#)),
            event(6, "response.incomplete", &format!(r#","response":{}"#, response("incomplete", item))),
        ];
        let named: Vec<(&str, &str)> =
            events.iter().map(|e| (e.split('"').nth(3).unwrap_or_default(), e.as_str())).collect();
        let c = case(Endpoint::Responses);
        assert_eq!(responses_stream(&c, &sse(&named)), Ok(()));
        assert!(responses_stream(&c, &sse(&named[..6])).is_err(), "no end");
        let skipped = [&named[..3], &named[4..]].concat();
        assert!(responses_stream(&c, &sse(&skipped)).is_err(), "a sequence number skipped");
        let done = [&named[..], &[("", "[DONE]")]].concat();
        assert!(responses_stream(&c, &sse(&done)).is_err());
    }
}

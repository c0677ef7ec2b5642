//! The fuzz suite's checks of one response: never 5xx, the expected status, every 4xx body (and
//! every error event of a stream) in its API's error shape (Anthropic's on the Messages routes,
//! whatever the method; OpenAI's elsewhere), 2xx bodies of the endpoint's type, and OpenAI
//! streams that end with `data: [DONE]` or an error event. The agent APIs' bodies and streams
//! are checked in `agent_check`.

use std::collections::BTreeSet;

use serde_json::Value;

use super::agent_check;
use super::gen::{Case, Endpoint, Expect, VOCAB};

/// What came back for one case.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub content_type: String,
    /// The `x-pagoda-ignored-tools` header.
    pub ignored_tools: Option<String>,
    pub body: Vec<u8>,
}

/// The body for a message, cut short.
pub fn excerpt(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    match text.char_indices().nth(600) {
        Some((at, _)) => format!("{}... ({} bytes)", &text[..at], body.len()),
        None => text.into_owned(),
    }
}

/// `{"error": {"message": non-empty string, "type": string, "param": string or null,
/// "code": string or null}}`.
pub fn error_shape(v: &Value) -> Result<(), String> {
    let error = v.get("error").and_then(Value::as_object).ok_or("no `error` object")?;
    match error.get("message") {
        Some(Value::String(m)) if !m.is_empty() => {}
        other => return Err(format!("`message` is not a non-empty string: {other:?}")),
    }
    if !error.get("type").is_some_and(Value::is_string) {
        return Err(format!("`type` is not a string: {:?}", error.get("type")));
    }
    for key in ["param", "code"] {
        match error.get(key) {
            Some(Value::String(_) | Value::Null) => {}
            other => return Err(format!("`{key}` is not a string or null: {other:?}")),
        }
    }
    Ok(())
}

fn json(body: &[u8]) -> Result<Value, String> {
    serde_json::from_slice(body).map_err(|e| format!("body is not JSON ({e}): {}", excerpt(body)))
}

/// Checks one reply against its case.
pub fn check(case: &Case, reply: &Reply) -> Result<(), String> {
    let status = reply.status;
    let body = &reply.body;
    if status >= 500 {
        return Err(format!("server error {status}: {}", excerpt(body)));
    }
    let wrong = match case.expect {
        Expect::Ok => status != 200,
        Expect::Status(s) => status != s,
        Expect::Any => false,
    };
    if wrong {
        return Err(format!("expected {:?}, got {status}: {}", case.expect, excerpt(body)));
    }
    if !(200..300).contains(&status) && !(400..500).contains(&status) {
        return Err(format!("unexpected status {status}: {}", excerpt(body)));
    }
    if case.method == "HEAD" {
        return Ok(()); // no body by definition
    }
    if status >= 400 {
        let v = json(body)?;
        let shaped = match agent_check::route_api(&case.path) {
            agent_check::Api::Anthropic => agent_check::anthropic_error(status, &v),
            agent_check::Api::OpenAi => error_shape(&v),
            // An unknown path under /v1/messages: the fallback cannot know whose client it is.
            agent_check::Api::Either => agent_check::anthropic_error(status, &v).or_else(|_| error_shape(&v)),
        };
        return shaped.map_err(|e| format!("{status} body: {e}: {}", excerpt(body)));
    }
    if matches!(case.endpoint, Endpoint::Messages | Endpoint::CountTokens | Endpoint::Responses) {
        agent_check::ignored_tools(case, reply.ignored_tools.as_deref())?;
    }
    let sse = reply.content_type.starts_with("text/event-stream");
    if let Some(stream) = case.stream {
        if stream != sse {
            return Err(format!("stream: {stream} but content-type {:?}", reply.content_type));
        }
    }
    match case.endpoint {
        Endpoint::Chat | Endpoint::Completions if sse => stream_body(case, body),
        Endpoint::Chat | Endpoint::Completions => completion_body(case, &json(body)?),
        Endpoint::Tokenize => {
            let v = json(body)?;
            let tokens = v["tokens"].as_array().ok_or_else(|| format!("no tokens: {v}"))?;
            let in_vocab = tokens.iter().all(|t| t.as_u64().is_some_and(|t| t < VOCAB));
            if !in_vocab || v["count"].as_u64() != Some(tokens.len() as u64) {
                return Err(format!("bad tokenize body: {v}"));
            }
            Ok(())
        }
        Endpoint::Detokenize => {
            let v = json(body)?;
            v["prompt"].as_str().map(drop).ok_or_else(|| format!("no prompt string: {v}"))
        }
        Endpoint::Messages if sse => agent_check::anthropic_stream(case, body),
        Endpoint::Responses if sse => agent_check::responses_stream(case, body),
        Endpoint::Messages | Endpoint::CountTokens | Endpoint::Responses | Endpoint::StoredResponses => {
            agent_check::agent_body(case, &json(body)?)
        }
        Endpoint::Info => info_body(&case.path, body),
        Endpoint::Other => Ok(()),
    }
}

fn info_body(path: &str, body: &[u8]) -> Result<(), String> {
    let ok = match path {
        "/v1/models" => json(body)?["object"] == "list",
        "/v1/models/smol" => json(body)?["object"] == "model",
        "/version" => json(body)?["version"].is_string(),
        "/openapi.json" => json(body)?["openapi"].is_string(),
        "/metrics" => String::from_utf8_lossy(body).contains("http_requests_total"),
        _ => true,
    };
    ok.then_some(()).ok_or_else(|| format!("unexpected body of {path}: {}", excerpt(body)))
}

fn expected_object(endpoint: Endpoint, chunk: bool) -> &'static str {
    match (endpoint, chunk) {
        (Endpoint::Chat, false) => "chat.completion",
        (Endpoint::Chat, true) => "chat.completion.chunk",
        _ => "text_completion",
    }
}

fn finish_reason_ok(v: &Value) -> bool {
    v.is_null() || matches!(v.as_str(), Some("stop" | "length"))
}

fn completion_body(case: &Case, v: &Value) -> Result<(), String> {
    let bad = |why: &str| Err(format!("{why}: {v}"));
    if v["object"] != expected_object(case.endpoint, false) {
        return bad("wrong object");
    }
    let Some(choices) = v["choices"].as_array() else { return bad("no choices") };
    if choices.is_empty() || case.choices.is_some_and(|n| n != choices.len()) {
        return bad(&format!("expected {:?} choices", case.choices));
    }
    for (i, c) in choices.iter().enumerate() {
        let text = match case.endpoint {
            Endpoint::Chat if c["message"]["role"] != "assistant" => return bad("role is not assistant"),
            Endpoint::Chat => &c["message"]["content"],
            _ => &c["text"],
        };
        if c["index"] != i || !text.is_string() || c["finish_reason"].is_null() {
            return bad(&format!("bad choice {i}"));
        }
        if !finish_reason_ok(&c["finish_reason"]) {
            return bad(&format!("bad finish_reason of choice {i}"));
        }
    }
    let usage = &v["usage"];
    let (p, c, t) = (
        usage["prompt_tokens"].as_u64(),
        usage["completion_tokens"].as_u64(),
        usage["total_tokens"].as_u64(),
    );
    match (p, c, t) {
        (Some(p), Some(c), Some(t)) if p + c == t => Ok(()),
        _ => bad("bad usage"),
    }
}

/// The events of an SSE body that carry data, in order: the `event:` name if any, and the
/// `data:` payload.
pub fn sse_events(body: &[u8]) -> Result<Vec<(Option<String>, String)>, String> {
    let text = std::str::from_utf8(body).map_err(|e| format!("stream is not UTF-8: {e}"))?;
    let mut out = Vec::new();
    for event in text.split("\n\n") {
        let field = |name: &'static str| {
            event.lines().filter_map(move |l| l.strip_prefix(name)).map(|d| d.strip_prefix(' ').unwrap_or(d))
        };
        let data: Vec<&str> = field("data:").collect();
        if !data.is_empty() {
            out.push((field("event:").next_back().map(str::to_owned), data.join("\n")));
        }
    }
    Ok(out)
}

/// The `data:` payloads of an SSE body, in order.
fn sse_payloads(body: &[u8]) -> Result<Vec<String>, String> {
    Ok(sse_events(body)?.into_iter().map(|(_, data)| data).collect())
}

fn stream_body(case: &Case, body: &[u8]) -> Result<(), String> {
    let payloads = sse_payloads(body)?;
    let bad = |why: String| Err(format!("{why}; stream: {}", excerpt(body)));
    let (last, events) = match payloads.split_last() {
        Some(split) => split,
        None => return bad("empty stream".into()),
    };
    let mut finished = BTreeSet::new();
    let mut errored = false;
    let ends_with_error = last != "[DONE]";
    let events: Vec<&String> =
        if ends_with_error { payloads.iter().collect() } else { events.iter().collect() };
    for (i, data) in events.iter().enumerate() {
        if *data == "[DONE]" {
            return bad(format!("event {i} is [DONE], but not the last"));
        }
        let v: Value =
            serde_json::from_str(data).map_err(|e| format!("event {i} is not JSON ({e}): {data}"))?;
        if v.get("error").is_some() {
            error_shape(&v).map_err(|e| format!("error event {i}: {e}: {data}"))?;
            errored = true;
            continue;
        }
        if errored {
            return bad(format!("event {i} after an error event"));
        }
        if v["object"] != expected_object(case.endpoint, true) {
            return bad(format!("event {i} has the wrong object"));
        }
        let Some(choices) = v["choices"].as_array() else { return bad(format!("event {i} has no choices")) };
        for c in choices {
            if !finish_reason_ok(&c["finish_reason"]) {
                return bad(format!("event {i}: bad finish_reason"));
            }
            if !c["finish_reason"].is_null() {
                finished.insert(c["index"].as_u64().unwrap_or(u64::MAX));
            }
        }
    }
    if ends_with_error && !errored {
        return bad(format!("the stream ends with neither [DONE] nor an error event: {last}"));
    }
    if case.expect == Expect::Ok {
        if errored {
            return bad("a valid request's stream has an error event".into());
        }
        if let Some(n) = case.choices {
            if finished != (0..n as u64).collect() {
                return bad(format!("finished choices {finished:?}, expected 0..{n}"));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn case(endpoint: Endpoint, expect: Expect) -> Case {
        Case {
            index: 0,
            endpoint,
            method: "POST",
            path: endpoint.path().to_owned(),
            content_type: None,
            auth: None,
            headers: Vec::new(),
            body: Vec::new(),
            expect,
            what: Vec::new(),
            stream: None,
            choices: None,
        }
    }

    fn reply(status: u16, content_type: &str, body: &str) -> Reply {
        Reply {
            status,
            content_type: content_type.to_owned(),
            ignored_tools: None,
            body: body.as_bytes().to_vec(),
        }
    }

    const ERROR: &str =
        r#"{"error":{"message":"bad","type":"invalid_request_error","param":null,"code":"x"}}"#;

    #[test]
    fn the_checks_catch_bad_replies() {
        let any = case(Endpoint::Chat, Expect::Any);
        assert!(check(&any, &reply(400, "application/json", ERROR)).is_ok());
        assert!(check(&any, &reply(500, "application/json", ERROR)).is_err());
        assert!(check(&any, &reply(503, "application/json", ERROR)).is_err());
        assert!(check(&case(Endpoint::Chat, Expect::Status(401)), &reply(400, "", ERROR)).is_err());
        assert!(check(&case(Endpoint::Chat, Expect::Ok), &reply(400, "", ERROR)).is_err());
        for bad in [
            r#"{"error":{"message":"","type":"t","param":null,"code":null}}"#,
            r#"{"error":{"message":"m","type":1,"param":null,"code":null}}"#,
            r#"{"error":{"message":"m","type":"t","code":null}}"#,
            r#"{"error":{"message":"m","type":"t","param":null,"code":5}}"#,
            r#"{"error":"m"}"#,
            "Bad Request",
        ] {
            assert!(check(&any, &reply(400, "application/json", bad)).is_err(), "{bad}");
        }
        let chat = r#"{"object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"x"},
                       "finish_reason":"length"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}"#;
        assert!(check(&any, &reply(200, "application/json", chat)).is_ok());
        let wrong = chat.replace("chat.completion", "text_completion");
        assert!(check(&any, &reply(200, "application/json", &wrong)).is_err());
        let mut two = case(Endpoint::Chat, Expect::Ok);
        two.choices = Some(2);
        assert!(check(&two, &reply(200, "application/json", chat)).is_err());
    }

    #[test]
    fn streams_end_with_done_or_an_error() {
        let sse = "text/event-stream";
        let chunk = r#"data: {"object":"text_completion","choices":[{"index":0,"text":"x","finish_reason":"length"}]}"#;
        let any = case(Endpoint::Completions, Expect::Any);
        assert!(check(&any, &reply(200, sse, &format!("{chunk}\n\ndata: [DONE]\n\n"))).is_ok());
        assert!(check(&any, &reply(200, sse, &format!("{chunk}\n\n"))).is_err());
        assert!(check(&any, &reply(200, sse, &format!("{chunk}\n\ndata: [DONE]\n\n{chunk}\n\n"))).is_err());
        let error = format!("{chunk}\n\ndata: {ERROR}\n\ndata: [DONE]\n\n");
        assert!(check(&any, &reply(200, sse, &error)).is_ok());
        assert!(check(&any, &reply(200, sse, &format!("{chunk}\n\ndata: {ERROR}\n\n"))).is_ok());
        assert!(check(&case(Endpoint::Completions, Expect::Ok), &reply(200, sse, &error)).is_err());
        let bad_error = r#"data: {"error":{"message":"m"}}"#;
        assert!(check(&any, &reply(200, sse, &format!("{bad_error}\n\ndata: [DONE]\n\n"))).is_err());
    }
}

//! Background responses (`background: true`) through the real server, as raw HTTP: answered at
//! once `queued`, polled to the same output a foreground response gives; their event stream
//! replayed whole and from `starting_after`; one whose creating client disconnects mid-stream
//! still finishing, and resumed; cancelling (the engine request aborted, idempotent, refused for
//! a foreground response); the store's bounds (a 429 when unfinished background responses hold
//! every place, the least recently used finished ones evicted first); and the errors, in
//! OpenAI's shape. The OpenAI Python SDK's view is tests/sdk/check_background.py, run here
//! against the bounded server.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use serde_json::{json, Value};

use crate::harness::{
    assert_error_shape, client, metric, metrics_text, post_json, shared, SseReader, TestServer, API_KEY,
};
use crate::responses::output_text;

/// Places in the bounded server's store.
const STORED: usize = 3;

/// A server of its own, for what counts places or running requests: at most [`STORED`] stored
/// responses of at most 64 KiB (a few hundred tokens' events). Its tests run one after another
/// in one test function.
fn bounded() -> &'static TestServer {
    static SERVER: OnceLock<TestServer> = OnceLock::new();
    SERVER.get_or_init(|| {
        TestServer::start(&[
            "--api-key",
            API_KEY,
            "--max-stored-responses",
            &STORED.to_string(),
            "--max-stored-response-bytes",
            "64KiB",
        ])
    })
}

fn body(input: &str, extra: Value) -> Value {
    let mut b = json!({"model": "smol", "input": input, "max_output_tokens": 40, "temperature": 0});
    b.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    b
}

/// A response that cannot end early: its JSON schema asks for hundreds of numbers, more than
/// its `max_output_tokens`, so it runs until cancelled or cut off (seconds on a CPU).
fn long_body() -> Value {
    let schema = json!({"type": "object", "additionalProperties": false, "required": ["n"],
        "properties": {"n": {"type": "array", "items": {"type": "integer"}, "minItems": 600}}});
    body(
        "List many numbers.",
        json!({"background": true, "max_output_tokens": 700,
               "text": {"format": {"type": "json_schema", "name": "numbers", "schema": schema}}}),
    )
}

async fn get(server: &TestServer, path: &str) -> Result<(u16, Value)> {
    let resp = client().get(server.url(path)).send().await?;
    let status = resp.status().as_u16();
    Ok((status, resp.json().await?))
}

/// Polls until the response has left `queued` / `in_progress` (or `until` holds).
async fn poll(server: &TestServer, id: &str, until: impl Fn(&Value) -> bool) -> Result<Value> {
    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        let (status, r) = get(server, &format!("/v1/responses/{id}")).await?;
        assert_eq!(status, 200, "{r}");
        if until(&r) || !matches!(r["status"].as_str(), Some("queued" | "in_progress")) {
            return Ok(r);
        }
        if Instant::now() > deadline {
            bail!("{id} still {} after 240 s", r["status"]);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The events of `GET /v1/responses/{id}?stream=true` plus `query`.
async fn replay(server: &TestServer, id: &str, query: &str) -> Result<Vec<Value>> {
    let resp = client().get(server.url(&format!("/v1/responses/{id}?stream=true{query}"))).send().await?;
    assert_eq!(resp.status(), 200, "{}", resp.text().await?);
    let mut reader = SseReader::new(resp);
    let mut events = Vec::new();
    while let Some(data) = reader.next_data().await? {
        events.push(serde_json::from_str(&data)?);
    }
    Ok(events)
}

fn deltas(events: &[Value]) -> String {
    events
        .iter()
        .filter(|e| e["type"] == "response.output_text.delta")
        .map(|e| e["delta"].as_str().unwrap())
        .collect()
}

#[tokio::test]
async fn a_background_response_is_polled_and_replayed() -> Result<()> {
    let server = shared();
    let url = server.url("/v1/responses");
    let b = body("What is the capital of France?", json!({}));
    let (_, foreground) = post_json(&client(), &url, &b).await?;
    let mut bg = b.clone();
    bg["background"] = json!(true);
    let (status, queued) = post_json(&client(), &url, &bg).await?;
    assert_eq!(status, 200, "{queued}");
    assert_eq!((queued["status"].as_str(), queued["background"].as_bool()), (Some("queued"), Some(true)));
    assert_eq!(queued["output"], json!([]));
    assert_eq!(foreground["background"], false);
    let id = queued["id"].as_str().unwrap();
    let done = poll(server, id, |_| false).await?;
    assert!(matches!(done["status"].as_str(), Some("completed" | "incomplete")), "{done}");
    assert_eq!(output_text(&done), output_text(&foreground));
    assert!(done["usage"]["output_tokens"].as_u64().unwrap() > 0);

    // The whole stream, replayed after the end: numbered from 0, queued first.
    let events = replay(server, id, "").await?;
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e["sequence_number"], i, "{e}");
    }
    let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(&types[..3], ["response.created", "response.in_progress", "response.output_item.added"]);
    assert_eq!(events[0]["response"]["status"], "queued");
    assert_eq!(events.last().unwrap()["response"], done);
    assert_eq!(deltas(&events), output_text(&done));
    // From a sequence number on.
    let n = events.len() / 2;
    let tail = replay(server, id, &format!("&starting_after={n}")).await?;
    assert_eq!(tail, events[n + 1..]);
    let last = events.len() - 1;
    assert!(replay(server, id, &format!("&starting_after={last}")).await?.is_empty());

    // The input items are listed, and the conversation goes on from it.
    let (status, items) = get(server, &format!("/v1/responses/{id}/input_items")).await?;
    assert_eq!((status, items["data"].as_array().unwrap().len()), (200, 1), "{items}");
    let next = body("And of Italy?", json!({"previous_response_id": id, "store": false}));
    let (status, r) = post_json(&client(), &url, &next).await?;
    assert_eq!(status, 200, "{r}");
    Ok(())
}

#[tokio::test]
async fn a_background_response_outlives_its_client_and_resumes() -> Result<()> {
    let server = shared();
    let mut b =
        body("Tell me about the sea.", json!({"background": true, "stream": true, "max_output_tokens": 120}));
    b["temperature"] = json!(0);
    let resp = client().post(server.url("/v1/responses")).json(&b).send().await?;
    assert_eq!(resp.status(), 200);
    let mut reader = SseReader::new(resp);
    let mut seen: Vec<Value> = Vec::new();
    while let Some(data) = reader.next_data().await? {
        let event: Value = serde_json::from_str(&data)?;
        let delta = event["type"] == "response.output_text.delta";
        seen.push(event);
        if delta {
            break;
        }
    }
    assert_eq!(seen[0]["type"], "response.created");
    let id = seen[0]["response"]["id"].as_str().unwrap().to_owned();
    // The client goes away mid-answer.
    drop(reader);
    let done = poll(server, &id, |_| false).await?;
    assert!(matches!(done["status"].as_str(), Some("completed" | "incomplete")), "{done}");
    let text = output_text(&done);
    assert!(text.starts_with(&deltas(&seen)) && text.len() > deltas(&seen).len(), "{text:?}");
    // It resumes after the last event the client saw.
    let last = seen.last().unwrap()["sequence_number"].as_u64().unwrap();
    let rest = replay(server, &id, &format!("&starting_after={last}")).await?;
    assert_eq!(rest[0]["sequence_number"], last + 1);
    assert_eq!(rest.last().unwrap()["response"], done);
    assert_eq!(deltas(&seen) + &deltas(&rest), text);
    Ok(())
}

#[tokio::test]
async fn background_errors_come_in_openai_shape() -> Result<()> {
    let server = shared();
    let url = server.url("/v1/responses");
    let (status, e) =
        post_json(&client(), &url, &body("hi", json!({"background": true, "store": false}))).await?;
    assert_eq!((status, assert_error_shape(&e)["param"].as_str()), (400, Some("background")), "{e}");
    let (_, fg) = post_json(&client(), &url, &body("hi", json!({"max_output_tokens": 2}))).await?;
    let fg = fg["id"].as_str().unwrap();
    let (_, bg) =
        post_json(&client(), &url, &body("hi", json!({"max_output_tokens": 2, "background": true}))).await?;
    let bg = bg["id"].as_str().unwrap();
    poll(server, bg, |_| false).await?;
    let bad = [
        (format!("/v1/responses/{bg}?stream=true&starting_after=x"), "starting_after"),
        (format!("/v1/responses/{bg}?stream=true&starting_after=-1"), "starting_after"),
        (format!("/v1/responses/{bg}?stream=true&starting_after=100000"), "starting_after"),
        (format!("/v1/responses/{bg}?starting_after=1"), "starting_after"),
        (format!("/v1/responses/{bg}?stream=yes"), "stream"),
        (format!("/v1/responses/{bg}?bogus=1"), "bogus"),
        (format!("/v1/responses/{fg}?stream=true"), "stream"),
    ];
    for (path, param) in bad {
        let (status, e) = get(server, &path).await?;
        assert_eq!((status, assert_error_shape(&e)["param"].as_str()), (400, Some(param)), "{path}: {e}");
    }
    let resp = client().post(server.url(&format!("/v1/responses/{fg}/cancel"))).send().await?;
    assert_eq!(resp.status(), 400);
    let e: Value = resp.json().await?;
    assert!(assert_error_shape(&e)["message"].as_str().unwrap().contains("background"), "{e}");
    for path in ["/v1/responses/resp_nope", "/v1/responses/resp_nope?stream=true"] {
        let (status, e) = get(server, path).await?;
        assert_eq!(
            (status, assert_error_shape(&e)["code"].as_str()),
            (404, Some("response_not_found")),
            "{e}"
        );
    }
    let resp = client().post(server.url("/v1/responses/resp_nope/cancel")).send().await?;
    assert_eq!(resp.status(), 404);
    Ok(())
}

async fn running(server: &TestServer) -> Result<f64> {
    let text = metrics_text(&client(), server).await?;
    Ok(metric(&text, "pagoda:num_requests_running", "").unwrap_or(f64::NAN))
}

async fn cancel(server: &TestServer, id: &str) -> Result<(u16, Value)> {
    let resp = client().post(server.url(&format!("/v1/responses/{id}/cancel"))).send().await?;
    let status = resp.status().as_u16();
    Ok((status, resp.json().await?))
}

/// Waits until the server runs no request (the engine aborted what was cancelled).
async fn idle(server: &TestServer, within: Duration) -> Result<()> {
    let deadline = Instant::now() + within;
    while running(server).await? != 0.0 {
        if Instant::now() > deadline {
            bail!("still {} requests running after {within:?}", running(server).await?);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// On the bounded server, one step after another: cancelling, the 429 of a store full of
/// unfinished responses, eviction of the least recently used finished ones, then the SDK.
#[tokio::test]
async fn cancelling_bounds_and_eviction() -> Result<()> {
    let server = bounded();
    let url = server.url("/v1/responses");
    let c = client();

    // Cancelling: at once `cancelled`, the output so far kept, the engine request aborted.
    let (status, r) = post_json(&c, &url, &long_body()).await?;
    assert_eq!(status, 200, "{r}");
    let id = r["id"].as_str().unwrap().to_owned();
    let started = poll(server, &id, |r| !output_text(r).is_empty()).await?;
    assert_eq!(started["status"], "in_progress", "it ended before it could be cancelled: {started}");
    let (status, cancelled) = cancel(server, &id).await?;
    assert_eq!((status, cancelled["status"].as_str()), (200, Some("cancelled")), "{cancelled}");
    assert!(output_text(&cancelled).starts_with(&output_text(&started)));
    // Left alone, the rest of its 700 tokens would take several seconds more.
    idle(server, Duration::from_secs(2)).await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (_, later) = get(server, &format!("/v1/responses/{id}")).await?;
    assert_eq!(later, cancelled, "a cancelled response does not change");
    let (status, again) = cancel(server, &id).await?;
    assert_eq!((status, &again), (200, &cancelled), "cancelling again is idempotent");
    // Its stream ends where it was cancelled.
    let events = replay(server, &id, "").await?;
    assert!(events.iter().all(|e| !e["type"].as_str().unwrap().ends_with(".completed")));

    // A long response keeps only its newest events: what is gone is a 400 naming the parameter.
    let (_, r) = post_json(&c, &url, &long_body()).await?;
    let id = r["id"].as_str().unwrap().to_owned();
    let done = poll(server, &id, |_| false).await?;
    assert_eq!(done["status"], "incomplete", "{done}");
    for (query, param) in [("", "stream"), ("&starting_after=0", "starting_after")] {
        let (status, e) = get(server, &format!("/v1/responses/{id}?stream=true{query}")).await?;
        assert_eq!((status, assert_error_shape(&e)["param"].as_str()), (400, Some(param)), "{e}");
    }
    let last = get(server, &format!("/v1/responses/{id}?stream=true&starting_after=1")).await?.1;
    assert!(last["error"]["message"].as_str().unwrap().contains("no longer buffered"), "{last}");
    let (_, e) = get(server, &format!("/v1/responses/{id}?stream=true&starting_after=1000000")).await?;
    let end: u64 =
        e["error"]["message"].as_str().unwrap().rsplit(' ').next().unwrap().trim_end_matches(')').parse()?;
    let tail = replay(server, &id, &format!("&starting_after={}", end - 3)).await?;
    let types: Vec<&str> = tail.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(types.last(), Some(&"response.incomplete"), "{types:?}");
    assert_eq!(tail.last().unwrap()["response"], done);

    // Unfinished background responses hold every place: a new one is a 429.
    let mut live = Vec::new();
    for _ in 0..STORED {
        let (status, r) = post_json(&c, &url, &long_body()).await?;
        assert_eq!(status, 200, "{r}");
        live.push(r["id"].as_str().unwrap().to_owned());
    }
    assert_eq!(get(server, &format!("/v1/responses/{id}")).await?.0, 404, "the finished one made room");
    let (status, e) = post_json(&c, &url, &long_body()).await?;
    assert_eq!((status, assert_error_shape(&e)["type"].as_str()), (429, Some("rate_limit_error")), "{e}");
    for id in &live {
        assert_eq!(cancel(server, id).await?.1["status"], "cancelled");
    }
    idle(server, Duration::from_secs(5)).await?;

    // Finished ones are evicted least recently used first.
    let mut done = Vec::new();
    for i in 0..STORED + 1 {
        let b = body(&format!("Say {i}."), json!({"background": true, "max_output_tokens": 3}));
        let (status, r) = post_json(&c, &url, &b).await?;
        assert_eq!(status, 200, "{r}");
        let id = r["id"].as_str().unwrap().to_owned();
        poll(server, &id, |_| false).await?;
        done.push(id);
    }
    for id in &live {
        assert_eq!(get(server, &format!("/v1/responses/{id}")).await?.0, 404);
    }
    assert_eq!(get(server, &format!("/v1/responses/{}", done[0])).await?.0, 404);
    for id in &done[1..] {
        assert_eq!(get(server, &format!("/v1/responses/{id}")).await?.0, 200);
    }

    // The same through the OpenAI Python SDK.
    let max = STORED.to_string();
    crate::sdk::run_script("check_background.py", &server.url(""), &["--max-stored", &max]).await
}

//! Priority scheduling through the real server: with `--scheduling-policy priority` and one
//! sequence slot, a high-priority request sent behind a queue of low-priority ones gets its first
//! token before them; without the policy a non-zero `priority` is a 400 naming it.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde_json::{json, Value};

use crate::harness::{assert_error_shape, client, post_json, shared, SseReader, TestServer};

/// Sends a streamed chat request and, once the server has admitted it (the response head is
/// back; with `running`, once its first token came), reads it in the background; the task
/// yields when its first token arrived.
async fn start(
    c: &reqwest::Client,
    url: &str,
    priority: i64,
    max_tokens: u32,
    running: bool,
) -> Result<tokio::task::JoinHandle<Result<Instant>>> {
    let body = json!({"model": "smol", "stream": true, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": true,
                      "priority": priority, "messages": [{"role": "user", "content": "Count to a hundred."}]});
    let resp = c.post(url).json(&body).send().await?;
    anyhow::ensure!(resp.status() == 200, "status {}", resp.status());
    let mut reader = SseReader::new(resp);
    let mut first = None;
    if running {
        while first.is_none() {
            let data = reader.next_data().await?.context("the stream ended before a token")?;
            let chunk: Value = serde_json::from_str(&data)?;
            if !chunk["choices"][0]["delta"]["content"].as_str().unwrap_or("").is_empty() {
                first = Some(Instant::now());
            }
        }
    }
    Ok(tokio::spawn(async move {
        while let Some(data) = reader.next_data().await? {
            if data == "[DONE]" {
                break;
            }
            let chunk: Value = serde_json::from_str(&data)?;
            let content = chunk["choices"][0]["delta"]["content"].as_str().unwrap_or("");
            if first.is_none() && !content.is_empty() {
                first = Some(Instant::now());
            }
        }
        first.context("no token came")
    }))
}

#[tokio::test]
async fn a_high_priority_request_overtakes_the_queue() -> Result<()> {
    let server = TestServer::start(&["--scheduling-policy", "priority", "--max-num-seqs", "1"]);
    let c = reqwest::Client::builder().timeout(Duration::from_secs(300)).build()?;
    let url = server.url("/v1/chat/completions");
    // The first low request runs (its first token came) before the others are sent.
    let mut low = vec![start(&c, &url, 10, 48, true).await?];
    for _ in 0..2 {
        low.push(start(&c, &url, 10, 48, false).await?);
    }
    let high = start(&c, &url, -10, 4, false).await?;
    let high = high.await??;
    let low: Vec<Instant> =
        futures_util::future::try_join_all(low).await?.into_iter().collect::<Result<_>>()?;
    // The first low request was running already; the two queued behind it came after.
    assert!(high < low[1] && high < low[2], "high {high:?}, low {low:?}");
    assert!(low[0] < high);
    Ok(())
}

#[tokio::test]
async fn without_the_policy_priority_is_refused() -> Result<()> {
    let body = json!({"model": "smol", "max_tokens": 2, "priority": -1, "messages": [{"role": "user", "content": "hi"}]});
    let (status, resp) = post_json(&client(), &shared().url("/v1/chat/completions"), &body).await?;
    assert_eq!(status, 400, "{resp}");
    assert_eq!(assert_error_shape(&resp)["param"], "priority");
    let body = json!({"model": "smol", "max_tokens": 2, "priority": 0, "prompt": "hi"});
    let (status, resp) = post_json(&client(), &shared().url("/v1/completions"), &body).await?;
    assert_eq!(status, 200, "{resp}");
    Ok(())
}

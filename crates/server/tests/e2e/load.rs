//! Concurrency and admission: 32 concurrent streams; a client that disconnects gets its
//! request aborted and its KV blocks freed (seen in /metrics); a full waiting queue answers 429.

use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use serde_json::{json, Value};

use crate::harness::{
    assert_error_shape, client, metric, metrics_text, read_sse, shared, SseReader, TestServer,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thirty_two_concurrent_streams() -> Result<()> {
    let c = client();
    let url = shared().url("/v1/completions");
    let tasks: Vec<_> = (0..32)
        .map(|i| {
            let (c, url) = (c.clone(), url.clone());
            tokio::spawn(async move {
                let body = json!({"prompt": format!("Item {i}:"), "max_tokens": 6, "temperature": 0, "stream": true,
                                  "ignore_eos": true});
                let resp = c.post(&url).json(&body).send().await?;
                anyhow::ensure!(resp.status() == 200, "status {}", resp.status());
                let (events, done) = read_sse(resp).await?;
                anyhow::ensure!(done, "no [DONE]");
                let finish: Vec<&Value> =
                    events.iter().map(|e| &e["choices"][0]["finish_reason"]).filter(|f| !f.is_null()).collect();
                anyhow::ensure!(finish == [&json!("length")], "finish reasons {finish:?}");
                Ok::<_, anyhow::Error>(())
            })
        })
        .collect();
    for t in tasks {
        t.await??;
    }
    Ok(())
}

async fn wait_for_metric(
    c: &reqwest::Client,
    s: &TestServer,
    name: &str,
    ok: impl Fn(f64) -> bool,
) -> Result<f64> {
    wait_for_labelled(c, s, name, "", ok).await
}

/// Polls /metrics until the sample of `name` with `labels` satisfies `ok` (30 s at most).
async fn wait_for_labelled(
    c: &reqwest::Client,
    s: &TestServer,
    name: &str,
    labels: &str,
    ok: impl Fn(f64) -> bool,
) -> Result<f64> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = metrics_text(c, s).await?;
        let v = metric(&text, name, labels).unwrap_or(f64::NAN);
        if ok(v) {
            return Ok(v);
        }
        if Instant::now() > deadline {
            bail!("{name} stuck at {v}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One sequence at a time and one waiting request: the third concurrent request gets 429.
/// Then the clients disconnect, and the engine frees every block.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_queue_is_429_and_disconnects_free_blocks() -> Result<()> {
    let server = TestServer::start(&["--max-num-seqs", "1", "--max-waiting-requests", "1"]);
    let c = reqwest::Client::new();
    let url = server.url("/v1/completions");
    let long = json!({"prompt": "Tell me a very long story.", "max_tokens": 900, "ignore_eos": true,
                      "temperature": 0, "stream": true});

    // A runs: wait for its first token.
    let a = c.post(&url).json(&long).send().await?;
    assert_eq!(a.status(), 200);
    let mut a = SseReader::new(a);
    assert!(a.next_data().await?.is_some());
    let running = wait_for_metric(&c, &server, "pagoda:num_requests_running", |v| v == 1.0).await?;
    assert_eq!(running, 1.0);
    let usage = wait_for_metric(&c, &server, "pagoda:kv_cache_usage_perc", |v| v > 0.0).await?;
    assert!(usage > 0.0);

    // B waits (its response head arrives once it is admitted to the queue).
    let b = c.post(&url).json(&long).send().await?;
    assert_eq!(b.status(), 200);
    // C finds the queue full.
    let resp = c.post(&url).json(&long).send().await?;
    assert_eq!(resp.status(), 429);
    assert!(resp.headers().contains_key("retry-after"));
    let body: Value = resp.json().await?;
    assert_eq!(assert_error_shape(&body)["code"], "queue_full");
    // Non-streaming requests are refused the same way.
    let mut plain = long.clone();
    plain["stream"] = json!(false);
    assert_eq!(c.post(&url).json(&plain).send().await?.status(), 429);

    // Both clients go away mid-stream: their requests are aborted and the blocks come back.
    drop(a);
    drop(b);
    wait_for_metric(&c, &server, "pagoda:kv_cache_usage_perc", |v| v == 0.0).await?;
    wait_for_metric(&c, &server, "pagoda:num_requests_running", |v| v == 0.0).await?;
    wait_for_metric(&c, &server, "pagoda:num_requests_waiting", |v| v == 0.0).await?;

    // A non-streaming client that gives up is aborted too.
    let impatient = reqwest::Client::builder().timeout(Duration::from_millis(700)).build()?;
    assert!(impatient.post(&url).json(&plain).send().await.is_err(), "should have timed out");
    let abort = "finished_reason=\"abort\"";
    wait_for_labelled(&c, &server, "pagoda:request_success_total", abort, |v| v >= 3.0).await?;
    wait_for_metric(&c, &server, "pagoda:kv_cache_usage_perc", |v| v == 0.0).await?;
    let text = metrics_text(&c, &server).await?;
    let aborted = metric(&text, "pagoda:request_success_total", "finished_reason=\"abort\"").unwrap_or(0.0);
    assert!(aborted >= 3.0, "aborted {aborted}\n{text}");
    let generated = metric(&text, "pagoda:generation_tokens_total", "").unwrap();
    assert!(generated < 900.0, "the aborted requests kept generating: {generated}");

    // The server still serves.
    let ok = c.post(&url).json(&json!({"prompt": "Hi", "max_tokens": 2})).send().await?;
    assert_eq!(ok.status(), 200);
    tokio::task::spawn_blocking(move || server.join()).await??;
    Ok(())
}

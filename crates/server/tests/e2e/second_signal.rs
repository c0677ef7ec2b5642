//! A second shutdown signal during the drain (Ctrl-C twice): requests in flight are aborted
//! with a clean end (a final chunk and `[DONE]` for streams) and the server exits at once,
//! long before its grace period is over; in-process, and on the real binary with SIGINT.

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde_json::{json, Value};

use crate::harness::SseReader;
use crate::harness::TestServer;
use crate::shutdown::{pagoda_serve, spawn_ready, wait_exit};

/// A completion that would stream for far longer than any test waits.
fn endless() -> Value {
    json!({"prompt": "Go on forever:", "max_tokens": 900, "ignore_eos": true, "temperature": 0,
           "stream": true})
}

/// Reads the rest of a stream: its last finish reason and whether `[DONE]` ended it.
async fn rest_of_stream(reader: &mut SseReader) -> Result<(Option<String>, bool)> {
    let mut finish = None;
    while let Some(data) = reader.next_data().await? {
        if data == "[DONE]" {
            return Ok((finish, true));
        }
        let event: Value = serde_json::from_str(&data)?;
        if let Some(f) = event["choices"][0]["finish_reason"].as_str() {
            finish = Some(f.to_owned());
        }
    }
    Ok((finish, false))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_signal_aborts_requests_in_flight_and_exits_at_once() -> Result<()> {
    let server = TestServer::start(&["--shutdown-timeout", "120"]);
    let c = reqwest::Client::new();
    let resp = c.post(server.url("/v1/completions")).json(&endless()).send().await?;
    assert_eq!(resp.status(), 200);
    let mut reader = SseReader::new(resp);
    assert!(reader.next_data().await?.is_some(), "no first chunk");
    // A non-streamed request in flight too: it must get an answer, not a dropped connection.
    let mut plain = endless();
    plain["stream"] = json!(false);
    let plain = tokio::spawn(c.post(server.url("/v1/completions")).json(&plain).send());
    tokio::time::sleep(Duration::from_millis(300)).await;

    server.signal_stop();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The first signal only drains: the stream goes on.
    assert!(reader.next_data().await?.is_some_and(|d| d != "[DONE]"), "the first signal ended the stream");

    let second = Instant::now();
    server.signal_again();
    let (finish, done) = tokio::time::timeout(Duration::from_secs(60), rest_of_stream(&mut reader))
        .await
        .context("the stream did not end")??;
    let ended = second.elapsed();
    assert!(done, "the stream did not end with [DONE]");
    assert_eq!(finish.as_deref(), Some("abort"), "the stream was not aborted");
    let plain = plain.await?.context("the non-streamed request got no answer")?;
    eprintln!("non-streamed request: {}", plain.status());
    tokio::task::spawn_blocking(move || server.join()).await??;
    let exited = second.elapsed();
    assert!(ended < Duration::from_secs(3), "the stream ended {ended:?} after the second signal");
    assert!(exited < Duration::from_secs(3), "the server exited {exited:?} after the second signal");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigint_twice_aborts_and_exits_the_binary_at_once() -> Result<()> {
    let extra = ["--kv-cache-memory", "64MiB", "--max-model-len", "1024", "--shutdown-timeout", "120"];
    let (mut child, addr, log) = spawn_ready(pagoda_serve(&extra))?;
    let pid = child.id().to_string();
    let sigint = || Command::new("kill").args(["-INT", &pid]).status();
    let result = async {
        let c = reqwest::Client::new();
        let resp = c.post(format!("http://{addr}/v1/completions")).json(&endless()).send().await?;
        assert_eq!(resp.status(), 200);
        let mut reader = SseReader::new(resp);
        assert!(reader.next_data().await?.is_some(), "no first chunk");
        assert!(sigint()?.success());
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            reader.next_data().await?.is_some_and(|d| d != "[DONE]"),
            "the first SIGINT ended the stream"
        );
        let second = Instant::now();
        assert!(sigint()?.success());
        let (finish, done) = tokio::time::timeout(Duration::from_secs(60), rest_of_stream(&mut reader))
            .await
            .context("the stream did not end")??;
        assert!(done, "the stream did not end with [DONE]");
        assert_eq!(finish.as_deref(), Some("abort"), "the stream was not aborted");
        anyhow::Ok(second)
    }
    .await;
    let code = wait_exit(&mut child, Duration::from_secs(60), "two SIGINTs").await?;
    let log = log.join().unwrap_or_default().join("\n");
    let second = result.with_context(|| format!("server log:\n{log}"))?;
    let exited = second.elapsed();
    assert!(exited < Duration::from_secs(3), "exited {exited:?} after the second SIGINT; log:\n{log}");
    assert!(code.success(), "exit status {code:?}; log:\n{log}");
    assert_eq!(log.matches("SIGINT received").count(), 2, "{log}");
    Ok(())
}

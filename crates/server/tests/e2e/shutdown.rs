//! Graceful shutdown: the real `pagoda` binary gets SIGTERM with a request in flight, stops
//! accepting, finishes the request and exits 0; in-process, a request that outlasts the grace
//! period is cut off and the server still exits cleanly.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use crate::harness::{model_path, SseReader, TestServer};

/// Reads the server's log until the "ready on http://..." line and returns the address and the
/// whole log (start-up lines included), complete once the server exits.
pub(crate) fn wait_ready(
    stderr: impl std::io::Read + Send + 'static,
) -> Result<(String, std::thread::JoinHandle<Vec<String>>)> {
    let mut lines = BufReader::new(stderr).lines();
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline {
        let Some(line) = lines.next() else { bail!("the server exited before it was ready") };
        let line = line?;
        if let Some(rest) = line.split("ready on http://").nth(1) {
            let addr: String =
                rest.chars().take_while(|c| c.is_ascii_digit() || *c == '.' || *c == ':').collect();
            seen.push(line);
            // Keep draining the log so the server never blocks on a full pipe.
            let rest = std::thread::spawn(move || {
                seen.extend(lines.map_while(Result::ok));
                seen
            });
            return Ok((addr, rest));
        }
        seen.push(line);
    }
    bail!("the server was not ready in time")
}

/// Waits up to `limit` for `child` to exit; past it the child is killed and `what` (the event
/// it should have exited after) is the error.
pub(crate) async fn wait_exit(
    child: &mut std::process::Child,
    limit: Duration,
    what: &str,
) -> Result<std::process::ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("the server did not exit after {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `pagoda serve` with the real model on a free port, and `extra` flags.
pub(crate) fn pagoda_serve(extra: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_pagoda"));
    command.args(["serve", "--model"]).arg(model_path()).args(["--port", "0"]).args(extra);
    command
}

/// Starts `command` (a `pagoda serve`) with its log piped and waits until it is ready; returns
/// the child, its address and the rest of its log. A child that never gets ready is killed.
pub(crate) fn spawn_ready(
    mut command: Command,
) -> Result<(std::process::Child, String, std::thread::JoinHandle<Vec<String>>)> {
    let mut child = command
        .env("NO_COLOR", "1")
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting the pagoda binary")?;
    let stderr = child.stderr.take().context("no stderr")?;
    match wait_ready(stderr) {
        Ok((addr, log)) => Ok((child, addr, log)),
        Err(e) => {
            let _ = child.kill();
            let _ = child.wait();
            Err(e)
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_finishes_in_flight_requests_and_exits_0() -> Result<()> {
    let extra = ["--kv-cache-memory", "64MiB", "--max-model-len", "512", "--shutdown-timeout", "60"];
    let (mut child, addr, log) = spawn_ready(pagoda_serve(&extra))?;
    let url = format!("http://{addr}/v1/completions");
    let c = reqwest::Client::new();
    let body = json!({"prompt": "Count slowly:", "max_tokens": 40, "ignore_eos": true, "temperature": 0,
                      "stream": true});
    let resp = c.post(&url).json(&body).send().await?;
    assert_eq!(resp.status(), 200);
    let mut reader = SseReader::new(resp);
    assert!(reader.next_data().await?.is_some(), "no first chunk");

    // SIGTERM while the request is in flight.
    let status = Command::new("kill").args(["-TERM", &child.id().to_string()]).status()?;
    assert!(status.success());
    tokio::time::sleep(Duration::from_millis(300)).await;
    // No new connections are accepted...
    let fresh = reqwest::Client::new();
    assert!(
        fresh.get(format!("http://{addr}/health")).send().await.is_err(),
        "still accepting after SIGTERM"
    );
    // ...but the request in flight runs to its end.
    let mut finish = None;
    let mut done = false;
    while let Some(data) = reader.next_data().await? {
        if data == "[DONE]" {
            done = true;
            break;
        }
        let event: Value = serde_json::from_str(&data)?;
        if let Some(f) = event["choices"][0]["finish_reason"].as_str() {
            finish = Some(f.to_owned());
        }
    }
    assert!(done, "the stream did not end with [DONE]");
    assert_eq!(finish.as_deref(), Some("length"));

    let code = wait_exit(&mut child, Duration::from_secs(30), "SIGTERM").await?;
    let log = log.join().unwrap_or_default();
    assert!(code.success(), "exit status {code:?}; log:\n{}", log.join("\n"));
    assert!(log.iter().any(|l| l.contains("SIGTERM")), "{}", log.join("\n"));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_past_the_grace_period_are_cut_off() -> Result<()> {
    let server = TestServer::start(&["--shutdown-timeout", "0.5"]);
    let c = reqwest::Client::new();
    let body = json!({"prompt": "Go on forever:", "max_tokens": 1000, "ignore_eos": true, "stream": true});
    let resp = c.post(server.url("/v1/completions")).json(&body).send().await?;
    assert_eq!(resp.status(), 200);
    let started = Instant::now();
    server.signal_stop();
    // The stream is cut off (connection closed, or the engine's abort) instead of running to
    // its length limit.
    let mut reader = SseReader::new(resp);
    let mut finish = None;
    while let Ok(Some(data)) = reader.next_data().await {
        if let Ok(event) = serde_json::from_str::<Value>(&data) {
            if let Some(f) = event["choices"][0]["finish_reason"].as_str() {
                finish = Some(f.to_owned());
            }
        }
    }
    assert_ne!(finish.as_deref(), Some("length"), "the request was not cut off");
    tokio::task::spawn_blocking(move || server.join()).await??;
    assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());
    Ok(())
}

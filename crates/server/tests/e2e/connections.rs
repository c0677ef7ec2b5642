//! Slow and idle clients: request heads that stall are closed after the header-read timeout,
//! idle keep-alive connections after the keep-alive timeout, the connection cap holds, and
//! `/health` still answers within a second while slow connections fill the server, up to its
//! open-file limit (the real binary under `ulimit -n`).

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::harness::{model_path, read_sse, TestServer};
use crate::shutdown::{spawn_ready, wait_exit};

/// A request head that never ends: the blank line after the headers never comes.
const PARTIAL_HEAD: &[u8] = b"GET /health HTTP/1.1\r\nHost: slow.example\r\nX-Slow: 1\r\n";

/// Opens `n` connections that each send [`PARTIAL_HEAD`] and stall.
async fn open_slow(addr: &str, n: usize) -> Result<Vec<TcpStream>> {
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let mut s = TcpStream::connect(addr).await.with_context(|| format!("slow connection {i}"))?;
        s.write_all(PARTIAL_HEAD).await?;
        out.push(s);
    }
    Ok(out)
}

/// Whether the server has closed `s` (EOF or reset), waiting at most `wait` to find out.
async fn is_closed(s: &mut TcpStream, wait: Duration) -> bool {
    let mut buf = [0u8; 1024];
    loop {
        match tokio::time::timeout(wait, s.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            // A response (e.g. a 408) before the close: keep reading.
            Ok(Ok(_)) => continue,
        }
    }
}

/// GET /health on a fresh connection, failing if the whole exchange takes over a second.
async fn health_within_a_second(addr: &str) -> Result<Duration> {
    let client = reqwest::Client::builder().timeout(Duration::from_secs(1)).build()?;
    let started = Instant::now();
    let resp =
        client.get(format!("http://{addr}/health")).send().await.context("/health did not answer in 1 s")?;
    assert_eq!(resp.status(), 200);
    Ok(started.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_head_is_closed_after_the_header_read_timeout() -> Result<()> {
    let server = TestServer::start(&["--http-header-read-timeout", "0.5"]);
    let addr = server.addr.to_string();
    let mut slow = open_slow(&addr, 1).await?.remove(0);
    let started = Instant::now();
    assert!(is_closed(&mut slow, Duration::from_secs(5)).await, "a stalled head was kept open for 5 s");
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(400), "closed after {took:?}, before the timeout");

    // A connection that takes its time but finishes its head inside the timeout is served.
    let mut s = TcpStream::connect(&addr).await?;
    s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n").await?;
    tokio::time::sleep(Duration::from_millis(200)).await;
    s.write_all(b"Connection: close\r\n\r\n").await?;
    let mut response = String::new();
    s.read_to_string(&mut response).await?;
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    tokio::task::spawn_blocking(move || server.join()).await??;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_keep_alive_connections_close_after_the_keep_alive_timeout() -> Result<()> {
    let server = TestServer::start(&["--http-header-read-timeout", "0.3", "--http-keep-alive-timeout", "1"]);
    let addr = server.addr.to_string();
    let mut s = TcpStream::connect(&addr).await?;
    s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n").await?;
    let mut buf = vec![0u8; 4096];
    let n = s.read(&mut buf).await?;
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&buf[..n]));
    let answered = Instant::now();
    // Idle longer than the header-read timeout: still open (keep-alive is the longer one).
    assert!(!is_closed(&mut s, Duration::from_millis(600)).await, "closed before the keep-alive timeout");
    assert!(is_closed(&mut s, Duration::from_secs(4)).await, "an idle connection was kept open");
    let idle = answered.elapsed();
    assert!(idle >= Duration::from_millis(900), "closed after {idle:?} idle");

    // A request in flight is not cut off by either timeout, however long it streams.
    let c = reqwest::Client::new();
    let body = json!({"prompt": "Count:", "max_tokens": 150, "ignore_eos": true, "stream": true});
    let resp = c.post(server.url("/v1/completions")).json(&body).send().await?;
    assert_eq!(resp.status(), 200);
    let (events, done) = read_sse(resp).await?;
    assert!(done, "the stream did not end with [DONE]");
    let finish: Vec<&str> = events.iter().filter_map(|e| e["choices"][0]["finish_reason"].as_str()).collect();
    assert_eq!(finish, ["length"]);
    tokio::task::spawn_blocking(move || server.join()).await??;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_connection_cap_holds_and_health_still_answers() -> Result<()> {
    const CAP: usize = 16;
    let server = TestServer::start(&["--max-connections", &CAP.to_string()]);
    let addr = server.addr.to_string();
    let mut slow = open_slow(&addr, 3 * CAP).await?;
    let took = health_within_a_second(&addr).await?;
    // The server has accepted every slow connection before /health's (they came first); give
    // the replaced ones a moment to close.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut open = 0;
    for s in &mut slow {
        if !is_closed(s, Duration::from_millis(20)).await {
            open += 1;
        }
    }
    assert!(open <= CAP, "{open} slow connections open with --max-connections {CAP}");
    // Only as many as needed were closed, not all of them.
    assert!(open >= CAP / 2, "only {open} of {} slow connections left open", slow.len());
    eprintln!("/health in {took:?} with {open} slow connections open");
    drop(slow);
    tokio::task::spawn_blocking(move || server.join()).await??;
    Ok(())
}

/// The real binary with `ulimit -n 256` and 300 stalled connections: without connection
/// limits, accept() failed with EMFILE and /health waited behind the slow ones for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_clients_past_the_open_file_limit_leave_health_answering() -> Result<()> {
    let mut command = Command::new("sh");
    command
        .args(["-c", "ulimit -n 256 && exec \"$0\" \"$@\"", env!("CARGO_BIN_EXE_pagoda")])
        .args(["serve", "--model"])
        .arg(model_path())
        .args(["--port", "0", "--kv-cache-memory", "64MiB", "--max-model-len", "512"]);
    let (mut child, addr, log) = spawn_ready(command)?;
    let result = async {
        let slow = open_slow(&addr, 300).await?;
        let took = health_within_a_second(&addr).await?;
        // And again, on another fresh connection.
        health_within_a_second(&addr).await?;
        eprintln!("/health in {took:?} past 300 slow connections");
        // A real request still gets its answer.
        let c = reqwest::Client::builder().timeout(Duration::from_secs(60)).build()?;
        let body = json!({"prompt": "Hello", "max_tokens": 4});
        let resp = c.post(format!("http://{addr}/v1/completions")).json(&body).send().await?;
        assert_eq!(resp.status(), 200);
        let v: Value = resp.json().await?;
        assert_eq!(v["usage"]["completion_tokens"], 4);
        drop(slow);
        anyhow::Ok(())
    }
    .await;
    // Stop it the way a supervisor would, and expect a clean exit.
    let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
    let code = wait_exit(&mut child, Duration::from_secs(30), "SIGTERM").await?;
    let log = log.join().unwrap_or_default().join("\n");
    result.with_context(|| format!("server log:\n{log}"))?;
    assert!(code.success(), "exit status {code:?}; log:\n{log}");
    Ok(())
}

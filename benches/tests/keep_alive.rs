//! `pagoda-bench serve` against servers that close keep-alive connections at awkward times, as
//! llama.cpp's `llama-server` does: it answers a stream with keep-alive framing and then closes
//! the connection, so a client that takes the connection from its pool at that moment writes a
//! request nobody reads. Such a request was never answered and must be sent again, not counted
//! as failed; a request the server did answer badly (HTTP 500, a stream cut after its headers)
//! must still fail. The server here is raw tokio TCP with chunked SSE, so the client's pooled
//! HTTP/1.1 behaviour is what gets tested.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use pagoda_bench::cli::{Cli, Command, ServeArgs};
use pagoda_bench::run::Report;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the server does with the requests of one connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Behavior {
    /// Answers a connection's first request and keeps the connection open; reads its next
    /// request, waits `delay_ms`, and closes without a byte of answer (the client lost the
    /// race with the server's close).
    DropReused { delay_ms: u64 },
    /// Answers every request with keep-alive framing, then closes after `delay_ms` without
    /// reading further (llama-server, whose close comes a moment after the stream's last byte).
    CloseAfterResponse { delay_ms: u64 },
    /// Answers every request with HTTP 500 and keeps the connection.
    Error500,
    /// Sends the headers and one chunk, then closes.
    CloseMidStream,
    /// Reads every request and closes without answering, on new connections too.
    NeverAnswer,
    /// Reads every request and neither answers nor closes.
    Silent,
}

#[derive(Default)]
struct Counters {
    connections: AtomicUsize,
    /// Completion requests read, answered or not.
    requests: AtomicUsize,
    /// Requests read and closed on without an answer.
    dropped: AtomicUsize,
}

struct Server {
    addr: SocketAddr,
    counters: Arc<Counters>,
}

impl Server {
    async fn start(behavior: Behavior) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let counters = Arc::new(Counters::default());
        let c = Arc::clone(&counters);
        tokio::spawn(async move {
            loop {
                let (socket, _) = listener.accept().await.unwrap();
                c.connections.fetch_add(1, Ordering::SeqCst);
                let c = Arc::clone(&c);
                tokio::spawn(async move {
                    let _ = connection(socket, behavior, &c).await;
                });
            }
        });
        Server { addr, counters }
    }

    fn dropped(&self) -> usize {
        self.counters.dropped.load(Ordering::SeqCst)
    }
}

/// Reads the next request's body from `socket`, keeping bytes past it in `buf`; `None` when the
/// client closed the connection between requests.
async fn read_request(socket: &mut TcpStream, buf: &mut Vec<u8>) -> std::io::Result<Option<Value>> {
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = socket.read(&mut chunk).await?;
        if n == 0 {
            return if buf.is_empty() { Ok(None) } else { Err(std::io::ErrorKind::UnexpectedEof.into()) };
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    assert!(head.starts_with("post /v1/completions "), "{head}");
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:").map(|v| v.trim().parse().unwrap()))
        .expect("a content-length");
    while buf.len() < head_end + len {
        let n = socket.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let body = serde_json::from_slice(&buf[head_end..head_end + len]).unwrap();
    buf.drain(..head_end + len);
    Ok(Some(body))
}

/// One HTTP/1.1 chunk.
fn chunk(data: &str) -> String {
    format!("{:x}\r\n{data}\r\n", data.len())
}

/// A complete streamed completion, chunked, with keep-alive headers.
fn stream_response(body: &Value) -> String {
    let max_tokens = body["max_tokens"].as_u64().unwrap();
    let mut out = String::from(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\
         connection: keep-alive\r\n\r\n",
    );
    for i in 0..max_tokens {
        let finish = if i + 1 == max_tokens { json!("length") } else { Value::Null };
        let event = json!({"object": "text_completion", "choices": [{"index": 0, "text": format!(" t{i}"), "finish_reason": finish}]});
        out.push_str(&chunk(&format!("data: {event}\n\n")));
    }
    let usage = json!({"choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": max_tokens}});
    out.push_str(&chunk(&format!("data: {usage}\n\n")));
    out.push_str(&chunk("data: [DONE]\n\n"));
    out.push_str("0\r\n\r\n");
    out
}

async fn connection(mut socket: TcpStream, behavior: Behavior, c: &Counters) -> std::io::Result<()> {
    let mut buf = Vec::new();
    let mut served = 0;
    while let Some(body) = read_request(&mut socket, &mut buf).await? {
        c.requests.fetch_add(1, Ordering::SeqCst);
        match behavior {
            Behavior::DropReused { delay_ms } if served > 0 => {
                tokio::time::sleep(Duration::from_millis(delay_ms)).await;
                c.dropped.fetch_add(1, Ordering::SeqCst);
                return Ok(());
            }
            Behavior::NeverAnswer => {
                c.dropped.fetch_add(1, Ordering::SeqCst);
                return Ok(());
            }
            Behavior::Silent => {
                tokio::time::sleep(Duration::from_secs(30)).await;
                return Ok(());
            }
            Behavior::DropReused { .. } => socket.write_all(stream_response(&body).as_bytes()).await?,
            Behavior::CloseAfterResponse { delay_ms } => {
                socket.write_all(stream_response(&body).as_bytes()).await?;
                tokio::time::sleep(Duration::from_millis(delay_ms)).await;
                return socket.shutdown().await;
            }
            Behavior::Error500 => {
                let payload = json!({"error": {"message": "mock failure", "code": 500}}).to_string();
                let head = format!(
                    "HTTP/1.1 500 Internal Server Error\r\ncontent-type: application/json\r\n\
                     content-length: {}\r\nconnection: keep-alive\r\n\r\n",
                    payload.len()
                );
                socket.write_all(format!("{head}{payload}").as_bytes()).await?;
            }
            Behavior::CloseMidStream => {
                let full = stream_response(&body);
                // The headers and the first event's chunk, then the connection ends.
                let cut = full.find("\r\n\r\n").unwrap() + 4;
                let first = full[cut..].find("\n\n\r\n").unwrap() + 4;
                socket.write_all(&full.as_bytes()[..cut + first]).await?;
                socket.flush().await?;
                tokio::time::sleep(Duration::from_millis(20)).await;
                return Ok(());
            }
        }
        served += 1;
    }
    Ok(())
}

fn args(server: &Server, extra: &[&str]) -> ServeArgs {
    let url = format!("http://{}", server.addr);
    let mut argv = vec![
        "pagoda-bench",
        "serve",
        "--base-url",
        &url,
        "--model",
        "m",
        "--no-progress",
        "--skip-test-request",
    ];
    argv.extend_from_slice(extra);
    match Cli::try_parse_from(argv).unwrap().command {
        Command::Serve(a) => a,
        Command::Report(_) => panic!("not serve"),
    }
}

async fn run(server: &Server, extra: &[&str]) -> Report {
    pagoda_bench::run::serve(args(server, extra)).await.unwrap()
}

/// A run in which every request fails: the command errs, so its saved result is read instead.
async fn run_failing(server: &Server, extra: &[&str]) -> Value {
    let path = std::env::temp_dir().join(format!(
        "pagoda-bench-keep-alive-{}-{}.json",
        std::process::id(),
        server.addr.port()
    ));
    let saved = path.to_str().unwrap();
    let mut extra = extra.to_vec();
    extra.extend(["--save-result", saved]);
    let err = pagoda_bench::run::serve(args(server, &extra)).await.unwrap_err();
    assert!(err.to_string().contains("every request failed"), "{err:#}");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    std::fs::remove_file(&path).unwrap();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_on_connections_the_server_closed_unanswered_are_sent_again() {
    let server = Server::start(Behavior::DropReused { delay_ms: 0 }).await;
    let report = run(&server, &["--num-prompts", "16", "--max-concurrency", "4", "--output-len", "3"]).await;
    let s = &report.summary;
    assert_eq!((s.completed, s.failed), (16, 0), "{:?}", s.errors);
    let dropped = server.dropped();
    assert!(dropped > 0, "the client never reused a connection; the test tested nothing");
    assert_eq!(s.connection_retries, dropped, "every unanswered request was sent again once");
    assert_eq!(server.counters.requests.load(Ordering::SeqCst), 16 + dropped);
    assert_eq!(s.total_output_tokens, 48);
    assert!(report.results.iter().all(|r| r.connection_retries <= 1));
    let row = format!("Connection retries:                      {dropped}\n");
    assert!(report.table.contains(&row), "{}", report.table);
    assert!(report.table.contains("sent a second time, on a new connection"), "{}", report.table);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_closes_after_every_stream_fails_nothing() {
    // llama-server's pattern: keep-alive headers, a complete body, then the close. Back-to-back
    // requests take the connection from the pool while the close is on its way.
    let server = Server::start(Behavior::CloseAfterResponse { delay_ms: 5 }).await;
    let report = run(&server, &["--num-prompts", "24", "--max-concurrency", "1", "--output-len", "2"]).await;
    let s = &report.summary;
    assert_eq!((s.completed, s.failed), (24, 0), "{:?}", s.errors);
    assert!(report.results.iter().all(|r| r.connection_retries <= 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_request_is_timed_from_its_first_attempt() {
    // The server holds each lost request 150 ms before closing: the user waited that long.
    let server = Server::start(Behavior::DropReused { delay_ms: 150 }).await;
    let report = run(&server, &["--num-prompts", "6", "--max-concurrency", "1", "--output-len", "2"]).await;
    assert_eq!((report.summary.completed, report.summary.failed), (6, 0));
    let (retried, first): (Vec<_>, Vec<_>) = report.results.iter().partition(|r| r.connection_retries == 1);
    assert!(!retried.is_empty() && !first.is_empty());
    for r in retried {
        let ttft = r.ttft_ms.unwrap();
        assert!(ttft >= 150.0 && r.e2el_ms >= ttft, "ttft {ttft} e2el {}", r.e2el_ms);
    }
    for r in first {
        assert!(r.ttft_ms.unwrap() < 150.0, "{r:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answered_failures_are_never_sent_again() {
    // HTTP 500 on kept-alive connections: the server answered, so each request fails once.
    let server = Server::start(Behavior::Error500).await;
    let v =
        run_failing(&server, &["--num-prompts", "6", "--max-concurrency", "2", "--output-len", "2"]).await;
    let s = &v["summary"];
    assert_eq!((s["failed"].as_u64(), s["connection_retries"].as_u64()), (Some(6), Some(0)), "{s}");
    assert_eq!(s["errors"], json!({"HTTP 500: mock failure": 6}));
    assert_eq!(server.counters.requests.load(Ordering::SeqCst), 6);

    // A stream cut after its headers and a first chunk: a failure, not a retry.
    let server = Server::start(Behavior::CloseMidStream).await;
    let v =
        run_failing(&server, &["--num-prompts", "4", "--max-concurrency", "2", "--output-len", "3"]).await;
    let s = &v["summary"];
    assert_eq!((s["failed"].as_u64(), s["connection_retries"].as_u64()), (Some(4), Some(0)), "{s}");
    let errors = s["errors"].as_object().unwrap();
    assert!(errors.keys().all(|e| e.starts_with("reading the stream failed")), "{errors:?}");
    for r in v["requests"].as_array().unwrap() {
        assert!(r["ttft_ms"].as_f64().is_some(), "the first chunk arrived: {r}");
        assert_eq!(r["connection_retries"], 0);
    }
    assert_eq!(server.counters.requests.load(Ordering::SeqCst), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_never_answers_fails_every_request_after_one_retry() {
    let server = Server::start(Behavior::NeverAnswer).await;
    let v =
        run_failing(&server, &["--num-prompts", "4", "--max-concurrency", "2", "--output-len", "2"]).await;
    let s = &v["summary"];
    assert_eq!((s["failed"].as_u64(), s["connection_retries"].as_u64()), (Some(4), Some(4)), "{s}");
    assert_eq!(server.dropped(), 8, "each request twice, no more");
    let errors = s["errors"].as_object().unwrap();
    assert!(errors.keys().all(|e| e.starts_with("request failed (sent twice): ")), "{errors:?}");
    assert!(v["requests"].as_array().unwrap().iter().all(|r| r["connection_retries"] == 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_is_a_failure_not_a_retry() {
    let server = Server::start(Behavior::Silent).await;
    let v =
        run_failing(&server, &["--num-prompts", "2", "--output-len", "2", "--request-timeout", "0.3"]).await;
    let s = &v["summary"];
    assert_eq!((s["failed"].as_u64(), s["connection_retries"].as_u64()), (Some(2), Some(0)), "{s}");
    assert_eq!(server.counters.requests.load(Ordering::SeqCst), 2);
    for r in v["requests"].as_array().unwrap() {
        assert!((300.0..2000.0).contains(&r["e2el_ms"].as_f64().unwrap()), "{r}");
    }
}

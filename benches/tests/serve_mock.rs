//! `pagoda-bench serve` against a minimal OpenAI-compatible server written here: real sockets on
//! 127.0.0.1, real HTTP/1.1 and SSE, with scripted timing, failures and usage, so the client's
//! timing, error accounting, concurrency limit and fallbacks can be checked exactly. (The run
//! against the real Pagoda server is in `pagoda_e2e.rs`.)

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use pagoda_bench::cli::{Cli, Command, ServeArgs};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the mock does.
#[derive(Debug, Clone, Default)]
struct Script {
    /// Before the first chunk.
    first_delay_ms: u64,
    /// Between chunks.
    chunk_delay_ms: u64,
    /// Send the usage chunk when asked for.
    usage: bool,
    /// Every k-th request (1-based arrival order) gets HTTP 500.
    fail_every: Option<usize>,
    /// Every k-th request gets an error event after its first chunk.
    error_event_every: Option<usize>,
    /// Answer this text, 4 characters a chunk, finishing with `stop` (or `length` when
    /// `max_tokens` chunks cannot hold it), instead of `max_tokens` chunks " t0", " t1", ...
    answer: Option<&'static str>,
}

#[derive(Default)]
struct Counters {
    requests: AtomicUsize,
    in_flight: AtomicUsize,
    peak: AtomicUsize,
    /// Bodies of the completion requests, in arrival order.
    bodies: std::sync::Mutex<Vec<Value>>,
}

struct Mock {
    addr: SocketAddr,
    counters: Arc<Counters>,
}

impl Mock {
    async fn start(script: Script) -> Mock {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let counters = Arc::new(Counters::default());
        let c = Arc::clone(&counters);
        tokio::spawn(async move {
            loop {
                let (socket, _) = listener.accept().await.unwrap();
                let (script, c) = (script.clone(), Arc::clone(&c));
                tokio::spawn(async move {
                    let _ = handle(socket, &script, &c).await;
                });
            }
        });
        Mock { addr, counters }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

/// Reads one request: the head and a Content-Length body.
async fn read_request(socket: &mut TcpStream) -> std::io::Result<(String, Value)> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        let n = socket.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let len = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse().unwrap())
        })
        .unwrap_or(0usize);
    while buf.len() < head_end + len {
        let n = socket.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let body =
        if len == 0 { Value::Null } else { serde_json::from_slice(&buf[head_end..head_end + len]).unwrap() };
    Ok((head, body))
}

async fn handle(mut socket: TcpStream, script: &Script, c: &Counters) -> std::io::Result<()> {
    let (head, body) = read_request(&mut socket).await?;
    if head.starts_with("GET /v1/models ") {
        let payload =
            json!({"object": "list", "data": [{"id": "mock-model", "object": "model"}]}).to_string();
        let response = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{payload}",
            payload.len()
        );
        return socket.write_all(response.as_bytes()).await;
    }
    assert!(
        head.starts_with("POST /v1/completions ") || head.starts_with("POST /v1/chat/completions "),
        "{head}"
    );
    let n = c.requests.fetch_add(1, Ordering::SeqCst) + 1;
    c.bodies.lock().unwrap().push(body.clone());
    let now = c.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    c.peak.fetch_max(now, Ordering::SeqCst);
    let result = respond(&mut socket, script, n, &body).await;
    c.in_flight.fetch_sub(1, Ordering::SeqCst);
    result
}

async fn respond(socket: &mut TcpStream, script: &Script, n: usize, body: &Value) -> std::io::Result<()> {
    if script.fail_every.is_some_and(|k| n.is_multiple_of(k)) {
        let payload =
            json!({"error": {"message": "mock overload", "type": "server_error", "code": 500}}).to_string();
        let response = format!(
            "HTTP/1.1 500 Internal Server Error\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
             connection: close\r\n\r\n{payload}",
            payload.len()
        );
        return socket.write_all(response.as_bytes()).await;
    }
    socket
        .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\nconnection: close\r\n\r\n")
        .await?;
    let chat = body.get("messages").is_some();
    let max_tokens = body["max_tokens"].as_u64().unwrap() as usize;
    let prompt_tokens = match chat {
        true => body["messages"][0]["content"].as_str().unwrap().split_whitespace().count(),
        false => body["prompt"].as_str().unwrap().split_whitespace().count(),
    };
    let chunk =
        |choice: Value| json!({"id": "x", "object": "chunk", "model": "mock-model", "choices": [choice]});
    if chat {
        // OpenAI's first chat chunk carries only the role.
        let role =
            chunk(json!({"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": null}));
        socket.write_all(format!("data: {role}\n\n").as_bytes()).await?;
    }
    let (pieces, end) = match script.answer {
        Some(answer) => {
            let chars: Vec<char> = answer.chars().collect();
            let pieces: Vec<String> = chars.chunks(4).map(|c| c.iter().collect()).collect();
            let end = if pieces.len() <= max_tokens { "stop" } else { "length" };
            (pieces.into_iter().take(max_tokens).collect(), end)
        }
        None => ((0..max_tokens).map(|i| format!(" t{i}")).collect::<Vec<_>>(), "length"),
    };
    let generated = pieces.len();
    tokio::time::sleep(Duration::from_millis(script.first_delay_ms)).await;
    for (i, piece) in pieces.into_iter().enumerate() {
        if i > 0 {
            tokio::time::sleep(Duration::from_millis(script.chunk_delay_ms)).await;
        }
        let finish = if i + 1 == generated { json!(end) } else { Value::Null };
        let choice = match chat {
            true => json!({"index": 0, "delta": {"content": piece}, "finish_reason": finish}),
            false => json!({"index": 0, "text": piece, "finish_reason": finish}),
        };
        socket.write_all(format!("data: {}\n\n", chunk(choice)).as_bytes()).await?;
        socket.flush().await?;
        if i == 0 && script.error_event_every.is_some_and(|k| n.is_multiple_of(k)) {
            let err = json!({"error": {"message": "mock engine failure", "code": 500}});
            return socket.write_all(format!("data: {err}\n\n").as_bytes()).await;
        }
    }
    if script.usage && body["stream_options"]["include_usage"] == json!(true) {
        let usage = json!({"id": "x", "object": "chunk", "choices": [],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": generated,
                      "total_tokens": prompt_tokens + generated}});
        socket.write_all(format!("data: {usage}\n\n").as_bytes()).await?;
    }
    socket.write_all(b"data: [DONE]\n\n").await
}

fn serve_args(url: &str, extra: &[&str]) -> ServeArgs {
    let mut argv = vec!["pagoda-bench", "serve", "--base-url", url, "--no-progress", "--skip-test-request"];
    argv.extend_from_slice(extra);
    match Cli::try_parse_from(argv).unwrap().command {
        Command::Serve(a) => a,
        Command::Report(_) => panic!("not serve"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timing_usage_and_body_against_a_scripted_stream() {
    let mock =
        Mock::start(Script { first_delay_ms: 60, chunk_delay_ms: 25, usage: true, ..Script::default() })
            .await;
    let args = serve_args(
        &mock.url(),
        &["--model", "m", "--num-prompts", "3", "--input-len", "10", "--output-len", "5", "--ignore-eos"],
    );
    let report = pagoda_bench::run::serve(args).await.unwrap();
    let s = &report.summary;
    assert_eq!((s.completed, s.failed, s.requests_without_usage), (3, 0, 0));
    assert_eq!((s.total_input_tokens, s.total_output_tokens), (30, 15));
    assert_eq!(s.peak_concurrency, 3);
    for r in &report.results {
        let ttft = r.ttft_ms.unwrap();
        assert!((60.0..500.0).contains(&ttft), "ttft {ttft}");
        assert_eq!(r.itl_ms.len(), 4);
        assert!(r.itl_ms.iter().all(|&g| (20.0..400.0).contains(&g)), "{:?}", r.itl_ms);
        let tpot = r.tpot_ms.unwrap();
        assert!((20.0..400.0).contains(&tpot), "tpot {tpot}");
        assert!(r.e2el_ms >= ttft + 4.0 * 25.0 - 1.0, "e2el {} ttft {ttft}", r.e2el_ms);
        assert_eq!(r.finish_reason.as_deref(), Some("length"));
    }
    let bodies = mock.counters.bodies.lock().unwrap().clone();
    assert_eq!(bodies.len(), 3);
    for b in &bodies {
        assert_eq!(b["model"], "m");
        assert_eq!(b["stream"], true);
        assert_eq!(b["stream_options"], json!({"include_usage": true}));
        assert_eq!(b["ignore_eos"], true);
        assert_eq!(b["max_tokens"], 5);
    }
    assert!(report.table.contains("Successful requests:                     3\n"), "{}", report.table);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn save_text_keeps_each_answer_in_the_saved_result() {
    let mock =
        Mock::start(Script { answer: Some("Paris is the capital."), usage: true, ..Script::default() }).await;
    let saved = std::env::temp_dir().join(format!("pagoda-bench-text-{}.json", std::process::id()));
    let path = saved.to_str().unwrap();
    let base = ["--model", "m", "--endpoint", "chat", "--num-prompts", "2", "--output-len", "3"];
    let with_text = [&base[..], &["--save-text", "--save-result", path]].concat();
    let report = pagoda_bench::run::serve(serve_args(&mock.url(), &with_text)).await.unwrap();
    // max_tokens 3 of 4-character pieces: the first 12 characters, in every request.
    assert!(report.results.iter().all(|r| r.text.as_deref() == Some("Paris is the")), "{:?}", report.results);
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&saved).unwrap()).unwrap();
    assert_eq!(v["requests"][1]["text"], "Paris is the");

    let without = [&base[..], &["--save-result", path]].concat();
    let report = pagoda_bench::run::serve(serve_args(&mock.url(), &without)).await.unwrap();
    assert!(report.results.iter().all(|r| r.text.is_none()));
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&saved).unwrap()).unwrap();
    std::fs::remove_file(&saved).unwrap();
    assert!(v["requests"][0].get("text").is_none(), "{v}");
    // Text is only kept to be saved.
    assert!(Cli::try_parse_from(["pagoda-bench", "serve", "--save-text"]).is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lora_modules_take_turns_in_model() {
    let mock = Mock::start(Script { usage: true, ..Script::default() }).await;
    let args = ["--model", "base", "--num-prompts", "6", "--output-len", "2"];
    let args = serve_args(&mock.url(), &[&args[..], &["--lora-modules", "a", "b", "c"]].concat());
    let report = pagoda_bench::run::serve(args).await.unwrap();
    assert_eq!(report.summary.completed, 6);
    let mut models: Vec<String> = mock
        .counters
        .bodies
        .lock()
        .unwrap()
        .iter()
        .map(|b| b["model"].as_str().unwrap().to_owned())
        .collect();
    models.sort();
    assert_eq!(models, ["a", "a", "b", "b", "c", "c"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_counted_with_their_errors() {
    let script = Script { usage: true, fail_every: Some(3), error_event_every: Some(4), ..Script::default() };
    let mock = Mock::start(script).await;
    let args = serve_args(&mock.url(), &["--model", "m", "--num-prompts", "12", "--output-len", "3"]);
    let report = pagoda_bench::run::serve(args).await.unwrap();
    let s = &report.summary;
    // Of arrivals 1..=12: 3, 6, 9, 12 get HTTP 500; 4 and 8 an error event.
    assert_eq!((s.completed, s.failed), (6, 6));
    assert_eq!(s.errors.get("HTTP 500: mock overload"), Some(&4));
    assert_eq!(s.errors.get("error in the stream: mock engine failure"), Some(&2));
    assert_eq!(s.total_output_tokens, 18, "only successful requests count");
    assert_eq!(report.results.len(), 12);
    assert!(report.table.contains("  4 × HTTP 500: mock overload\n"), "{}", report.table);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_usage_chunks_are_counted_and_the_report_says_so() {
    let mock = Mock::start(Script { usage: false, ..Script::default() }).await;
    let args = serve_args(
        &mock.url(),
        &["--model", "m", "--num-prompts", "2", "--input-len", "7", "--output-len", "4"],
    );
    let report = pagoda_bench::run::serve(args).await.unwrap();
    let s = &report.summary;
    assert_eq!((s.completed, s.requests_without_usage), (2, 2));
    assert_eq!((s.total_input_tokens, s.total_output_tokens), (14, 8));
    assert!(report.results.iter().all(|r| !r.usage_reported));
    assert!(report.table.contains("sent no usage for 2 request(s)"), "{}", report.table);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_concurrency_bounds_requests_in_flight() {
    let mock = Mock::start(Script { chunk_delay_ms: 10, usage: true, ..Script::default() }).await;
    let args = serve_args(
        &mock.url(),
        &["--model", "m", "--num-prompts", "8", "--output-len", "4", "--max-concurrency", "2"],
    );
    let report = pagoda_bench::run::serve(args).await.unwrap();
    assert_eq!(report.summary.completed, 8);
    assert_eq!(mock.counters.peak.load(Ordering::SeqCst), 2, "the server saw at most 2 at once");
    assert!(report.summary.peak_concurrency <= 2);
    assert!(report.table.contains("Maximum request concurrency:             2\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_rate_spreads_arrivals() {
    let mock = Mock::start(Script { usage: true, ..Script::default() }).await;
    let args = serve_args(
        &mock.url(),
        &["--model", "m", "--num-prompts", "10", "--output-len", "2", "--request-rate", "40", "--seed", "5"],
    );
    let report = pagoda_bench::run::serve(args).await.unwrap();
    let starts: Vec<f64> = report.results.iter().map(|r| r.start_s).collect();
    let want = pagoda_bench::serve::arrival_offsets(10, 40.0, 5);
    for (got, want) in starts.iter().zip(&want) {
        assert!(*got >= want - 0.002 && *got < want + 0.2, "sent at {got}, scheduled {want}");
    }
    assert!(report.summary.duration_s >= want[9], "{} < {}", report.summary.duration_s, want[9]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_endpoint_and_model_discovery() {
    let mock = Mock::start(Script { usage: true, ..Script::default() }).await;
    let args = serve_args(&mock.url(), &["--endpoint", "chat", "--num-prompts", "2", "--output-len", "3"]);
    let report = pagoda_bench::run::serve(args).await.unwrap();
    assert_eq!((report.summary.completed, report.summary.total_output_tokens), (2, 6));
    // The role-only first delta is not content: TTFT is the first text.
    assert!(report.results.iter().all(|r| r.itl_ms.len() == 2));
    let bodies = mock.counters.bodies.lock().unwrap().clone();
    assert_eq!(bodies[0]["model"], "mock-model", "taken from GET /v1/models");
    assert_eq!(bodies[0]["messages"][0]["role"], "user");
    assert!(report.table.contains("chat template adds tokens"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_schemas_are_sent_round_robin_and_answers_validated() {
    let dir = std::env::temp_dir().join(format!("pagoda-bench-mock-schemas-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("b-number.json"), r#"{"type": "integer"}"#).unwrap();
    std::fs::write(dir.join("a-color.json"), r#"{"description": "A color", "enum": ["red"]}"#).unwrap();
    let saved = dir.join("result.json");
    let mock = Mock::start(Script { usage: true, answer: Some("\"red\""), ..Script::default() }).await;
    let schemas = dir.to_str().unwrap();
    let argv = ["--model", "m", "--endpoint", "chat", "--num-prompts", "4", "--input-len", "5"];
    let mut args = serve_args(&mock.url(), &argv);
    args.json_schema = Some(dir.clone());
    args.output.save_result = Some(saved.clone());
    let report = pagoda_bench::run::serve(args).await.unwrap();

    let bodies = mock.counters.bodies.lock().unwrap().clone();
    assert_eq!(bodies.len(), 4);
    for (i, b) in bodies.iter().enumerate() {
        let format = &b["response_format"];
        assert_eq!(
            (format["type"].as_str(), format["json_schema"]["strict"].as_bool()),
            (Some("json_schema"), Some(true))
        );
        let prompt = b["messages"][0]["content"].as_str().unwrap();
        // The arrival order is not the dataset order; the prompt says which schema a body has.
        if format["json_schema"]["name"] == "a_color" {
            assert_eq!(prompt, "A color. Answer in JSON.", "request {i}");
            assert_eq!(format["json_schema"]["schema"]["enum"], json!(["red"]));
        } else {
            assert_eq!(format["json_schema"]["name"], "b_number");
            assert_eq!(prompt.split_whitespace().count(), 5, "no description: the dataset's prompt");
        }
    }
    let v = report.summary.validity.clone().unwrap();
    assert_eq!((v.checked, v.valid, v.finished_length, v.invalid_not_cut_off), (4, 2, 0, 2));
    assert!(report.table.contains("Valid answers / successful requests:     2 / 4\n"), "{}", report.table);
    assert!(report.table.contains("2 JSON schema(s) from"), "{}", report.table);
    let checks: Vec<_> = report.results.iter().map(|r| r.schema_check.clone().unwrap()).collect();
    assert_eq!(checks[0].schema, "a-color.json");
    assert_eq!((checks[1].schema.as_str(), checks[1].valid), ("b-number.json", Some(false)));
    let saved: Value = serde_json::from_str(&std::fs::read_to_string(&saved).unwrap()).unwrap();
    assert_eq!(saved["summary"]["validity"]["valid"], 2);
    assert_eq!(saved["config"]["json_schema"], schemas);
    assert_eq!(saved["requests"][2]["valid"], true);
    assert!(saved["requests"][3]["invalid_reason"].as_str().unwrap().contains("integer"), "{saved}");

    // One token cannot hold the answer: cut off, hence invalid; --validate false checks nothing.
    let color = dir.join("a-color.json");
    let color = color.to_str().unwrap();
    let args = serve_args(
        &mock.url(),
        &["--model", "m", "--num-prompts", "2", "--output-len", "1", "--json-schema", color],
    );
    let v = pagoda_bench::run::serve(args).await.unwrap().summary.validity.unwrap();
    assert_eq!((v.checked, v.valid, v.finished_length, v.invalid_not_cut_off), (2, 0, 2, 0));
    let args = serve_args(
        &mock.url(),
        &["--model", "m", "--num-prompts", "2", "--json-schema", color, "--validate", "false"],
    );
    let report = pagoda_bench::run::serve(args).await.unwrap();
    assert!(report.summary.validity.is_none() && !report.table.contains("Valid answers"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_server_fails_the_test_request() {
    // A port nothing listens on: bind, take the address, close.
    let addr = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap();
    let argv =
        ["pagoda-bench", "serve", "--base-url", &format!("http://{addr}"), "--model", "m", "--no-progress"];
    let Command::Serve(args) = Cli::try_parse_from(argv).unwrap().command else { panic!("not serve") };
    let err = pagoda_bench::run::serve(args).await.unwrap_err();
    assert!(format!("{err:#}").contains("test request"), "{err:#}");
}

#[test]
fn the_binary_prints_the_table_and_saves_the_result() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let mock = rt.block_on(Mock::start(Script { chunk_delay_ms: 2, usage: true, ..Script::default() }));
    let dir = std::env::temp_dir().join(format!("pagoda-bench-bin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let saved = dir.join("result.json");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_pagoda-bench"))
        .args(["serve", "--base-url", &mock.url(), "--model", "m", "--num-prompts", "4", "--input-len", "6"])
        .args(["--output-len", "3", "--percentiles", "50,90", "--save-result", saved.to_str().unwrap()])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("Serving Benchmark Result") && stdout.contains("P90 ITL (ms):"), "{stdout}");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&saved).unwrap()).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(v["mode"], "serve");
    assert_eq!(v["summary"]["completed"], 4);
    assert_eq!(v["config"]["num_prompts"], 4);
    let requests = v["requests"].as_array().unwrap();
    assert_eq!(requests.len(), 4);
    for r in requests {
        assert_eq!((r["prompt_len"].as_u64(), r["output_len"].as_u64()), (Some(6), Some(3)));
        assert_eq!(r["itl_ms"].as_array().unwrap().len(), 2);
        assert!(r["ttft_ms"].as_f64().unwrap() > 0.0);
    }
    // The test request came first, then the four of the run.
    assert_eq!(mock.counters.requests.load(Ordering::SeqCst), 5);

    // Every request failing makes the exit status 1.
    let failing = rt.block_on(Mock::start(Script { fail_every: Some(1), ..Script::default() }));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_pagoda-bench"))
        .args([
            "serve",
            "--base-url",
            &failing.url(),
            "--model",
            "m",
            "--num-prompts",
            "2",
            "--skip-test-request",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("Failed requests:                         2"));
    assert!(String::from_utf8_lossy(&out.stderr).contains("every request failed"));
}

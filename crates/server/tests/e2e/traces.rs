//! OpenTelemetry traces against a real OTLP receiver: tests/sdk/otlp_sink.py runs oteltest's
//! gRPC and HTTP sinks and prints each span it receives. Two servers, one per protocol, export
//! there (`--otlp-traces-endpoint`); a request with a W3C `traceparent` gets an `llm_request`
//! span that is a child of the client's span, with vLLM's attributes and `queue`, `prefill`
//! and `decode` children inside it; a request without one starts its own trace; an unsampled
//! parent exports nothing; spans of the last requests reach the receiver when the server exits.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::ChildStdout;

use crate::harness::{client, startup_error, TestServer};
use crate::sdk::{python_check, repo_root, tools_python};

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";
const UNSAMPLED_TRACE: &str = "0af7651916cd43dd8448eb211c80319c";

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    listener.local_addr().expect("local addr").port()
}

/// Spans the sink has printed, by transport.
struct Sink {
    lines: Lines<BufReader<ChildStdout>>,
    spans: Vec<Value>,
}

impl Sink {
    /// Reads spans until `done` holds for those read so far, or `wait` passes.
    async fn until(&mut self, wait: Duration, done: impl Fn(&[Value]) -> bool) -> Result<&[Value]> {
        let deadline = tokio::time::Instant::now() + wait;
        while !done(&self.spans) {
            let line = tokio::time::timeout_at(deadline, self.lines.next_line())
                .await
                .with_context(|| format!("spans so far: {:#?}", self.spans))?
                .context("reading the sink")?
                .context("the sink exited")?;
            self.spans.push(serde_json::from_str(&line).with_context(|| format!("sink line {line}"))?);
        }
        Ok(&self.spans)
    }
}

async fn chat(server: &TestServer, traceparent: Option<&str>, stream: bool) -> Result<(String, u64)> {
    let body = json!({
        "model": "smol",
        "messages": [{"role": "user", "content": "Name a color."}],
        "max_tokens": 6,
        "temperature": 0,
        "stream": stream,
        "stream_options": if stream { json!({"include_usage": true}) } else { Value::Null },
    });
    let mut request = client().post(server.url("/v1/chat/completions")).json(&body);
    if let Some(tp) = traceparent {
        request = request.header("traceparent", tp);
    }
    let resp = request.send().await?;
    ensure!(resp.status() == 200, "status {}", resp.status());
    let request_id = resp.headers()["x-request-id"].to_str()?.to_owned();
    let text = resp.text().await?;
    let usage = if stream {
        text.lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .filter_map(|d| serde_json::from_str::<Value>(d).ok())
            .find_map(|v| v["usage"]["completion_tokens"].as_u64())
            .context("no usage chunk")?
    } else {
        serde_json::from_str::<Value>(&text)?["usage"]["completion_tokens"].as_u64().context("usage")?
    };
    Ok((request_id, usage))
}

fn attr<'a>(span: &'a Value, key: &str) -> &'a Value {
    &span["attributes"][key]
}

/// The `llm_request` span of `request_id` and its children, checked.
fn check_request_span(
    spans: &[Value],
    request_id: &str,
    completion_tokens: u64,
    transport: &str,
) -> Result<Value> {
    let request = spans
        .iter()
        .find(|s| s["name"] == "llm_request" && attr(s, "gen_ai.request.id") == request_id)
        .with_context(|| format!("no llm_request span for {request_id}"))?
        .clone();
    ensure!(request["transport"] == transport && request["service"] == "pagoda", "{request}");
    ensure!(request["kind"] == 2, "SERVER kind: {request}");
    ensure!(attr(&request, "gen_ai.response.model") == "smol", "{request}");
    ensure!(
        attr(&request, "gen_ai.usage.completion_tokens").as_i64() == Some(completion_tokens as i64),
        "{request}"
    );
    ensure!(attr(&request, "gen_ai.usage.prompt_tokens").as_i64().is_some_and(|n| n > 5), "{request}");
    ensure!(attr(&request, "gen_ai.request.max_tokens").as_i64() == Some(6), "{request}");
    ensure!(attr(&request, "gen_ai.request.n").as_i64() == Some(1), "{request}");
    ensure!(attr(&request, "gen_ai.request.temperature").as_f64() == Some(0.0), "{request}");
    let latency = |k: &str| attr(&request, k).as_f64().with_context(|| format!("{k}: {request}"));
    let (queue, ttft, e2e) = (
        latency("gen_ai.latency.time_in_queue")?,
        latency("gen_ai.latency.time_to_first_token")?,
        latency("gen_ai.latency.e2e")?,
    );
    let (prefill, decode) =
        (latency("gen_ai.latency.time_in_model_prefill")?, latency("gen_ai.latency.time_in_model_decode")?);
    latency("gen_ai.latency.time_in_model_inference")?;
    ensure!(0.0 <= queue && queue <= ttft && ttft <= e2e && e2e < 60.0, "{request}");
    ensure!((queue + prefill + decode - e2e).abs() < 1e-3, "phases add up to e2e: {request}");
    let (start, end) =
        (request["start_ns"].as_u64().context("start")?, request["end_ns"].as_u64().context("end")?);
    ensure!(start < end, "{request}");
    let children: HashMap<&str, &Value> = spans
        .iter()
        .filter(|s| s["parent_span_id"] == request["span_id"])
        .map(|s| (s["name"].as_str().unwrap_or(""), s))
        .collect();
    let mut at = start;
    for phase in ["queue", "prefill", "decode"] {
        let child = children.get(phase).with_context(|| format!("no {phase} child of {request}"))?;
        ensure!(child["trace_id"] == request["trace_id"], "{child}");
        let (s, e) = (child["start_ns"].as_u64().context("start")?, child["end_ns"].as_u64().context("end")?);
        // Phases follow one another inside the request (nanosecond rounding aside).
        ensure!(s + 1000 >= at && s <= e && e <= end + 1000, "{phase} [{s}, {e}] in [{start}, {end}]");
        at = e;
    }
    Ok(request)
}

async fn exports_over(sink: &mut Sink, transport: &str, port: u16) -> Result<()> {
    let protocol = if transport == "grpc" { "grpc" } else { "http/protobuf" };
    let endpoint = format!("http://127.0.0.1:{port}");
    let server =
        TestServer::start(&["--otlp-traces-endpoint", &endpoint, "--otlp-traces-protocol", protocol]);
    let (unsampled, _) =
        chat(&server, Some(&format!("00-{UNSAMPLED_TRACE}-{CLIENT_SPAN}-00")), false).await?;
    let (traced, traced_tokens) =
        chat(&server, Some(&format!("00-{TRACE_ID}-{CLIENT_SPAN}-01")), false).await?;
    let (rooted, rooted_tokens) = chat(&server, None, true).await?;
    let has = |spans: &[Value], id: &str| spans.iter().any(|s| attr(s, "gen_ai.request.id") == id);
    // Exported while the server runs.
    let spans = sink.until(Duration::from_secs(20), |s| has(s, &traced) && has(s, &rooted)).await?.to_vec();
    let request = check_request_span(&spans, &traced, traced_tokens, transport)?;
    ensure!(request["trace_id"] == TRACE_ID && request["parent_span_id"] == CLIENT_SPAN, "{request}");
    let root = check_request_span(&spans, &rooted, rooted_tokens, transport)?;
    ensure!(root["parent_span_id"] == "" && root["trace_id"] != TRACE_ID, "{root}");
    ensure!(!has(&spans, &unsampled), "an unsampled parent's request was exported");
    ensure!(spans.iter().all(|s| s["trace_id"] != UNSAMPLED_TRACE), "unsampled trace exported");
    // The last request's span is flushed at exit.
    let (last, last_tokens) = chat(&server, None, false).await?;
    tokio::task::spawn_blocking(move || server.join()).await??;
    let spans = sink.until(Duration::from_secs(10), |s| has(s, &last)).await?.to_vec();
    check_request_span(&spans, &last, last_tokens, transport)?;
    Ok(())
}

#[tokio::test]
async fn request_spans_reach_an_otlp_receiver_over_grpc_and_http() -> Result<()> {
    let python = tools_python("sdk", "sdk-tools");
    let (grpc_port, http_port) = (free_port(), free_port());
    let mut child = python_check(&python, &repo_root().join("tests/sdk/otlp_sink.py"))
        .arg(grpc_port.to_string())
        .arg(http_port.to_string())
        .spawn()
        .context("starting the OTLP sink")?;
    let mut lines = BufReader::new(child.stdout.take().context("sink stdout")?).lines();
    let ready = tokio::time::timeout(Duration::from_secs(60), lines.next_line()).await??;
    ensure!(ready.as_deref() == Some("ready"), "sink said {ready:?}");
    let mut sink = Sink { lines, spans: Vec::new() };
    exports_over(&mut sink, "grpc", grpc_port).await?;
    exports_over(&mut sink, "http", http_port).await?;
    child.kill().await?;
    Ok(())
}

#[tokio::test]
async fn bad_endpoints_are_refused_at_start_up() -> Result<()> {
    for bad in ["127.0.0.1:4317", "grpc://127.0.0.1:4317", "http://"] {
        let e = startup_error(&["--otlp-traces-endpoint", bad]).await.unwrap_or_else(|e| e.to_string());
        assert!(e.contains("--otlp-traces-endpoint") && e.contains("http://"), "{bad}: {e}");
    }
    let e = startup_error(&[
        "--otlp-traces-endpoint",
        "http://127.0.0.1:1",
        "--otlp-traces-protocol",
        "http/json",
    ])
    .await
    .unwrap_or_else(|e| e.to_string());
    assert!(e.contains("http/json"), "{e}");
    Ok(())
}

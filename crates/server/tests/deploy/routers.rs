//! sglang-router and vllm-router (the PyPI wheels `make router-tools` installs, pinned) in front
//! of Pagoda replicas on 127.0.0.1: starting one with a policy, a workload of shared prefixes,
//! and what the replicas' own metrics say about the calls the router made of them.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use futures_util::StreamExt;
use serde_json::{json, Value};

use crate::processes::{free_port, wait_for, Process};
use crate::stack::{Replica, SERVED_MODEL};

/// The routers' virtual environment (scripts/install-router-tools.sh).
fn routers_dir() -> PathBuf {
    std::env::var_os("PAGODA_ROUTERS_DIR").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/pagoda-routers")
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouterKind {
    Sglang,
    Vllm,
}

impl RouterKind {
    pub fn name(self) -> &'static str {
        match self {
            RouterKind::Sglang => "sglang-router",
            RouterKind::Vllm => "vllm-router",
        }
    }

    /// The `--get-load-format` the replicas need behind this router.
    pub fn load_format(self) -> &'static str {
        match self {
            RouterKind::Sglang => "sglang",
            RouterKind::Vllm => "vllm-router",
        }
    }
}

pub struct Router {
    pub process: Process,
    pub url: String,
}

impl Router {
    /// Starts `kind` with `policy` in front of `workers`, checking health every second, and
    /// waits until it routes.
    pub async fn start(kind: RouterKind, policy: &str, workers: &[String], logs: &Path) -> Result<Router> {
        Self::start_with(kind, policy, workers, &[], logs).await
    }

    /// [`Router::start`] with the router's own `extra` flags.
    pub async fn start_with(
        kind: RouterKind,
        policy: &str,
        workers: &[String],
        extra: &[&str],
        logs: &Path,
    ) -> Result<Router> {
        let mut args = vec!["--worker-urls".to_owned()];
        args.extend(workers.iter().map(|w| format!("http://{w}")));
        args.extend(extra.iter().map(|a| a.to_string()));
        Self::launch(kind, policy, &format!("{}-{policy}", kind.name()), &args, logs).await
    }

    /// Starts `kind` in its prefill/decode mode: `prefill` (whose KV-transfer listener is on
    /// `bootstrap_port`, what sglang-router tells the decode instance) and `decode`.
    pub async fn start_pd(
        kind: RouterKind,
        prefill: &str,
        bootstrap_port: u16,
        decode: &str,
        logs: &Path,
    ) -> Result<Router> {
        let mode = match kind {
            RouterKind::Sglang => "--pd-disaggregation",
            RouterKind::Vllm => "--vllm-pd-disaggregation",
        };
        let args = [
            mode.to_owned(),
            "--prefill".to_owned(),
            format!("http://{prefill}"),
            bootstrap_port.to_string(),
            "--decode".to_owned(),
            format!("http://{decode}"),
        ];
        Self::launch(kind, "round_robin", &format!("{}-pd", kind.name()), &args, logs).await
    }

    async fn launch(
        kind: RouterKind,
        policy: &str,
        name: &str,
        args: &[String],
        logs: &Path,
    ) -> Result<Router> {
        let dir = routers_dir();
        let port = free_port()?;
        let metrics_port = free_port()?;
        let mut command = match kind {
            RouterKind::Sglang => {
                let mut c = Command::new(dir.join("bin/python"));
                c.args(["-m", "sglang_router.launch_router"]);
                c
            }
            RouterKind::Vllm => Command::new(dir.join("bin/vllm-router")),
        };
        ensure!(
            dir.join("bin/vllm-router").is_file(),
            "the routers are not installed in {}: run `make router-tools`",
            dir.display()
        );
        command.args(["--host", "127.0.0.1", "--port", &port.to_string(), "--policy", policy]);
        command.args(args);
        command.args(["--prometheus-port", &metrics_port.to_string()]);
        // Health every second; power_of_two polls /get_load at the startup-check interval.
        command.args(["--health-check-interval-secs", "1", "--worker-startup-check-interval", "1"]);
        // The model path the replicas report is a file; no hub lookup may leave the machine.
        command.env("HF_ENDPOINT", "http://127.0.0.1:9").env("HF_HUB_OFFLINE", "1");
        let mut process = Process::spawn(name, command, logs)?;
        let url = format!("http://127.0.0.1:{port}");
        let http = reqwest::Client::builder().timeout(Duration::from_secs(5)).build()?;
        // A chat request through the router is the readiness both routers share.
        let probe = chat_body("Say hi.", false);
        wait_for(&format!("{name} to route"), Duration::from_secs(60), || {
            let running = process.ensure_running();
            let (http, url, probe) = (http.clone(), format!("{url}/v1/chat/completions"), probe.clone());
            async move {
                running?;
                Ok(match http.post(&url).json(&probe).send().await {
                    Ok(r) if r.status().is_success() => Ok(()),
                    Ok(r) => Err(format!("status {}", r.status())),
                    Err(e) => Err(e.to_string()),
                })
            }
        })
        .await?;
        Ok(Router { process, url })
    }
}

pub fn chat_body(content: &str, stream: bool) -> Value {
    json!({"model": SERVED_MODEL, "messages": [{"role": "user", "content": content}],
           "max_tokens": 8, "temperature": 0, "stream": stream})
}

/// What one request through the router came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// 200 and a whole answer (a stream ends with `[DONE]`).
    Completed,
    /// A status other than 200, or a stream cut short: the client learns it failed.
    Failed(String),
}

/// Sends `body` to `url` and reads the whole answer.
pub async fn send(http: &reqwest::Client, url: &str, body: &Value) -> Outcome {
    let resp = match http.post(url).json(body).send().await {
        Ok(r) => r,
        Err(e) => return Outcome::Failed(format!("transport: {e}")),
    };
    let status = resp.status();
    if !status.is_success() {
        let text = resp.text().await.unwrap_or_default();
        return Outcome::Failed(format!("{status}: {}", text.chars().take(200).collect::<String>()));
    }
    let mut bytes = Vec::new();
    let mut stream = resp.bytes_stream();
    while let Some(chunk) = stream.next().await {
        match chunk {
            Ok(c) => bytes.extend_from_slice(&c),
            Err(e) => return Outcome::Failed(format!("body cut: {e}")),
        }
    }
    let text = String::from_utf8_lossy(&bytes);
    let answer = if body["stream"] == true {
        whole_stream(&text)
    } else {
        serde_json::from_str::<Value>(&text).map_err(|e| format!("not JSON: {e}")).and_then(|v| {
            if v["choices"].is_array() {
                Ok(())
            } else {
                Err("no choices".to_owned())
            }
        })
    };
    match answer {
        Ok(()) => Outcome::Completed,
        Err(why) => Outcome::Failed(format!("incomplete answer ({why}) of {} bytes: {text}", bytes.len())),
    }
}

/// Whether an SSE body is a whole answer: every event's data a JSON chunk (none an error
/// object), the last one `[DONE]`. The events are parsed, not searched: generated text may
/// well contain `"error"` or `[DONE]`. Comment lines (keep-alives) are skipped.
pub fn whole_stream(text: &str) -> Result<(), String> {
    let datas = text.split("\n\n").filter_map(|event| {
        let lines: Vec<&str> = event.lines().filter(|l| !l.is_empty() && !l.starts_with(':')).collect();
        (!lines.is_empty()).then_some(lines)
    });
    let mut done = false;
    for lines in datas {
        let data = match lines.as_slice() {
            [line] => line.strip_prefix("data:").map(|d| d.strip_prefix(' ').unwrap_or(d)),
            _ => None,
        }
        .ok_or_else(|| format!("not one data line: {lines:?}"))?;
        if done {
            return Err(format!("an event after [DONE]: {data}"));
        }
        if data == "[DONE]" {
            done = true;
            continue;
        }
        let chunk: Value =
            serde_json::from_str(data).map_err(|e| format!("a chunk that is not JSON ({e})"))?;
        if chunk.get("error").is_some() {
            return Err(format!("an error event: {data}"));
        }
    }
    if done {
        Ok(())
    } else {
        Err("no [DONE]".to_owned())
    }
}

/// A long shared prefix per group (a system prompt, or a document to continue), each group's
/// requests differing only in their last words: what cache-aware routing is for.
fn group_prefix(group: usize) -> String {
    let topics = ["rivers", "mountains", "castles", "forests", "harbours", "deserts", "glaciers", "islands"];
    let topic = topics[group % topics.len()];
    format!(
        "You are a guide who knows everything about {topic}. {} Answer in one short sentence.",
        format!("Facts about {topic} number {group} are long and detailed and worth telling. ").repeat(16)
    )
}

/// Request `i` of `group`: chat for even groups, completions for odd ones; every other one
/// streamed.
pub fn workload_request(group: usize, i: usize) -> (&'static str, Value) {
    let stream = i % 2 == 1;
    if group.is_multiple_of(2) {
        let body = json!({"model": SERVED_MODEL, "max_tokens": 8, "temperature": 0, "stream": stream,
                          "messages": [{"role": "system", "content": group_prefix(group)},
                                       {"role": "user", "content": format!("Question {i}: what is special?")}]});
        ("/v1/chat/completions", body)
    } else {
        let prompt = format!("{}\nQuestion {i}: what is special?\nAnswer:", group_prefix(group));
        let body = json!({"model": SERVED_MODEL, "prompt": prompt, "max_tokens": 8, "temperature": 0,
                          "stream": stream});
        ("/v1/completions", body)
    }
}

/// `groups` groups of `per_group` requests, sent round by round (request `r` of every group at
/// once), so a group's later requests can find its prefix where its first one ran. Returns
/// the outcomes and the wall time.
pub async fn run_workload(
    http: &reqwest::Client,
    router: &Router,
    groups: usize,
    per_group: usize,
) -> (Vec<Outcome>, Duration) {
    let started = Instant::now();
    let mut outcomes = Vec::new();
    for i in 0..per_group {
        let round = (0..groups).map(|g| {
            let (path, body) = workload_request(g, i);
            let url = format!("{}{path}", router.url);
            async move { send(http, &url, &body).await }
        });
        outcomes.extend(futures_util::future::join_all(round).await);
    }
    (outcomes, started.elapsed())
}

/// A replica's `/metrics` text.
pub async fn replica_metrics(http: &reqwest::Client, replica: &Replica) -> Result<String> {
    let url = replica.url("/metrics");
    http.get(&url).send().await?.error_for_status()?.text().await.context("metrics")
}

/// The sum of `metric`'s samples whose labels contain every one of `labels`.
pub fn metric_sum(text: &str, metric: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.split_once(['{', ' ']).is_some_and(|(name, _)| name == metric))
        .filter(|l| labels.iter().all(|label| l.contains(label)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Requests of `handler` a replica answered with `status`.
pub fn http_count(text: &str, handler: &str, status: u16) -> f64 {
    metric_sum(
        text,
        "http_requests_total",
        &[&format!("handler=\"{handler}\""), &format!("status=\"{status}\"")],
    )
}

/// The replica's requests that found no route (404) or whose route the server does not know.
pub fn not_found_lines(text: &str) -> Vec<String> {
    text.lines()
        .filter(|l| l.starts_with("http_requests_total{"))
        .filter(|l| l.contains("status=\"404\"") || l.contains("handler=\"unmatched\""))
        .map(str::to_owned)
        .collect()
}

#[test]
fn a_stream_is_whole_by_its_events_not_its_words() {
    let chunk = |text: &str| format!("data: {}\n\n", json!({"choices": [{"index": 0, "text": text}]}));
    // Generated text that reads like an error or an end is still text.
    let words = format!("{}: keep-alive\n\n{}data: [DONE]\n\n", chunk("error"), chunk("[DONE]"));
    assert_eq!(whole_stream(&words), Ok(()));
    let cut = chunk("Once upon");
    assert_eq!(whole_stream(&cut), Err("no [DONE]".to_owned()));
    let error = format!("{}data: {}\n\ndata: [DONE]\n\n", chunk("a"), json!({"error": {"message": "gone"}}));
    assert!(whole_stream(&error).unwrap_err().starts_with("an error event"));
    let half_chunk = format!("{}data: {{\"choices\n\n", chunk("a"));
    assert!(whole_stream(&half_chunk).unwrap_err().contains("not JSON"));
    let after_done = format!("data: [DONE]\n\n{}", chunk("late"));
    assert!(whole_stream(&after_done).unwrap_err().starts_with("an event after [DONE]"));
}

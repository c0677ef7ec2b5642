//! The fuzz suite (issue 14): a few thousand requests generated from the wire types and mutated
//! (`gen`, `agent_gen`, `mcp_gen`, `mutate`, `bytes`), sent to the real `pagoda` binary with the
//! real model, each checked (`check`, `agent_check`): no 5xx, 2xx bodies and streams well formed,
//! every error in its API's shape. The requests cover OpenAI's chat and completions, tokenize and
//! detokenize, Anthropic's Messages API (`/v1/messages` and `count_tokens`: errors in
//! Anthropic's shape, streams of named events ending with `message_stop` or `error`) and OpenAI's
//! Responses API (`/v1/responses`: streams of typed events numbered from 0, ending with
//! `response.completed`, `.incomplete` or `.failed`; and `GET` / `DELETE` on made-up stored
//! responses, which are 404s; `mcp` tools, which are 400s: this server allows no MCP server).
//! Every rejection is also sent once more on a raw connection that must then serve another
//! request (`reuse`). Afterwards `/health` is 200, a greedy request gives
//! the text it gave before, the process is alive and its log has no panic.
//!
//! The server runs as a child process so that its log is its own: a panic anywhere in it (HTTP
//! task, engine thread, model pool) shows up there and nowhere else, whatever the other tests of
//! this binary do. The seed is fixed; `PAGODA_FUZZ_SEED` (decimal or 0x-hex) changes it,
//! `PAGODA_FUZZ_CASES` the number of cases, `PAGODA_FUZZ_ONLY=3,17` runs only those cases, and
//! `PAGODA_FUZZ_VERBOSE=1` prints every case with its status.

mod agent_check;
mod agent_gen;
mod bytes;
mod check;
mod deep_grammar;
mod gen;
mod huge_n;
pub(crate) mod images;
mod mcp_gen;
mod mutate;
mod reuse;
pub(crate) mod rng;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use futures_util::stream::{self, StreamExt};
use serde_json::{json, Value};

use crate::harness::model_path;
use check::{check, excerpt, Reply};
use gen::{Case, API_KEY, BODY_LIMIT, MODEL};

const DEFAULT_SEED: u64 = 0x5EED_0014;
const DEFAULT_CASES: usize = 2400;
const CONCURRENCY: usize = 8;
/// The longest any one case may take; a hang is a failure.
const CASE_TIMEOUT: Duration = Duration::from_secs(60);

/// `pagoda serve` as a child process, its log collected line by line. Killed when dropped.
struct Server {
    child: Child,
    url: String,
    log: Arc<Mutex<Vec<String>>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    fn start() -> Result<Server> {
        let limit = BODY_LIMIT.to_string();
        let mut child = Command::new(env!("CARGO_BIN_EXE_pagoda"))
            .args(["serve", "--model"])
            .arg(model_path())
            .args(["--served-model-name", MODEL, "--api-key", API_KEY, "--port", "0"])
            // A short context bounds what any request can cost (a mutation may drop max_tokens),
            // long enough for SmolLM2's tool prompt (over 100 tokens) and a short conversation.
            .args(["--max-model-len", "256", "--kv-cache-memory", "64MiB", "--max-num-seqs", "16"])
            .args(["--max-waiting-requests", "4096", "--max-request-body-bytes", &limit])
            .env("NO_COLOR", "1")
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting the pagoda binary")?;
        let stderr = child.stderr.take().context("no stderr")?;
        let log = Arc::new(Mutex::new(Vec::new()));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let lines = Arc::clone(&log);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(rest) = line.split("ready on http://").nth(1) {
                    let addr: String =
                        rest.chars().take_while(|c| c.is_ascii_digit() || *c == '.' || *c == ':').collect();
                    let _ = ready_tx.send(addr);
                }
                lines.lock().unwrap().push(line);
            }
        });
        let mut server = Server { child, url: String::new(), log };
        match ready_rx.recv_timeout(Duration::from_secs(120)) {
            Ok(addr) => server.url = format!("http://{addr}"),
            Err(_) => bail!("the server did not start; log:\n{}", server.log.lock().unwrap().join("\n")),
        }
        Ok(server)
    }

    fn log_lines(&self, pred: impl Fn(&str) -> bool) -> Vec<String> {
        self.log.lock().unwrap().iter().filter(|l| pred(l)).cloned().collect()
    }
}

fn env_number(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    let v = v.trim();
    match v.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => v.parse().ok(),
    }
}

/// What happened to one case: its status (`None`: no response) or why it failed.
struct Outcome {
    index: usize,
    status: Option<u16>,
    failure: Option<String>,
}

async fn send(client: &reqwest::Client, url: &str, case: &Case) -> Result<Reply> {
    let method = reqwest::Method::from_bytes(case.method.as_bytes())?;
    let mut req = client.request(method, format!("{url}{}", case.path)).body(case.body.clone());
    if let Some(ct) = &case.content_type {
        req = req.header("content-type", ct);
    }
    if let Some(auth) = &case.auth {
        req = req.header("authorization", auth);
    }
    for (name, value) in &case.headers {
        req = req.header(*name, value);
    }
    let resp = req.send().await?;
    let status = resp.status().as_u16();
    let content_type =
        resp.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    let ignored_tools =
        resp.headers().get("x-pagoda-ignored-tools").and_then(|v| v.to_str().ok()).map(str::to_owned);
    let body = resp.bytes().await?.to_vec();
    Ok(Reply { status, content_type, ignored_tools, body })
}

async fn run_case(client: &reqwest::Client, url: &str, case: &Case) -> Outcome {
    let reply = match send(client, url, case).await {
        Ok(reply) => reply,
        Err(e) => {
            return Outcome { index: case.index, status: None, failure: Some(format!("no response: {e:#}")) }
        }
    };
    let mut failure = check(case, &reply).err();
    // Rejections are cheap to send twice: once more on a connection of its own, followed by
    // another request on that connection.
    if failure.is_none() && (400..500).contains(&reply.status) {
        let addr = url.trim_start_matches("http://");
        failure = reuse::connection_survives(addr, case).await.err();
    }
    Outcome { index: case.index, status: Some(reply.status), failure }
}

/// The case, in full enough to send it again by hand (a long body goes to a file).
fn describe(case: &Case, seed: u64) -> String {
    let body = match std::str::from_utf8(&case.body) {
        Ok(text) if text.len() <= 4096 => text.to_owned(),
        Err(_) if case.body.len() <= 4096 => format!("(not UTF-8, escaped) {}", case.body.escape_ascii()),
        _ => {
            let file = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
                .join(format!("fuzz-{seed:#x}-{}.body", case.index));
            let saved = match std::fs::write(&file, &case.body) {
                Ok(()) => format!("the whole body is in {}", file.display()),
                Err(e) => format!("could not save it to {}: {e}", file.display()),
            };
            format!("{} ({saved})", excerpt(&case.body).escape_debug())
        }
    };
    format!(
        "case {} [{}; {}]: {} {}\n  content-type: {:?}\n  authorization: {:?}\n  headers: {:?}\n  body ({} bytes): {body}",
        case.index,
        case.endpoint.label(),
        if case.what.is_empty() { "valid".to_owned() } else { case.what.join("; ") },
        case.method,
        case.path,
        case.content_type,
        case.auth,
        case.headers,
        case.body.len(),
    )
}

/// The greedy reference request's text.
async fn greedy_text(client: &reqwest::Client, url: &str) -> Result<String> {
    let body = json!({"model": MODEL, "messages": [{"role": "user", "content": "What is the capital of France?"}],
                      "temperature": 0, "max_tokens": 8});
    let resp = client
        .post(format!("{url}/v1/chat/completions"))
        .header("authorization", format!("Bearer {API_KEY}"))
        .json(&body)
        .send()
        .await?;
    let status = resp.status();
    let v: Value = resp.json().await?;
    ensure!(status == 200, "the greedy request got {status}: {v}");
    v["choices"][0]["message"]["content"].as_str().map(str::to_owned).context("no content")
}

async fn health(client: &reqwest::Client, url: &str) -> Result<()> {
    let status = client.get(format!("{url}/health")).send().await?.status();
    ensure!(status == 200, "/health is {status}");
    Ok(())
}

fn tally(label: &str, counts: &BTreeMap<String, usize>) -> String {
    let parts: Vec<String> = counts.iter().map(|(k, v)| format!("{k} {v}")).collect();
    format!("  {label}: {}", parts.join(", "))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generated_and_mutated_requests_never_break_the_server() -> Result<()> {
    let seed = env_number("PAGODA_FUZZ_SEED").unwrap_or(DEFAULT_SEED);
    let count = env_number("PAGODA_FUZZ_CASES").map_or(DEFAULT_CASES, |n| n as usize);
    let only = std::env::var("PAGODA_FUZZ_ONLY")
        .ok()
        .map(|v| v.split(',').filter_map(|i| i.trim().parse().ok()).collect::<BTreeSet<usize>>());
    println!("fuzz: seed {seed:#x} (PAGODA_FUZZ_SEED to change it)");
    let cases: Vec<Case> = match &only {
        Some(indices) => indices.iter().map(|&i| gen::generate(seed, i)).collect(),
        None => (0..count).map(|i| gen::generate(seed, i)).collect(),
    };

    let server = tokio::task::spawn_blocking(Server::start).await??;
    let url = server.url.clone();
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(CASE_TIMEOUT)
        .build()?;
    health(&client, &url).await?;
    // Cold, then (most likely) from the prefix cache: either is the right answer afterwards.
    let reference = [greedy_text(&client, &url).await?, greedy_text(&client, &url).await?];

    let started = Instant::now();
    let outcomes: Vec<Outcome> = stream::iter(&cases)
        .map(|case| run_case(&client, &url, case))
        .buffer_unordered(CONCURRENCY)
        .collect()
        .await;
    let elapsed = started.elapsed();
    let mut outcomes = outcomes;
    outcomes.sort_by_key(|o| o.index); // in the order of `cases`

    if std::env::var_os("PAGODA_FUZZ_VERBOSE").is_some() {
        for (case, outcome) in cases.iter().zip(&outcomes) {
            println!(
                "case {} [{}]: {:?} {}",
                case.index,
                case.endpoint.label(),
                outcome.status,
                case.what.join("; ")
            );
        }
    }
    let mut by_endpoint = BTreeMap::new();
    let mut by_status = BTreeMap::new();
    for (case, outcome) in cases.iter().zip(&outcomes) {
        *by_endpoint.entry(case.endpoint.label().to_owned()).or_insert(0) += 1;
        let status = outcome.status.map_or("none".to_owned(), |s| s.to_string());
        *by_status.entry(status).or_insert(0) += 1;
    }
    println!("fuzz: {} cases in {:.1} s, {CONCURRENCY} at a time", cases.len(), elapsed.as_secs_f64());
    println!("{}", tally("by endpoint", &by_endpoint));
    println!("{}", tally("by status", &by_status));

    // Case failures, grouped by what went wrong.
    let by_index: BTreeMap<usize, &Case> = cases.iter().map(|c| (c.index, c)).collect();
    let failed: Vec<&Outcome> = outcomes.iter().filter(|o| o.failure.is_some()).collect();
    let mut kinds: BTreeMap<String, Vec<&Outcome>> = BTreeMap::new();
    for outcome in &failed {
        let message = outcome.failure.as_deref().unwrap_or_default();
        let kind = message.split('{').next().unwrap_or_default().chars().take(56).collect();
        kinds.entry(kind).or_default().push(outcome);
    }
    let mut report = Vec::new();
    for (kind, outcomes) in &kinds {
        let indices: Vec<String> = outcomes.iter().take(12).map(|o| o.index.to_string()).collect();
        report.push(format!("{} case(s): {kind}... (cases {}...)", outcomes.len(), indices.join(", ")));
    }
    let mut failures: Vec<String> = Vec::new();
    for outcomes in kinds.values() {
        for outcome in outcomes.iter().take(2) {
            let case = by_index[&outcome.index];
            let id = format!("fuzz-{seed}-{} ", case.index);
            let log = server.log_lines(|l| l.contains(&id) && !l.contains(" INFO "));
            failures.push(format!(
                "{}\n  FAILED: {}\n  server log: {log:?}",
                describe(case, seed),
                outcome.failure.as_deref().unwrap_or_default()
            ));
        }
    }

    // Afterwards: still healthy, still correct, never panicked.
    if let Err(e) = health(&client, &url).await {
        failures.push(format!("after the fuzzing: {e:#}"));
    }
    match greedy_text(&client, &url).await {
        Ok(text) if reference.contains(&text) => {}
        Ok(text) => failures.push(format!("the greedy request gave {text:?} after, {reference:?} before")),
        Err(e) => failures.push(format!("the greedy request after the fuzzing failed: {e:#}")),
    }
    let mut server = server;
    if let Ok(Some(status)) = server.child.try_wait() {
        failures.push(format!("the server exited: {status}"));
    }
    let panics = server.log_lines(|l| l.contains("panicked"));
    if !panics.is_empty() {
        failures.push(format!("panics in the server log:\n{}", panics.join("\n")));
    }

    if !failures.is_empty() {
        println!("\nfuzz: {} of {} cases failed:\n  {}", failed.len(), cases.len(), report.join("\n  "));
        for f in &failures {
            println!("\n{f}");
        }
        let indices: Vec<String> = failed.iter().map(|o| o.index.to_string()).collect();
        bail!(
            "{} of {} cases failed, in {} way(s), and {} other problem(s) (see above); rerun the cases with \
             PAGODA_FUZZ_SEED={seed:#x} PAGODA_FUZZ_ONLY={}",
            failed.len(),
            cases.len(),
            kinds.len(),
            failures.len() - kinds.values().map(|o| o.len().min(2)).sum::<usize>(),
            indices.join(",")
        );
    }
    Ok(())
}

//! Starting real servers with the real model on 127.0.0.1:0, and small HTTP/SSE helpers.
//!
//! Each server runs on its own thread with its own tokio runtime, so it outlives any one
//! test's runtime; [`TestServer::signal_stop`] drives its shutdown like a signal would, and
//! [`TestServer::signal_again`] like a second one.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Parser;
use futures_util::StreamExt;
use pagoda_server::config::{ServeArgs, ServerConfig};
use pagoda_server::server::Server;
use serde_json::Value;

pub const API_KEY: &str = "e2e-secret";

/// The error `Server::build` gives for the real model with a 64 MiB cache and `extra` flags;
/// an error itself when the server builds.
pub async fn startup_error(extra: &[&str]) -> Result<String> {
    let model = model_path().display().to_string();
    let mut argv = vec!["pagoda", "--model", &model, "--port", "0", "--kv-cache-memory", "64MiB"];
    argv.extend_from_slice(extra);
    let config = ServerConfig::from_args(Cli::try_parse_from(&argv)?.args)?;
    match Server::build(&config).await {
        Ok(_) => bail!("{argv:?} started"),
        Err(e) => Ok(e.to_string()),
    }
}

/// The default model; its absence fails the tests (run `make model`).
pub fn model_path() -> PathBuf {
    // Cargo's run-time value: a test binary reused from a build in another checkout still
    // carries that checkout's compile-time path.
    let path = std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from)
        .join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(path.exists(), "{} is missing: run `make model` first", path.display());
    path
}

/// `pagoda serve`'s flags, parsed as the binary parses them.
#[derive(Parser)]
pub struct Cli {
    #[command(flatten)]
    pub args: ServeArgs,
}

pub struct TestServer {
    pub addr: SocketAddr,
    /// Each message is one shutdown signal; `None` once the first was sent.
    stop: std::sync::Mutex<Option<tokio::sync::mpsc::UnboundedSender<()>>>,
    signals: tokio::sync::mpsc::UnboundedSender<()>,
    thread: std::sync::Mutex<Option<std::thread::JoinHandle<Result<()>>>>,
}

impl TestServer {
    /// Starts `pagoda serve` in-process with the real model and `extra` flags.
    pub fn start(extra: &[&str]) -> TestServer {
        Self::start_with_model(&model_path().display().to_string(), extra)
    }

    /// Starts `pagoda serve` with the real model, `template` as its chat template (written to a
    /// file named after `name`) and `extra` flags.
    pub fn start_with_template(name: &str, template: &str, extra: &[&str]) -> TestServer {
        let dir = std::env::temp_dir().join(format!("pagoda-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("template.jinja");
        std::fs::write(&path, template).expect("template file");
        let mut flags = vec!["--chat-template", path.to_str().expect("utf-8 temp path")];
        flags.extend_from_slice(extra);
        Self::start(&flags)
    }

    /// Starts `pagoda serve` in-process with `--model model` and `extra` flags.
    pub fn start_with_model(model: &str, extra: &[&str]) -> TestServer {
        let mut argv = vec![
            "pagoda".to_owned(),
            "--model".to_owned(),
            model.to_owned(),
            "--served-model-name".to_owned(),
            "smol".to_owned(),
            "--port".to_owned(),
            "0".to_owned(),
        ];
        if !extra.contains(&"--kv-cache-memory") {
            argv.extend(["--kv-cache-memory".to_owned(), "96MiB".to_owned()]);
        }
        // 1024 unless the test picks its own (a model with fewer positions).
        if !extra.contains(&"--max-model-len") {
            argv.extend(["--max-model-len".to_owned(), "1024".to_owned()]);
        }
        argv.extend(extra.iter().map(|s| s.to_string()));
        let args = Cli::try_parse_from(argv).expect("test flags parse").args;
        let config = ServerConfig::from_args(args).expect("test config is valid");
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
        let signals = stop_tx.clone();
        let thread = std::thread::spawn(move || -> Result<()> {
            let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
            rt.block_on(async move {
                let server = match Server::build(&config).await {
                    Ok(s) => s,
                    Err(e) => {
                        let _ = addr_tx.send(Err(e.to_string()));
                        bail!("start-up failed: {e}");
                    }
                };
                let _ = addr_tx.send(Ok(server.local_addr()?));
                let signals = futures_util::stream::unfold(stop_rx, |mut rx| async move {
                    rx.recv().await.map(|()| ((), rx))
                });
                server.run_with_signals(signals).await?;
                Ok(())
            })
        });
        let addr = addr_rx
            .recv_timeout(Duration::from_secs(120))
            .expect("server start-up timed out")
            .unwrap_or_else(|e| panic!("server failed to start: {e}"));
        TestServer {
            addr,
            stop: std::sync::Mutex::new(Some(stop_tx)),
            signals,
            thread: std::sync::Mutex::new(Some(thread)),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Sends the shutdown signal without waiting (once: later calls do nothing).
    pub fn signal_stop(&self) {
        if let Some(tx) = self.stop.lock().unwrap().take() {
            let _ = tx.send(());
        }
    }

    /// Sends one more shutdown signal, like a second Ctrl-C.
    pub fn signal_again(&self) {
        let _ = self.signals.send(());
    }

    /// Signals shutdown and waits until the server has exited (from a blocking context).
    pub fn join(&self) -> Result<()> {
        self.signal_stop();
        let thread = self.thread.lock().unwrap().take().context("already joined")?;
        thread.join().map_err(|_| anyhow::anyhow!("server thread panicked"))?
    }
}

/// The server most tests share: API key required, a small body limit.
pub fn shared() -> &'static TestServer {
    static SERVER: OnceLock<TestServer> = OnceLock::new();
    SERVER.get_or_init(|| {
        TestServer::start(&[
            "--api-key",
            API_KEY,
            "--max-request-body-bytes",
            "64KiB",
            "--max-num-seqs",
            "64",
        ])
    })
}

/// A client that sends the shared server's API key.
pub fn client() -> reqwest::Client {
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(reqwest::header::AUTHORIZATION, format!("Bearer {API_KEY}").parse().unwrap());
    reqwest::Client::builder().default_headers(headers).timeout(Duration::from_secs(300)).build().unwrap()
}

/// POSTs `body` and returns the status and JSON body.
pub async fn post_json(client: &reqwest::Client, url: &str, body: &Value) -> Result<(u16, Value)> {
    let resp = client.post(url).json(body).send().await?;
    let status = resp.status().as_u16();
    let text = resp.text().await?;
    let json = serde_json::from_str(&text).with_context(|| format!("not JSON ({status}): {text}"))?;
    Ok((status, json))
}

/// Asserts the OpenAI error shape and returns the error object.
pub fn assert_error_shape(body: &Value) -> &serde_json::Map<String, Value> {
    let error =
        body.get("error").and_then(Value::as_object).unwrap_or_else(|| panic!("no error object: {body}"));
    for key in ["message", "type", "param", "code"] {
        assert!(error.contains_key(key), "error lacks {key}: {body}");
    }
    assert!(error["message"].as_str().is_some_and(|m| !m.is_empty()), "{body}");
    assert!(error["type"].is_string(), "{body}");
    error
}

/// Reads a whole SSE response: the JSON of each `data:` event, and whether `[DONE]` came last.
pub async fn read_sse(resp: reqwest::Response) -> Result<(Vec<Value>, bool)> {
    let mut events = SseReader::new(resp);
    let mut out = Vec::new();
    while let Some(data) = events.next_data().await? {
        if data == "[DONE]" {
            if events.next_data().await?.is_some() {
                bail!("data after [DONE]");
            }
            return Ok((out, true));
        }
        out.push(serde_json::from_str(&data).with_context(|| format!("bad event {data}"))?);
    }
    Ok((out, false))
}

/// Incremental SSE reader over a response body.
pub struct SseReader {
    body: futures_util::stream::BoxStream<'static, reqwest::Result<axum::body::Bytes>>,
    buf: String,
}

impl SseReader {
    pub fn new(resp: reqwest::Response) -> Self {
        Self { body: resp.bytes_stream().boxed(), buf: String::new() }
    }

    /// The next event's `data:` payload; `None` at the end of the body.
    pub async fn next_data(&mut self) -> Result<Option<String>> {
        loop {
            if let Some(end) = self.buf.find("\n\n") {
                let event: String = self.buf.drain(..end + 2).collect();
                let data: Vec<&str> =
                    event.lines().filter_map(|l| l.strip_prefix("data:")).map(|d| d.trim_start()).collect();
                if data.is_empty() {
                    continue; // a keep-alive comment
                }
                return Ok(Some(data.join("\n")));
            }
            match self.body.next().await {
                Some(chunk) => self.buf.push_str(std::str::from_utf8(&chunk?)?),
                None => return Ok(None),
            }
        }
    }
}

/// The value of the first sample of `metric` whose labels contain `labels` in /metrics text.
pub fn metric(text: &str, metric: &str, labels: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| {
            l.split_once(['{', ' ']).is_some_and(|(name, _)| name == metric)
                && (labels.is_empty() || l.contains(labels))
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

pub async fn metrics_text(client: &reqwest::Client, server: &TestServer) -> Result<String> {
    Ok(client.get(server.url("/metrics")).send().await?.error_for_status()?.text().await?)
}

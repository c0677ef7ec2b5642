//! Sending one streamed request to an OpenAI-compatible server and timing its chunks.
//!
//! Every request asks for `stream: true` and `stream_options: {include_usage: true}`. The clock
//! starts just before the request is sent; a chunk's time is when its bytes arrived. TTFT is
//! the time to the first chunk with content (text), ITLs are the gaps between content chunks,
//! and the latency ends when `[DONE]` arrives (or the connection closes).
//!
//! Connections are kept alive and pooled. A server may close a kept-alive connection just as
//! the next request goes out on it (llama.cpp's server closes every connection a moment after
//! a stream's last byte, although its headers said keep-alive). That request was never taken:
//! no byte of an answer came back. It is sent once more, on a new connection, and counted in
//! [`Outcome::connection_retries`]; its clock keeps running from the first attempt. A request
//! the server answered in any way (an error status, a cut stream) is never sent again.
//!
//! A request may also carry a `response_format` ([`RequestExtras`]), and its answer text can be
//! kept ([`Outcome::text`]) so that it can be checked against the schema; otherwise no text is
//! kept, so memory stays flat however long the run.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use futures_util::StreamExt;
use serde_json::{json, Map, Value};

use crate::embedding_reply::embedding_outcome;
use crate::sse::{clip, error_message, interpret, SseParser, StreamItem};

/// How long the rest of a body is read after its stream ended.
const DRAIN_LIMIT: Duration = Duration::from_millis(200);

/// Pooled connections idle longer than this are not reused. Many servers (uvicorn, so vLLM;
/// llama.cpp's cpp-httplib; Node) close a connection idle for 5 s, and one taken from the pool
/// just as the server closes it loses the request (which then needs the retry).
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(4);

/// hyper's messages for a request that got no response: the connection closed after the
/// request was written, or before it was.
const CLOSED_UNANSWERED: [&str; 2] = ["connection closed before message completed", "operation was canceled"];

/// Which OpenAI API to call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Endpoint {
    /// `/v1/chat/completions`, the prompt as one user message (the server's chat template adds
    /// its own tokens).
    Chat,
    /// `/v1/completions`, the prompt as it is.
    Completions,
    /// `/v1/embeddings`, the prompt as the one input, not streamed: its TTFT and end-to-end
    /// latency are both the time to the embedding, and it has no output tokens.
    Embeddings,
}

/// How to reach the server and what every request carries besides its prompt.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// `http://host:port`, with or without a trailing `/v1`.
    pub base_url: String,
    pub model: String,
    pub endpoint: Endpoint,
    pub api_key: Option<String>,
    /// Send `ignore_eos: true` (a vLLM/llama.cpp/Pagoda extension).
    pub ignore_eos: bool,
    pub temperature: f64,
    /// Merged into every body last, so it can override any field.
    pub extra_body: Map<String, Value>,
    /// Limit on a whole request, stream included.
    pub timeout: Option<Duration>,
}

/// `base_url` with `/v1/{path}`, not doubling a `/v1` the base already ends with.
pub fn api_url(base_url: &str, path: &str) -> String {
    let base = base_url.trim_end_matches('/');
    if base.ends_with("/v1") {
        format!("{base}/{path}")
    } else {
        format!("{base}/v1/{path}")
    }
}

/// What happened to one request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Outcome {
    /// `None` on success.
    pub error: Option<String>,
    /// To the first content chunk; `None` when no text arrived.
    pub ttft: Option<Duration>,
    /// Gaps between consecutive content chunks.
    pub itl: Vec<Duration>,
    /// Send to the end of the stream (or to the failure).
    pub latency: Duration,
    pub content_chunks: usize,
    /// From the usage chunk, when the server sent one.
    pub prompt_tokens: Option<usize>,
    pub completion_tokens: Option<usize>,
    pub finish_reason: Option<String>,
    /// Characters of generated text (reasoning included).
    pub generated_chars: usize,
    /// The answer text (reasoning excluded), when it was asked to be kept.
    pub text: Option<String>,
    /// Times the request was sent again because the server closed the connection without
    /// answering it (0 or 1).
    pub connection_retries: usize,
}

/// Folds a stream's items into an [`Outcome`]; independent of the network so it can be tested.
#[derive(Debug)]
pub struct StreamState {
    start: Instant,
    last_content: Option<Instant>,
    done: bool,
    outcome: Outcome,
}

impl StreamState {
    pub fn new(start: Instant) -> Self {
        Self { start, last_content: None, done: false, outcome: Outcome::default() }
    }

    /// Also accumulates the answer text into [`Outcome::text`].
    pub fn keeping_text(mut self) -> Self {
        self.outcome.text = Some(String::new());
        self
    }

    /// Whether nothing more should be read (`[DONE]` or an error).
    pub fn is_over(&self) -> bool {
        self.done || self.outcome.error.is_some()
    }

    /// Takes one item that arrived at `now`.
    pub fn on_item(&mut self, item: StreamItem, now: Instant) {
        if self.is_over() {
            return;
        }
        match item {
            StreamItem::Done => self.done = true,
            StreamItem::Error(message) => {
                self.outcome.error = Some(format!("error in the stream: {message}"))
            }
            StreamItem::Chunk(chunk) => {
                let o = &mut self.outcome;
                if !chunk.content.is_empty() || !chunk.reasoning.is_empty() {
                    match self.last_content {
                        None => o.ttft = Some(now.saturating_duration_since(self.start)),
                        Some(last) => o.itl.push(now.saturating_duration_since(last)),
                    }
                    self.last_content = Some(now);
                    o.content_chunks += 1;
                    o.generated_chars += chunk.content.chars().count() + chunk.reasoning.chars().count();
                }
                if let Some(text) = &mut o.text {
                    text.push_str(&chunk.content);
                }
                if let Some(reason) = chunk.finish_reason {
                    o.finish_reason = Some(reason);
                }
                if let Some(usage) = chunk.usage {
                    o.prompt_tokens = usage.prompt_tokens.or(o.prompt_tokens);
                    o.completion_tokens = usage.completion_tokens.or(o.completion_tokens);
                }
            }
        }
    }

    /// Records a failure that ended the stream (connection lost, timeout).
    pub fn fail(&mut self, message: String) {
        if self.outcome.error.is_none() {
            self.outcome.error = Some(message);
        }
    }

    /// The outcome when the stream ended at `end`. A stream that closes without `[DONE]` still
    /// succeeds if a choice finished; `abort` and `error` finish reasons are failures.
    pub fn finish(mut self, end: Instant) -> Outcome {
        self.outcome.latency = end.saturating_duration_since(self.start);
        let o = &mut self.outcome;
        if o.error.is_none() {
            match o.finish_reason.as_deref() {
                Some(r @ ("abort" | "error")) => o.error = Some(format!("the request finished with \"{r}\"")),
                None if !self.done => o.error = Some("the stream ended before [DONE]".into()),
                _ => {}
            }
        }
        self.outcome
    }
}

/// What one request carries besides its prompt and length.
#[derive(Debug, Clone, Copy, Default)]
pub struct RequestExtras<'a> {
    /// The body's `response_format` (e.g. a `json_schema`); `--extra-body` still overrides it.
    pub response_format: Option<&'a Value>,
    /// Keep the answer text in [`Outcome::text`].
    pub keep_text: bool,
    /// The `model` of this request (a LoRA adapter's name) instead of the client's.
    pub model: Option<&'a str>,
}

/// Sends requests to one server.
#[derive(Debug, Clone)]
pub struct Client {
    /// Pooled keep-alive connections.
    http: reqwest::Client,
    /// A new connection for every request, for retries: an unanswered retry is the server's
    /// failure, not a race with a close.
    fresh: reqwest::Client,
    url: String,
    config: ClientConfig,
}

impl Client {
    pub fn new(config: ClientConfig) -> anyhow::Result<Self> {
        let path = match config.endpoint {
            Endpoint::Chat => "chat/completions",
            Endpoint::Completions => "completions",
            Endpoint::Embeddings => "embeddings",
        };
        let url = api_url(&config.base_url, path);
        reqwest::Url::parse(&url)
            .with_context(|| format!("--base-url {:?} is not a URL", config.base_url))?;
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(1024)
            .pool_idle_timeout(POOL_IDLE_TIMEOUT)
            .tcp_nodelay(true)
            .build()?;
        let fresh = reqwest::Client::builder().pool_max_idle_per_host(0).tcp_nodelay(true).build()?;
        Ok(Self { http, fresh, url, config })
    }

    /// The URL requests go to.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The JSON body for `prompt` with `max_tokens`.
    pub fn body(&self, prompt: &str, max_tokens: usize) -> Value {
        self.body_with(prompt, max_tokens, None)
    }

    /// The JSON body for `prompt` with `max_tokens` and, if given, `response_format`.
    pub fn body_with(&self, prompt: &str, max_tokens: usize, response_format: Option<&Value>) -> Value {
        let c = &self.config;
        if c.endpoint == Endpoint::Embeddings {
            let mut body = json!({"model": c.model, "input": prompt});
            let map = body.as_object_mut().expect("an object");
            for (k, v) in &c.extra_body {
                map.insert(k.clone(), v.clone());
            }
            return body;
        }
        let mut body = json!({
            "model": c.model,
            "max_tokens": max_tokens,
            "temperature": c.temperature,
            "stream": true,
            "stream_options": {"include_usage": true},
        });
        let map = body.as_object_mut().expect("an object");
        match c.endpoint {
            Endpoint::Completions => map.insert("prompt".into(), json!(prompt)),
            Endpoint::Chat => map.insert("messages".into(), json!([{"role": "user", "content": prompt}])),
            Endpoint::Embeddings => unreachable!("handled above"),
        };
        if c.ignore_eos {
            map.insert("ignore_eos".into(), json!(true));
        }
        if let Some(format) = response_format {
            map.insert("response_format".into(), format.clone());
        }
        for (k, v) in &c.extra_body {
            map.insert(k.clone(), v.clone());
        }
        body
    }

    /// The POST of `body` through `http`, limited to `timeout`.
    fn request(
        &self,
        http: &reqwest::Client,
        body: &Value,
        timeout: Option<Duration>,
    ) -> reqwest::RequestBuilder {
        let mut request = http.post(&self.url).json(body).header("accept", "text/event-stream");
        if let Some(key) = &self.config.api_key {
            request = request.bearer_auth(key);
        }
        if let Some(t) = timeout {
            request = request.timeout(t);
        }
        request
    }

    /// Sends one request and reads its stream to the end; never fails, errors are in the outcome.
    pub async fn send(&self, prompt: &str, max_tokens: usize) -> Outcome {
        self.send_with(prompt, max_tokens, RequestExtras::default()).await
    }

    /// [`Self::send`] with a request's own extras.
    pub async fn send_with(&self, prompt: &str, max_tokens: usize, extras: RequestExtras<'_>) -> Outcome {
        let mut body = self.body_with(prompt, max_tokens, extras.response_format);
        if let Some(model) = extras.model {
            body["model"] = json!(model);
        }
        let start = Instant::now();
        let mut state = StreamState::new(start);
        if extras.keep_text {
            state = state.keeping_text();
        }
        let mut sent = self.request(&self.http, &body, self.config.timeout).send().await;
        if let Err(e) = &sent {
            // The user waited through the lost attempt too: the retry keeps `start`, and gets
            // what is left of the timeout.
            let left = self.config.timeout.map(|t| t.saturating_sub(start.elapsed()));
            if closed_unanswered(e) && left != Some(Duration::ZERO) {
                state.outcome.connection_retries += 1;
                sent = self.request(&self.fresh, &body, left).send().await;
            }
        }
        let response = match sent {
            Ok(r) => r,
            Err(e) => {
                let again = if state.outcome.connection_retries > 0 { " (sent twice)" } else { "" };
                state.fail(format!("request failed{again}: {}", error_chain(&e)));
                return state.finish(Instant::now());
            }
        };
        let status = response.status();
        if self.config.endpoint == Endpoint::Embeddings && status.is_success() {
            let body = response.text().await;
            let now = Instant::now();
            return match body.map(|text| serde_json::from_str::<Value>(&text)) {
                Ok(Ok(reply)) => embedding_outcome(&reply, start, now),
                Ok(Err(e)) => {
                    state.fail(format!("the embedding answer is not JSON: {e}"));
                    state.finish(now)
                }
                Err(e) => {
                    state.fail(format!("reading the answer failed: {}", error_chain(&e)));
                    state.finish(now)
                }
            };
        }
        if !status.is_success() {
            let text = response.text().await.unwrap_or_default();
            let message = match serde_json::from_str::<Value>(&text) {
                Ok(v) if v.get("error").is_some() => error_message(&v["error"]),
                _ => clip(text.trim()),
            };
            state.fail(format!("HTTP {}: {message}", status.as_u16()));
            return state.finish(Instant::now());
        }
        let mut parser = SseParser::new();
        let mut bytes = response.bytes_stream();
        while !state.is_over() {
            match bytes.next().await {
                Some(Ok(data)) => {
                    let now = Instant::now();
                    for event in parser.push(&data) {
                        state.on_item(interpret(&event), now);
                    }
                }
                Some(Err(e)) => state.fail(format!("reading the stream failed: {}", error_chain(&e))),
                None => {
                    if let Some(event) = parser.finish() {
                        state.on_item(interpret(&event), Instant::now());
                    }
                    break;
                }
            }
        }
        let outcome = state.finish(Instant::now());
        // Read the (normally empty) rest of the body so the connection goes back to the pool and
        // the next request does not pay for a new one; a server that keeps the stream open
        // after [DONE] gets a moment, not the whole timeout.
        let drain = async { while let Some(Ok(_)) = bytes.next().await {} };
        let _ = tokio::time::timeout(DRAIN_LIMIT, drain).await;
        outcome
    }
}

/// Whether `e` says the connection closed (or was reset) before a response head arrived, with
/// nothing else wrong: the server did not answer the request. (hyper cannot say whether part of
/// a head came; a server that began answering does not stop inside its status line.) Timeouts,
/// failed connects and anything after the head are the server's failures.
fn closed_unanswered(e: &reqwest::Error) -> bool {
    if e.is_timeout() || e.is_connect() || e.is_status() || e.is_body() || e.is_decode() {
        return false;
    }
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind::*;
            return matches!(io.kind(), ConnectionReset | ConnectionAborted | BrokenPipe | UnexpectedEof);
        }
        if CLOSED_UNANSWERED.contains(&s.to_string().as_str()) {
            return true;
        }
        source = s.source();
    }
    false
}

/// An error with its sources (reqwest's top-level messages alone say little).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut message = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        message.push_str(": ");
        message.push_str(&s.to_string());
        source = s.source();
    }
    message
}

/// The first model `GET /v1/models` lists (for runs without `--model`).
pub async fn first_model(base_url: &str, api_key: Option<&str>) -> anyhow::Result<String> {
    let url = api_url(base_url, "models");
    let mut request = reqwest::Client::new().get(&url);
    if let Some(key) = api_key {
        request = request.bearer_auth(key);
    }
    let response = request.send().await.map_err(|e| anyhow::anyhow!("GET {url}: {}", error_chain(&e)))?;
    let status = response.status();
    let text = response.text().await.with_context(|| format!("GET {url}"))?;
    if !status.is_success() {
        bail!("GET {url}: HTTP {}: {}", status.as_u16(), clip(text.trim()));
    }
    let v: Value = serde_json::from_str(&text).with_context(|| format!("GET {url}: not JSON"))?;
    match v["data"][0]["id"].as_str() {
        Some(id) => Ok(id.to_owned()),
        None => bail!("GET {url} lists no model; pass --model"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sse::{Chunk, ChunkUsage};

    fn config(endpoint: Endpoint) -> ClientConfig {
        ClientConfig {
            base_url: "http://127.0.0.1:8000".into(),
            model: "m".into(),
            endpoint,
            api_key: None,
            ignore_eos: false,
            temperature: 0.0,
            extra_body: Map::new(),
            timeout: None,
        }
    }

    fn text(s: &str) -> StreamItem {
        StreamItem::Chunk(Chunk { content: s.into(), ..Chunk::default() })
    }

    #[test]
    fn urls_join_with_or_without_v1() {
        assert_eq!(api_url("http://h:1", "completions"), "http://h:1/v1/completions");
        assert_eq!(api_url("http://h:1/", "models"), "http://h:1/v1/models");
        assert_eq!(api_url("https://h/v1/", "chat/completions"), "https://h/v1/chat/completions");
        assert_eq!(api_url("http://h/proxy/v1", "models"), "http://h/proxy/v1/models");
        let chat = Client::new(config(Endpoint::Chat)).unwrap();
        assert_eq!(chat.url(), "http://127.0.0.1:8000/v1/chat/completions");
        assert!(Client::new(ClientConfig { base_url: "not a url".into(), ..config(Endpoint::Chat) }).is_err());
    }

    #[test]
    fn bodies_stream_with_usage_and_take_extras_last() {
        let mut c = config(Endpoint::Completions);
        c.ignore_eos = true;
        c.extra_body.insert("temperature".into(), json!(0.7));
        c.extra_body.insert("top_k".into(), json!(5));
        let body = Client::new(c).unwrap().body("hi there", 16);
        assert_eq!(
            body,
            json!({"model": "m", "prompt": "hi there", "max_tokens": 16, "temperature": 0.7, "top_k": 5,
                   "stream": true, "stream_options": {"include_usage": true}, "ignore_eos": true})
        );
        let chat = Client::new(config(Endpoint::Chat)).unwrap().body("q", 4);
        assert_eq!(chat["messages"], json!([{"role": "user", "content": "q"}]));
        assert!(chat.get("prompt").is_none() && chat.get("ignore_eos").is_none());
        assert!(chat.get("response_format").is_none());
    }

    #[test]
    fn embedding_requests_are_plain_and_timed_whole() {
        let embeddings = Client::new(config(Endpoint::Embeddings)).unwrap();
        assert!(embeddings.url().ends_with("/v1/embeddings"), "{}", embeddings.url());
        let body = embeddings.body("q", 4);
        assert_eq!(body["input"], "q");
        assert!(body.get("max_tokens").is_none() && body.get("stream").is_none(), "{body}");
        let reply = json!({"data": [{"embedding": [0.5, 0.25]}], "usage": {"prompt_tokens": 3}});
        let t0 = Instant::now();
        let outcome = embedding_outcome(&reply, t0, t0 + Duration::from_millis(7));
        assert_eq!(
            (outcome.error, outcome.prompt_tokens, outcome.ttft),
            (None, Some(3), Some(Duration::from_millis(7)))
        );
        assert!(embedding_outcome(&json!({"data": []}), t0, t0).error.is_some());
    }

    #[test]
    fn a_response_format_goes_into_the_body() {
        let format =
            json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {}, "strict": true}});
        for endpoint in [Endpoint::Chat, Endpoint::Completions] {
            let body = Client::new(config(endpoint)).unwrap().body_with("q", 4, Some(&format));
            assert_eq!(body["response_format"], format);
        }
        let mut c = config(Endpoint::Chat);
        c.extra_body.insert("response_format".into(), json!({"type": "json_object"}));
        let body = Client::new(c).unwrap().body_with("q", 4, Some(&format));
        assert_eq!(body["response_format"], json!({"type": "json_object"}), "--extra-body wins");
    }

    #[test]
    fn answer_text_is_kept_only_when_asked_and_without_reasoning() {
        let t0 = Instant::now();
        let reasoning = StreamItem::Chunk(Chunk { reasoning: "hmm".into(), ..Chunk::default() });
        let mut kept = StreamState::new(t0).keeping_text();
        let mut dropped = StreamState::new(t0);
        for s in [&mut kept, &mut dropped] {
            s.on_item(reasoning.clone(), t0);
            s.on_item(text("{\"a\": "), t0);
            s.on_item(text("1}"), t0);
            s.on_item(StreamItem::Done, t0);
        }
        let (kept, dropped) = (kept.finish(t0), dropped.finish(t0));
        assert_eq!(kept.text.as_deref(), Some("{\"a\": 1}"));
        assert_eq!(dropped.text, None);
        assert_eq!((kept.content_chunks, kept.generated_chars), (3, 11), "reasoning is timed and counted");
    }

    #[test]
    fn ttft_and_itls_come_from_content_chunks_only() {
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        let mut s = StreamState::new(t0);
        s.on_item(text(""), ms(5)); // role-only delta: no content
        s.on_item(text("a"), ms(20));
        s.on_item(text("b"), ms(30));
        s.on_item(text(""), ms(35));
        s.on_item(text("cd"), ms(50));
        s.on_item(
            StreamItem::Chunk(Chunk {
                finish_reason: Some("length".into()),
                usage: Some(ChunkUsage { prompt_tokens: Some(9), completion_tokens: Some(4) }),
                ..Chunk::default()
            }),
            ms(51),
        );
        s.on_item(StreamItem::Done, ms(52));
        assert!(s.is_over());
        s.on_item(text("ignored after [DONE]"), ms(60));
        let o = s.finish(ms(53));
        assert_eq!(o.error, None);
        assert_eq!(o.ttft, Some(Duration::from_millis(20)));
        assert_eq!(o.itl, [Duration::from_millis(10), Duration::from_millis(20)]);
        assert_eq!(o.latency, Duration::from_millis(53));
        assert_eq!((o.content_chunks, o.generated_chars), (3, 4));
        assert_eq!((o.prompt_tokens, o.completion_tokens), (Some(9), Some(4)));
        assert_eq!(o.finish_reason.as_deref(), Some("length"));
    }

    #[test]
    fn stream_errors_and_bad_endings_fail_the_request() {
        let t0 = Instant::now();
        let mut s = StreamState::new(t0);
        s.on_item(text("a"), t0);
        s.on_item(StreamItem::Error("boom".into()), t0);
        s.on_item(StreamItem::Error("second".into()), t0);
        assert_eq!(s.finish(t0).error.as_deref(), Some("error in the stream: boom"));

        let mut s = StreamState::new(t0);
        s.on_item(text("a"), t0);
        assert_eq!(s.finish(t0).error.as_deref(), Some("the stream ended before [DONE]"));

        // No [DONE], but the choice finished: accepted.
        let mut s = StreamState::new(t0);
        s.on_item(StreamItem::Chunk(Chunk { finish_reason: Some("stop".into()), ..Chunk::default() }), t0);
        assert_eq!(s.finish(t0).error, None);

        let mut s = StreamState::new(t0);
        s.on_item(StreamItem::Chunk(Chunk { finish_reason: Some("abort".into()), ..Chunk::default() }), t0);
        s.on_item(StreamItem::Done, t0);
        assert_eq!(s.finish(t0).error.as_deref(), Some("the request finished with \"abort\""));
    }
}

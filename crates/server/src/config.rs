//! `pagoda serve` configuration: command-line flags in vLLM's vocabulary, an optional TOML file
//! (`--config FILE`, the same names in kebab-case), and the resolved [`ServerConfig`].
//!
//! Precedence: flags (and `PAGODA_API_KEY`) over the file over the defaults. Every flag is an
//! `Option` declared once, for clap and serde alike; the file is read into [`ServeArgs`] and
//! the command line set over it by clap ([`ServeArgs::layered`]), and [`ServerConfig`] fills in
//! the defaults ([`defaults`], the engine's in `pagoda_runtime`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use pagoda_runtime::{EngineArgs, EngineSettings};
use serde::Deserialize;

pub use crate::flag_values::{GetLoadFormat, HostedToolsPolicy, SchedulingPolicy};
use crate::metrics::MetricsPrefix;
use crate::traces::{OtlpProtocol, TraceError, TraceSettings};
pub use pagoda_runtime::{ByteSize, CpuGemmDtype, DeviceArg, DtypeArg, LoadFormat, DEFAULT_MODEL};

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read the config file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("invalid config file {path}: {source}")]
    Parse { path: PathBuf, source: Box<toml::de::Error> },
    #[error("invalid config file {path}: unknown option `{key}` (the options are `pagoda serve`'s flags without the dashes, e.g. `max-model-len = 2048`)")]
    UnknownKey { path: PathBuf, key: String },
    #[error("invalid value for {flag}: {message}")]
    Invalid { flag: &'static str, message: String },
    #[error(transparent)]
    Flags(#[from] Box<clap::Error>),
    #[error("--config {0}: a config file is read by ServerConfig::from_matches, which knows which flags are given")]
    FileNotLayered(PathBuf),
}

impl From<pagoda_runtime::ArgsError> for ConfigError {
    fn from(e: pagoda_runtime::ArgsError) -> Self {
        ConfigError::Invalid { flag: e.flag, message: e.message }
    }
}

fn invalid(flag: &'static str, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid { flag, message: message.into() }
}

/// A duration flag in seconds: finite and not negative.
fn seconds(flag: &'static str, value: f64) -> Result<Duration, ConfigError> {
    Duration::try_from_secs_f64(value)
        .map_err(|_| invalid(flag, format!("expected a number of seconds, got {value}")))
}

/// Flags of `pagoda serve`: the server's own, then the model's and engine's ([`EngineArgs`]).
/// Every field is optional so that the config file can supply it.
#[derive(Debug, Clone, Default, clap::Args, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct ServeArgs {
    /// Name(s) clients use in the `model` field. [default: a GGUF file's stem, else the --model argument]
    #[arg(long, value_name = "NAME", num_args = 1..)]
    pub served_model_name: Option<Vec<String>>,
    /// Jinja chat template file, replacing the model's own.
    #[arg(long, value_name = "FILE")]
    pub chat_template: Option<PathBuf>,
    /// Directory of the Batch API's files and batch state (`/v1/files`, `/v1/batches`); unfinished
    /// batches found there resume at start-up. [default: none, the Files and Batch endpoints answer 404]
    #[arg(long, value_name = "DIR")]
    pub batch_dir: Option<PathBuf>,
    /// How the model writes tool calls. [default: detected from the chat template; `generic`
    /// when the template knows no tools]
    #[arg(long, value_enum)]
    pub tool_call_parser: Option<pagoda_text::ToolCallFormat>,
    /// Split the model's reasoning (`<think>...</think>`) into `reasoning_content`. [default: none]
    #[arg(long, value_enum)]
    pub reasoning_parser: Option<pagoda_text::ReasoningFormat>,
    /// What a request's hosted tools get: the tools a vendor's API runs on its own side
    /// (Responses' `web_search*`, `file_search`, `code_interpreter`, `image_generation`,
    /// `computer_use*`; Anthropic's `web_search_*`, `web_fetch_*`, `code_execution_*`), which
    /// this server cannot run. `ignore` serves the request without them and names them in the
    /// `x-pagoda-ignored-tools` response header; `reject` answers 400. A `tool_choice` that
    /// forces one is a 400 either way. [default: ignore]
    #[arg(long, value_enum)]
    pub hosted_tools: Option<HostedToolsPolicy>,
    /// URL prefixes of the MCP servers a Responses request's `mcp` tools may name in
    /// `server_url` (e.g. `http://127.0.0.1:9000/mcp`): the server lists those tools, offers
    /// them to the model and calls them itself. Any other `server_url` is a 400; redirects are
    /// not followed. Plain `http://` only (no TLS client in this build). [default: none, `mcp`
    /// tools are refused]
    #[arg(long, value_name = "URL-PREFIX", num_args = 1..)]
    pub allow_mcp_servers: Option<Vec<String>>,
    /// Seconds one MCP operation may take (listing a server's tools, or one tool call,
    /// connection included); past it the call ends with an error item. [default: 30]
    #[arg(long, value_name = "SECONDS")]
    pub mcp_timeout: Option<u64>,
    /// Hosts whose `http(s)://` image URLs requests may name (exact host names, as vLLM's
    /// flag; a JSON list or separate values); a redirect is followed only to a listed host.
    /// [default: none, image URLs must be data: URLs]
    #[arg(long, value_name = "HOST", num_args = 1..)]
    pub allowed_media_domains: Option<Vec<String>>,
    /// Directory whose files `file://` image URLs may name (checked after `..` and symlinks
    /// are resolved). [default: none, file:// URLs are refused]
    #[arg(long, value_name = "DIR")]
    pub allowed_local_media_path: Option<PathBuf>,
    /// Most images one request may hold: a number, or vLLM's JSON `{"image": N}`. [default: 8]
    #[arg(long, value_name = "N|JSON")]
    pub limit_mm_per_prompt: Option<crate::media::policy::ImageLimitArg>,
    /// Seconds one image fetch may take, redirects included. [default: 10]
    #[arg(long, value_name = "SECONDS")]
    pub media_fetch_timeout: Option<f64>,
    /// Memory a vision model's encoder cache may hold (image features kept by image hash, least
    /// recently used first out); 0 keeps none. [default: 256MiB]
    #[arg(long, value_name = "BYTES")]
    pub encoder_cache_memory: Option<ByteSize>,
    /// Address to listen on. [default: 127.0.0.1]
    #[arg(long)]
    pub host: Option<String>,
    /// Port to listen on; 0 picks a free one. [default: 8000]
    #[arg(long)]
    pub port: Option<u16>,
    /// How waiting requests are ordered: `fcfs`, or `priority` (the request's `priority` field,
    /// lower first). [default: fcfs]
    #[arg(long, value_enum)]
    pub scheduling_policy: Option<SchedulingPolicy>,
    /// Require `Authorization: Bearer KEY` (or `x-api-key: KEY`) on /v1/*, /tokenize,
    /// /detokenize, /server_info and /health_generate.
    #[arg(long, env = "PAGODA_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Serve /health_generate without the API key, for a router that probes workers without
    /// one (it answers from a probe shared by all callers, at most one generation a second).
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub health_generate_without_key: Option<bool>,
    /// CORS origins allowed to call the API from a browser page of another origin, as vLLM's
    /// flag: a JSON list (`'["https://example.com"]'`, `'["*"]'` for any) or the origins as
    /// separate values. [default: none, no CORS headers; the web UI is same-origin]
    #[arg(long, value_name = "ORIGIN", num_args = 1..)]
    pub allowed_origins: Option<Vec<String>>,
    /// Methods CORS allows (with --allowed-origins), a JSON list or separate values; `*` for
    /// any. [default: GET, POST, DELETE, OPTIONS]
    #[arg(long, value_name = "METHOD", num_args = 1..)]
    pub allowed_methods: Option<Vec<String>>,
    /// Request headers CORS allows (with --allowed-origins), a JSON list or separate values;
    /// `*` for any. [default: *]
    #[arg(long, value_name = "HEADER", num_args = 1..)]
    pub allowed_headers: Option<Vec<String>>,
    /// Namespace of the Prometheus metrics: `pagoda:...`, or `vllm:...` for vLLM dashboards.
    #[arg(long, value_enum)]
    pub metrics_prefix: Option<MetricsPrefix>,
    /// The shape of `GET /get_load`: `sglang` (for sglang-router) or `vllm-router`. [default: sglang]
    #[arg(long, value_enum)]
    pub get_load_format: Option<GetLoadFormat>,
    /// vLLM's KV-events config as JSON, e.g. `{"enable_kv_cache_events": true, "endpoint":
    /// "tcp://*:5557", "replay_endpoint": "tcp://*:5558", "topic": "kv"}`: publish the prefix
    /// cache's changes over ZMQ for cache-aware routers (vLLM's wire format and block hashes).
    #[arg(long, value_name = "JSON")]
    pub kv_events_config: Option<String>,
    /// Prefill/decode disaggregation, as vLLM's KV-transfer config JSON, e.g. `{"kv_role":
    /// "kv_producer", "kv_port": 14579}` on the prefill instance and `{"kv_role": "kv_consumer"}`
    /// on the decode instance (Pagoda's own TCP transport; docs/deployment.md).
    #[arg(long, value_name = "JSON")]
    pub kv_transfer_config: Option<String>,
    /// Most top logprobs a request may ask for. [default: 20]
    #[arg(long)]
    pub max_logprobs: Option<usize>,
    /// Responses API responses kept in memory for retrieval and `previous_response_id`; the
    /// least recently used goes first. 0 stores none (`store` then defaults to false). [default: 1024]
    #[arg(long, value_name = "N")]
    pub max_stored_responses: Option<usize>,
    /// Memory all stored responses may take together (their JSON's bytes); the least recently
    /// used go first. 0 stores none. [default: 256MiB]
    #[arg(long, value_name = "BYTES")]
    pub stored_responses_memory: Option<ByteSize>,
    /// Largest stored response. A request with `store: true` whose own fields (input,
    /// instructions, user, metadata, tools...) are larger gets 400 naming the largest;
    /// `store: false` is not limited. [default: 4MiB]
    #[arg(long, value_name = "BYTES")]
    pub max_stored_response_bytes: Option<ByteSize>,
    /// Largest request body accepted; larger ones get 413. [default: 8MiB]
    #[arg(long, value_name = "BYTES")]
    pub max_request_body_bytes: Option<ByteSize>,
    /// Seconds to let in-flight requests finish after SIGTERM/SIGINT; a second signal aborts
    /// them at once (streams end with `finish_reason: "abort"`) and exits. [default: 30]
    #[arg(long, value_name = "SECONDS")]
    pub shutdown_timeout: Option<f64>,
    /// Seconds a client has to send a request's head, from connecting or from the first byte
    /// of a later request on the same connection; slower connections are closed. [default: 10]
    #[arg(long, value_name = "SECONDS")]
    pub http_header_read_timeout: Option<f64>,
    /// Seconds an idle connection is kept open for its next request; 0 closes each connection
    /// after one response. [default: 75, above nginx's 60 s for upstream connections]
    #[arg(long, value_name = "SECONDS")]
    pub http_keep_alive_timeout: Option<f64>,
    /// Most client connections open at once (lowered to what the open-file limit allows). When
    /// all are taken, a new one replaces the longest-waiting connection that has no request in
    /// flight, else waits. [default: 2048]
    #[arg(long)]
    pub max_connections: Option<usize>,
    /// Do not serve the web UI: the playground at `/` and the dashboard at `/dashboard` (the
    /// JSON behind the dashboard, `/stats`, stays).
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub disable_web_ui: Option<bool>,
    /// Serve sleep mode, as vLLM's: `POST /sleep?level=1|2` frees the KV cache (level 2 the
    /// weights too), `POST /wake_up` takes it back, `GET /is_sleeping`. Off by default (the
    /// routes answer 404): a sleep takes the server out of service; behind the API key.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub enable_sleep_mode: Option<bool>,
    /// Export an OpenTelemetry span per request to this OTLP endpoint, as vLLM's flag (e.g.
    /// `http://127.0.0.1:4317`): `llm_request` with vLLM's `gen_ai.*` attributes, and its
    /// `queue`, `prefill` and `decode` phases. A client's W3C `traceparent` header makes it a
    /// child of the client's span. [default: none, no traces]
    #[arg(long, value_name = "URL")]
    pub otlp_traces_endpoint: Option<String>,
    /// The protocol of --otlp-traces-endpoint: `grpc`, or `http/protobuf` (an endpoint without
    /// a path gets `/v1/traces`). [default: grpc]
    #[arg(long, value_enum, env = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")]
    pub otlp_traces_protocol: Option<OtlpProtocol>,
    /// TOML file with any of these options in kebab-case (e.g. `max-model-len = 2048`).
    #[arg(long, value_name = "FILE")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    #[serde(flatten)]
    pub engine: EngineArgs,
}

/// Everything `pagoda serve` needs, resolved and checked.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerConfig {
    /// The model's and engine's settings.
    pub engine: EngineSettings,
    pub served_model_names: Vec<String>,
    pub chat_template: Option<PathBuf>,
    /// `--batch-dir`: where the Batch API keeps its files and state; none: the API is off.
    pub batch_dir: Option<PathBuf>,
    pub tool_call_parser: Option<pagoda_text::ToolCallFormat>,
    pub reasoning_parser: Option<pagoda_text::ReasoningFormat>,
    pub hosted_tools: HostedToolsPolicy,
    /// `--allow-mcp-servers`: the URL prefixes `mcp` tools may name; empty: none may.
    pub allow_mcp_servers: Vec<String>,
    /// `--mcp-timeout`.
    pub mcp_timeout: std::time::Duration,
    /// The image flags: allowed hosts and directory, images per request, fetch timeout.
    pub media: crate::media::policy::MediaSettings,
    /// `--encoder-cache-memory`, in bytes.
    pub encoder_cache_bytes: u64,
    pub host: String,
    pub port: u16,
    pub scheduling_policy: SchedulingPolicy,
    pub api_key: Option<String>,
    /// /health_generate is served without the key.
    pub health_generate_without_key: bool,
    /// CORS origins; empty: no CORS.
    pub allowed_origins: Vec<String>,
    pub allowed_methods: Vec<String>,
    pub allowed_headers: Vec<String>,
    pub metrics_prefix: MetricsPrefix,
    pub get_load_format: GetLoadFormat,
    /// KV events, when enabled.
    pub kv_events: Option<pagoda_kv_events::KvEventsConfig>,
    /// Prefill/decode disaggregation, when configured.
    pub kv_transfer: Option<pagoda_kv_transfer::KvTransferConfig>,
    pub max_logprobs: usize,
    pub max_request_body_bytes: usize,
    pub max_stored_responses: usize,
    pub stored_responses_memory: usize,
    pub max_stored_response_bytes: usize,
    pub shutdown_timeout: Duration,
    pub http_header_read_timeout: Duration,
    pub http_keep_alive_timeout: Duration,
    pub max_connections: usize,
    /// Serve the playground and the dashboard.
    pub web_ui: bool,
    /// Serve `/sleep`, `/wake_up` and `/is_sleeping`.
    pub enable_sleep_mode: bool,
    /// `--otlp-traces-endpoint`: where request spans go; none: no traces.
    pub otlp_traces: Option<TraceSettings>,
}

/// Keys a config file may not hold although they are flags: they only make sense on a command
/// line.
const FLAG_ONLY_KEYS: [&str; 2] = ["config", "no-enable-prefix-caching"];

/// The server's defaults: the values a flag that neither the command line nor the file gives
/// takes. Each flag's help states its default; a test checks the two agree.
pub mod defaults {
    pub const HOST: &str = "127.0.0.1";
    pub const PORT: u16 = 8000;
    pub const MCP_TIMEOUT_SECONDS: u64 = 30;
    pub const MAX_IMAGES_PER_PROMPT: usize = 8;
    pub const MEDIA_FETCH_TIMEOUT_SECONDS: f64 = 10.0;
    pub const ENCODER_CACHE_BYTES: u64 = 256 << 20;
    pub const ALLOWED_METHODS: [&str; 4] = ["GET", "POST", "DELETE", "OPTIONS"];
    pub const ALLOWED_HEADERS: [&str; 1] = ["*"];
    pub const MAX_LOGPROBS: usize = 20;
    pub const MAX_STORED_RESPONSES: usize = 1024;
    pub const MAX_REQUEST_BODY_BYTES: usize = 8 << 20;
    pub const SHUTDOWN_TIMEOUT_SECONDS: f64 = 30.0;
    pub const HTTP_HEADER_READ_TIMEOUT_SECONDS: f64 = 10.0;
    /// Above nginx's 60 s for upstream connections.
    pub const HTTP_KEEP_ALIVE_TIMEOUT_SECONDS: f64 = 75.0;
    pub const MAX_CONNECTIONS: usize = 2048;
}

impl ServeArgs {
    /// The flags clap matched (`matches`, of a command with [`ServeArgs`]' arguments) over the
    /// file `--config` names: the file is read into a `ServeArgs`, then clap sets on it exactly
    /// the flags given on the command line (or by their environment variables), so no flag is
    /// merged by hand.
    pub fn layered(matches: &clap::ArgMatches) -> Result<Self, ConfigError> {
        let config: Option<&PathBuf> = matches.get_one("config");
        let file = match config {
            Some(path) => ServerConfig::read_file(path)?,
            None => ServeArgs::default(),
        };
        let mut args = Self::over(file, matches)?;
        // Read and under the flags now: `--config` has nothing left to say.
        args.config = None;
        Ok(args)
    }

    /// The command line's flags (`matches`) over `file`'s.
    pub(crate) fn over(mut file: ServeArgs, matches: &clap::ArgMatches) -> Result<Self, ConfigError> {
        clap::FromArgMatches::update_from_arg_matches(&mut file, matches).map_err(Box::new)?;
        Ok(file)
    }
}

impl ServerConfig {
    /// `pagoda serve`'s command line, as clap matched it, over its `--config` file over the
    /// defaults.
    pub fn from_matches(matches: &clap::ArgMatches) -> Result<Self, ConfigError> {
        Self::from_args(ServeArgs::layered(matches)?)
    }

    /// The configuration `args` ask for, defaults filled in and checked. `args` are the flags
    /// with any config file already under them ([`ServeArgs::layered`]): given `--config` here,
    /// the file could not be put under the flags (which of them were given is known only to
    /// clap's matches), so it is refused rather than ignored.
    pub fn from_args(args: ServeArgs) -> Result<Self, ConfigError> {
        if let Some(path) = &args.config {
            return Err(ConfigError::FileNotLayered(path.clone()));
        }
        Self::resolve(args)
    }

    fn read_file(path: &Path) -> Result<ServeArgs, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| ConfigError::Read { path: path.to_owned(), source })?;
        Self::parse_file(&text).map_err(|e| match e {
            FileError::Parse(source) => {
                ConfigError::Parse { path: path.to_owned(), source: Box::new(source) }
            }
            FileError::UnknownKey(key) => ConfigError::UnknownKey { path: path.to_owned(), key },
        })
    }

    /// A config file's options. Its keys are the flags' names (serde's `flatten` cannot refuse
    /// unknown fields, so the keys are checked against clap's list of flags first).
    pub fn parse_file(text: &str) -> Result<ServeArgs, FileError> {
        let table: toml::Table = toml::from_str(text).map_err(FileError::Parse)?;
        let command = <ServeArgs as clap::Args>::augment_args(clap::Command::new("pagoda"));
        let known = |key: &str| {
            !FLAG_ONLY_KEYS.contains(&key) && command.get_arguments().any(|a| a.get_long() == Some(key))
        };
        if let Some(key) = table.keys().find(|k| !known(k)) {
            return Err(FileError::UnknownKey(key.clone()));
        }
        toml::from_str(text).map_err(FileError::Parse)
    }

    /// The flags' values (file already under command line), defaults filled in and checked.
    fn resolve(a: ServeArgs) -> Result<Self, ConfigError> {
        let engine = a.engine.settings()?;
        let served_model_names =
            a.served_model_name.unwrap_or_else(|| vec![crate::state::default_served_name(&engine.model)]);
        let owned = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let config = Self {
            engine,
            served_model_names,
            chat_template: a.chat_template,
            batch_dir: a.batch_dir,
            tool_call_parser: a.tool_call_parser,
            reasoning_parser: a.reasoning_parser,
            hosted_tools: a.hosted_tools.unwrap_or_default(),
            allow_mcp_servers: crate::responses::mcp::spec::check_prefixes(
                a.allow_mcp_servers.unwrap_or_default(),
            )
            .map_err(|message| invalid("--allow-mcp-servers", message))?,
            mcp_timeout: match a.mcp_timeout.unwrap_or(defaults::MCP_TIMEOUT_SECONDS) {
                0 => return Err(invalid("--mcp-timeout", "must be at least 1 second")),
                s => std::time::Duration::from_secs(s),
            },
            media: media_settings(
                a.allowed_media_domains,
                a.allowed_local_media_path,
                a.limit_mm_per_prompt,
                a.media_fetch_timeout,
            )?,
            encoder_cache_bytes: a.encoder_cache_memory.map_or(defaults::ENCODER_CACHE_BYTES, |b| b.0),
            host: a.host.unwrap_or_else(|| defaults::HOST.to_owned()),
            port: a.port.unwrap_or(defaults::PORT),
            scheduling_policy: a.scheduling_policy.unwrap_or_default(),
            api_key: a.api_key.filter(|k| !k.is_empty()),
            health_generate_without_key: a.health_generate_without_key.unwrap_or(false),
            allowed_origins: cors_list("--allowed-origins", a.allowed_origins.unwrap_or_default())?,
            allowed_methods: cors_list(
                "--allowed-methods",
                a.allowed_methods.unwrap_or_else(|| owned(&defaults::ALLOWED_METHODS)),
            )?,
            allowed_headers: cors_list(
                "--allowed-headers",
                a.allowed_headers.unwrap_or_else(|| owned(&defaults::ALLOWED_HEADERS)),
            )?,
            metrics_prefix: a.metrics_prefix.unwrap_or_default(),
            get_load_format: a.get_load_format.unwrap_or_default(),
            kv_events: match a.kv_events_config {
                None => None,
                Some(json) => Some(
                    pagoda_kv_events::KvEventsConfig::parse(&json)
                        .map_err(|e| invalid("--kv-events-config", e.to_string()))?,
                )
                .filter(|c| c.enabled()),
            },
            kv_transfer: match a.kv_transfer_config {
                None => None,
                Some(json) => Some(
                    pagoda_kv_transfer::KvTransferConfig::parse(&json)
                        .map_err(|e| invalid("--kv-transfer-config", e.to_string()))?,
                ),
            },
            max_logprobs: a.max_logprobs.unwrap_or(defaults::MAX_LOGPROBS),
            max_request_body_bytes: a
                .max_request_body_bytes
                .map_or(defaults::MAX_REQUEST_BODY_BYTES, |b| b.0 as usize),
            max_stored_responses: a.max_stored_responses.unwrap_or(defaults::MAX_STORED_RESPONSES),
            stored_responses_memory: a
                .stored_responses_memory
                .map_or(crate::responses::store::DEFAULT_STORE_BYTES, |b| b.0 as usize),
            max_stored_response_bytes: a
                .max_stored_response_bytes
                .map_or(crate::responses::store::DEFAULT_ENTRY_BYTES, |b| b.0 as usize),
            // A negative grace is none; an endless one is refused, not a panic.
            shutdown_timeout: seconds(
                "--shutdown-timeout",
                a.shutdown_timeout.unwrap_or(defaults::SHUTDOWN_TIMEOUT_SECONDS).max(0.0),
            )?,
            http_header_read_timeout: seconds(
                "--http-header-read-timeout",
                a.http_header_read_timeout.unwrap_or(defaults::HTTP_HEADER_READ_TIMEOUT_SECONDS),
            )?,
            http_keep_alive_timeout: seconds(
                "--http-keep-alive-timeout",
                a.http_keep_alive_timeout.unwrap_or(defaults::HTTP_KEEP_ALIVE_TIMEOUT_SECONDS),
            )?,
            max_connections: a.max_connections.unwrap_or(defaults::MAX_CONNECTIONS),
            web_ui: !a.disable_web_ui.unwrap_or(false),
            enable_sleep_mode: a.enable_sleep_mode.unwrap_or(false),
            otlp_traces: match a.otlp_traces_endpoint {
                Some(endpoint) => {
                    let settings =
                        TraceSettings { endpoint, protocol: a.otlp_traces_protocol.unwrap_or_default() };
                    if let Err(TraceError::Endpoint { endpoint, message }) = settings.export_url() {
                        return Err(invalid("--otlp-traces-endpoint", format!("{endpoint}: {message}")));
                    }
                    Some(settings)
                }
                None => None,
            },
        };
        config.check()?;
        Ok(config)
    }

    fn check(&self) -> Result<(), ConfigError> {
        if self.served_model_names.is_empty() || self.served_model_names.iter().any(|n| n.is_empty()) {
            return Err(invalid("--served-model-name", "names must not be empty"));
        }
        if self.max_request_body_bytes == 0 {
            return Err(invalid("--max-request-body-bytes", "must be at least 1"));
        }
        let adapters = self.engine.lora.as_ref().map_or(&[][..], |l| l.modules.as_slice());
        if let Some((name, _)) = adapters.iter().find(|(n, _)| self.served_model_names.contains(n)) {
            return Err(invalid("--lora-modules", format!("{name:?} is also the model's served name")));
        }
        if self.http_header_read_timeout.is_zero() {
            return Err(invalid("--http-header-read-timeout", "must be above 0"));
        }
        if self.max_connections == 0 {
            return Err(invalid("--max-connections", "must be at least 1"));
        }
        if self.allowed_origins.iter().any(|o| o != "*" && axum::http::HeaderValue::from_str(o).is_err()) {
            return Err(invalid(
                "--allowed-origins",
                "origins must be valid header values such as https://example.com",
            ));
        }
        if self
            .allowed_methods
            .iter()
            .any(|m| m != "*" && axum::http::Method::from_bytes(m.as_bytes()).is_err())
        {
            return Err(invalid("--allowed-methods", "methods must be HTTP methods such as GET"));
        }
        if self
            .allowed_headers
            .iter()
            .any(|h| h != "*" && axum::http::HeaderName::from_bytes(h.as_bytes()).is_err())
        {
            return Err(invalid("--allowed-headers", "headers must be header names such as content-type"));
        }
        if self.max_stored_response_bytes == 0 {
            return Err(invalid("--max-stored-response-bytes", "must be at least 1"));
        }
        Ok(())
    }

    /// The address to bind.
    pub fn bind_addr(&self) -> String {
        if self.host.contains(':') && !self.host.starts_with('[') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

/// The image flags resolved (their parsing lives with the policy, in `media::policy`).
fn media_settings(
    domains: Option<Vec<String>>,
    local: Option<PathBuf>,
    limit: Option<crate::media::policy::ImageLimitArg>,
    timeout: Option<f64>,
) -> Result<crate::media::policy::MediaSettings, ConfigError> {
    use crate::media::policy;
    let timeout = seconds("--media-fetch-timeout", timeout.unwrap_or(defaults::MEDIA_FETCH_TIMEOUT_SECONDS))?;
    if timeout.is_zero() {
        return Err(invalid("--media-fetch-timeout", "must be above 0"));
    }
    Ok(policy::MediaSettings {
        allowed_domains: policy::parse_domains(domains.unwrap_or_default())
            .map_err(|m| invalid("--allowed-media-domains", m))?,
        local_root: local
            .map(|dir| policy::canonical_root(&dir))
            .transpose()
            .map_err(|m| invalid("--allowed-local-media-path", m))?,
        max_images: limit.map_or(defaults::MAX_IMAGES_PER_PROMPT, |l| l.0),
        fetch_timeout: timeout,
    })
}

/// A CORS list flag's values: each a JSON list (vLLM's form, `'["*"]'`) or one value.
fn cors_list(flag: &'static str, values: Vec<String>) -> Result<Vec<String>, ConfigError> {
    let mut list = Vec::new();
    for value in values {
        if value.trim_start().starts_with('[') {
            let items: Vec<String> = serde_json::from_str(&value)
                .map_err(|e| invalid(flag, format!("expected a JSON list of strings: {e}")))?;
            list.extend(items);
        } else {
            list.push(value);
        }
    }
    Ok(list)
}

/// Why a config file's text was refused.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error(transparent)]
    Parse(toml::de::Error),
    #[error("unknown option `{0}`")]
    UnknownKey(String),
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;

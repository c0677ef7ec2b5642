//! `pagoda serve` configuration: command-line flags in vLLM's vocabulary, an optional TOML file
//! (`--config FILE`, the same names in kebab-case), and the resolved [`ServerConfig`].
//!
//! Precedence: flags (and `PAGODA_API_KEY`) over the file over the defaults.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

pub use crate::flag_values::{
    DtypeArg, GemmDtypeArg, LoadFormatArg, ReasoningParserArg, SchedulingPolicy, ToolCallParserArg,
};
use crate::metrics::MetricsPrefix;

/// What `pagoda serve` serves when no `--model` is given.
pub const DEFAULT_MODEL: &str = "models/SmolLM2-135M-Instruct.Q4_1.gguf";

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read the config file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("invalid config file {path}: {source}")]
    Parse { path: PathBuf, source: Box<toml::de::Error> },
    #[error("invalid value for {flag}: {message}")]
    Invalid { flag: &'static str, message: String },
}

fn invalid(flag: &'static str, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid { flag, message: message.into() }
}

/// A duration flag in seconds: finite and not negative.
fn seconds(flag: &'static str, value: f64) -> Result<Duration, ConfigError> {
    Duration::try_from_secs_f64(value)
        .map_err(|_| invalid(flag, format!("expected a number of seconds, got {value}")))
}

/// `cpu`, `cuda` or `cuda:N`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum DeviceArg {
    #[default]
    Cpu,
    Cuda(usize),
}

/// The step token budget when none is given. On the CPU a step's time grows with its tokens,
/// so a 2048-token prefill chunk stalls every running decode for seconds. Measured at 32
/// streams, 512 tokens lost no throughput, halved TTFT p50 and the longest stall, and cost
/// decodes some TPOT (benches/reports/2026-11-25-step-token-budget-cpu.md).
pub fn default_max_num_batched_tokens(device: DeviceArg) -> usize {
    match device {
        DeviceArg::Cpu => 512,
        DeviceArg::Cuda(_) => 2048,
    }
}

impl std::str::FromStr for DeviceArg {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "cpu" => Ok(DeviceArg::Cpu),
            "cuda" | "gpu" => Ok(DeviceArg::Cuda(0)),
            other => other
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(DeviceArg::Cuda)
                .ok_or_else(|| format!("expected cpu, cuda or cuda:N, got {s:?}")),
        }
    }
}

impl std::fmt::Display for DeviceArg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceArg::Cpu => f.write_str("cpu"),
            DeviceArg::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

impl<'de> Deserialize<'de> for DeviceArg {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?.parse().map_err(serde::de::Error::custom)
    }
}

/// A byte count: an integer, or a number with a unit (`512MiB`, `2GiB`, `1.5GB`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteSize(pub u64);

impl std::str::FromStr for ByteSize {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim();
        let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let num: f64 =
            num.parse().map_err(|_| format!("expected a size like 1073741824 or 1GiB, got {s:?}"))?;
        let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 1.0,
            "k" | "kb" => 1e3,
            "m" | "mb" => 1e6,
            "g" | "gb" => 1e9,
            "ki" | "kib" => 1024.0,
            "mi" | "mib" => 1024.0 * 1024.0,
            "gi" | "gib" => 1024.0 * 1024.0 * 1024.0,
            "ti" | "tib" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
            u => return Err(format!("unknown size unit {u:?} in {s:?}")),
        };
        Ok(ByteSize((num * mult) as u64))
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Int(u64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Int(n) => Ok(ByteSize(n)),
            Raw::Text(s) => s.parse().map_err(serde::de::Error::custom),
        }
    }
}

/// Flags of `pagoda serve`. Every field is optional so that the config file can supply it.
#[derive(Debug, Clone, Default, clap::Args, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ServeArgs {
    /// Model to serve: a GGUF file, a Hugging Face model directory (config.json + safetensors),
    /// or, with --load-format dummy, a config.json shape file. [default: models/SmolLM2-135M-Instruct.Q4_1.gguf]
    #[arg(long, value_name = "PATH")]
    pub model: Option<String>,
    /// Hugging Face cache for `--model ORG/NAME` or `ORG/NAME/FILE.gguf`. [default: $HF_HOME]
    #[arg(long, value_name = "DIR")]
    pub download_dir: Option<PathBuf>,
    /// Tokenizer: a GGUF file, or a Hugging Face directory with tokenizer.json. [default: the model]
    #[arg(long, value_name = "PATH")]
    pub tokenizer: Option<String>,
    /// Name(s) clients use in the `model` field. [default: a GGUF file's stem, else the --model argument]
    #[arg(long, value_name = "NAME", num_args = 1..)]
    pub served_model_name: Option<Vec<String>>,
    /// How to read the weights.
    #[arg(long, value_enum)]
    pub load_format: Option<LoadFormatArg>,
    /// Jinja chat template file, replacing the model's own.
    #[arg(long, value_name = "FILE")]
    pub chat_template: Option<PathBuf>,
    /// How the model writes tool calls. [default: detected from the chat template; `generic`
    /// when the template knows no tools]
    #[arg(long, value_enum)]
    pub tool_call_parser: Option<ToolCallParserArg>,
    /// Split the model's reasoning (`<think>...</think>`) into `reasoning_content`. [default: none]
    #[arg(long, value_enum)]
    pub reasoning_parser: Option<ReasoningParserArg>,
    /// Address to listen on. [default: 127.0.0.1]
    #[arg(long)]
    pub host: Option<String>,
    /// Port to listen on; 0 picks a free one. [default: 8000]
    #[arg(long)]
    pub port: Option<u16>,
    /// Longest prompt plus completion, in tokens. [default: the model's context length, capped by
    /// what the KV cache holds]
    #[arg(long)]
    pub max_model_len: Option<usize>,
    /// Most sequences in one engine step. [default: 256]
    #[arg(long)]
    pub max_num_seqs: Option<usize>,
    /// Token budget of one engine step (prefill chunks plus decodes). [default: 512 on the CPU,
    /// 2048 on CUDA]
    #[arg(long)]
    pub max_num_batched_tokens: Option<usize>,
    /// Requests allowed to wait for admission; beyond that a request gets 429. [default: 1024]
    #[arg(long)]
    pub max_waiting_requests: Option<usize>,
    /// How waiting requests are ordered: `fcfs`, or `priority` (the request's `priority` field,
    /// lower first). [default: fcfs]
    #[arg(long, value_enum)]
    pub scheduling_policy: Option<SchedulingPolicy>,
    /// Tokens per KV-cache block. [default: 16]
    #[arg(long)]
    pub block_size: Option<usize>,
    /// KV-cache size, e.g. 2GiB or 536870912. [default: 1GiB on the CPU; on a GPU, sized by
    /// --gpu-memory-utilization]
    #[arg(long, value_name = "BYTES")]
    pub kv_cache_memory: Option<ByteSize>,
    /// Fraction of GPU memory Pagoda may use, in (0, 1]: the KV cache gets what is left of it
    /// after the weights, everything else in use and the peak of a profiling step at
    /// --max-num-batched-tokens. Unless --kv-cache-memory is given. [default: 0.9]
    #[arg(long)]
    pub gpu_memory_utilization: Option<f64>,
    /// Use exactly this many KV blocks, ignoring the memory settings.
    #[arg(long)]
    pub num_gpu_blocks_override: Option<usize>,
    /// Reuse KV blocks of identical prompt prefixes (on by default).
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub enable_prefix_caching: Option<bool>,
    /// Turn prefix caching off.
    #[arg(long, conflicts_with = "enable_prefix_caching")]
    #[serde(skip)]
    pub no_enable_prefix_caching: bool,
    /// Compute dtype.
    #[arg(long, value_enum)]
    pub dtype: Option<DtypeArg>,
    /// KV-cache storage dtype; auto: float16 when computing in float32 (as llama.cpp), else
    /// the compute dtype. [default: auto]
    #[arg(long, value_enum)]
    pub kv_cache_dtype: Option<DtypeArg>,
    /// CPU, GGUF models: what steps of more than 16 tokens (prefill chunks, large decode
    /// batches) multiply weights and activations in, summing in float32 either way. auto:
    /// bfloat16 on CPUs with AVX512-BF16 (twice the throughput), else float32 (exact), and on
    /// CPUs with AVX512-VNNI steps of up to 16 tokens multiply the weights' codes by
    /// activations rounded to 16 bits per block of 32 (faster than the exact blocks, one kernel
    /// for a speculative step's positions); where the CPU has both, a start-up timing on the
    /// model's own weight runs every step on that int16 kernel when it beats bfloat16 by 1.15x.
    /// float32 and bfloat16 keep exact activations for the small steps; int8 and int16 run at
    /// every step size (int8: llama.cpp's 8-bit activations). [default: auto]
    #[arg(long, value_enum)]
    pub cpu_gemm_dtype: Option<GemmDtypeArg>,
    /// Every step runs the same kernels whatever its size, so a request's tokens and logprobs
    /// are bit-identical however it is batched: alone or beside others, cached or not, chunked,
    /// preempted or speculated (docs/numerics.md). CPU (float32): with auto, the int16 kernel on
    /// CPUs with AVX512-VNNI, else the exact f32 block kernel, or the --cpu-gemm-dtype named.
    /// CUDA (bfloat16/float16): our skinny matmul at every step, attention per token.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub batch_invariant: Option<bool>,
    /// Speculative decoding, as JSON in vLLM's shape: `{"method": "ngram",
    /// "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2,
    /// "disable_by_batch_size": 4}`, or `"method": "suffix"` (proposals also from recent
    /// requests' outputs; `suffix_decoding_max_tree_depth`, `_max_cached_requests`,
    /// `_max_spec_factor`, `_min_token_prob`), or `"method": "draft_model", "model": "self",
    /// "num_draft_layers": N` (the model's first N layers draft), or `"method": "draft_model",
    /// "model": PATH` (a smaller model with the same vocabulary drafts, with its own KV cache
    /// sharing the target's blocks). Outputs keep the target model's distribution;
    /// greedy and seeded ones stay the same tokens. `disable_by_batch_size` defaults to 4 on the
    /// CPU and 32 on CUDA. [default: off]
    #[arg(long, value_name = "JSON")]
    pub speculative_config: Option<String>,
    /// Dequantize GGUF weights to --dtype instead of running quantized matmuls.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub dequantize: Option<bool>,
    /// cpu, cuda or cuda:N. [default: cpu]
    #[arg(long, value_name = "DEVICE")]
    pub device: Option<DeviceArg>,
    /// Require `Authorization: Bearer KEY` on /v1/*, /tokenize and /detokenize.
    #[arg(long, env = "PAGODA_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// CORS origins allowed to call the API; `*` for any. [default: *]
    #[arg(long, value_name = "ORIGIN", num_args = 1..)]
    pub allowed_origins: Option<Vec<String>>,
    /// Namespace of the Prometheus metrics: `pagoda:...`, or `vllm:...` for vLLM dashboards.
    #[arg(long, value_enum)]
    pub metrics_prefix: Option<MetricsPrefix>,
    /// Most top logprobs a request may ask for. [default: 20]
    #[arg(long)]
    pub max_logprobs: Option<usize>,
    /// Responses API responses kept in memory for retrieval and `previous_response_id`; the
    /// least recently used goes first. 0 stores none (`store` then defaults to false). [default: 1024]
    #[arg(long, value_name = "N")]
    pub max_stored_responses: Option<usize>,
    /// Largest request body accepted; larger ones get 413. [default: 8MiB]
    #[arg(long, value_name = "BYTES")]
    pub max_request_body_bytes: Option<ByteSize>,
    /// Seconds to let in-flight requests finish after SIGTERM/SIGINT. [default: 30]
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
    /// TOML file with any of these options in kebab-case (e.g. `max-model-len = 2048`).
    #[arg(long, value_name = "FILE")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
}

/// Everything `pagoda serve` needs, resolved and checked.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerConfig {
    pub model: String,
    /// Whether `model` is the built-in default (for the "run `make model`" hint).
    pub model_is_default: bool,
    pub download_dir: Option<PathBuf>,
    pub tokenizer: Option<String>,
    pub served_model_names: Vec<String>,
    pub load_format: LoadFormatArg,
    pub chat_template: Option<PathBuf>,
    pub tool_call_parser: Option<ToolCallParserArg>,
    pub reasoning_parser: Option<ReasoningParserArg>,
    pub host: String,
    pub port: u16,
    pub max_model_len: Option<usize>,
    pub max_num_seqs: usize,
    pub max_num_batched_tokens: usize,
    pub max_waiting_requests: usize,
    pub scheduling_policy: SchedulingPolicy,
    pub block_size: usize,
    pub kv_cache_memory: Option<u64>,
    pub gpu_memory_utilization: f64,
    pub num_gpu_blocks_override: Option<usize>,
    pub enable_prefix_caching: bool,
    pub dtype: DtypeArg,
    pub kv_cache_dtype: DtypeArg,
    pub cpu_gemm_dtype: GemmDtypeArg,
    pub batch_invariant: bool,
    pub speculative: Option<crate::speculative_config::SpeculativeSetting>,
    pub dequantize: Option<bool>,
    pub device: DeviceArg,
    pub api_key: Option<String>,
    pub allowed_origins: Vec<String>,
    pub metrics_prefix: MetricsPrefix,
    pub max_logprobs: usize,
    pub max_request_body_bytes: usize,
    pub max_stored_responses: usize,
    pub shutdown_timeout: Duration,
    pub http_header_read_timeout: Duration,
    pub http_keep_alive_timeout: Duration,
    pub max_connections: usize,
}

/// KV-cache size on the CPU when none is given.
pub const DEFAULT_CPU_KV_CACHE_BYTES: u64 = 1 << 30;

impl ServerConfig {
    /// Reads `--config` (if any) and merges it under the flags.
    pub fn from_args(args: ServeArgs) -> Result<Self, ConfigError> {
        let file = match &args.config {
            Some(path) => Self::read_file(path)?,
            None => ServeArgs::default(),
        };
        Self::merge(args, file)
    }

    fn read_file(path: &Path) -> Result<ServeArgs, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| ConfigError::Read { path: path.to_owned(), source })?;
        toml::from_str(&text)
            .map_err(|source| ConfigError::Parse { path: path.to_owned(), source: Box::new(source) })
    }

    /// `cli` over `file` over the defaults.
    pub fn merge(cli: ServeArgs, file: ServeArgs) -> Result<Self, ConfigError> {
        let enable_prefix_caching = if cli.no_enable_prefix_caching {
            false
        } else {
            cli.enable_prefix_caching.or(file.enable_prefix_caching).unwrap_or(true)
        };
        let given_model = cli.model.or(file.model);
        let model_is_default = given_model.is_none();
        let model = given_model.unwrap_or_else(|| DEFAULT_MODEL.to_owned());
        let served_model_names = cli
            .served_model_name
            .or(file.served_model_name)
            .unwrap_or_else(|| vec![crate::state::default_served_name(&model)]);
        let device = cli.device.or(file.device).unwrap_or_default();
        let config = Self {
            model_is_default,
            download_dir: cli.download_dir.or(file.download_dir),
            tokenizer: cli.tokenizer.or(file.tokenizer),
            served_model_names,
            load_format: cli.load_format.or(file.load_format).unwrap_or_default(),
            chat_template: cli.chat_template.or(file.chat_template),
            tool_call_parser: cli.tool_call_parser.or(file.tool_call_parser),
            reasoning_parser: cli.reasoning_parser.or(file.reasoning_parser),
            host: cli.host.or(file.host).unwrap_or_else(|| "127.0.0.1".to_owned()),
            port: cli.port.or(file.port).unwrap_or(8000),
            max_model_len: cli.max_model_len.or(file.max_model_len),
            max_num_seqs: cli.max_num_seqs.or(file.max_num_seqs).unwrap_or(256),
            max_num_batched_tokens: cli
                .max_num_batched_tokens
                .or(file.max_num_batched_tokens)
                .unwrap_or_else(|| default_max_num_batched_tokens(device)),
            max_waiting_requests: cli.max_waiting_requests.or(file.max_waiting_requests).unwrap_or(1024),
            scheduling_policy: cli.scheduling_policy.or(file.scheduling_policy).unwrap_or_default(),
            block_size: cli.block_size.or(file.block_size).unwrap_or(16),
            kv_cache_memory: cli.kv_cache_memory.or(file.kv_cache_memory).map(|b| b.0),
            gpu_memory_utilization: cli.gpu_memory_utilization.or(file.gpu_memory_utilization).unwrap_or(0.9),
            num_gpu_blocks_override: cli.num_gpu_blocks_override.or(file.num_gpu_blocks_override),
            enable_prefix_caching,
            dtype: cli.dtype.or(file.dtype).unwrap_or_default(),
            kv_cache_dtype: cli.kv_cache_dtype.or(file.kv_cache_dtype).unwrap_or_default(),
            cpu_gemm_dtype: cli.cpu_gemm_dtype.or(file.cpu_gemm_dtype).unwrap_or_default(),
            batch_invariant: cli.batch_invariant.or(file.batch_invariant).unwrap_or(false),
            speculative: cli
                .speculative_config
                .or(file.speculative_config)
                .map(|json| crate::speculative_config::parse(&json, device))
                .transpose()
                .map_err(|message| invalid("--speculative-config", message))?,
            dequantize: cli.dequantize.or(file.dequantize),
            device,
            api_key: cli.api_key.or(file.api_key).filter(|k| !k.is_empty()),
            allowed_origins: cli
                .allowed_origins
                .or(file.allowed_origins)
                .unwrap_or_else(|| vec!["*".to_owned()]),
            metrics_prefix: cli.metrics_prefix.or(file.metrics_prefix).unwrap_or_default(),
            max_logprobs: cli.max_logprobs.or(file.max_logprobs).unwrap_or(20),
            max_request_body_bytes: cli
                .max_request_body_bytes
                .or(file.max_request_body_bytes)
                .map(|b| b.0 as usize)
                .unwrap_or(8 << 20),
            max_stored_responses: cli.max_stored_responses.or(file.max_stored_responses).unwrap_or(1024),
            shutdown_timeout: Duration::from_secs_f64(
                cli.shutdown_timeout.or(file.shutdown_timeout).unwrap_or(30.0).max(0.0),
            ),
            http_header_read_timeout: seconds(
                "--http-header-read-timeout",
                cli.http_header_read_timeout.or(file.http_header_read_timeout).unwrap_or(10.0),
            )?,
            http_keep_alive_timeout: seconds(
                "--http-keep-alive-timeout",
                cli.http_keep_alive_timeout.or(file.http_keep_alive_timeout).unwrap_or(75.0),
            )?,
            max_connections: cli.max_connections.or(file.max_connections).unwrap_or(2048),
            model,
        };
        config.check()?;
        Ok(config)
    }

    fn check(&self) -> Result<(), ConfigError> {
        if self.served_model_names.is_empty() || self.served_model_names.iter().any(|n| n.is_empty()) {
            return Err(invalid("--served-model-name", "names must not be empty"));
        }
        if self.max_model_len == Some(0) {
            return Err(invalid("--max-model-len", "must be at least 1"));
        }
        if self.max_num_seqs == 0 {
            return Err(invalid("--max-num-seqs", "must be at least 1"));
        }
        if self.max_num_batched_tokens == 0 {
            return Err(invalid("--max-num-batched-tokens", "must be at least 1"));
        }
        if !(1..=1024).contains(&self.block_size) {
            return Err(invalid("--block-size", format!("must be in [1, 1024], got {}", self.block_size)));
        }
        if !(self.gpu_memory_utilization > 0.0 && self.gpu_memory_utilization <= 1.0) {
            return Err(invalid(
                "--gpu-memory-utilization",
                format!("must be in (0, 1], got {}", self.gpu_memory_utilization),
            ));
        }
        if self.kv_cache_memory == Some(0) || self.num_gpu_blocks_override == Some(0) {
            return Err(invalid("--kv-cache-memory", "the KV cache needs at least one block"));
        }
        if self.batch_invariant {
            let refused = match (self.device, self.dtype, self.dequantize) {
                (_, _, Some(false)) => {
                    Some("needs dequantized weights (candle's quantized matmul is not covered)")
                }
                (DeviceArg::Cuda(_), DtypeArg::Float32, _) => {
                    Some("computes in bfloat16 or float16 on CUDA (--dtype bfloat16)")
                }
                (DeviceArg::Cuda(_), _, _) => None,
                (_, DtypeArg::Float16 | DtypeArg::Bfloat16, _) => {
                    Some("computes in float32 on the CPU (--dtype float32)")
                }
                _ => None,
            };
            if let Some(why) = refused {
                return Err(invalid("--batch-invariant", why));
            }
        }
        if self.max_request_body_bytes == 0 {
            return Err(invalid("--max-request-body-bytes", "must be at least 1"));
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

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;

//! Wire types of the calls routers make of a worker: SGLang's `/server_info` and `/model_info`
//! (also as `/get_server_info` and `/get_model_info`), `/get_load` in either router's shape, the
//! flush and readiness answers, and vLLM's rendered prompts (`/v1/chat/completions/render`,
//! `/v1/completions/render`).

use serde::Serialize;
use utoipa::ToSchema;

/// The server's identity and capacity, with the fields both routers read: sglang-router takes
/// the model from `served_model_name`/`model_path`; vllm-router's `kv_aware` policy reads
/// `model_id`, `instance_id` and `kv_block_size`, and its PD mode the `vllm_config` block.
/// Every number is a non-negative integer (a router discards the whole answer otherwise).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ServerInfo {
    /// The name requests use (the first served name).
    pub model_id: String,
    pub served_model_name: String,
    /// What `--model` pointed at.
    pub model_path: String,
    /// Unique to this process: the name a router gives its KV events.
    pub instance_id: String,
    pub version: String,
    pub tp_size: usize,
    pub dp_size: usize,
    /// SGLang's names of the instance's part in a prefill/decode split: `prefill` (a
    /// `kv_producer`), `decode` (a `kv_consumer`), or `null` (no split, or `kv_both`).
    pub disaggregation_mode: String,
    /// A prefill instance's KV-transfer port (SGLang's bootstrap port); absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disaggregation_bootstrap_port: Option<u16>,
    /// Tokens per KV block (the prefix cache's granularity).
    pub kv_block_size: usize,
    /// Tokens the KV cache holds.
    pub max_total_tokens: usize,
    /// Tokens one step schedules at most.
    pub max_prefill_tokens: usize,
    /// Sequences one step runs at most.
    pub max_running_requests: usize,
    pub max_model_len: usize,
    pub num_gpu_blocks: usize,
    pub enable_prefix_caching: bool,
    pub kv_cache_dtype: String,
    /// The same in vLLM's config layout.
    pub vllm_config: VllmConfig,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct VllmConfig {
    pub model_config: VllmModelConfig,
    pub cache_config: VllmCacheConfig,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct VllmModelConfig {
    pub model: String,
    pub served_model_name: String,
    pub max_model_len: usize,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct VllmCacheConfig {
    pub block_size: usize,
    pub num_gpu_blocks: usize,
    pub enable_prefix_caching: bool,
    pub cache_dtype: String,
}

/// The served model, as SGLang describes it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ModelInfo {
    pub model_path: String,
    pub tokenizer_path: String,
    pub served_model_name: String,
    /// False for embedding and scoring models.
    pub is_generation: bool,
    /// Hugging Face's `model_type` (`llama`, `qwen3_moe`, ...).
    pub model_type: String,
    /// Hugging Face's architecture class, when the model type has one.
    pub architectures: Vec<String>,
    pub max_model_len: usize,
    /// Whether chat requests can be served; without a template only completions generate.
    pub has_chat_template: bool,
}

/// One data-parallel rank's load, SGLang's `/get_load` entry.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct RankLoad {
    pub dp_rank: usize,
    /// Requests running or waiting.
    pub num_reqs: usize,
    pub num_waiting_reqs: usize,
    /// Tokens held in the KV cache.
    pub num_tokens: usize,
}

/// vllm-router's `/get_load`: requests in flight.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct Load {
    pub load: usize,
}

/// The answer to a prefix-cache flush.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct FlushResponse {
    pub message: String,
    /// Cached blocks the flush dropped.
    pub flushed_blocks: usize,
}

/// `/ready` and `/health_generate`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct StatusResponse {
    pub status: String,
}

/// A prompt as the engine would run it, vLLM's `GenerateRequest`: the rendered token ids and
/// the sampling parameters the request resolves to. A router hashes `token_ids` into the same
/// blocks as the worker's prefix cache.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct RenderedPrompt {
    pub request_id: String,
    pub token_ids: Vec<u32>,
    /// Multimodal features; always null (text models).
    #[schema(value_type = Option<Object>)]
    pub features: Option<serde_json::Value>,
    pub sampling_params: RenderedSampling,
    pub model: String,
    pub stream: bool,
    pub cache_salt: Option<String>,
    pub priority: i64,
}

/// The sampling parameters of a [`RenderedPrompt`], resolved (defaults filled in).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct RenderedSampling {
    pub n: usize,
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: usize,
    pub min_p: f32,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    pub repetition_penalty: f32,
    pub seed: Option<u64>,
    /// `None`: as many as the context allows.
    pub max_tokens: Option<usize>,
    pub min_tokens: usize,
    pub stop_token_ids: Vec<u32>,
    pub ignore_eos: bool,
    pub skip_special_tokens: bool,
    pub logprobs: Option<usize>,
}

impl RenderedSampling {
    pub fn of(params: &crate::validate::GenerationParams) -> Self {
        let s = &params.sampling;
        Self {
            n: params.n,
            temperature: s.temperature,
            top_p: s.top_p,
            top_k: s.top_k,
            min_p: s.min_p,
            presence_penalty: s.presence_penalty,
            frequency_penalty: s.frequency_penalty,
            repetition_penalty: s.repetition_penalty,
            seed: s.seed,
            max_tokens: params.max_tokens,
            min_tokens: params.min_tokens,
            stop_token_ids: params.stop_token_ids.clone(),
            ignore_eos: params.ignore_eos,
            skip_special_tokens: params.skip_special_tokens,
            logprobs: s.logprobs,
        }
    }
}

/// One data-parallel rank's KV-event sockets, as vllm-router's `kv_aware` policy discovers
/// them (`/kv_event_sources` maps the rank, as a string, to this).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct KvEventSourceInfo {
    /// The PUB socket (`tcp://0.0.0.0:PORT` when bound on every address).
    pub endpoint: String,
    pub replay_endpoint: Option<String>,
    pub topic: String,
    pub hwm: usize,
    pub buffer_steps: usize,
    /// `zmq`.
    pub publisher: String,
    /// `msgpack`: vLLM's `KVEventBatch`.
    pub encoding: String,
    pub schema_version: u32,
    pub enable_kv_cache_events: bool,
}

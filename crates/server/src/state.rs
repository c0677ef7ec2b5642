//! What every handler shares: the engine handle, the prompt builder (tokenizer and chat
//! template), the metrics, the served model's identity and the request limits.

use std::sync::Arc;

use pagoda_engine::EngineHandle;
use pagoda_text::{ReasoningFormat, ToolCallFormat};

use crate::embeddings::EmbeddingModel;
use crate::error::ApiError;
use crate::grammars::Grammars;
use crate::metrics::{EngineSnapshot, Metrics};
use crate::prompt::PromptBuilder;
use crate::responses::store::ResponseStore;
use crate::validate::Limits;

/// The name a model is served under when `--served-model-name` is not given: a GGUF file's stem
/// (`SmolLM2-135M-Instruct.Q4_1` for `models/SmolLM2-135M-Instruct.Q4_1.gguf`), else `--model` as
/// given (a hub id, a directory). The `--model` value itself is also accepted in requests.
pub fn default_served_name(model: &str) -> String {
    let path = std::path::Path::new(model);
    match (path.extension().and_then(|e| e.to_str()), path.file_stem().and_then(|s| s.to_str())) {
        (Some(ext), Some(stem)) if ext.eq_ignore_ascii_case("gguf") && !stem.is_empty() => stem.to_owned(),
        _ => model.to_owned(),
    }
}

/// The served model as `/v1/models` shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelInfo {
    /// Names clients may use; the first is the one responses carry.
    pub served_names: Vec<String>,
    /// What `--model` pointed at.
    pub root: String,
    /// Seconds since the epoch at start-up.
    pub created: u64,
    /// The model's architecture (`general.architecture`, or `model_type`).
    pub architecture: String,
    /// Positions the model itself supports (`max_model_len` may be lower).
    pub context_length: usize,
}

impl ModelInfo {
    /// The name to answer with: the requested one if it is served (404 if not), else the first.
    pub fn resolve(&self, requested: Option<&str>) -> Result<String, ApiError> {
        match requested {
            None | Some("") => Ok(self.served_names[0].clone()),
            Some(name) if self.served_names.iter().any(|n| n == name) => Ok(name.to_owned()),
            // The `--model` value as given also names the default model.
            Some(name) if name == self.root => Ok(self.served_names[0].clone()),
            Some(name) => Err(ApiError::ModelNotFound(name.to_owned())),
        }
    }
}

/// The KV-event publisher and its config, for `/kv_event_sources` and the metrics.
#[derive(Debug, Clone)]
pub struct KvEventSource {
    pub publisher: Arc<pagoda_kv_events::KvEventPublisher>,
    pub config: pagoda_kv_events::KvEventsConfig,
}

/// What the worker endpoints a router calls report beyond the engine's config.
#[derive(Debug, Clone)]
pub struct WorkerIdentity {
    /// Unique to this process (routers name its KV events by it).
    pub instance_id: String,
    /// The shape of `/get_load`.
    pub get_load_format: crate::config::GetLoadFormat,
    /// The KV cache's element type, by its vLLM name (`auto`, `bfloat16`, ...).
    pub kv_cache_dtype: String,
    /// Where the prefix cache's changes are published, when they are.
    pub kv_events: Option<KvEventSource>,
}

pub struct AppState {
    pub engine: EngineHandle,
    /// Prefill/decode disaggregation, with `--kv-transfer-config`.
    pub disaggregation: Option<crate::disaggregation::Disaggregation>,
    pub prompts: PromptBuilder,
    pub metrics: Arc<Metrics>,
    pub model: ModelInfo,
    pub limits: Limits,
    /// The model's end-of-sequence ids, a stop condition of every request.
    pub eos_token_ids: Vec<u32>,
    /// Compiles and caches structured-output grammars (built in the background at start-up;
    /// unavailable when the vocabulary cannot be used for them: structured requests get a 400).
    pub grammars: Grammars,
    /// How the model writes tool calls (and whether its template renders tools itself:
    /// every format but `Generic`).
    pub tool_format: ToolCallFormat,
    /// Splits reasoning from content, when configured.
    pub reasoning: Option<ReasoningFormat>,
    /// What a request's hosted tools get (`--hosted-tools`).
    pub hosted_tools: crate::config::HostedToolsPolicy,
    /// The URL prefixes a Responses request's `mcp` tools may name (`--allow-mcp-servers`).
    pub mcp_servers: Vec<String>,
    /// The time limit of one MCP operation (`--mcp-timeout`).
    pub mcp_timeout: std::time::Duration,
    /// Responses API responses kept for retrieval and `previous_response_id`.
    pub responses: ResponseStore,
    /// The embedding model served, when the model embeds rather than generates.
    pub embedding: Option<EmbeddingModel>,
    /// The LoRA adapters served beside the model.
    pub loras: crate::lora::ServedAdapters,
    /// How this server describes itself to routers.
    pub worker: WorkerIdentity,
    /// The dashboard's recent samples of the metrics.
    pub stats: crate::live_stats::StatsHistory,
    /// Request spans for `--otlp-traces-endpoint`.
    pub traces: Option<Arc<crate::traces::RequestTracer>>,
    /// Image inputs: which URLs may be read, the limits, and the model's processor (if any).
    pub media: crate::media::build::MediaState,
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState")
            .field("model", &self.model)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

pub type SharedState = Arc<AppState>;

impl AppState {
    /// The name to answer with and the LoRA adapter to run, for a request's `model`: an
    /// adapter's name picks the adapter, the model's names the base model (404 for others).
    pub fn resolve_model(
        &self,
        requested: Option<&str>,
    ) -> Result<(String, Option<pagoda_engine::LoraId>), ApiError> {
        match requested.and_then(|name| self.loras.get(name)) {
            Some(adapter) => Ok((adapter.name.clone(), Some(adapter.id))),
            None => Ok((self.model.resolve(requested)?, None)),
        }
    }

    /// [`Self::resolve_model`] for the endpoints that do not generate (embeddings, score): an
    /// adapter's name there is a 400 naming `model`.
    pub fn resolve_base_model(&self, requested: Option<&str>) -> Result<String, ApiError> {
        match self.resolve_model(requested)? {
            (name, Some(_)) => Err(ApiError::invalid(
                "model",
                format!("{name} is a LoRA adapter; adapters serve generation (completions, chat), not this endpoint"),
            )),
            (name, None) => Ok(name),
        }
    }

    /// Copies the engine's gauges and counters into the metrics (at scrape time).
    pub fn refresh_engine_metrics(&self) {
        let s = self.engine.stats();
        self.metrics.record_engine(&EngineSnapshot {
            num_running: s.num_running_seqs,
            num_waiting: s.num_waiting_seqs,
            kv_cache_usage: s.kv_usage(),
            num_preemptions: s.num_preemptions,
            prefix_cache_queries: s.prefix_cache_queries,
            prefix_cache_hits: s.prefix_cache_hits,
            spec: s.spec,
        });
        if self.disaggregation.is_some() {
            self.metrics.record_kv_transfer_holds(s.kv_held_blocks, s.kv_expired_holds);
        }
        if let Some(tiers) = self.engine.kv_tier_stats() {
            self.metrics.caches.record_kv_offload(tiers);
        }
        if let Some(cache) = &self.media.encoder_cache {
            let c = cache.snapshot();
            self.metrics.caches.record_encoder_cache(c.hits, c.misses);
        }
        if let Some(kv) = &self.worker.kv_events {
            let stats = kv.publisher.stats();
            let load = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
            self.metrics.record_kv_events(load(&stats.batches), load(&stats.dropped_events));
        }
        if let Some(max_loras) = self.loras.max_loras() {
            let activity = self.engine.lora_activity();
            let names = |ids: &[pagoda_engine::LoraId]| self.loras.names(ids);
            self.metrics.record_lora(max_loras, &names(&activity.running), &names(&activity.waiting));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_names_resolve_or_404() {
        let info = ModelInfo {
            served_names: vec!["a".into(), "b".into()],
            root: "x".into(),
            created: 0,
            architecture: "llama".into(),
            context_length: 8,
        };
        assert_eq!(info.resolve(None).unwrap(), "a");
        assert_eq!(info.resolve(Some("b")).unwrap(), "b");
        assert_eq!(info.resolve(Some("c")), Err(ApiError::ModelNotFound("c".into())));
    }
}

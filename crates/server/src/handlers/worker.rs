//! The calls routers make of a worker: server and model info (SGLang's names, both spellings),
//! `/get_load`, the prefix-cache flush, `/health_generate` and `/ready`. `/health` says the
//! process and its engine are alive; `/ready` says it takes new requests now.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};

use crate::config::GetLoadFormat;
use crate::error::ApiError;
use crate::openai::worker::{
    FlushResponse, KvEventSourceInfo, Load, ModelInfo, RankLoad, ServerInfo, StatusResponse, VllmCacheConfig,
    VllmConfig, VllmModelConfig,
};
use crate::openai::ErrorResponse;
use crate::state::SharedState;

/// How long `/health_generate`'s one-token generation may take, queueing included.
const HEALTH_GENERATE_TIMEOUT: Duration = Duration::from_secs(20);

/// How long one probe's answer serves later `/health_generate` callers: a flood of probes costs
/// at most one generation per interval, never a place in the admission queue each.
const HEALTH_GENERATE_REUSE: Duration = Duration::from_secs(1);

/// The last `/health_generate` probe: when it ended and how it went. Callers take turns on the
/// lock, so those that arrive while a probe runs wait for it and share its answer.
#[derive(Debug, Default)]
pub struct HealthProbe {
    last: tokio::sync::Mutex<Option<(Instant, Result<(), ApiError>)>>,
}

impl HealthProbe {
    /// The answer of a probe that ended within [`HEALTH_GENERATE_REUSE`], else of a new one.
    async fn check(&self, state: &SharedState) -> Result<(), ApiError> {
        let mut last = self.last.lock().await;
        if let Some((ended, result)) =
            last.as_ref().filter(|(ended, _)| ended.elapsed() < HEALTH_GENERATE_REUSE)
        {
            tracing::trace!(age = ?ended.elapsed(), "health probe reused");
            return result.clone();
        }
        let result = tokio::time::timeout(HEALTH_GENERATE_TIMEOUT, generate_one(state))
            .await
            .map_err(|_| {
                ApiError::EngineUnavailable(format!(
                    "no token generated within {} s",
                    HEALTH_GENERATE_TIMEOUT.as_secs()
                ))
            })
            .and_then(|r| r);
        *last = Some((Instant::now(), result.clone()));
        result
    }
}

/// The server's identity and capacity (behind the API key when one is set: it names the
/// model's path and the process).
#[utoipa::path(get, path = "/server_info", tag = "router",
    responses((status = 200, body = ServerInfo), (status = 401, body = ErrorResponse)),
    security((), ("api_key" = [])))]
pub async fn server_info(State(state): State<SharedState>) -> Json<ServerInfo> {
    let ec = state.engine.config();
    let name = state.model.served_names[0].clone();
    Json(ServerInfo {
        model_id: name.clone(),
        served_model_name: name.clone(),
        model_path: state.model.root.clone(),
        instance_id: state.worker.instance_id.clone(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        tp_size: 1,
        dp_size: 1,
        disaggregation_mode: match state.disaggregation.as_ref().map(|pd| pd.config.role) {
            Some(pagoda_kv_transfer::KvRole::KvProducer) => "prefill",
            Some(pagoda_kv_transfer::KvRole::KvConsumer) => "decode",
            _ => "null",
        }
        .to_owned(),
        disaggregation_bootstrap_port: state
            .disaggregation
            .as_ref()
            .filter(|pd| pd.config.role.produces())
            .map(|pd| pd.config.listen_port),
        kv_block_size: ec.block_size,
        max_total_tokens: ec.cache_capacity_tokens(),
        max_prefill_tokens: ec.max_num_batched_tokens,
        max_running_requests: ec.max_num_seqs,
        max_model_len: ec.max_model_len,
        num_gpu_blocks: ec.num_blocks,
        enable_prefix_caching: ec.enable_prefix_caching,
        kv_cache_dtype: state.worker.kv_cache_dtype.clone(),
        vllm_config: VllmConfig {
            model_config: VllmModelConfig {
                model: state.model.root.clone(),
                served_model_name: name,
                max_model_len: ec.max_model_len,
            },
            cache_config: VllmCacheConfig {
                block_size: ec.block_size,
                num_gpu_blocks: ec.num_blocks,
                enable_prefix_caching: ec.enable_prefix_caching,
                cache_dtype: state.worker.kv_cache_dtype.clone(),
            },
        },
    })
}

/// Hugging Face's `model_type` and architecture class for our architecture name.
fn hf_names(architecture: &str) -> (&str, Option<&'static str>) {
    match architecture {
        "llama" => ("llama", Some("LlamaForCausalLM")),
        "mistral" => ("mistral", Some("MistralForCausalLM")),
        "mixtral" => ("mixtral", Some("MixtralForCausalLM")),
        "qwen2" => ("qwen2", Some("Qwen2ForCausalLM")),
        "qwen3" => ("qwen3", Some("Qwen3ForCausalLM")),
        "qwen3moe" => ("qwen3_moe", Some("Qwen3MoeForCausalLM")),
        "phi3" => ("phi3", Some("Phi3ForCausalLM")),
        "gemma2" => ("gemma2", Some("Gemma2ForCausalLM")),
        "gemma3" => ("gemma3_text", Some("Gemma3ForCausalLM")),
        "smollm3" | "smollm" => ("smollm3", Some("SmolLM3ForCausalLM")),
        "bert" => ("bert", Some("BertModel")),
        other => (other, None),
    }
}

/// The served model.
#[utoipa::path(get, path = "/model_info", tag = "router", responses((status = 200, body = ModelInfo)))]
pub async fn model_info(State(state): State<SharedState>) -> Json<ModelInfo> {
    let (model_type, class) = hf_names(&state.model.architecture);
    Json(ModelInfo {
        model_path: state.model.root.clone(),
        tokenizer_path: state.model.root.clone(),
        served_model_name: state.model.served_names[0].clone(),
        is_generation: state.embedding.is_none(),
        model_type: model_type.to_owned(),
        architectures: class.map(str::to_owned).into_iter().collect(),
        max_model_len: state.limits.max_model_len,
        has_chat_template: state.prompts.has_chat_template(),
    })
}

/// The load in the shape `--get-load-format` names: SGLang's list of ranks, or vllm-router's
/// `{"load": N}`.
#[utoipa::path(get, path = "/get_load", tag = "router",
    responses((status = 200, description = "`[RankLoad]` (sglang) or `Load` (vllm-router)", body = Vec<RankLoad>)))]
pub async fn get_load(State(state): State<SharedState>) -> Response {
    let s = state.engine.stats();
    // Submissions not yet taken by a step are waiting too; the gauges lag by up to one step.
    let waiting = s.num_waiting_seqs.max(state.engine.num_pending());
    let in_flight = s.num_running_seqs + waiting;
    match state.worker.get_load_format {
        GetLoadFormat::Sglang => Json(vec![RankLoad {
            dp_rank: 0,
            num_reqs: in_flight,
            num_waiting_reqs: waiting,
            num_tokens: s.kv_blocks_used * state.engine.config().block_size,
        }])
        .into_response(),
        GetLoadFormat::VllmRouter => Json(Load { load: in_flight }).into_response(),
    }
}

/// Empties the prefix cache (SGLang's `/flush_cache`, vLLM's `/reset_prefix_cache`); 409 while
/// requests are in flight, whose blocks are still their KV.
#[utoipa::path(post, path = "/flush_cache", tag = "router",
    responses((status = 200, body = FlushResponse), (status = 409, body = ErrorResponse),
              (status = 503, body = ErrorResponse)))]
pub async fn flush_cache(State(state): State<SharedState>) -> Result<Json<FlushResponse>, ApiError> {
    let flushed_blocks = state.engine.flush_prefix_cache().await?;
    tracing::info!(flushed_blocks, "prefix cache flushed");
    Ok(Json(FlushResponse { message: "Cache flushed.".to_owned(), flushed_blocks }))
}

/// 200 once one greedy token has been generated end to end (the engine runs, not only lives),
/// by a probe shared with the callers of the last second; 503 otherwise. Embedding models
/// answer with their engine's health. Behind the API key unless `--health-generate-without-key`.
#[utoipa::path(get, path = "/health_generate", tag = "router",
    responses((status = 200, body = StatusResponse), (status = 401, body = ErrorResponse),
              (status = 503, body = ErrorResponse)),
    security((), ("api_key" = [])))]
pub async fn health_generate(
    State(state): State<SharedState>,
    Extension(probe): Extension<Arc<HealthProbe>>,
) -> Result<Json<StatusResponse>, ApiError> {
    state.engine.health()?;
    if state.embedding.is_none() {
        probe.check(&state).await?;
    }
    Ok(Json(StatusResponse { status: "ok".to_owned() }))
}

/// One greedy token after the tokens of a space (with the tokenizer's special tokens, so the
/// prompt is never empty where the model has a BOS).
async fn generate_one(state: &SharedState) -> Result<(), ApiError> {
    let prompt = state.prompts.encode(" ".to_owned(), true).await?;
    let prompt = if prompt.is_empty() { vec![0] } else { prompt };
    let params = pagoda_engine::SamplingParams { temperature: 0.0, ..Default::default() };
    let request = pagoda_engine::Request::new(state.engine.next_request_id(), prompt, Arc::new(params))
        .with_max_tokens(1);
    let mut stream = state.engine.submit(request)?;
    while let Some(event) = stream.recv().await {
        if let Some(reason) = event.finished.as_ref().filter(|r| r.is_failure()) {
            return Err(ApiError::EngineUnavailable(format!("{reason:?}")));
        }
        if event.is_last() {
            return Ok(());
        }
    }
    Err(ApiError::EngineUnavailable("the request ended without an answer".to_owned()))
}

/// Where this server publishes its KV events, by data-parallel rank (one rank; `{}` when it
/// publishes none).
#[utoipa::path(get, path = "/kv_event_sources", tag = "router",
    responses((status = 200, body = std::collections::BTreeMap<String, KvEventSourceInfo>)))]
pub async fn kv_event_sources(
    State(state): State<SharedState>,
) -> Json<std::collections::BTreeMap<String, KvEventSourceInfo>> {
    let sources = state.worker.kv_events.as_ref().map(|kv| {
        let ends = kv.publisher.endpoints();
        let info = KvEventSourceInfo {
            endpoint: ends.publish.clone(),
            replay_endpoint: ends.replay.clone(),
            topic: kv.config.topic.clone(),
            hwm: kv.config.hwm,
            buffer_steps: kv.config.buffer_steps,
            publisher: "zmq".to_owned(),
            encoding: "msgpack".to_owned(),
            schema_version: 1,
            enable_kv_cache_events: true,
        };
        ("0".to_owned(), info)
    });
    Json(sources.into_iter().collect())
}

/// 200 while the server takes new requests; 503 once its engine has stopped, while it sleeps
/// (sleep mode) or once it is shutting down. (`/health` only says the process is alive.)
#[utoipa::path(get, path = "/ready", tag = "ops",
    responses((status = 200, body = StatusResponse), (status = 503, body = ErrorResponse)))]
pub async fn ready(State(state): State<SharedState>) -> Result<Json<StatusResponse>, ApiError> {
    if state.engine.shutdown().is_triggered() {
        return Err(ApiError::ShuttingDown);
    }
    state.engine.health()?;
    if let Some(asleep) = crate::sleep::not_ready(&state) {
        return Err(asleep);
    }
    Ok(Json(StatusResponse { status: "ready".to_owned() }))
}

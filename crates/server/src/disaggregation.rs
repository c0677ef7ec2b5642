//! Prefill/decode disaggregation in the request path (`--kv-transfer-config`): which requests
//! hold their prompt's KV for a decode instance, which fetch it from a prefill instance first,
//! and the transfer listener a prefill instance runs. The flows and the wire are
//! `pagoda_kv_transfer`'s; the blocks are the engine's (`pagoda_engine::kv_transfer`).
//!
//! A fetch that fails or times out costs only time: the decode instance computes the prompt
//! itself (vLLM's `kv_load_failure_policy: "recompute"`), unless the config says `"fail"`.
//! Received pages enter the prefix cache every request shares, so a decode instance fetches
//! only from the producers its config trusts (`allowed_producers`, loopback by default), and
//! takes no more blocks than the request's prompt has, nor a value that is not finite.

use std::sync::Arc;
use std::time::Instant;

use serde_json::Value;

use pagoda_engine::{EngineHandle, HeldExport, KvHold, Request, SpeculativeMethod};
use pagoda_kv_transfer::config::FailurePolicy;
use pagoda_kv_transfer::directive::{self, Bootstrap};
use pagoda_kv_transfer::tcp::{serve, TcpConnector};
use pagoda_kv_transfer::{
    BoxFuture, Directive, FetchSpec, KvConnector, KvSource, KvTransferConfig, TransferSource,
};

use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::prompt::TokenizedPrompt;
use crate::state::AppState;
use crate::validate::GenerationParams;

/// This instance's part in a disaggregated pair.
pub struct Disaggregation {
    pub config: KvTransferConfig,
    /// Names this instance in the parameters a prefill answers with.
    pub engine_id: String,
    /// The model as both instances must name it: the last component of `--model` (a file or
    /// directory name, or a hub id's name), so that two hosts with the model at different
    /// paths still agree.
    pub model: String,
    connector: Arc<dyn KvConnector>,
}

/// The disaggregation fields of a chat or completions request, as they came.
#[derive(Debug, Clone, Copy, Default)]
pub struct PdFields<'a> {
    pub kv_transfer_params: Option<&'a Value>,
    pub bootstrap_host: Option<&'a Value>,
    pub bootstrap_port: Option<&'a Value>,
    pub bootstrap_room: Option<&'a Value>,
    pub stream: bool,
}

/// Why the server cannot take part as configured.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("--kv-transfer-config: {0}")]
    Unsupported(String),
    #[error("--kv-transfer-config: cannot listen for KV transfers on {addr}: {source}")]
    Bind { addr: String, source: std::io::Error },
}

impl Disaggregation {
    /// Checks the engine can hold and import prefixes and, on a prefill instance, starts the
    /// transfer listener.
    pub async fn start(
        config: KvTransferConfig,
        engine: &EngineHandle,
        metrics: Arc<Metrics>,
        instance_id: &str,
        model_path: &str,
    ) -> Result<Self, StartError> {
        let ec = engine.config();
        if !ec.enable_prefix_caching {
            return Err(StartError::Unsupported(
                "transferred KV enters through the prefix cache; run without --no-enable-prefix-caching"
                    .into(),
            ));
        }
        if ec.kv_groups.len() != 1 {
            return Err(StartError::Unsupported(
                "this model has sliding-window layers, whose KV cannot be transferred yet".into(),
            ));
        }
        if engine.kv_page_layout().is_none() {
            return Err(StartError::Unsupported(
                "this model keeps no KV pages that could be transferred".into(),
            ));
        }
        if config.role.consumes()
            && ec.speculative.as_ref().is_some_and(|s| matches!(s.method, SpeculativeMethod::DraftModel))
        {
            return Err(StartError::Unsupported(
                "a separate draft model keeps a KV cache of its own, which is not transferred; \
                 use another speculative method on a decode instance"
                    .into(),
            ));
        }
        if config.role.produces() {
            let addr = format!("{}:{}", config.listen_host, config.listen_port);
            let listener = tokio::net::TcpListener::bind(&addr)
                .await
                .map_err(|source| StartError::Bind { addr: addr.clone(), source })?;
            let source =
                Arc::new(EngineSource { engine: engine.clone(), metrics, model: model_name(model_path) });
            let max_wait = config.transfer_timeout.max(config.hold_timeout);
            tokio::spawn(serve(listener, source, max_wait, config.idle_timeout));
            tracing::info!(%addr, role = config.role.name(), "KV transfer listener started");
        }
        let engine_id = config.engine_id.clone().unwrap_or_else(|| instance_id.to_owned());
        Ok(Self { config, engine_id, model: model_name(model_path), connector: Arc::new(TcpConnector) })
    }
}

/// The last component of a model path or hub id.
fn model_name(path: &str) -> String {
    path.trim_end_matches('/').rsplit('/').next().unwrap_or(path).to_owned()
}

/// A transfer key no outsider can guess (holds are taken by key).
fn unguessable(n: u64) -> String {
    use std::hash::BuildHasher;
    let state = std::collections::hash_map::RandomState::new();
    format!("{:016x}{:016x}", state.hash_one(n), state.hash_one(!n))
}

/// Reads what a request asks of disaggregation; a field this instance cannot honour is a 400
/// naming it.
pub fn directive_of(
    pd: Option<&Disaggregation>,
    fields: PdFields<'_>,
    request_key: u64,
) -> Result<Option<Directive>, ApiError> {
    let params = match fields.kv_transfer_params {
        None | Some(Value::Null) => None,
        Some(Value::Object(map)) => Some(map),
        Some(_) => return Err(ApiError::invalid("kv_transfer_params", "must be an object")),
    };
    let bootstrap = Bootstrap {
        host: scalar(fields.bootstrap_host, "bootstrap_host", |v| v.as_str().map(str::to_owned))?,
        port: scalar(fields.bootstrap_port, "bootstrap_port", |v| {
            v.as_u64().and_then(|p| u16::try_from(p).ok())
        })?,
        room: scalar(fields.bootstrap_room, "bootstrap_room", Value::as_u64)?,
    };
    let config = pd.map(|pd| &pd.config);
    let key = match pd {
        Some(pd) => format!("{}-{}", pd.engine_id, unguessable(request_key)),
        None => request_key.to_string(),
    };
    let found = directive::directive(config, params, &bootstrap, &key)
        .map_err(|e| ApiError::invalid(e.field, e.message))?;
    if fields.stream && matches!(found, Some(Directive::Hold { params: true, .. })) {
        return Err(ApiError::invalid(
            "kv_transfer_params.do_remote_decode",
            "a prefill for remote decoding answers with kv_transfer_params, so it takes stream: false",
        ));
    }
    Ok(found)
}

/// One value of an SGLang bootstrap field. A router sends arrays for `n > 1` or several
/// prompts, which one transfer per request cannot serve.
fn scalar<T>(
    value: Option<&Value>,
    field: &str,
    read: impl Fn(&Value) -> Option<T>,
) -> Result<Option<T>, ApiError> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(_)) => Err(ApiError::invalid(
            field,
            "a disaggregated request takes one prompt and n = 1 (one bootstrap value, not a list)",
        )),
        Some(v) => {
            read(v).map(Some).ok_or_else(|| ApiError::invalid(field, format!("{v} is not a valid {field}")))
        }
    }
}

/// Sets up the engine requests of a call for its directive: a hold on the (single) prompt's
/// request, limited to the prefill's one token where the flow asks only for the prefill.
pub fn apply_hold(
    pd: Option<&Disaggregation>,
    directive: Option<&Directive>,
    requests: &mut [Request],
) -> Result<Option<Value>, ApiError> {
    let (Some(pd), Some(Directive::Hold { key, params, prefill_only })) = (pd, directive) else {
        return Ok(None);
    };
    let [request] = requests else {
        return Err(ApiError::invalid("prompt", "a disaggregated request takes one prompt"));
    };
    request.kv_hold = Some(KvHold { key: key.clone(), timeout: pd.config.hold_timeout });
    if *prefill_only {
        request.max_tokens = Some(1);
        request.stop.min_tokens = 0;
    }
    Ok(params.then(|| directive::hold_params(&pd.config, &pd.engine_id, key)))
}

/// On a decode instance, brings the prompt's KV from the prefill instance into the prefix
/// cache before the request is submitted. Failures fall back to computing the prompt here,
/// unless the config asks to fail the request instead.
pub async fn fetch_prompt_kv(
    state: &AppState,
    params: &GenerationParams,
    prompts: &[TokenizedPrompt],
) -> Result<(), ApiError> {
    let (Some(pd), Some(Directive::Fetch(source))) = (&state.disaggregation, &params.kv_transfer) else {
        return Ok(());
    };
    let (engine, metrics, lora) = (&state.engine, &state.metrics, params.lora);
    let [prompt] = prompts else {
        return Err(ApiError::invalid("prompt", "a disaggregated request takes one prompt"));
    };
    let started = Instant::now();
    let result = fetch_and_import(engine, metrics, pd, source, &prompt.token_ids, lora).await;
    match result {
        Ok(tokens) => {
            tracing::debug!(
                key = source.key,
                tokens,
                ms = started.elapsed().as_millis() as u64,
                "prompt KV fetched"
            );
            Ok(())
        }
        Err((reason, message)) => {
            metrics.record_kv_transfer_failure(reason);
            tracing::warn!(
                key = source.key,
                reason,
                message,
                "prompt KV not fetched; computing the prompt here"
            );
            match pd.config.failure_policy {
                FailurePolicy::Recompute => Ok(()),
                FailurePolicy::Fail => Err(ApiError::EngineUnavailable(format!(
                    "the prompt's KV could not be fetched from the prefill instance ({message})"
                ))),
            }
        }
    }
}

/// Fetches and imports; returns the leading prompt tokens now cached. The error is a metric
/// label (one of a fixed few, never a host) and a message.
async fn fetch_and_import(
    engine: &EngineHandle,
    metrics: &Metrics,
    pd: &Disaggregation,
    source: &TransferSource,
    prompt: &[u32],
    lora: Option<pagoda_engine::LoraId>,
) -> Result<usize, (&'static str, String)> {
    let deadline = Instant::now() + pd.config.transfer_timeout;
    let layout = engine.kv_page_layout().ok_or(("refused", "this cache cannot be transferred".to_owned()))?;
    let bs = layout.block_size.max(1);
    // The prompt's whole blocks are all a producer can rightly send: the transport refuses a
    // larger answer before it allocates for it.
    let spec = FetchSpec {
        source: source.clone(),
        model: pd.model.clone(),
        layout: layout.clone(),
        max_blocks: prompt.len() / bs,
    };
    let mut prefix = pd.connector.fetch(&spec, deadline).await.map_err(|e| (e.kind(), e.to_string()))?;
    // Checked again whatever the transport: what enters the cache is this cache's layout,
    // whole blocks covered by their pages, no more than the prompt has.
    if prefix.layout != *layout {
        return Err(("refused", "the pages' layout is not this cache's".into()));
    }
    prefix.check().map_err(|e| ("invalid", e))?;
    if prefix.num_blocks() > spec.max_blocks {
        let msg = format!("{} blocks for a prompt of {} whole blocks", prefix.num_blocks(), spec.max_blocks);
        return Err(("invalid", msg));
    }
    metrics.record_kv_transfer_received(prefix.num_blocks());
    if prefix.num_blocks() == 0 {
        // A prompt shorter than one block: nothing whole to move, and nothing failed.
        return Ok(0);
    }
    // Only blocks of this very prompt are imported: a prefill that tokenized differently
    // (another template or model) contributes the blocks the two agree on.
    let agree = prefix.token_ids.iter().zip(prompt).take_while(|(a, b)| a == b).count();
    prefix.truncate_blocks(agree / bs);
    if prefix.num_blocks() == 0 {
        return Err(("mismatch", "the prefill instance's prompt differs from this one's".into()));
    }
    // A value that is not finite would turn the logits of every later request hitting these
    // blocks into NaN. Read off the async workers: a long prompt's pages are many megabytes.
    let (prefix, checked) = tokio::task::spawn_blocking(move || {
        let checked = prefix.layout.check_values(&prefix.pages);
        (prefix, checked)
    })
    .await
    .map_err(|e| ("invalid", format!("checking the pages failed: {e}")))?;
    checked.map_err(|e| ("invalid", e))?;
    engine.import_prefix(prefix, lora).await.map_err(|e| ("import", e.to_string()))
}

/// What the transfer listener serves: the engine's held prefixes, taken on read.
struct EngineSource {
    engine: EngineHandle,
    metrics: Arc<Metrics>,
    model: String,
}

impl KvSource for EngineSource {
    fn take<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<HeldExport, String>> {
        Box::pin(async move {
            let taken = self.engine.export_held(key).await.map_err(|e| e.to_string())?;
            if let HeldExport::Ready(prefix) = &taken {
                self.metrics.record_kv_transfer_sent(prefix.num_blocks());
            }
            Ok(taken)
        })
    }

    fn model(&self) -> &str {
        &self.model
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn instance(role: &str) -> Disaggregation {
        let config = KvTransferConfig::parse(&format!(r#"{{"kv_role": "{role}"}}"#)).unwrap();
        Disaggregation {
            config,
            engine_id: "p0".into(),
            model: "m".into(),
            connector: Arc::new(TcpConnector),
        }
    }

    fn param_of(err: ApiError) -> String {
        match err {
            ApiError::InvalidParam(p) => p.param.unwrap_or_default(),
            other => panic!("not a 400: {other}"),
        }
    }

    #[test]
    fn fields_become_directives_or_name_what_is_refused() {
        let producer = instance("kv_producer");
        let ask = json!({"do_remote_decode": true, "remote_host": null});
        let fields = PdFields { kv_transfer_params: Some(&ask), ..Default::default() };
        let found = directive_of(Some(&producer), fields, 7).unwrap();
        let Some(Directive::Hold { key, params: true, prefill_only: false }) = found else {
            panic!("{found:?}")
        };
        assert!(key.starts_with("req-p0-") && key.len() == "req-p0-".len() + 32, "{key}");
        let again = directive_of(Some(&producer), fields, 7).unwrap();
        assert_ne!(
            again,
            Some(Directive::Hold { key, params: true, prefill_only: false }),
            "keys are not guessable"
        );
        assert_eq!(model_name("/models/SmolLM2.gguf"), "SmolLM2.gguf");
        assert_eq!(model_name("HuggingFaceTB/SmolLM2-135M-Instruct/"), "SmolLM2-135M-Instruct");
        // The answer comes in the response body, so the prefill cannot be streamed.
        let streamed = PdFields { stream: true, ..fields };
        assert_eq!(
            param_of(directive_of(Some(&producer), streamed, 7).unwrap_err()),
            "kv_transfer_params.do_remote_decode"
        );
        // sglang-router sends lists for n > 1 and batches.
        let rooms = json!([1, 2]);
        let listed = PdFields { bootstrap_room: Some(&rooms), ..Default::default() };
        assert_eq!(param_of(directive_of(Some(&producer), listed, 1).unwrap_err()), "bootstrap_room");
        let text = json!("7");
        let wrong = PdFields { bootstrap_port: Some(&text), ..Default::default() };
        assert_eq!(param_of(directive_of(Some(&producer), wrong, 1).unwrap_err()), "bootstrap_port");
        let not_object = json!([true]);
        let odd = PdFields { kv_transfer_params: Some(&not_object), ..Default::default() };
        assert_eq!(param_of(directive_of(Some(&producer), odd, 1).unwrap_err()), "kv_transfer_params");
        assert_eq!(param_of(directive_of(None, fields, 1).unwrap_err()), "kv_transfer_params");
        // A room above 2^53 (as sglang-router draws them) survives exactly.
        let room = json!(9221738690343631381u64);
        let host = json!("127.0.0.1");
        let sglang =
            PdFields { bootstrap_room: Some(&room), bootstrap_host: Some(&host), ..Default::default() };
        let Some(Directive::Fetch(source)) = directive_of(Some(&instance("kv_consumer")), sglang, 1).unwrap()
        else {
            panic!("no fetch")
        };
        assert_eq!(source.key, "room-9221738690343631381");
    }
}

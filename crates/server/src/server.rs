//! `pagoda serve` from start to exit: load the model and tokenizer, size the KV cache, start the
//! engine, bind, serve, and on the shutdown signal stop accepting, let in-flight requests finish
//! for up to the grace period, then stop the engine. A second signal during that drain aborts
//! the requests in flight (streams end with `finish_reason: "abort"`) and exits at once, as
//! Ctrl-C twice does elsewhere. Every start-up stage logs one line with its time. The signals
//! are an argument, so tests drive them.

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use axum::Router;
use futures_util::{Stream, StreamExt};
use pagoda_engine::{EngineObserver, Shutdown};
use pagoda_kv_events::{AdapterNames, KvEventPublisher, KvEventsConfig};
use pagoda_runtime::{LoadedRuntime, OptionsError, RuntimeError};
use pagoda_text::ChatTemplate;
use tokio::net::TcpListener;

use crate::app::{router, router_with_batch, HttpOptions};
use crate::config::{SchedulingPolicy, ServerConfig};
use crate::grammars::Grammars;
use crate::listen::{self, ConnectionLimits};
use crate::metrics::Metrics;
use crate::prompt::PromptBuilder;
use crate::responses::store::ResponseStore;
use crate::state::{AppState, ModelInfo, SharedState};
use crate::validate::Limits;

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Options(#[from] OptionsError),
    #[error("--chat-template {path}: {message}")]
    ChatTemplate { path: PathBuf, message: String },
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error("setting up metrics failed: {0}")]
    Metrics(#[from] prometheus::Error),
    #[error("cannot listen on {addr}: {source}")]
    Bind { addr: String, source: std::io::Error },
    #[error("the server failed: {0}")]
    Io(#[from] std::io::Error),
    #[error("start-up task failed: {0}")]
    Join(String),
    #[error(transparent)]
    KvEvents(#[from] pagoda_kv_events::PublisherError),
    #[error(transparent)]
    KvTransfer(#[from] crate::disaggregation::StartError),
    #[error(transparent)]
    Traces(#[from] crate::traces::TraceError),
    #[error("--batch-dir: {0}")]
    Batch(#[from] crate::batch::store::StoreError),
    #[error("image inputs: {0}")]
    Media(String),
}

fn load_chat_template(path: &Path, runtime: &LoadedRuntime) -> Result<ChatTemplate, ServeError> {
    let err = |message: String| ServeError::ChatTemplate { path: path.to_owned(), message };
    let source = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
    let t = &runtime.tokenizer;
    ChatTemplate::new(&source, t.bos_token(), t.eos_token()).map_err(|e| err(e.to_string()))
}

/// Feeds engine steps into the metrics, and the prefix cache's changes to the KV-event
/// publisher.
struct StepObserver {
    metrics: Arc<Metrics>,
    kv_events: Option<Arc<KvEventPublisher>>,
}

impl EngineObserver for StepObserver {
    fn on_step(&self, stats: &pagoda_engine::StepStats) {
        self.metrics.observe_iteration(stats.num_prefill_tokens + stats.num_decode_tokens);
    }

    fn on_cache_events(&self, events: Vec<pagoda_engine::CacheEvent>) {
        if let Some(publisher) = &self.kv_events {
            publisher.submit(events);
        }
    }
}

/// Starts the KV-event publisher `config` asks for; a `*` endpoint binds `host` (`--host`).
/// Adapters are named through `state` once it exists (their names and paths go into their
/// blocks' hashes).
fn start_kv_events(
    config: &KvEventsConfig,
    host: &str,
    engine: &pagoda_engine::EngineConfig,
    state: Arc<OnceLock<Weak<AppState>>>,
) -> Result<KvEventPublisher, ServeError> {
    let windows = (0..engine.kv_groups.len()).map(|g| engine.kv_groups.window(g)).collect();
    let adapters: AdapterNames = Arc::new(move |id| {
        let state = state.get()?.upgrade()?;
        let adapter = state.loras.list().into_iter().find(|a| a.id == id)?;
        Some((adapter.name, adapter.path.display().to_string()))
    });
    let publisher = KvEventPublisher::start(config, host, engine.block_size, windows, adapters)?;
    let ends = publisher.endpoints();
    tracing::info!(publish = %ends.publish, replay = ?ends.replay, topic = %config.topic, "publishing KV events");
    Ok(publisher)
}

/// A loaded, bound server that has not started serving yet.
pub struct Server {
    state: SharedState,
    router: Router,
    listener: TcpListener,
    engine_thread: JoinHandle<()>,
    engine_shutdown: Shutdown,
    grace: Duration,
    connections: ConnectionLimits,
    started: Instant,
}

/// How long aborted requests get to send their last event before their connections are cut.
const ABORT_DRAIN: Duration = Duration::from_secs(2);

/// How long the exit waits for the last request spans to reach the OTLP endpoint.
const TRACE_FLUSH: Duration = Duration::from_secs(5);

impl Server {
    /// Loads everything `config` names (on the blocking pool), starts the engine and binds.
    pub async fn build(config: &ServerConfig) -> Result<Self, ServeError> {
        let started = Instant::now();
        let mut options = config.engine.runtime_options()?;
        options.kv_cache_events = config.kv_events.is_some();
        options.encoder_cache_bytes = Some(config.encoder_cache_bytes);
        tracing::info!(
            model = %config.engine.model,
            device = %config.engine.device,
            dtype = ?options.dtype,
            "loading the model"
        );
        let chat_template_path = config.chat_template.clone();
        let runtime = tokio::task::spawn_blocking(move || -> Result<LoadedRuntime, ServeError> {
            let mut runtime = LoadedRuntime::load(&options)?;
            if let Some(path) = chat_template_path {
                runtime.chat_template = Some(Arc::new(load_chat_template(&path, &runtime)?));
            }
            Ok(runtime)
        })
        .await
        .map_err(|e| ServeError::Join(e.to_string()))??;

        let model_config = runtime.model_config.clone();
        let t = runtime.times;
        tracing::info!(
            seconds = format!("{:.2}", t.model_seconds),
            arch = %model_config.architecture,
            layers = model_config.num_layers,
            vocab = model_config.vocab_size,
            context = model_config.max_position_embeddings,
            "model loaded"
        );
        tracing::info!(
            seconds = format!("{:.2}", t.tokenizer_seconds),
            vocab = runtime.tokenizer.vocab_size(),
            chat_template = runtime.chat_template.is_some(),
            "tokenizer loaded"
        );
        let ec = runtime.engine_config.clone();
        tracing::info!(
            seconds = format!("{:.2}", t.cache_seconds),
            blocks = ec.num_blocks,
            block_size = ec.block_size,
            tokens = ec.cache_capacity_tokens(),
            gib = format!("{:.3}", runtime.kv_cache_bytes as f64 / (1u64 << 30) as f64),
            dtype = ?runtime.kv_cache_dtype,
            "KV cache allocated"
        );
        tracing::info!(
            "kv cache: {} pages, {:.3} GiB, {:.0} bytes/token at max_model_len {} with windows vs {} full",
            ec.num_blocks,
            runtime.kv_cache_bytes as f64 / (1u64 << 30) as f64,
            runtime.kv_bytes_per_token,
            ec.max_model_len,
            model_config.kv_bytes_per_token(runtime.kv_cache_dtype.size_in_bytes()),
        );

        let model_name = config.served_model_names[0].clone();
        let metrics = Arc::new(Metrics::new(config.metrics_prefix, &model_name, ec.max_model_len)?);
        let kv_cache_dtype = pagoda_runtime::dtype_name(runtime.kv_cache_dtype);
        metrics.record_cache_config(ec.block_size, ec.num_blocks, kv_cache_dtype, ec.enable_prefix_caching);
        let vocab_size = model_config.vocab_size;
        let state_cell = Arc::new(OnceLock::new());
        let kv_events = match &config.kv_events {
            Some(kv) => Some(Arc::new(start_kv_events(
                kv,
                &config.host,
                &runtime.engine_config,
                Arc::clone(&state_cell),
            )?)),
            None => None,
        };
        let engine_shutdown = Shutdown::new();
        let engine_started = Instant::now();
        let observer = StepObserver { metrics: Arc::clone(&metrics), kv_events: kv_events.clone() };
        let running = runtime.start(Arc::new(observer), engine_shutdown.clone())?;
        tracing::info!(
            seconds = format!("{:.2}", engine_started.elapsed().as_secs_f64()),
            max_model_len = ec.max_model_len,
            max_num_seqs = ec.max_num_seqs,
            max_num_batched_tokens = ec.max_num_batched_tokens,
            max_waiting_requests = ec.max_waiting_requests,
            prefix_caching = ec.enable_prefix_caching,
            speculative = ?ec.speculative,
            "engine started"
        );

        // Built on a thread of its own (a large vocabulary's token trie takes a second or two):
        // serving starts at once, and the first structured request waits for it.
        let grammars = Grammars::build_in_background(Arc::clone(&running.tokenizer));
        let tool_format = config.tool_call_parser.unwrap_or_else(|| {
            running
                .chat_template
                .as_ref()
                .and_then(|t| pagoda_text::ToolCallFormat::detect(t.source()))
                .unwrap_or(pagoda_text::ToolCallFormat::Generic)
        });
        let reasoning = config.reasoning_parser;
        tracing::info!(
            tool_call_parser = tool_format.name(),
            reasoning_parser = reasoning.map(|r| r.name()),
            "tool calling ready"
        );
        let embedding = running.pooling.map(|pooling| crate::embeddings::EmbeddingModel {
            dimensions: running.model_config.hidden_size,
            pooling,
        });
        let created = crate::openai::unix_now();
        let instance_id = format!("pagoda-{}-{created}", std::process::id());
        let disaggregation = match config.kv_transfer.clone() {
            Some(kv) => Some(
                crate::disaggregation::Disaggregation::start(
                    kv,
                    &running.engine,
                    Arc::clone(&metrics),
                    &instance_id,
                    &config.engine.model,
                )
                .await?,
            ),
            None => None,
        };
        let traces = match &config.otlp_traces {
            Some(settings) => {
                let tracer = crate::traces::RequestTracer::start(settings, "pagoda")?;
                tracing::info!(endpoint = settings.endpoint, protocol = ?settings.protocol, "exporting request traces");
                Some(Arc::new(tracer))
            }
            None => None,
        };
        let vision = running.vision.as_deref().map(crate::media::VisionProcessor::of_spec);
        if let Some(v) = &vision {
            tracing::info!(
                image_token = v.image_token,
                tokens_per_tile = v.config.image_seq_len,
                "the model takes images"
            );
        }
        let takes_images = vision.is_some();
        let mut media =
            crate::media::build::MediaState::new(config.media.clone(), vision).map_err(ServeError::Media)?;
        media.encoder_cache = takes_images.then(|| Arc::clone(&running.encoder_cache));
        let state = Arc::new(AppState {
            disaggregation,
            worker: crate::state::WorkerIdentity {
                instance_id,
                get_load_format: config.get_load_format,
                kv_cache_dtype: kv_cache_dtype.to_owned(),
                kv_events: kv_events
                    .zip(config.kv_events.clone())
                    .map(|(publisher, config)| crate::state::KvEventSource { publisher, config }),
            },
            embedding,
            loras: crate::lora::ServedAdapters::new(
                running.loras.clone(),
                config.engine.lora.clone(),
                running.lora_reader.clone(),
            ),
            responses: ResponseStore::new(config.max_stored_responses)
                .with_byte_limits(config.stored_responses_memory, config.max_stored_response_bytes),
            grammars,
            tool_format,
            reasoning,
            hosted_tools: config.hosted_tools,
            mcp_servers: config.allow_mcp_servers.clone(),
            mcp_timeout: config.mcp_timeout,
            stats: Default::default(),
            media,
            traces: traces.clone(),
            eos_token_ids: running.tokenizer.eos_token_ids().to_vec(),
            prompts: PromptBuilder::new(
                Arc::clone(&running.tokenizer),
                running.chat_template.clone(),
                vocab_size,
                ec.max_model_len,
            ),
            engine: running.engine,
            metrics,
            model: ModelInfo {
                served_names: config.served_model_names.clone(),
                root: config.engine.model.clone(),
                created,
                architecture: running.model_config.architecture.clone(),
                context_length: running.model_config.max_position_embeddings,
            },
            limits: Limits {
                vocab_size,
                max_model_len: ec.max_model_len,
                max_logprobs: config.max_logprobs,
                max_num_seqs: ec.max_num_seqs,
                priority_scheduling: config.scheduling_policy == SchedulingPolicy::Priority,
            },
        });
        let _ = state_cell.set(Arc::downgrade(&state));
        let http = HttpOptions {
            api_key: config.api_key.clone(),
            allowed_origins: config.allowed_origins.clone(),
            allowed_methods: config.allowed_methods.clone(),
            allowed_headers: config.allowed_headers.clone(),
            health_generate_without_key: config.health_generate_without_key,
            max_request_body_bytes: config.max_request_body_bytes,
            web_ui: config.web_ui,
            enable_sleep_mode: config.enable_sleep_mode,
        };
        // Batch lines run through the API in-process, past the key check: their batch passed it.
        let batch = match &config.batch_dir {
            Some(dir) => {
                let inner = router(Arc::clone(&state), &HttpOptions { api_key: None, ..http.clone() });
                let in_flight = (ec.max_num_seqs / 2).max(1);
                let priority = config.scheduling_policy == SchedulingPolicy::Priority;
                match crate::batch::BatchService::start(dir, inner, priority, in_flight) {
                    Ok(b) => Some(b),
                    Err(e) => {
                        engine_shutdown.trigger();
                        return Err(e.into());
                    }
                }
            }
            None => None,
        };
        let router = router_with_batch(Arc::clone(&state), &http, batch);
        let addr = config.bind_addr();
        let listener = match TcpListener::bind(&addr).await {
            Ok(l) => l,
            Err(source) => {
                engine_shutdown.trigger();
                return Err(ServeError::Bind { addr, source });
            }
        };
        Ok(Self {
            state,
            router,
            listener,
            engine_thread: running.engine_thread,
            engine_shutdown,
            grace: config.shutdown_timeout,
            connections: ConnectionLimits {
                header_read_timeout: config.http_header_read_timeout,
                keep_alive_timeout: config.http_keep_alive_timeout,
                max_connections: config.max_connections,
            },
            started,
        })
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// The API as it serves, to call in-process (`pagoda run-batch`).
    pub fn router(&self) -> Router {
        self.router.clone()
    }

    pub fn state(&self) -> &SharedState {
        &self.state
    }

    /// Serves until `shutdown` resolves, then drains (up to the grace period) and stops the
    /// engine.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send + 'static) -> Result<(), ServeError> {
        self.run_with_signals(futures_util::stream::once(shutdown)).await
    }

    /// Serves until the first item of `signals` (or its end), then drains up to the grace
    /// period; a second item aborts the requests still in flight and returns at once.
    pub async fn run_with_signals(
        self,
        signals: impl Stream<Item = ()> + Send + 'static,
    ) -> Result<(), ServeError> {
        let Server { state, router, listener, engine_thread, engine_shutdown, grace, connections, started } =
            self;
        let addr = listener.local_addr()?;
        tracing::info!(
            seconds = format!("{:.2}", started.elapsed().as_secs_f64()),
            model = %state.model.served_names[0],
            "ready on http://{addr}"
        );
        let sampler = tokio::spawn(crate::live_stats::run_sampler(Arc::downgrade(&state)));
        // Fused: a source that has ended is polled again for the second signal.
        let mut signals = Box::pin(signals.fuse());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let mut serve = Box::pin(listen::serve(listener, router, connections, async move {
            let _ = stopped.await;
        }));
        // Aborting ends every stream with finish_reason "abort"; their connections then close.
        let abort = |serve| {
            engine_shutdown.trigger();
            tokio::time::timeout(ABORT_DRAIN, serve)
        };
        tokio::select! {
            () = &mut serve => {}
            _ = signals.next() => {
                let _ = stop.send(());
                tracing::info!(
                    grace_seconds = grace.as_secs_f64(),
                    in_flight = state.engine.stats().num_requests,
                    "shutting down: no new connections; finishing requests in flight (signal again to abort them)"
                );
                tokio::select! {
                    drained = tokio::time::timeout(grace, &mut serve) => {
                        if drained.is_err() {
                            tracing::warn!("grace period over: aborting the requests still in flight");
                            let _ = abort(&mut serve).await;
                        }
                    }
                    Some(()) = signals.next() => {
                        tracing::warn!(
                            in_flight = state.engine.stats().num_requests,
                            "second signal: aborting the requests in flight"
                        );
                        let _ = abort(&mut serve).await;
                    }
                }
            }
        }
        // Whatever is still open is cut off here.
        drop(serve);
        sampler.abort();
        engine_shutdown.trigger();
        tokio::task::spawn_blocking(move || engine_thread.join())
            .await
            .map_err(|e| ServeError::Join(e.to_string()))?
            .map_err(|_| ServeError::Join("the engine thread panicked".into()))?;
        if let Some(traces) = &state.traces {
            traces.shutdown(TRACE_FLUSH).await;
        }
        tracing::info!("shut down");
        Ok(())
    }
}

/// Each SIGINT (Ctrl-C) or SIGTERM, for [`Server::run_with_signals`]: the first drains, the
/// second aborts.
pub fn shutdown_signals() -> std::io::Result<impl Stream<Item = ()> + Send + 'static> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let signals = (signal(SignalKind::interrupt())?, signal(SignalKind::terminate())?);
        Ok(futures_util::stream::unfold(signals, |(mut int, mut term)| async move {
            tokio::select! {
                Some(()) = int.recv() => tracing::info!("SIGINT received"),
                Some(()) = term.recv() => tracing::info!("SIGTERM received"),
                else => return None,
            }
            Some(((), (int, term)))
        }))
    }
    #[cfg(not(unix))]
    {
        Ok(futures_util::stream::unfold((), |()| async {
            tokio::signal::ctrl_c().await.ok()?;
            tracing::info!("Ctrl-C received");
            Some(((), ()))
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ServeArgs;

    #[test]
    fn a_missing_default_model_says_how_to_fetch_it() {
        let mut config = ServerConfig::from_args(ServeArgs::default()).unwrap();
        config.engine.model = "definitely/not/here.gguf".into();
        let err = config.engine.runtime_options().unwrap_err();
        assert!(matches!(err, OptionsError::DefaultModelMissing(_)));
        assert!(err.to_string().contains("make model"), "{err}");
        config.engine.model_is_default = false;
        // An absolute path cannot be a hub id, so no download is tried.
        config.engine.model = "/definitely/not/here.gguf".into();
        assert!(matches!(config.engine.runtime_options(), Err(OptionsError::ModelMissing(_))));
    }
}

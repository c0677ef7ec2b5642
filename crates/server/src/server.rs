//! `pagoda serve` from start to exit: load the model and tokenizer, size the KV cache, start the
//! engine, bind, serve, and on the shutdown signal stop accepting, let in-flight requests finish
//! for up to the grace period, then stop the engine. A second signal during that drain aborts
//! the requests in flight (streams end with `finish_reason: "abort"`) and exits at once, as
//! Ctrl-C twice does elsewhere. Every start-up stage logs one line with its time. The signals
//! are an argument, so tests drive them.

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use axum::Router;
use candle_core::{DType, Device};
use futures_util::{Stream, StreamExt};
use pagoda_engine::{EngineObserver, Shutdown};
use pagoda_models::{LoadFormat, PanelPrecision, SmallSteps};
use pagoda_text::ChatTemplate;
use tokio::net::TcpListener;

use crate::app::{router, HttpOptions};
use crate::config::{
    DeviceArg, DtypeArg, GemmDtypeArg, LoadFormatArg, SchedulingPolicy, ServerConfig,
    DEFAULT_CPU_KV_CACHE_BYTES,
};
use crate::grammars::Grammars;
use crate::hub;
use crate::listen::{self, ConnectionLimits};
use crate::metrics::Metrics;
use crate::prompt::PromptBuilder;
use crate::responses::store::ResponseStore;
use crate::runtime::{LoadedRuntime, RuntimeError, RuntimeOptions};
use crate::state::{AppState, ModelInfo, SharedState};
use crate::validate::Limits;

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("the default model {0} is missing: run `make model` to fetch it, or pass --model PATH")]
    DefaultModelMissing(String),
    #[error(
        "--model {0}: no such file or directory (pass a GGUF file, a Hugging Face model directory, a hub id ORG/NAME or ORG/NAME/FILE.gguf, or with \
         --load-format dummy a config.json)"
    )]
    ModelMissing(String),
    #[error("--speculative-config: draft model {0}: no such file or directory (pass a GGUF file, a Hugging Face model directory or a hub id)")]
    DraftModelMissing(String),
    #[error("--device {device}: {message}")]
    Device { device: DeviceArg, message: String },
    #[error("--chat-template {path}: {message}")]
    ChatTemplate { path: PathBuf, message: String },
    #[error("--model {0}")]
    Hub(#[from] hub::HubError),
    #[error("--speculative-config: draft model {0}")]
    DraftHub(hub::HubError),
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
}

fn device(arg: DeviceArg) -> Result<Device, ServeError> {
    match arg {
        DeviceArg::Cpu => Ok(Device::Cpu),
        DeviceArg::Cuda(n) => {
            Device::new_cuda(n).map_err(|e| ServeError::Device { device: arg, message: e.to_string() })
        }
    }
}

fn dtype(arg: DtypeArg, device: &Device) -> DType {
    match arg {
        DtypeArg::Auto if device.is_cpu() => DType::F32,
        DtypeArg::Auto => DType::BF16,
        DtypeArg::Float32 => DType::F32,
        DtypeArg::Float16 => DType::F16,
        DtypeArg::Bfloat16 => DType::BF16,
    }
}

/// The KV cache's dtype for a model computing in `compute`: `auto` stores f32 models' K/V as
/// f16 (as llama.cpp does), which halves the cache's memory and the attention's reads.
fn kv_cache_dtype(arg: DtypeArg, compute: DType) -> DType {
    match arg {
        DtypeArg::Auto if compute == DType::F32 => DType::F16,
        DtypeArg::Auto => compute,
        other => dtype(other, &Device::Cpu),
    }
}

/// `auto` is [`PanelPrecision::auto_float`]. With `batch_invariant` it is the int16 kernel at
/// every step size on CPUs with AVX512-VNNI (on an AMD VM as fast as the default at 1 and 32
/// streams, where the exact f32 blocks ran 32 streams at half speed:
/// benches/reports/2026-11-26-batch-invariant-int16-amd.md), else f32, the exact block kernel at
/// every step size (bfloat16 panels would halve the one-stream speed:
/// benches/reports/2026-11-25-batch-invariant-cpu-intel.md). `int8` and `int16` need
/// AVX512-VNNI: without it the portable loops are slower than `auto`'s kernels.
fn panel_precision(arg: GemmDtypeArg, batch_invariant: bool) -> PanelPrecision {
    match arg {
        GemmDtypeArg::Auto if batch_invariant && PanelPrecision::cpu_has_native_int8() => {
            PanelPrecision::Int16
        }
        GemmDtypeArg::Auto if batch_invariant => PanelPrecision::F32,
        GemmDtypeArg::Int8 if PanelPrecision::cpu_has_native_int8() => PanelPrecision::Int8,
        GemmDtypeArg::Int16 if PanelPrecision::cpu_has_native_int8() => PanelPrecision::Int16,
        GemmDtypeArg::Int8 | GemmDtypeArg::Int16 => {
            let name = format!("{arg:?}").to_lowercase();
            tracing::warn!("--cpu-gemm-dtype {name} needs AVX512-VNNI, which this CPU lacks; using auto");
            panel_precision(GemmDtypeArg::Auto, batch_invariant)
        }
        GemmDtypeArg::Auto => PanelPrecision::auto_float(),
        GemmDtypeArg::Float32 => PanelPrecision::F32,
        GemmDtypeArg::Bfloat16 => PanelPrecision::Bf16,
    }
}

/// `auto` on CPUs with AVX512-VNNI runs steps of up to 16 tokens on int16 panels, faster than
/// the exact blocks from one token on and one kernel for a speculative step's positions
/// (benches/reports/2026-11-25-int16-small-steps-amd.md); the named float dtypes and
/// `--batch-invariant` keep the blocks.
fn small_steps(arg: GemmDtypeArg, batch_invariant: bool) -> SmallSteps {
    if arg == GemmDtypeArg::Auto && !batch_invariant && PanelPrecision::cpu_has_native_int8() {
        SmallSteps::Int16
    } else {
        SmallSteps::Blocks
    }
}

/// `auto` without `--batch-invariant` times bfloat16 against int16 panels for the large steps
/// (where the CPU runs both; `pagoda_models::large_steps`); a named dtype is what it says.
fn choose_large_steps(arg: GemmDtypeArg, batch_invariant: bool) -> bool {
    arg == GemmDtypeArg::Auto && !batch_invariant
}

/// The runtime options `config` asks for.
pub fn runtime_options(config: &ServerConfig) -> Result<RuntimeOptions, ServeError> {
    // The default model is fetched by `make model`, never from the hub.
    if config.model_is_default && !Path::new(&config.model).exists() {
        return Err(ServeError::DefaultModelMissing(config.model.clone()));
    }
    let model = local_or_hub(Path::new(&config.model), config)?
        .ok_or_else(|| ServeError::ModelMissing(config.model.clone()))?;
    let device = device(config.device)?;
    let mut options = RuntimeOptions::new(model);
    options.tokenizer = config.tokenizer.as_ref().map(PathBuf::from);
    options.load_format = match config.load_format {
        LoadFormatArg::Auto => LoadFormat::Auto,
        LoadFormatArg::Gguf => LoadFormat::Gguf,
        LoadFormatArg::Safetensors => LoadFormat::Safetensors,
        LoadFormatArg::Dummy => LoadFormat::Dummy,
    };
    options.dequantize = config.dequantize;
    options.dtype = dtype(config.dtype, &device);
    options.kv_cache_dtype = kv_cache_dtype(config.kv_cache_dtype, options.dtype);
    options.panel_precision = panel_precision(config.cpu_gemm_dtype, config.batch_invariant);
    options.small_steps = small_steps(config.cpu_gemm_dtype, config.batch_invariant);
    options.choose_large_steps = choose_large_steps(config.cpu_gemm_dtype, config.batch_invariant);
    options.batch_invariant = config.batch_invariant;
    options.device = device;
    options.block_size = config.block_size;
    options.kv_cache_bytes = config.kv_cache_memory.unwrap_or(DEFAULT_CPU_KV_CACHE_BYTES);
    options.num_blocks = config.num_gpu_blocks_override;
    // An explicit --kv-cache-memory wins; otherwise a GPU sizes its cache from free memory.
    options.gpu_memory_utilization =
        config.kv_cache_memory.is_none().then_some(config.gpu_memory_utilization);
    options.max_model_len = config.max_model_len;
    options.max_num_seqs = config.max_num_seqs;
    options.max_num_batched_tokens = config.max_num_batched_tokens;
    options.max_waiting_requests = config.max_waiting_requests;
    options.enable_prefix_caching = config.enable_prefix_caching;
    if let Some(setting) = &config.speculative {
        options.speculative = Some(setting.config);
        if let Some(path) = &setting.draft_model {
            let found = local_or_hub(path, config).map_err(ServeError::DraftHub)?;
            let found = found.ok_or_else(|| ServeError::DraftModelMissing(path.display().to_string()))?;
            options.draft_model = Some(found);
        }
    }
    Ok(options)
}

/// `path` when it exists, else the hub's copy when it names a hub id; `None` when it is
/// neither.
fn local_or_hub(path: &Path, config: &ServerConfig) -> Result<Option<PathBuf>, hub::HubError> {
    if path.exists() {
        return Ok(Some(path.to_path_buf()));
    }
    match path.to_str().filter(|id| hub::is_hub_id(id)) {
        Some(id) => hub::resolve(id, config.download_dir.as_deref(), hub::offline_from_env()).map(Some),
        None => Ok(None),
    }
}

fn load_chat_template(path: &Path, runtime: &LoadedRuntime) -> Result<ChatTemplate, ServeError> {
    let err = |message: String| ServeError::ChatTemplate { path: path.to_owned(), message };
    let source = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
    let t = &runtime.tokenizer;
    ChatTemplate::new(&source, t.bos_token(), t.eos_token()).map_err(|e| err(e.to_string()))
}

/// Feeds engine steps into the metrics.
struct StepMetrics(Arc<Metrics>);

impl EngineObserver for StepMetrics {
    fn on_step(&self, stats: &pagoda_engine::StepStats) {
        self.0.observe_iteration(stats.num_prefill_tokens + stats.num_decode_tokens);
    }
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

impl Server {
    /// Loads everything `config` names (on the blocking pool), starts the engine and binds.
    pub async fn build(config: &ServerConfig) -> Result<Self, ServeError> {
        let started = Instant::now();
        let options = runtime_options(config)?;
        tracing::info!(
            model = %config.model,
            device = %config.device,
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

        let model_config = runtime.runner.model().config().clone();
        let t = runtime.times;
        tracing::info!(
            seconds = format!("{:.2}", t.model_seconds),
            arch = %model_config.architecture,
            layers = model_config.num_layers,
            vocab = model_config.vocab_size,
            context = model_config.max_position_embeddings,
            "model loaded"
        );
        if let Some(choice) = runtime.large_steps {
            let timing = choice.timing;
            tracing::info!(
                rows = timing.rows,
                bf16_ms = format!("{:.3}", timing.bf16_seconds * 1e3),
                int16_ms = format!("{:.3}", timing.int16_seconds * 1e3),
                chosen = ?choice.precision,
                "CPU kernel for steps over 16 tokens, timed on one of the model's weights (--cpu-gemm-dtype pins one)"
            );
        }
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
        let vocab_size = model_config.vocab_size;
        let engine_shutdown = Shutdown::new();
        let engine_started = Instant::now();
        let running = runtime.start(Arc::new(StepMetrics(Arc::clone(&metrics))), engine_shutdown.clone())?;
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
        let tool_format = config.tool_call_parser.map(|p| p.format()).unwrap_or_else(|| {
            running
                .chat_template
                .as_ref()
                .and_then(|t| pagoda_text::ToolCallFormat::detect(t.source()))
                .unwrap_or(pagoda_text::ToolCallFormat::Generic)
        });
        let reasoning = config.reasoning_parser.map(|p| p.format());
        tracing::info!(
            tool_call_parser = tool_format.name(),
            reasoning_parser = reasoning.map(|r| r.name()),
            "tool calling ready"
        );
        let state = Arc::new(AppState {
            responses: ResponseStore::new(config.max_stored_responses),
            grammars,
            tool_format,
            reasoning,
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
                root: config.model.clone(),
                created: crate::openai::unix_now(),
                architecture: running.model_config.architecture.clone(),
                context_length: running.model_config.max_position_embeddings,
            },
            limits: Limits {
                vocab_size,
                max_model_len: ec.max_model_len,
                max_logprobs: config.max_logprobs,
                priority_scheduling: config.scheduling_policy == SchedulingPolicy::Priority,
            },
        });
        let http = HttpOptions {
            api_key: config.api_key.clone(),
            allowed_origins: config.allowed_origins.clone(),
            max_request_body_bytes: config.max_request_body_bytes,
        };
        let router = router(Arc::clone(&state), &http);
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
        engine_shutdown.trigger();
        tokio::task::spawn_blocking(move || engine_thread.join())
            .await
            .map_err(|e| ServeError::Join(e.to_string()))?
            .map_err(|_| ServeError::Join("the engine thread panicked".into()))?;
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
        let mut config = ServerConfig::merge(ServeArgs::default(), ServeArgs::default()).unwrap();
        config.model = "definitely/not/here.gguf".into();
        let err = runtime_options(&config).unwrap_err();
        assert!(matches!(err, ServeError::DefaultModelMissing(_)));
        assert!(err.to_string().contains("make model"), "{err}");
        config.model_is_default = false;
        // An absolute path cannot be a hub id, so no download is tried.
        config.model = "/definitely/not/here.gguf".into();
        assert!(matches!(runtime_options(&config), Err(ServeError::ModelMissing(_))));
    }

    #[test]
    fn cpu_gemm_dtype_auto_uses_bf16_only_where_the_cpu_multiplies_it() {
        for invariant in [false, true] {
            assert_eq!(panel_precision(GemmDtypeArg::Float32, invariant), PanelPrecision::F32);
            assert_eq!(panel_precision(GemmDtypeArg::Bfloat16, invariant), PanelPrecision::Bf16);
        }
        let native =
            if PanelPrecision::cpu_has_native_bf16() { PanelPrecision::Bf16 } else { PanelPrecision::F32 };
        assert_eq!(panel_precision(GemmDtypeArg::Auto, false), native);
        let int8 = if PanelPrecision::cpu_has_native_int8() { PanelPrecision::Int8 } else { native };
        assert_eq!(panel_precision(GemmDtypeArg::Int8, false), int8);
        // Batch-invariant, auto is the int16 kernel where the CPU has VNNI, else the exact
        // block kernel (f32), which is also int8's and int16's fallback.
        let vnni = PanelPrecision::cpu_has_native_int8();
        let invariant_auto = if vnni { PanelPrecision::Int16 } else { PanelPrecision::F32 };
        assert_eq!(panel_precision(GemmDtypeArg::Auto, true), invariant_auto);
        let int8 = if vnni { PanelPrecision::Int8 } else { PanelPrecision::F32 };
        assert_eq!(panel_precision(GemmDtypeArg::Int8, true), int8);
        assert_eq!(panel_precision(GemmDtypeArg::Int16, true), invariant_auto);
        // Small steps: int16 panels under auto where the CPU has VNNI, else the exact blocks.
        assert_eq!(small_steps(GemmDtypeArg::Auto, false) == SmallSteps::Int16, vnni);
        for arg in [GemmDtypeArg::Float32, GemmDtypeArg::Bfloat16, GemmDtypeArg::Int8, GemmDtypeArg::Int16] {
            assert_eq!(small_steps(arg, false), SmallSteps::Blocks);
        }
        assert_eq!(small_steps(GemmDtypeArg::Auto, true), SmallSteps::Blocks);
        // Only auto, and not batch-invariant, times the large-step kernels.
        assert!(choose_large_steps(GemmDtypeArg::Auto, false));
        assert!(!choose_large_steps(GemmDtypeArg::Auto, true));
        for arg in [GemmDtypeArg::Float32, GemmDtypeArg::Bfloat16, GemmDtypeArg::Int8, GemmDtypeArg::Int16] {
            assert!(!choose_large_steps(arg, false));
        }
    }

    #[test]
    fn kv_cache_dtype_auto_stores_f32_models_as_f16_and_follows_other_dtypes() {
        assert_eq!(kv_cache_dtype(DtypeArg::Auto, DType::F32), DType::F16);
        assert_eq!(kv_cache_dtype(DtypeArg::Auto, DType::BF16), DType::BF16);
        assert_eq!(kv_cache_dtype(DtypeArg::Float32, DType::F32), DType::F32);
        assert_eq!(kv_cache_dtype(DtypeArg::Bfloat16, DType::F32), DType::BF16);
    }
}

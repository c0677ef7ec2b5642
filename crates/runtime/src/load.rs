//! Assembles what serving needs from [`RuntimeOptions`]: the kernel plan, the model runner with
//! its KV cache (sized from the budget or from device memory), the tokenizer and chat template,
//! and the engine thread over them. Used by `pagoda serve`, `pagoda generate` and the offline
//! benchmark, so all three run the same path.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use candle_core::DType;
use pagoda_engine::stats::EngineObserver;
use pagoda_engine::{Engine, EngineConfig, EngineError, EngineHandle, LoraId, Shutdown};
use pagoda_models::kv_sizing::{size_from_device_memory, GpuKvBudget, KvSizingError, ProfileShape};
use pagoda_models::lora::AdapterReader;
use pagoda_models::{
    load_model, KvCache, KvLayout, LoadFormat, LoadOptions, Model, ModelConfig, ModelError, ModelRunner,
    Pooling, ResolvedPlan,
};
use pagoda_ops::PanelTiming;
use pagoda_text::{ChatTemplate, ChatTemplateError, Tokenizer, TokenizerError};

use crate::draft::{attach_draft, load_draft, target_share};
use crate::engine_args::EngineSettings;
use crate::options::RuntimeOptions;
use crate::plan::{model_load_options, resolve_plan, RuntimePlan};
use crate::vision::VisionSpec;
use pagoda_engine::EncoderCacheStats;

/// Why the model or the engine could not be started.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error("{path}: chat template: {source}")]
    ChatTemplate { path: PathBuf, source: ChatTemplateError },
    #[error("{0}: no tokenizer found; pass --tokenizer (a GGUF file or a directory with tokenizer.json)")]
    NoTokenizer(PathBuf),
    #[error("the KV cache budget of {bytes} bytes holds no block of {block_size} tokens")]
    CacheTooSmall { bytes: u64, block_size: usize },
    #[error(
        "--max-model-len {requested} is beyond this model's context of {model} tokens (its position \
         embeddings end there); pass at most {model}, leave it out, or stretch the context with --rope-scaling"
    )]
    MaxModelLenBeyondModel { requested: usize, model: usize },
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    KvSizing(#[from] KvSizingError),
    #[error(
        "--pooling {0} does not apply to a cross-encoder: it scores text pairs with its classifier \
         head over the [CLS] state; leave --pooling out"
    )]
    PoolingOfCrossEncoder(&'static str),
    #[error("LoRA adapter {name} ({path}): {source}")]
    Lora { name: String, path: PathBuf, source: Box<ModelError> },
    #[error("draft model {path}: {reason}")]
    DraftIncompatible { path: PathBuf, reason: String },
    #[error(transparent)]
    Vision(#[from] crate::vision::VisionConfigError),
}

/// Stage timings of start-up, for the log.
#[derive(Debug, Clone, Copy, Default)]
pub struct StartupTimes {
    pub model_seconds: f64,
    pub tokenizer_seconds: f64,
    pub cache_seconds: f64,
}

/// The loaded model and tokenizer, before the engine starts.
pub struct LoadedRuntime {
    pub runner: ModelRunner,
    /// The model's shape (architecture, layers, context), as loaded.
    pub model_config: ModelConfig,
    pub tokenizer: Arc<Tokenizer>,
    pub chat_template: Option<Arc<ChatTemplate>>,
    pub engine_config: EngineConfig,
    pub kv_cache_bytes: u64,
    /// KV bytes per token that one sequence of `max_model_len` tokens holds (less than the
    /// model's `kv_bytes_per_token` when sliding-window layers keep only their windows).
    pub kv_bytes_per_token: f64,
    pub kv_cache_dtype: DType,
    /// How the cache was sized from device memory, when it was.
    pub gpu_kv_budget: Option<GpuKvBudget>,
    /// What the model runs on; its text is the `kernel plan: ...` line.
    pub plan: RuntimePlan,
    /// The timing `auto` chose the prefill-sized kernel by, when it timed.
    pub kernel_timing: Option<PanelTiming>,
    pub times: StartupTimes,
    /// An embedding model's pooling; `None` for a model that generates.
    pub pooling: Option<Pooling>,
    /// The LoRA adapters loaded at start-up: (name, the engine's id, directory).
    pub loras: Vec<(String, LoraId, PathBuf)>,
    /// Reads adapters loaded while serving; `None` without `--enable-lora`.
    pub lora_reader: Option<Arc<AdapterReader>>,
    /// How sleep mode loads the weights again (`None`: this model cannot sleep).
    pub reload: Option<crate::sleep::Reload>,
    /// How the model takes images; `None` without a vision encoder.
    pub vision: Option<Arc<VisionSpec>>,
    /// The encoder cache's counters (a vision model's; they stay 0 otherwise).
    pub encoder_cache: Arc<EncoderCacheStats>,
}

/// A running engine and what requests are prepared with.
pub struct Runtime {
    pub engine: EngineHandle,
    pub engine_thread: JoinHandle<()>,
    pub tokenizer: Arc<Tokenizer>,
    pub chat_template: Option<Arc<ChatTemplate>>,
    pub engine_config: EngineConfig,
    pub model_config: ModelConfig,
    /// An embedding model's pooling; `None` for a model that generates.
    pub pooling: Option<Pooling>,
    /// The LoRA adapters loaded at start-up: (name, the engine's id, directory).
    pub loras: Vec<(String, LoraId, PathBuf)>,
    /// Reads adapters loaded while serving; `None` without `--enable-lora`.
    pub lora_reader: Option<Arc<AdapterReader>>,
    /// How the model takes images; `None` without a vision encoder.
    pub vision: Option<Arc<VisionSpec>>,
    /// The encoder cache's counters (a vision model's; they stay 0 otherwise).
    pub encoder_cache: Arc<EncoderCacheStats>,
}

impl LoadedRuntime {
    /// How the model takes images (what the server preprocesses them with and the token their
    /// placeholders are); `None` when it has no vision encoder.
    pub fn vision(&self) -> Option<&VisionSpec> {
        self.vision.as_deref()
    }
}

impl Runtime {
    /// As [`LoadedRuntime::vision`].
    pub fn vision(&self) -> Option<&VisionSpec> {
        self.vision.as_deref()
    }
}

fn tokenizer_source(options: &RuntimeOptions) -> Result<PathBuf, RuntimeError> {
    if let Some(t) = &options.tokenizer {
        return Ok(t.clone());
    }
    let model = &options.model;
    if options.settings.load_format == LoadFormat::Dummy {
        return Err(RuntimeError::NoTokenizer(model.clone()));
    }
    Ok(model.clone())
}

pub(crate) fn load_tokenizer(path: &Path) -> Result<Tokenizer, RuntimeError> {
    Ok(if path.is_dir() { Tokenizer::from_dir(path)? } else { Tokenizer::from_gguf(path)? })
}

/// The tokenizer and the chat template, loaded while the model loads.
struct TextParts {
    tokenizer: Arc<Tokenizer>,
    chat_template: Option<Arc<ChatTemplate>>,
    tokenizer_seconds: f64,
}

fn load_text(path: &Path) -> Result<TextParts, RuntimeError> {
    let started = Instant::now();
    let tokenizer = Arc::new(load_tokenizer(path)?);
    let chat_template = match tokenizer.chat_template() {
        Some(source) => Some(Arc::new(
            ChatTemplate::new(source, tokenizer.bos_token(), tokenizer.eos_token())
                .map_err(|source| RuntimeError::ChatTemplate { path: path.to_path_buf(), source })?,
        )),
        None => None,
    };
    let tokenizer_seconds = started.elapsed().as_secs_f64();
    Ok(TextParts { tokenizer, chat_template, tokenizer_seconds })
}

impl LoadedRuntime {
    /// Loads in named stages: the plan, the model and the text side at once, the cache sized
    /// and allocated, a draft attached, the engine's configuration (complete: nothing changes
    /// it after this returns).
    pub fn load(options: &RuntimeOptions) -> Result<Self, RuntimeError> {
        let settings = &options.settings;
        let (plan, resolved) = resolve_plan(options)?;
        log_plan(&plan, &resolved);
        let load = LoadOptions {
            kernel_plan: plan.kernels,
            quantization: settings.quantization,
            rope_scaling: settings.rope_scaling,
            ..model_load_options(options)
        };
        if settings.quantization.is_some() && options.device.is_cpu() {
            tracing::warn!(
                "--quantization fp8 on the CPU rounds the projections to their FP8 values and keeps them \
                 dense: the GPU's numbers, no memory saved"
            );
        }
        let (mut loaded, text) = load_model_and_text(options, &load)?;
        if let Some(kind) = settings.pooling {
            set_pooling(&mut loaded.model, kind)?;
        }
        let mut times = StartupTimes {
            model_seconds: loaded.load_seconds,
            tokenizer_seconds: text.tokenizer_seconds,
            ..Default::default()
        };
        let TextParts { tokenizer, chat_template, .. } = text;
        let vision = VisionSpec::for_model(&options.model, &loaded.model, &tokenizer)?.map(Arc::new);

        let started = Instant::now();
        let config = loaded.model.config().clone();
        // A generating model embeds too when --pooling asks it to.
        let self_pooling = loaded.model.pooling().copied();
        // Positions past the model's table cannot be computed: every longer request would fail
        // in the middle of a step instead of at admission.
        if let Some(requested) = settings.max_model_len.filter(|&l| l > config.max_position_embeddings) {
            return Err(RuntimeError::MaxModelLenBeyondModel {
                requested,
                model: config.max_position_embeddings,
            });
        }
        if let Some(pooling) = self_pooling.filter(|_| loaded.model.is_encoder()) {
            return Self::encoder(
                options,
                loaded.model,
                pooling,
                plan,
                resolved.timing,
                times,
                tokenizer,
                started,
            );
        }
        let cache_dtype = options.kv_cache_dtype;
        let layout = KvLayout::for_config(&config);
        // A draft's cache would need scales of its own.
        if let Some(path) = options.draft_model.as_ref().filter(|_| cache_dtype == DType::F8E4M3) {
            let reason =
                "--kv-cache-dtype fp8 is for the target model alone; leave it out with a draft model";
            return Err(RuntimeError::DraftIncompatible { path: path.clone(), reason: reason.into() });
        }
        // A draft runs the target's kernel plan.
        let draft = match &options.draft_model {
            Some(path) => Some(load_draft(path, &load, &config, &tokenizer)?),
            None => None,
        };
        let draft_config = draft.as_ref().map(|d| d.config().clone());
        let mut runner = ModelRunner::new(
            loaded.model,
            KvCache::new(&config, 1, settings.block_size, cache_dtype, &options.device)?,
            options.device.clone(),
        )?;
        let encoder_cache = runner.encoder_cache_stats();
        if let Some(bytes) = options.encoder_cache_bytes {
            runner.set_encoder_cache(bytes as usize, Arc::clone(&encoder_cache));
        }
        let loras = load_loras(&mut runner, options)?;
        let lora_reader = settings
            .lora
            .as_ref()
            .map(|l| Arc::new(AdapterReader::new(config.clone(), runner.model().dtype(), l.dtype)));
        let (num_blocks, gpu_kv_budget) = cache_blocks(&mut runner, options, &config, draft_config.as_ref())?;
        let groups = layout.kv_groups();
        // Without an explicit limit, the context is what the model, a draft model and the cache
        // allow (windowed groups hold only their windows, so a hybrid cache fits longer sequences).
        let max_model_len = settings.max_model_len.unwrap_or_else(|| {
            let fits = |len: usize| {
                groups.max_pages_for_sequence(len, settings.max_num_batched_tokens, settings.block_size)
                    <= num_blocks
            };
            let positions = draft_config.as_ref().map_or(usize::MAX, |d| d.max_position_embeddings);
            longest_fitting(config.max_position_embeddings.min(positions), fits)
        });
        if num_blocks == 0 {
            return Err(RuntimeError::CacheTooSmall {
                bytes: gpu_kv_budget.map_or(options.kv_cache_bytes(), |b| b.kv_bytes),
                block_size: settings.block_size,
            });
        }
        allocate_cache(&mut runner, options, &config, num_blocks, &tokenizer, chat_template.as_deref())?;
        // A batch-invariant step plans attention per token, which a replayed plan cannot.
        let graphs = options.device.is_cuda() && !settings.enforce_eager && !settings.kernels.batch_invariant;
        if graphs {
            runner.enable_decode_graphs(settings.max_num_seqs, max_model_len, true);
        }
        let dtype_size = cache_dtype.size_in_bytes();
        let mut kv_cache_bytes =
            (num_blocks * layout.page_bytes(&config, settings.block_size, dtype_size)) as u64;
        if let Some(draft) = draft {
            kv_cache_bytes += attach_draft(&mut runner, draft, options, num_blocks, max_model_len)?;
        }
        let kv_bytes_per_token =
            layout.bytes_per_token(&config, max_model_len.max(1), settings.block_size, dtype_size);
        times.cache_seconds = started.elapsed().as_secs_f64();

        let mut engine_config = step_limits(&options.settings, num_blocks, max_model_len);
        engine_config.kv_groups = groups;
        engine_config.enable_prefix_caching = settings.enable_prefix_caching;
        engine_config.kv_cache_events = options.kv_cache_events;
        let dtypes = format!(
            "dtype {:?}; kv {cache_dtype:?}; quantization {:?}",
            settings.dtype, settings.quantization
        );
        let identity =
            crate::kv_offload::model_identity(&options.model.display().to_string(), &config, &dtypes);
        engine_config.kv_offload = crate::kv_offload::engine_config(&settings.kv_offload, identity);
        engine_config.speculative = options.speculative();
        engine_config.max_loras = settings.lora.as_ref().map(|l| l.max_loras);
        engine_config.images = vision.is_some();
        engine_config.validate().map_err(EngineError::from)?;

        let reload = crate::sleep::Reload {
            model: options.model.clone(),
            load: load.clone(),
            pooling: settings.pooling,
            decode_graphs: graphs.then_some((settings.max_num_seqs, max_model_len)),
            refuse_level2: settings.lora.as_ref().map(|_| {
                "sleep level 2 does not support LoRA adapters (--enable-lora); use level 1".to_owned()
            }),
        };
        Ok(Self {
            model_config: config.clone(),
            reload: Some(reload),
            runner,
            tokenizer,
            chat_template,
            engine_config,
            kv_cache_bytes,
            kv_bytes_per_token,
            kv_cache_dtype: cache_dtype,
            gpu_kv_budget,
            plan,
            kernel_timing: resolved.timing,
            times,
            pooling: self_pooling,
            loras,
            lora_reader,
            vision,
            encoder_cache,
        })
    }

    /// An encoder (embedding model): its inputs are cut to the model's own input limit, and
    /// its cache holds no pages, only enough blocks to page one full step of inputs.
    #[allow(clippy::too_many_arguments)]
    fn encoder(
        options: &RuntimeOptions,
        model: Model,
        pooling: Pooling,
        plan: RuntimePlan,
        kernel_timing: Option<PanelTiming>,
        mut times: StartupTimes,
        tokenizer: Arc<Tokenizer>,
        started: Instant,
    ) -> Result<Self, RuntimeError> {
        let settings = &options.settings;
        let config = model.config().clone();
        if let Some(path) = &options.draft_model {
            return Err(RuntimeError::DraftIncompatible {
                path: path.clone(),
                reason: "the model is an embedding model, which generates nothing to draft".into(),
            });
        }
        if let Some((name, path)) = settings.lora.as_ref().and_then(|l| l.modules.first()) {
            return Err(RuntimeError::Lora {
                name: name.clone(),
                path: path.clone(),
                source: Box::new(ModelError::InvalidOption(
                    "an embedding model takes no LoRA adapters".into(),
                )),
            });
        }
        let positions = config.max_position_embeddings;
        let max_model_len = settings
            .max_model_len
            .unwrap_or_else(|| pooling.max_input_tokens.unwrap_or(positions).min(positions));
        // Every input lives for one step: a step's budget over whole blocks, plus a partial
        // block per input.
        let num_blocks = settings.num_gpu_blocks_override.unwrap_or_else(|| {
            settings.max_num_batched_tokens.div_ceil(settings.block_size) + settings.max_num_seqs
        });
        let cache = KvCache::accounting_only(&config, num_blocks, settings.block_size);
        let runner = ModelRunner::new(model, cache, options.device.clone())?;
        times.cache_seconds = started.elapsed().as_secs_f64();
        let mut engine_config = step_limits(&options.settings, num_blocks, max_model_len);
        engine_config.enable_prefix_caching = false;
        engine_config.validate().map_err(EngineError::from)?;
        Ok(Self {
            model_config: config,
            runner,
            tokenizer,
            chat_template: None,
            engine_config,
            kv_cache_bytes: 0,
            kv_bytes_per_token: 0.0,
            kv_cache_dtype: options.kv_cache_dtype,
            gpu_kv_budget: None,
            plan,
            kernel_timing,
            times,
            loras: Vec::new(),
            lora_reader: None,
            pooling: Some(pooling),
            reload: None,
            vision: None,
            encoder_cache: Arc::default(),
        })
    }

    /// Starts the engine thread over the loaded model.
    pub fn start(
        self,
        observer: Arc<dyn EngineObserver>,
        shutdown: Shutdown,
    ) -> Result<Runtime, RuntimeError> {
        let decoder: Arc<dyn pagoda_text::TokenDecoder> = self.tokenizer.clone();
        let executor = crate::sleep::SleepyRunner::new(self.runner, self.reload);
        let (engine, engine_thread) =
            Engine::spawn(self.engine_config.clone(), executor, decoder, observer, shutdown)?;
        Ok(Runtime {
            engine,
            engine_thread,
            tokenizer: self.tokenizer,
            chat_template: self.chat_template,
            engine_config: self.engine_config,
            model_config: self.model_config,
            pooling: self.pooling,
            loras: self.loras,
            lora_reader: self.lora_reader,
            vision: self.vision,
            encoder_cache: self.encoder_cache,
        })
    }
}

/// The plan line, why `auto` fell back (if it did) and what it timed.
fn log_plan(plan: &RuntimePlan, resolved: &ResolvedPlan) {
    tracing::info!("{plan}");
    if let Some(why) = &resolved.fallback {
        tracing::warn!("{why}");
    }
    if let Some(timing) = &resolved.timing {
        let ms: Vec<String> =
            timing.seconds.iter().map(|(p, s)| format!("{p:?} {:.3} ms", s * 1e3)).collect();
        tracing::info!(
            rows = timing.rows,
            "prefill-sized kernels timed on the model's weight: {}",
            ms.join(", ")
        );
    }
}

/// The engine's configuration for a cache of `num_blocks` blocks and sequences of up to
/// `max_model_len` tokens, with the step's limits the settings give.
fn step_limits(settings: &EngineSettings, num_blocks: usize, max_model_len: usize) -> EngineConfig {
    let mut config = EngineConfig::new(settings.block_size, num_blocks, max_model_len);
    config.max_num_seqs = settings.max_num_seqs;
    config.max_num_batched_tokens = settings.max_num_batched_tokens;
    config.max_waiting_requests = settings.max_waiting_requests;
    config
}

/// The model (parallel over the rayon pool) and the text side (one thread), loaded at once.
fn load_model_and_text(
    options: &RuntimeOptions,
    load: &LoadOptions,
) -> Result<(pagoda_models::LoadedModel, TextParts), RuntimeError> {
    let tokenizer_path = tokenizer_source(options)?;
    let (loaded, text) = std::thread::scope(|scope| {
        let text = scope.spawn(|| load_text(&tokenizer_path));
        let loaded = load_model(&options.model, load);
        (loaded, text.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)))
    });
    Ok((loaded?, text?))
}

/// `--pooling kind`: an embedding model keeps its normalization and input limit; a generating
/// one normalizes, as vLLM's pooling runner does by default. A cross-encoder takes none.
pub(crate) fn set_pooling(model: &mut Model, kind: pagoda_models::PoolingKind) -> Result<(), RuntimeError> {
    let base = model.pooling().copied();
    if base.is_some_and(|p| p.cross_encoder) {
        return Err(RuntimeError::PoolingOfCrossEncoder(kind.name()));
    }
    let generating =
        Pooling { kind, normalize: true, max_input_tokens: None, matryoshka: false, cross_encoder: false };
    model.set_pooling(base.map_or(generating, |p| Pooling { kind, ..p }));
    Ok(())
}

/// The cache's blocks: as many as asked, or what the budget (the bytes given, or on CUDA what
/// a profiled step leaves of device memory) holds of the target's pages beside a draft's.
fn cache_blocks(
    runner: &mut ModelRunner,
    options: &RuntimeOptions,
    config: &ModelConfig,
    draft: Option<&ModelConfig>,
) -> Result<(usize, Option<GpuKvBudget>), RuntimeError> {
    let (settings, cache_dtype) = (&options.settings, options.kv_cache_dtype);
    if let Some(n) = settings.num_gpu_blocks_override {
        return Ok((n, None));
    }
    let (bytes, budget) = match options.gpu_memory_utilization() {
        Some(utilization) if options.device.is_cuda() => {
            let (max_num_batched_tokens, max_num_seqs) =
                (settings.max_num_batched_tokens, settings.max_num_seqs);
            let shape =
                ProfileShape { max_num_batched_tokens, max_num_seqs, block_size: settings.block_size };
            let budget = size_from_device_memory(runner, config, shape, cache_dtype, utilization)?;
            (budget.kv_bytes, Some(budget))
        }
        _ => (options.kv_cache_bytes(), None),
    };
    let bytes = target_share(bytes, config, draft, settings.block_size, cache_dtype);
    Ok((KvCache::blocks_for_budget(config, settings.block_size, cache_dtype, bytes), budget))
}

/// The largest length in `0..=max` that `fits` (which holds for every shorter length too).
fn longest_fitting(max: usize, fits: impl Fn(usize) -> bool) -> usize {
    let (mut lo, mut hi) = (0, max);
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    lo
}

/// Allocates the `num_blocks` cache into `runner`, an FP8 cache with its calibrated scales
/// (calibrated first: its scratch cache and activations then fit in what the profiled step
/// left).
fn allocate_cache(
    runner: &mut ModelRunner,
    options: &RuntimeOptions,
    config: &ModelConfig,
    num_blocks: usize,
    tokenizer: &Tokenizer,
    chat_template: Option<&ChatTemplate>,
) -> Result<(), RuntimeError> {
    let (block_size, cache_dtype) = (options.settings.block_size, options.kv_cache_dtype);
    let scales = match cache_dtype {
        DType::F8E4M3 => {
            Some(crate::fp8_kv::calibrated_scales(runner, tokenizer, chat_template, block_size, cache_dtype)?)
        }
        _ => None,
    };
    let mut cache = KvCache::new(config, num_blocks, block_size, cache_dtype, &options.device)?;
    if let Some(scales) = scales {
        cache = cache.with_scales(scales)?;
    }
    runner.replace_cache(cache);
    Ok(())
}

/// Loads the start-up adapters of `--lora-modules` into `runner`, ids from 1 in the order given.
fn load_loras(
    runner: &mut ModelRunner,
    options: &RuntimeOptions,
) -> Result<Vec<(String, LoraId, PathBuf)>, RuntimeError> {
    let Some(lora) = &options.settings.lora else { return Ok(Vec::new()) };
    runner.set_lora_dtype(lora.dtype);
    let mut loaded = Vec::with_capacity(lora.modules.len());
    for (i, (name, path)) in lora.modules.iter().enumerate() {
        let id = i as LoraId + 1;
        runner.add_lora(id, path, lora.max_lora_rank).map_err(|source| RuntimeError::Lora {
            name: name.clone(),
            path: path.clone(),
            source: Box::new(source),
        })?;
        let weights = runner.model().lora_weight_dtype(id).map_or("mixed".into(), |d| d.as_str().to_owned());
        tracing::info!(name = %name, id, path = %path.display(), weights = %weights, "LoRA adapter loaded");
        loaded.push((name.clone(), id, path.clone()));
    }
    Ok(loaded)
}

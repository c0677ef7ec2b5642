//! Sleep mode for the model runner ([`pagoda_engine::sleep`]): [`SleepyRunner`] is the
//! executor the engine runs, a [`ModelRunner`] it can free and take back.
//!
//! Level 1 swaps the KV cache for a one-page stand-in (the pages' memory goes back to the
//! allocator, on CUDA to the device) and keeps the weights where they are; waking allocates a
//! cache of the same geometry, zeroed, with the FP8 scales calibrated at start-up. Level 2 drops
//! the whole runner, weights included, and waking loads the model again through the start-up
//! path ([`pagoda_models::load_model`] with the same options). Not supported: a draft model
//! (its cache would need the same care) and, at level 2, LoRA adapters (they live in the
//! model and would have to be read again).

use candle_core::{DType, Device};
use pagoda_engine::{
    ExecutorError, KvGroups, KvPageLayout, LoraId, ModelExecutor, PreparedLora, ScheduledBatch, SleepError,
    SleepLevel, StepOutput,
};
use pagoda_models::{load_model, KvCache, LoadOptions, ModelConfig, ModelRunner, PoolingKind};
use pagoda_ops::KvScales;
use std::path::PathBuf;

/// What loads the weights again after level 2, as start-up loaded them.
#[derive(Debug, Clone)]
pub struct Reload {
    pub model: PathBuf,
    pub load: LoadOptions,
    /// `--pooling` of a generating model.
    pub pooling: Option<PoolingKind>,
    /// CUDA decode graphs to enable again: (most sequences, longest context).
    pub decode_graphs: Option<(usize, usize)>,
    /// Level 2 is refused, and why (LoRA adapters live in the model).
    pub refuse_level2: Option<String>,
}

/// The cache's geometry, to allocate it again.
struct CacheShape {
    num_blocks: usize,
    block_size: usize,
    dtype: DType,
    scales: Vec<KvScales>,
}

/// A [`ModelRunner`] that can sleep; see the module docs.
pub struct SleepyRunner {
    /// `None` while asleep at level 2.
    runner: Option<ModelRunner>,
    /// `None` when this model cannot sleep (an encoder, whose cache holds no pages).
    reload: Option<Reload>,
    config: ModelConfig,
    device: Device,
    /// Set while asleep.
    asleep: Option<(SleepLevel, CacheShape)>,
    // What the engine may ask while the runner is gone.
    block_size: usize,
    num_blocks: usize,
    kv_groups: KvGroups,
    num_layers: Option<usize>,
    kv_page_layout: Option<KvPageLayout>,
    takes_images: bool,
    /// The encoder cache's size and counters, for a runner loaded again.
    encoder_cache: (usize, std::sync::Arc<pagoda_engine::EncoderCacheStats>),
}

impl SleepyRunner {
    pub fn new(runner: ModelRunner, reload: Option<Reload>) -> Self {
        Self {
            config: runner.model().config().clone(),
            device: runner.device().clone(),
            block_size: runner.block_size(),
            num_blocks: runner.num_blocks(),
            kv_groups: runner.kv_groups(),
            num_layers: runner.num_layers(),
            kv_page_layout: runner.kv_page_layout(),
            takes_images: runner.takes_images(),
            encoder_cache: (runner.encoder_cache_bytes(), runner.encoder_cache_stats()),
            runner: Some(runner),
            reload,
            asleep: None,
        }
    }

    fn awake(&mut self) -> Result<&mut ModelRunner, ExecutorError> {
        self.runner.as_mut().ok_or_else(|| ExecutorError::Execution("the model is asleep".into()))
    }

    fn cache_of(&self, shape: &CacheShape) -> Result<KvCache, SleepError> {
        let failed =
            |e: pagoda_models::ModelError| SleepError::Failed(format!("cannot allocate the KV cache: {e}"));
        KvCache::new(&self.config, shape.num_blocks, shape.block_size, shape.dtype, &self.device)
            .and_then(|c| c.with_scales(shape.scales.clone()))
            .map_err(failed)
    }

    /// Loads the weights again into a runner with a cache of `shape`.
    fn reload(&self, reload: &Reload, shape: &CacheShape) -> Result<ModelRunner, SleepError> {
        let failed =
            |e: pagoda_models::ModelError| SleepError::Failed(format!("cannot reload the model: {e}"));
        let mut model = load_model(&reload.model, &reload.load).map_err(failed)?.model;
        if let Some(kind) = reload.pooling {
            crate::load::set_pooling(&mut model, kind).map_err(|e| SleepError::Failed(e.to_string()))?;
        }
        let mut runner =
            ModelRunner::new(model, self.cache_of(shape)?, self.device.clone()).map_err(failed)?;
        if let Some((max_batch, max_context)) = reload.decode_graphs {
            runner.enable_decode_graphs(max_batch, max_context, true);
        }
        let (bytes, stats) = &self.encoder_cache;
        runner.set_encoder_cache(*bytes, std::sync::Arc::clone(stats));
        Ok(runner)
    }
}

impl ModelExecutor for SleepyRunner {
    fn execute(&mut self, batch: &ScheduledBatch) -> Result<StepOutput, ExecutorError> {
        if self.asleep.is_some() {
            return Err(ExecutorError::Execution("the model is asleep".into()));
        }
        self.awake()?.execute(batch)
    }

    fn block_size(&self) -> usize {
        self.block_size
    }

    fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    fn kv_groups(&self) -> KvGroups {
        self.kv_groups.clone()
    }

    fn num_layers(&self) -> Option<usize> {
        self.num_layers
    }

    fn has_draft_model(&self) -> bool {
        self.runner.as_ref().is_some_and(ModelExecutor::has_draft_model)
    }

    fn takes_images(&self) -> bool {
        self.takes_images
    }

    fn install_lora(&mut self, id: LoraId, adapter: PreparedLora) -> Result<(), ExecutorError> {
        self.awake()?.install_lora(id, adapter)
    }

    fn unload_lora(&mut self, id: LoraId) -> bool {
        self.runner.as_mut().is_some_and(|r| r.unload_lora(id))
    }

    fn kv_page_layout(&self) -> Option<KvPageLayout> {
        self.kv_page_layout.clone()
    }

    fn read_kv_pages(&mut self, blocks: &[u32]) -> Result<Vec<u8>, ExecutorError> {
        self.awake()?.read_kv_pages(blocks)
    }

    fn write_kv_pages(&mut self, blocks: &[u32], pages: &[u8]) -> Result<(), ExecutorError> {
        self.awake()?.write_kv_pages(blocks, pages)
    }

    fn sleep(&mut self, level: SleepLevel) -> Result<(), SleepError> {
        let Some(reload) = &self.reload else {
            return Err(SleepError::Unsupported("this model (an encoder) has no KV cache to free".into()));
        };
        if let (SleepLevel::Weights, Some(why)) = (level, &reload.refuse_level2) {
            return Err(SleepError::Unsupported(why.clone()));
        }
        let runner = self.runner.as_mut().ok_or_else(|| SleepError::Failed("the model is asleep".into()))?;
        if runner.has_draft_model() {
            return Err(SleepError::Unsupported("sleep mode does not support a draft model".into()));
        }
        let cache = runner.cache();
        let Some(dtype) = cache.dtype() else {
            return Err(SleepError::Unsupported("this model has no KV cache to free".into()));
        };
        let shape = CacheShape {
            num_blocks: cache.num_blocks(),
            block_size: cache.block_size(),
            dtype,
            scales: cache.slot_scales(),
        };
        match level {
            SleepLevel::Cache => {
                // One page in place of the pool: the runner stays whole, its pages are freed.
                let stand_in =
                    self.cache_of(&CacheShape { num_blocks: 1, scales: shape.scales.clone(), ..shape })?;
                if let Some(runner) = self.runner.as_mut() {
                    drop(runner.replace_cache(stand_in));
                    // Cached image features are device memory too; they are encoded again.
                    runner.clear_encoder_cache();
                }
            }
            SleepLevel::Weights => drop(self.runner.take()),
        }
        self.asleep = Some((level, shape));
        Ok(())
    }

    fn wake_up(&mut self) -> Result<(), SleepError> {
        let Some((level, shape)) = self.asleep.take() else { return Ok(()) };
        let woken = match (level, self.reload.clone()) {
            (SleepLevel::Cache, _) if self.runner.is_some() => {
                let cache = self.cache_of(&shape);
                cache.map(|cache| {
                    if let Some(runner) = self.runner.as_mut() {
                        drop(runner.replace_cache(cache));
                    }
                })
            }
            (_, Some(reload)) => self.reload(&reload, &shape).map(|runner| self.runner = Some(runner)),
            (_, None) => Err(SleepError::Failed("nothing to reload the model from".into())),
        };
        if woken.is_err() {
            // Still asleep: a later wake-up tries again.
            self.asleep = Some((level, shape));
        }
        woken
    }
}

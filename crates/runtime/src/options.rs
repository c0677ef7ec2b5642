//! [`RuntimeOptions`]: what to load, where, and how big to make the cache and the batches, as
//! [`EngineSettings::runtime_options`] resolves them: the model found on disk or in the Hugging
//! Face cache, the device opened, the dtypes decided.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device};
use pagoda_models::{KernelRequest, LoadFormat};

use crate::engine_args::{EngineSettings, DEFAULT_CPU_KV_CACHE_BYTES};
use crate::flags::DeviceArg;
use crate::hub::{self, HubError};

/// Why the settings could not be turned into something to load.
#[derive(Debug, thiserror::Error)]
pub enum OptionsError {
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
    #[error("--model {0}")]
    Hub(#[from] HubError),
    #[error("--speculative-config: draft model {0}")]
    DraftHub(HubError),
}

/// What to load and how big to make the cache and the batches.
#[derive(Debug, Clone)]
pub struct RuntimeOptions {
    pub model: PathBuf,
    /// Tokenizer source when it is not the model itself (required for dummy weights).
    pub tokenizer: Option<PathBuf>,
    pub load_format: LoadFormat,
    /// See [`pagoda_models::LoadOptions::dequantize`]; `None` decides by model size.
    pub dequantize: Option<bool>,
    /// See [`pagoda_models::LoadOptions::quantization`].
    pub quantization: Option<pagoda_models::WeightQuantization>,
    /// `--pooling`: makes a generating model embed too, or changes an embedding model's pooling.
    pub pooling: Option<pagoda_models::PoolingKind>,
    pub device: Device,
    /// The device as the user named it, for the log.
    pub device_name: String,
    pub dtype: DType,
    /// Storage dtype of the KV cache (attention computes in f32 whatever it is).
    pub kv_cache_dtype: DType,
    /// `--cpu-gemm-dtype` and `--batch-invariant`, resolved into a kernel plan at load.
    pub kernels: KernelRequest,
    /// Run decode steps eagerly on CUDA instead of replaying them as CUDA graphs.
    pub enforce_eager: bool,
    pub block_size: usize,
    /// Bytes of KV cache; ignored when `num_blocks` is set or the cache is sized from device
    /// memory.
    pub kv_cache_bytes: u64,
    pub num_blocks: Option<usize>,
    /// On a GPU without `num_blocks`: size the cache to this fraction of device memory after a
    /// profiling step (see `pagoda_models::kv_sizing`) instead of `kv_cache_bytes`.
    pub gpu_memory_utilization: Option<f64>,
    pub max_model_len: Option<usize>,
    /// See [`pagoda_models::LoadOptions::rope_scaling`].
    pub rope_scaling: Option<pagoda_models::RopeScalingOverride>,
    pub max_num_seqs: usize,
    pub max_num_batched_tokens: usize,
    pub max_waiting_requests: usize,
    pub enable_prefix_caching: bool,
    pub speculative: Option<pagoda_engine::SpeculativeConfig>,
    /// A separate draft model (`SpeculativeMethod::DraftModel`), loaded like the target.
    pub draft_model: Option<PathBuf>,
    /// LoRA adapters, when served.
    pub lora: Option<crate::LoraSettings>,
    /// Whether the engine reports its cache's stored and removed blocks (KV events).
    pub kv_cache_events: bool,
}

fn open_device(arg: DeviceArg) -> Result<Device, OptionsError> {
    match arg {
        DeviceArg::Cpu => Ok(Device::Cpu),
        DeviceArg::Cuda(n) => {
            Device::new_cuda(n).map_err(|e| OptionsError::Device { device: arg, message: e.to_string() })
        }
    }
}

impl EngineSettings {
    /// The options these settings ask for: the model (and a draft model) found locally or in the
    /// hub's cache (downloading what is missing), the device opened.
    pub fn runtime_options(&self) -> Result<RuntimeOptions, OptionsError> {
        // The default model is fetched by `make model`, never from the hub.
        if self.model_is_default && !Path::new(&self.model).exists() {
            return Err(OptionsError::DefaultModelMissing(self.model.clone()));
        }
        let model = self
            .local_or_hub(Path::new(&self.model))?
            .ok_or_else(|| OptionsError::ModelMissing(self.model.clone()))?;
        let device = open_device(self.device)?;
        let dtype = self.dtype.compute(self.device);
        let mut draft_model = None;
        if let Some(path) = self.speculative.as_ref().and_then(|s| s.draft_model.as_ref()) {
            let found = self.local_or_hub(path).map_err(OptionsError::DraftHub)?;
            draft_model =
                Some(found.ok_or_else(|| OptionsError::DraftModelMissing(path.display().to_string()))?);
        }
        Ok(RuntimeOptions {
            model,
            tokenizer: self.tokenizer.as_ref().map(PathBuf::from),
            load_format: self.load_format.into(),
            dequantize: self.dequantize,
            quantization: self.quantization,
            pooling: self.pooling,
            device,
            device_name: self.device.to_string(),
            dtype,
            kv_cache_dtype: self.kv_cache_dtype.kv_cache(dtype),
            kernels: self.kernels,
            enforce_eager: self.enforce_eager,
            block_size: self.block_size,
            kv_cache_bytes: self.kv_cache_memory.unwrap_or(DEFAULT_CPU_KV_CACHE_BYTES),
            num_blocks: self.num_gpu_blocks_override,
            // An explicit --kv-cache-memory wins; otherwise a GPU sizes its cache from free memory.
            gpu_memory_utilization: self.kv_cache_memory.is_none().then_some(self.gpu_memory_utilization),
            max_model_len: self.max_model_len,
            rope_scaling: self.rope_scaling,
            max_num_seqs: self.max_num_seqs,
            max_num_batched_tokens: self.max_num_batched_tokens,
            max_waiting_requests: self.max_waiting_requests,
            enable_prefix_caching: self.enable_prefix_caching,
            speculative: self.speculative.as_ref().map(|s| s.config),
            draft_model,
            lora: self.lora.clone(),
            kv_cache_events: false,
        })
    }

    /// `path` when it exists, else the hub's copy when it names a hub id; `None` when it is
    /// neither.
    fn local_or_hub(&self, path: &Path) -> Result<Option<PathBuf>, HubError> {
        if path.exists() {
            return Ok(Some(path.to_path_buf()));
        }
        match path.to_str().filter(|id| hub::is_hub_id(id)) {
            Some(id) => hub::resolve(id, self.download_dir.as_deref(), hub::offline_from_env()).map(Some),
            None => Ok(None),
        }
    }
}

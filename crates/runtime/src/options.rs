//! [`RuntimeOptions`]: what to load, where, and how big to make the cache and the batches, as
//! [`EngineSettings::runtime_options`] resolves them: the model found on disk or in the Hugging
//! Face cache, the device opened, the dtypes decided.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device};

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

/// What to load and how big to make the cache and the batches: the settings as given, and what
/// resolving them found (the model's files, the device, the dtypes). Nothing of the settings is
/// copied: a flag's value is read from [`RuntimeOptions::settings`] where it is used.
#[derive(Debug, Clone)]
pub struct RuntimeOptions {
    pub settings: EngineSettings,
    /// The model's file or directory, found locally or in the hub's cache.
    pub model: PathBuf,
    /// Tokenizer source when it is not the model itself (required for dummy weights).
    pub tokenizer: Option<PathBuf>,
    pub device: Device,
    pub dtype: DType,
    /// Storage dtype of the KV cache (attention computes in f32 whatever it is).
    pub kv_cache_dtype: DType,
    /// A separate draft model (`SpeculativeMethod::DraftModel`), loaded like the target.
    pub draft_model: Option<PathBuf>,
    /// Whether the engine reports its cache's stored and removed blocks (KV events).
    pub kv_cache_events: bool,
    /// Most bytes of image features a vision model's encoder cache keeps; `None`:
    /// [`pagoda_models::encoder_cache::DEFAULT_ENCODER_CACHE_BYTES`].
    pub encoder_cache_bytes: Option<u64>,
}

impl RuntimeOptions {
    /// Bytes of KV cache; ignored when `--num-gpu-blocks-override` is given or the cache is
    /// sized from device memory.
    pub fn kv_cache_bytes(&self) -> u64 {
        self.settings.kv_cache_memory.unwrap_or(DEFAULT_CPU_KV_CACHE_BYTES)
    }

    /// On a GPU without a block count: size the cache to this fraction of device memory after a
    /// profiling step (see `pagoda_models::kv_sizing`). An explicit --kv-cache-memory wins.
    pub fn gpu_memory_utilization(&self) -> Option<f64> {
        self.settings.kv_cache_memory.is_none().then_some(self.settings.gpu_memory_utilization)
    }

    /// The engine's speculative decoding, when asked for.
    pub fn speculative(&self) -> Option<pagoda_engine::SpeculativeConfig> {
        self.settings.speculative.as_ref().map(|s| s.config)
    }
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
            settings: self.clone(),
            model,
            tokenizer: self.tokenizer.as_ref().map(PathBuf::from),
            device,
            dtype,
            kv_cache_dtype: self.kv_cache_dtype.kv_cache(dtype),
            draft_model,
            kv_cache_events: false,
            encoder_cache_bytes: None,
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

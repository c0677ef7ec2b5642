//! Finds out what a `--model` path holds (GGUF file, Hugging Face directory, or a shape config
//! for dummy weights) and builds the model from it.

use std::path::{Path, PathBuf};
use std::time::Instant;

use candle_core::{DType, Device};
use pagoda_ops::QuantFormat;

use crate::config::{LongRope, ModelConfig};
use crate::error::{ModelError, Result};
use crate::idefics3::{Idefics3, Idefics3Config};
use crate::kernel_plan::{self, CpuFeatures, KernelPlan, KernelRequest, ResolvedPlan};
use crate::linear_fp8::WeightQuantization;
use crate::model::Model;
use crate::weights::{DummyWeights, GgufWeights, SafetensorsWeights, WeightSource};

/// Largest dequantized model that `dequantize: None` dequantizes.
pub const AUTO_DEQUANTIZE_MAX_BYTES: u64 = 2 << 30;

/// `--load-format`: how to read the weights. The `value(help)`s are the flag's documentation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum LoadFormat {
    /// GGUF for a `.gguf` file, safetensors for a directory.
    #[default]
    #[cfg_attr(feature = "clap", value(help = "GGUF for a file, safetensors for a directory"))]
    Auto,
    Gguf,
    Safetensors,
    /// Random weights shaped by a `config.json`-style file.
    #[cfg_attr(
        feature = "clap",
        value(help = "Random weights shaped by a config.json-style file (for benchmarking)")
    )]
    Dummy,
}

#[derive(Debug, Clone)]
pub struct LoadOptions {
    pub device: Device,
    /// Compute dtype; f32 on the CPU.
    pub dtype: DType,
    /// Dequantize GGUF projections to `dtype` (`Some(true)`) or run them as quantized matmuls
    /// (`Some(false)`: on CUDA our kernels over the blocks kept on the device, on the CPU
    /// candle's quantized matmul). `None` dequantizes when the dequantized weights fit in
    /// [`AUTO_DEQUANTIZE_MAX_BYTES`]: for small models dense matmuls are both exact and fast,
    /// while candle's quantized matmul rounds activations to 8 bits.
    pub dequantize: Option<bool>,
    pub format: LoadFormat,
    /// Which kernels the CPU's matmuls run, as [`resolve_kernel_plan`] resolved them; with
    /// `batch_invariant` also on CUDA, where dense projections take
    /// [`crate::linear::LinearWeight::RowInvariant`] and attention plans each token as its own
    /// decode. A batch-invariant plan dequantizes GGUF projections (candle's quantized matmul is
    /// not covered).
    pub kernel_plan: KernelPlan,
    /// With [`LoadFormat::Dummy`]: every projection random blocks of this GGUF format (kept
    /// quantized as a GGUF's are, or dequantized with `dequantize: Some(true)`) instead of dense
    /// `dtype` values, every tensor seeded by its name. For timings and device comparisons.
    pub dummy_quantization: Option<QuantFormat>,
    /// Layer projections that load dense stored this way (`--quantization fp8`:
    /// [`crate::linear_fp8`]); `None` keeps them as loaded.
    pub quantization: Option<WeightQuantization>,
    /// `--rope-scaling`: replaces the rope scaling the files declare (see
    /// [`ModelConfig::with_rope_override`]).
    pub rope_scaling: Option<crate::RopeScalingOverride>,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            device: Device::Cpu,
            dtype: DType::F32,
            dequantize: None,
            format: LoadFormat::Auto,
            kernel_plan: KernelPlan::default(),
            dummy_quantization: None,
            quantization: None,
            rope_scaling: None,
        }
    }
}

/// What was loaded and how long it took.
pub struct LoadedModel {
    pub model: Model,
    pub path: PathBuf,
    pub format: LoadFormat,
    pub load_seconds: f64,
}

/// Phi-3's LongRoPE tables of a GGUF (`rope_factors_short`/`_long`), with the original context
/// and attention factor from `{arch}.rope.scaling.*`.
fn long_rope_of(path: &Path, weights: &mut GgufWeights, c: &ModelConfig) -> Result<Option<LongRope>> {
    if !weights.contains("rope_factors_long.weight") {
        return Ok(None);
    }
    let half = c.head_dim / 2;
    let factors = |w: &mut GgufWeights, name: &str| -> Result<Vec<f32>> {
        Ok(w.dense(name, &[half])?.to_dtype(DType::F32)?.to_vec1()?)
    };
    let long_factors = factors(weights, "rope_factors_long.weight")?;
    let short_factors = factors(weights, "rope_factors_short.weight")?;
    let key = |k: &str| weights.metadata().get(&format!("{}.rope.scaling.{k}", c.architecture));
    let original = key("original_context_length")
        .and_then(|v| v.to_u32().map(|n| n as usize).or_else(|_| v.to_u64().map(|n| n as usize)).ok())
        .ok_or_else(|| ModelError::Config {
            path: path.to_path_buf(),
            message: "LongRoPE factors without rope.scaling.original_context_length".into(),
        })?;
    let attention_factor = key("attn_factor")
        .and_then(|v| v.to_f32().ok())
        .unwrap_or_else(|| LongRope::default_attention_factor(c.max_position_embeddings, original));
    Ok(Some(LongRope {
        short_factors,
        long_factors,
        original_max_position_embeddings: original,
        attention_factor,
    }))
}

/// Whether the `config.json` at `path` is a vision-language Idefics3's (`model_type`
/// `idefics3`), which nests its decoder's config and loads apart from the text models.
fn is_idefics3(path: &Path) -> Result<bool> {
    let text = std::fs::read_to_string(path)
        .map_err(|source| ModelError::Io { path: path.to_path_buf(), source })?;
    let value: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| ModelError::Config { path: path.to_path_buf(), message: e.to_string() })?;
    Ok(value.get("model_type").and_then(serde_json::Value::as_str) == Some("idefics3"))
}

/// The format `options` names for `path`, with `Auto` resolved.
fn format_of(path: &Path, format: LoadFormat) -> LoadFormat {
    match format {
        LoadFormat::Auto if path.is_dir() => LoadFormat::Safetensors,
        LoadFormat::Auto => LoadFormat::Gguf,
        f => f,
    }
}

fn missing(path: &Path) -> ModelError {
    ModelError::Io {
        path: path.to_path_buf(),
        source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such file or directory"),
    }
}

/// Whether a GGUF's projections are dequantized: as asked, else always for a batch-invariant
/// plan, else when the dequantized weights fit in [`AUTO_DEQUANTIZE_MAX_BYTES`].
fn dequantizes(weights: &GgufWeights, options: &LoadOptions, batch_invariant: bool) -> bool {
    options.dequantize.unwrap_or_else(|| {
        batch_invariant
            || weights.num_elements() * options.dtype.size_in_bytes() as u64 <= AUTO_DEQUANTIZE_MAX_BYTES
    })
}

/// The kernel plan `request` resolves to for the model at `path` loaded with `options` (whose
/// own `kernel_plan` is ignored). Where `auto` has kernels to choose among, they are timed on
/// one of a GGUF's projections as the CPU would multiply it (once per model file and process,
/// [`kernel_plan::time_once`]).
pub fn resolve_kernel_plan(
    path: &Path,
    options: &LoadOptions,
    request: KernelRequest,
) -> Result<ResolvedPlan> {
    let sample = || {
        if !(options.device.is_cpu() && format_of(path, options.format) == LoadFormat::Gguf) {
            return None;
        }
        let mut weights = GgufWeights::open(path, &options.device, options.dtype, false).ok()?;
        let dequantize = dequantizes(&weights, options, request.batch_invariant);
        weights.set_dequantize(dequantize);
        // The projection is read once more when the model loads: a few MB, next to the timing's
        // few ms.
        weights.sample_projection()
    };
    if !path.exists() {
        return Err(missing(path));
    }
    Ok(request.resolve(CpuFeatures::detect(), |candidates| kernel_plan::time_once(path, candidates, sample)))
}

pub fn load_model(path: &Path, options: &LoadOptions) -> Result<LoadedModel> {
    let started = Instant::now();
    if !path.exists() {
        return Err(missing(path));
    }
    let format = format_of(path, options.format);
    let (dtype, device) = (options.dtype, &options.device);
    let plan = options.kernel_plan;
    if plan.batch_invariant {
        let refused = if !device.is_cpu() && !device.is_cuda() {
            Some("runs on the CPU and CUDA only")
        } else {
            kernel_plan::batch_invariant_refusal(device.is_cuda(), dtype, options.dequantize)
        };
        if let Some(why) = refused {
            return Err(ModelError::InvalidOption(format!("--batch-invariant {why}")));
        }
        if options.quantization == Some(WeightQuantization::Fp8) {
            return Err(ModelError::InvalidOption(
                "--batch-invariant has no kernels for --quantization fp8 weights".into(),
            ));
        }
    }
    let model = match format {
        LoadFormat::Gguf => {
            let mut weights = GgufWeights::open(path, device, dtype, false)?;
            let dequantize = dequantizes(&weights, options, plan.batch_invariant);
            weights.set_dequantize(dequantize);
            weights.set_kernel_plan(plan);
            weights.set_quantization(options.quantization);
            let has_output = weights.contains("output.weight");
            let has_bias = weights.contains("blk.0.attn_q.bias");
            let metadata = weights.metadata();
            let arch = metadata.get("general.architecture").and_then(|v| v.to_string().ok());
            crate::gguf_check::check_hyperparameters(
                metadata,
                arch.map_or("", String::as_str),
                weights.tensor_names(),
            )
            .map_err(|e| ModelError::Gguf { path: path.to_path_buf(), message: e.to_string() })?;
            let mut config = ModelConfig::from_gguf(path, metadata, has_output, has_bias)?;
            if weights.contains("rope_freqs.weight") {
                let factors = weights.dense("rope_freqs.weight", &[config.head_dim / 2])?;
                config.rope_freq_factors = Some(factors.to_dtype(DType::F32)?.to_vec1()?);
            }
            config.long_rope = long_rope_of(path, &mut weights, &config)?;
            let config = config.with_rope_override(options.rope_scaling.as_ref());
            Model::load(&mut weights, config, dtype, device)?
        }
        LoadFormat::Safetensors if is_idefics3(&path.join("config.json"))? => {
            if options.rope_scaling.is_some() {
                return Err(ModelError::InvalidOption("--rope-scaling is not supported for idefics3".into()));
            }
            let config = Idefics3Config::from_json(&path.join("config.json"))?;
            let mut weights = SafetensorsWeights::open(path, "idefics3", device, dtype)?;
            weights.set_kernel_plan(plan);
            weights.set_quantization(options.quantization);
            Model::idefics3(Idefics3::load_from(&mut weights, config, device)?, dtype, device)?
        }
        LoadFormat::Safetensors => {
            let config = ModelConfig::from_hf_json(&path.join("config.json"))?
                .with_rope_override(options.rope_scaling.as_ref());
            let mut weights = SafetensorsWeights::open(path, &config.architecture, device, dtype)?;
            weights.set_kernel_plan(plan);
            weights.set_quantization(options.quantization);
            Model::load(&mut weights, config, dtype, device)?
        }
        LoadFormat::Dummy if plan.batch_invariant => {
            return Err(ModelError::InvalidOption("dummy weights have no batch-invariant kernels".into()));
        }
        LoadFormat::Dummy => {
            let config_path = if path.is_dir() { path.join("config.json") } else { path.to_path_buf() };
            let config =
                ModelConfig::from_hf_json(&config_path)?.with_rope_override(options.rope_scaling.as_ref());
            let mut weights = DummyWeights::new(&config_path, device, dtype)
                .quantized(options.dummy_quantization, options.dequantize == Some(true))
                .stored_as(options.quantization);
            Model::load(&mut weights as &mut dyn WeightSource, config, dtype, device)?
        }
        LoadFormat::Auto => unreachable!("resolved above"),
    };
    Ok(LoadedModel { model, path: path.to_path_buf(), format, load_seconds: started.elapsed().as_secs_f64() })
}

//! Finds out what a `--model` path holds (GGUF file, Hugging Face directory, or a shape config
//! for dummy weights) and builds the model from it.

use std::path::{Path, PathBuf};
use std::time::Instant;

use candle_core::{DType, Device};
use pagoda_ops::PanelPrecision;

use crate::config::{LongRope, ModelConfig};
use crate::error::{ModelError, Result};
use crate::large_steps::LargeStepChoice;
use crate::linear::{CpuGemm, SmallSteps};
use crate::model::Model;
use crate::weights::{DummyWeights, GgufWeights, SafetensorsWeights, WeightSource};

/// Largest dequantized model that `dequantize: None` dequantizes.
pub const AUTO_DEQUANTIZE_MAX_BYTES: u64 = 2 << 30;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LoadFormat {
    /// GGUF for a `.gguf` file, safetensors for a directory.
    #[default]
    Auto,
    Gguf,
    Safetensors,
    /// Random weights shaped by a `config.json`-style file.
    Dummy,
}

#[derive(Debug, Clone)]
pub struct LoadOptions {
    pub device: Device,
    /// Compute dtype; f32 on the CPU.
    pub dtype: DType,
    /// Dequantize GGUF projections to `dtype` (`Some(true)`) or run them as quantized matmuls
    /// (`Some(false)`). `None` dequantizes when the dequantized weights fit in
    /// [`AUTO_DEQUANTIZE_MAX_BYTES`]: for small models f32 GEMMs are both exact and fast, while
    /// candle's quantized matmul rounds activations to 8 bits.
    pub dequantize: Option<bool>,
    pub format: LoadFormat,
    /// What the dense copies of block-quantized CPU weights (the many-token GEMM's operand) are
    /// stored and multiplied in.
    pub panel_precision: PanelPrecision,
    /// What steps of at most 16 tokens run when `panel_precision` is a float one
    /// ([`CpuGemm::small_steps`]).
    pub small_steps: SmallSteps,
    /// Every CPU matmul runs one kernel whatever the step's size (the blocks for f32, else the
    /// panels of `panel_precision`), so a sequence's outputs do not depend on what else is batched
    /// with it ([`CpuGemm::batch_invariant`]). On the CPU in f32; on CUDA in f16/bf16, where
    /// dense projections take [`crate::linear::LinearWeight::RowInvariant`] and attention plans
    /// each token as its own decode. GGUF projections are dequantized (candle's quantized matmul
    /// is not covered).
    pub batch_invariant: bool,
    /// `--cpu-gemm-dtype auto` on a CPU with both native kernels (`panel_precision` bfloat16,
    /// small steps int16): time both on one of a GGUF's own projections and run every step on
    /// int16 panels where they are clearly faster ([`LargeStepChoice`]).
    pub choose_large_steps: bool,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            device: Device::Cpu,
            dtype: DType::F32,
            dequantize: None,
            format: LoadFormat::Auto,
            panel_precision: PanelPrecision::F32,
            small_steps: SmallSteps::Blocks,
            batch_invariant: false,
            choose_large_steps: false,
        }
    }
}

/// What was loaded and how long it took.
pub struct LoadedModel {
    pub model: Model,
    pub path: PathBuf,
    pub format: LoadFormat,
    pub load_seconds: f64,
    /// What [`LoadOptions::choose_large_steps`] measured and chose, when it ran.
    pub large_steps: Option<LargeStepChoice>,
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

pub fn load_model(path: &Path, options: &LoadOptions) -> Result<LoadedModel> {
    let started = Instant::now();
    if !path.exists() {
        return Err(ModelError::Io {
            path: path.to_path_buf(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such file or directory"),
        });
    }
    let format = match options.format {
        LoadFormat::Auto if path.is_dir() => LoadFormat::Safetensors,
        LoadFormat::Auto => LoadFormat::Gguf,
        f => f,
    };
    let (dtype, device) = (options.dtype, &options.device);
    if options.batch_invariant {
        let refused = if options.dequantize == Some(false) {
            Some("with dequantized weights only (candle's quantized matmul is not covered)")
        } else if device.is_cpu() && dtype != DType::F32 {
            Some("in float32 only on the CPU")
        } else if device.is_cuda() && !matches!(dtype, DType::BF16 | DType::F16) {
            Some("in bfloat16 or float16 only on CUDA")
        } else if !device.is_cpu() && !device.is_cuda() {
            Some("on the CPU and CUDA only")
        } else {
            None
        };
        if let Some(why) = refused {
            return Err(ModelError::InvalidOption(format!("batch-invariant kernels run {why}")));
        }
    }
    let mut large_steps = None;
    let mut gemm = CpuGemm {
        precision: options.panel_precision,
        small_steps: options.small_steps,
        batch_invariant: options.batch_invariant,
    };
    let model = match format {
        LoadFormat::Gguf => {
            let mut weights = GgufWeights::open(path, device, dtype, false)?;
            let dequantize = options.dequantize.unwrap_or_else(|| {
                options.batch_invariant
                    || weights.num_elements() * dtype.size_in_bytes() as u64 <= AUTO_DEQUANTIZE_MAX_BYTES
            });
            weights.set_dequantize(dequantize);
            let choosing = options.choose_large_steps
                && !options.batch_invariant
                && gemm.precision == PanelPrecision::Bf16
                && gemm.small_steps == SmallSteps::Int16;
            if choosing {
                // The projection is read once more when the model loads: a few MB, next to
                // the timing's few ms.
                large_steps = LargeStepChoice::measure_once(path, || weights.sample_projection());
                if let Some(choice) = large_steps {
                    gemm.precision = choice.precision;
                }
            }
            weights.set_cpu_gemm(gemm);
            let has_output = weights.contains("output.weight");
            let has_bias = weights.contains("blk.0.attn_q.bias");
            let mut config = ModelConfig::from_gguf(path, weights.metadata(), has_output, has_bias)?;
            if weights.contains("rope_freqs.weight") {
                let factors = weights.dense("rope_freqs.weight", &[config.head_dim / 2])?;
                config.rope_freq_factors = Some(factors.to_dtype(DType::F32)?.to_vec1()?);
            }
            config.long_rope = long_rope_of(path, &mut weights, &config)?;
            Model::load(&mut weights, config, dtype, device)?
        }
        LoadFormat::Safetensors => {
            let config = ModelConfig::from_hf_json(&path.join("config.json"))?;
            let mut weights = SafetensorsWeights::open(path, &config.architecture, device, dtype)?;
            weights.set_cpu_gemm(gemm);
            Model::load(&mut weights, config, dtype, device)?
        }
        LoadFormat::Dummy if options.batch_invariant => {
            return Err(ModelError::InvalidOption("dummy weights have no batch-invariant kernels".into()));
        }
        LoadFormat::Dummy => {
            let config_path = if path.is_dir() { path.join("config.json") } else { path.to_path_buf() };
            let config = ModelConfig::from_hf_json(&config_path)?;
            let mut weights = DummyWeights::new(&config_path, device, dtype);
            Model::load(&mut weights as &mut dyn WeightSource, config, dtype, device)?
        }
        LoadFormat::Auto => unreachable!("resolved above"),
    };
    Ok(LoadedModel {
        model,
        path: path.to_path_buf(),
        format,
        load_seconds: started.elapsed().as_secs_f64(),
        large_steps,
    })
}

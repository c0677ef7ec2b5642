//! Random weights of a given shape, for benchmarking models whose real weights are not at hand:
//! dense in the model's dtype, or with every projection in one GGUF block format (what a
//! quantized checkpoint of that shape would multiply).
//!
//! Block-format models are seeded by tensor name and made on the host, so the same config gives
//! the same model on every device: the GPU check compares a CUDA run with a CPU one, and blocks
//! kept on the device with the same blocks dequantized.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use pagoda_ops::{QuantFormat, QuantizedWeight};

use super::WeightSource;
use crate::error::Result;
use crate::kernel_plan::KernelPlan;
use crate::linear::{Linear, LinearWeight};
use crate::linear_fp8::WeightQuantization;

/// The largest weight magnitude of quantized dummy projections (about the dense ones' 0.02
/// standard deviation, times three).
const QUANTIZED_MAGNITUDE: f32 = 0.06;

pub struct DummyWeights {
    config_path: PathBuf,
    device: Device,
    dtype: DType,
    /// The block format of every projection; dense when `None`.
    quantization: Option<QuantFormat>,
    /// Whether block-format projections are dequantized to dense `dtype` (as `--dequantize`
    /// does to a GGUF's).
    dequantize: bool,
    /// How dense layer projections are stored (`--quantization`).
    stored_as: Option<WeightQuantization>,
}

/// A seed per tensor name (FNV-1a), so tensors differ and runs repeat.
fn seed_of(name: &str) -> u64 {
    name.bytes().fold(0xCBF2_9CE4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01B3))
}

impl DummyWeights {
    pub fn new(config_path: &Path, device: &Device, dtype: DType) -> Self {
        Self {
            config_path: config_path.to_path_buf(),
            device: device.clone(),
            dtype,
            quantization: None,
            dequantize: false,
            stored_as: None,
        }
    }

    /// Dense layer projections stored as `quantization` says (`--quantization fp8` on random
    /// bf16 weights: what the GPU benchmarks time).
    pub fn stored_as(self, stored_as: Option<WeightQuantization>) -> Self {
        Self { stored_as, ..self }
    }

    /// Every projection in `format`'s blocks (kept as blocks, as a GGUF of that format is, or
    /// dequantized with `dequantize`), but those whose width is not a whole number of the
    /// format's blocks. Every tensor is then seeded by its name.
    pub fn quantized(self, quantization: Option<QuantFormat>, dequantize: bool) -> Self {
        Self { quantization, dequantize, ..self }
    }

    /// The block format a block-format model draws a tensor of `cols` columns from: its own
    /// where the blocks divide the width, else Q8_0's 32-element blocks; `None` for dense models
    /// (and widths of no whole 32-element block).
    fn values_format(&self, cols: usize) -> Option<QuantFormat> {
        let own = self.quantization?;
        [own, QuantFormat::Q8_0].into_iter().find(|f| cols.is_multiple_of(f.gguf_block_elems()))
    }

    fn random(&self, name: &str, shape: &[usize]) -> Result<Tensor> {
        let cols = *shape.last().unwrap_or(&1);
        let Some(format) = self.values_format(cols) else {
            // Small weights keep activations finite through many layers; values are irrelevant
            // to speed, only shapes and dtypes matter.
            return Ok(Tensor::randn(0f32, 0.02, shape, &self.device)?.to_dtype(self.dtype)?);
        };
        // The same values on every device, and in blocks or dense (a tied embedding table is
        // both): blocks of the name's seed, dequantized.
        let rows = shape.iter().product::<usize>() / cols;
        let blocks = QuantizedWeight::random(format, rows, cols, QUANTIZED_MAGNITUDE, seed_of(name))?;
        Ok(Tensor::from_vec(blocks.dequantize(), shape, &Device::Cpu)?
            .to_dtype(self.dtype)?
            .to_device(&self.device)?)
    }
}

impl WeightSource for DummyWeights {
    fn path(&self) -> &Path {
        &self.config_path
    }

    fn device(&self) -> &Device {
        &self.device
    }

    fn contains(&self, name: &str) -> bool {
        // Untied lm head, separate Q/K/V, no biases, no rope frequency table.
        !name.ends_with(".bias") && !name.contains("attn_qkv") && name != "rope_freqs.weight"
    }

    fn quantization(&self) -> Option<WeightQuantization> {
        self.stored_as
    }

    fn dense(&mut self, name: &str, shape: &[usize]) -> Result<Tensor> {
        if name.contains("norm") {
            return Ok(Tensor::ones(shape, self.dtype, &self.device)?);
        }
        self.random(name, shape)
    }

    fn blocks(&mut self, name: &str, rows: usize, cols: usize) -> Result<Option<QuantizedWeight>> {
        // A width the format's blocks do not divide stays dense (llama.cpp's quantizer falls
        // back to another type for such tensors); dequantized blocks are dense weights.
        let format = self.quantization.filter(|f| cols.is_multiple_of(f.gguf_block_elems()));
        let Some(format) = format.filter(|_| !self.dequantize) else { return Ok(None) };
        Ok(Some(QuantizedWeight::random(format, rows, cols, QUANTIZED_MAGNITUDE, seed_of(name))?))
    }

    fn linear(&mut self, name: &str, out_dim: usize, in_dim: usize, _bias: Option<&str>) -> Result<Linear> {
        if let Some(blocks) = self.blocks(name, out_dim, in_dim)? {
            return Linear::blocks_on(blocks, KernelPlan::default(), &self.device);
        }
        Ok(Linear::new(LinearWeight::Dense(self.random(name, &[out_dim, in_dim])?), None))
    }

    fn experts(&mut self, name: &str, num_experts: usize, rows: usize, cols: usize) -> Result<Vec<Linear>> {
        (0..num_experts).map(|e| self.linear(&format!("{name}.{e}"), rows, cols, None)).collect()
    }
}

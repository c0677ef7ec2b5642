//! `--quantization fp8`: a model's layer projections quantized at load to FP8 (e4m3) with a
//! scale per output row ([`pagoda_ops::Fp8Weight`]), from the dense weights the checkpoint holds.
//!
//! - Quantized: every attention and MLP projection of every layer, experts included. Kept as
//!   loaded: the embeddings, the lm head and an MoE router (vLLM's choice too: they are small
//!   and their errors reach every token).
//! - Projections stack first (Q/K/V, gate/up), then quantize: each output row keeps its own
//!   scale, so stacking changes nothing but the launches.
//! - On CUDA a kernel quantizes each weight where it was loaded and the codes stay there
//!   ([`LinearWeight::DeviceFp8`]): one byte per weight.
//! - On the CPU the weights are rounded to their FP8 values and kept dense in the compute dtype:
//!   no memory saved, the same numbers the GPU multiplies, for checking a model's accuracy.
//! - A GGUF's blocks are dequantized first, then quantized: two roundings, for comparisons (the
//!   option is meant for bf16, f16 and f32 checkpoints).

use std::sync::Arc;

use candle_core::quantized::QMatMul;
use candle_core::{DType, Device, Tensor};
use pagoda_ops::{DeviceFp8Weight, Fp8Weight};

use crate::error::{ModelError, Result};
use crate::linear::{Linear, LinearWeight, StackedLinear};

/// How a model's layer projections are stored, when not as the checkpoint holds them
/// (`--quantization`; the `value(help)` is the flag's documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum WeightQuantization {
    /// e4m3 codes with an f32 scale per output row.
    #[cfg_attr(
        feature = "clap",
        value(help = "FP8 (e4m3) with a scale per output channel, quantized at load")
    )]
    Fp8,
}

impl WeightQuantization {
    /// Whether the projection `name` (a GGUF tensor name) is quantized: a layer's projections,
    /// not the embeddings, the lm head or an MoE router.
    pub(crate) fn covers(self, name: &str) -> bool {
        name.starts_with("blk.") && !name.contains("ffn_gate_inp")
    }

    /// `stacked` stored this way.
    pub(crate) fn apply(self, stacked: StackedLinear) -> Result<StackedLinear> {
        match self {
            WeightQuantization::Fp8 => stacked.into_fp8(),
        }
    }

    /// One projection stored this way.
    pub(crate) fn apply_one(self, linear: Linear) -> Result<Linear> {
        match self {
            WeightQuantization::Fp8 => linear.into_fp8(),
        }
    }
}

fn fp8_error(e: String) -> ModelError {
    ModelError::InvalidOption(format!("--quantization fp8: {e}"))
}

impl Linear {
    /// This projection quantized to FP8 from the values it holds (see the module doc).
    pub(crate) fn into_fp8(self) -> Result<Linear> {
        let (weight, bias) = self.into_parts();
        let dense = match weight {
            LinearWeight::Dense(t) => t,
            LinearWeight::Quantized(QMatMul::Tensor(t) | QMatMul::TensorF16(t)) => t,
            LinearWeight::Quantized(QMatMul::QTensor(q)) => q.dequantize(&q.device())?,
            LinearWeight::Packed { blocks, .. } => {
                Tensor::from_vec(blocks.dequantize(), (blocks.rows(), blocks.cols()), &Device::Cpu)?
            }
            LinearWeight::DeviceBlocks(w) => w.dequantize(DType::F32)?,
            LinearWeight::DeviceFp8(_) => return Ok(Linear::new(weight, bias)),
            LinearWeight::Panels(_) | LinearWeight::RowInvariant(_) => {
                return Err(fp8_error(
                    "a batch-invariant model's weights are packed for their own kernels".to_owned(),
                ))
            }
        };
        // On CUDA quantized by a kernel where the weight lives, never copied to the host.
        let weight = if dense.device().is_cuda() {
            LinearWeight::DeviceFp8(Arc::new(DeviceFp8Weight::quantize(&dense)?))
        } else {
            let (rows, cols) = dense.dims2()?;
            let values: Vec<f32> = dense.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?;
            let fp8 = Fp8Weight::quantize(rows, cols, &values).map_err(fp8_error)?;
            let rounded = Tensor::from_vec(fp8.dequantize(), (rows, cols), &Device::Cpu)?;
            LinearWeight::Dense(rounded.to_dtype(dense.dtype())?)
        };
        Ok(Linear::new(weight, bias))
    }
}

impl StackedLinear {
    /// Each part (or the stacked weight) quantized to FP8 with [`Linear::into_fp8`].
    pub(crate) fn into_fp8(self) -> Result<StackedLinear> {
        Ok(match self {
            StackedLinear::Stacked { linear, widths } => {
                StackedLinear::Stacked { linear: linear.into_fp8()?, widths }
            }
            StackedLinear::Separate(parts) => {
                StackedLinear::Separate(parts.into_iter().map(Linear::into_fp8).collect::<Result<_>>()?)
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel_plan::KernelPlan;

    #[test]
    fn dense_weights_round_to_their_fp8_values_on_the_cpu() {
        let values: Vec<f32> = (0..4 * 64).map(|i| ((i * 37 % 101) as f32 - 50.0) / 70.0).collect();
        let dense = Tensor::from_vec(values.clone(), (4, 64), &Device::Cpu).unwrap();
        let bias = Tensor::from_vec(vec![1f32, 2.0, 3.0, 4.0], 4, &Device::Cpu).unwrap();
        let linear = Linear::dense(dense, Some(bias), KernelPlan::default()).unwrap().into_fp8().unwrap();
        let want = Fp8Weight::quantize(4, 64, &values).unwrap().dequantize();
        let x = Tensor::eye(64, DType::F32, &Device::Cpu).unwrap();
        // x = I: the output is the weight, transposed, plus the bias.
        let got: Vec<Vec<f32>> = linear.forward(&x).unwrap().t().unwrap().to_vec2().unwrap();
        for (n, row) in got.iter().enumerate() {
            for (k, v) in row.iter().enumerate() {
                assert_eq!(*v, want[n * 64 + k] + (n + 1) as f32, "{n} {k}");
            }
        }
        assert!(values.iter().zip(&want).any(|(a, b)| a != b), "fp8 rounds some weights");
        assert!(WeightQuantization::Fp8.covers("blk.3.attn_qkv.weight"));
        assert!(!WeightQuantization::Fp8.covers("blk.3.ffn_gate_inp.weight"));
        assert!(!WeightQuantization::Fp8.covers("output.weight"));
    }
}

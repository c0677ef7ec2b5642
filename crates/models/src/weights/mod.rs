//! Where weights come from: GGUF files, Hugging Face safetensors directories, or random dummy
//! weights. The model asks for tensors by their GGUF names (`blk.3.attn_q.weight`); each source
//! maps those to its own naming.

mod dummy;
mod gguf;
mod safetensors;

use std::path::Path;

use candle_core::{Device, Tensor};
use pagoda_ops::QuantizedWeight;

pub use dummy::DummyWeights;
pub use gguf::GgufWeights;
pub use safetensors::SafetensorsWeights;

use crate::error::Result;
use crate::kernel_plan::KernelPlan;
use crate::linear::{Linear, StackedLinear};
use crate::linear_fp8::WeightQuantization;

/// A store of named weights that the model builder reads from.
pub trait WeightSource {
    /// File or directory the weights come from, for error messages.
    fn path(&self) -> &Path;
    /// Where the weights are loaded to.
    fn device(&self) -> &Device;
    fn contains(&self, name: &str) -> bool;
    /// A dense tensor of the given shape, in the model's compute dtype (dequantized if needed).
    fn dense(&mut self, name: &str, shape: &[usize]) -> Result<Tensor>;
    /// Whether [`WeightSource::linear`] would keep `name` quantized rather than dense.
    fn keeps_quantized(&self, _name: &str) -> bool {
        false
    }
    /// The `[rows, cols]` weight `name` as GGUF blocks, when the source keeps it in blocks our
    /// kernels read: [`pagoda_ops::quant_matmul`] on the CPU (dequantizing to f32), or
    /// [`pagoda_ops::DeviceQuantWeight`] on CUDA (not dequantizing). Decides from the tensor
    /// index before reading any data.
    fn blocks(&mut self, _name: &str, _rows: usize, _cols: usize) -> Result<Option<QuantizedWeight>> {
        Ok(None)
    }
    /// Which kernels multiply this source's weights on the CPU.
    fn kernel_plan(&self) -> KernelPlan {
        KernelPlan::default()
    }
    /// How layer projections are stored when not as the file holds them (`--quantization`).
    fn quantization(&self) -> Option<WeightQuantization> {
        None
    }
    /// A `[out, in]` projection, kept quantized when the source and options allow it.
    fn linear(&mut self, name: &str, out_dim: usize, in_dim: usize, bias: Option<&str>) -> Result<Linear>;
    /// The `num_experts` projections `[rows, cols]` of the stacked expert weight `name`
    /// (`[num_experts, rows, cols]`, llama.cpp's `blk.N.ffn_gate_exps.weight`), in expert order.
    fn experts(&mut self, name: &str, num_experts: usize, rows: usize, cols: usize) -> Result<Vec<Linear>>;
}

/// One projection of the model: `[out_dim, in_dim]` with an optional bias. Block-quantized
/// weights that [`pagoda_ops::quant_matmul`] reads are kept as blocks plus a dense copy.
pub fn load_linear(
    source: &mut dyn WeightSource,
    name: &str,
    out_dim: usize,
    in_dim: usize,
    bias: Option<&str>,
) -> Result<Linear> {
    Ok(load_stacked(source, &[(name, out_dim, bias)], in_dim)?.into_single())
}

/// Projections of one input, `(name, out_dim, bias)` each, stacked into one matmul when
/// their weights allow it. Block-quantized parts are stacked as blocks and dequantized once.
/// Layer projections are then stored as the source's [`WeightSource::quantization`] says
/// (`crate::linear_fp8`).
pub fn load_stacked(
    source: &mut dyn WeightSource,
    parts: &[(&str, usize, Option<&str>)],
    in_dim: usize,
) -> Result<StackedLinear> {
    let stacked = load_stacked_as_held(source, parts, in_dim)?;
    match source.quantization() {
        Some(q) if parts.iter().all(|(name, _, _)| q.covers(name)) => q.apply(stacked),
        _ => Ok(stacked),
    }
}

fn load_stacked_as_held(
    source: &mut dyn WeightSource,
    parts: &[(&str, usize, Option<&str>)],
    in_dim: usize,
) -> Result<StackedLinear> {
    if parts.iter().all(|(_, _, bias)| bias.is_none()) {
        let mut blocks = Vec::with_capacity(parts.len());
        for &(name, out_dim, _) in parts {
            match source.blocks(name, out_dim, in_dim)? {
                Some(b) => blocks.push(b),
                None => break,
            }
        }
        if blocks.len() == parts.len() {
            let plan = source.kernel_plan();
            // Parts in different formats (Gemma 3's Q5_0 Q/K and Q8_0 V) run as separate matmuls.
            if blocks.iter().any(|b| b.format() != blocks[0].format()) {
                let device = source.device().clone();
                let linears =
                    blocks.into_iter().map(|b| Linear::blocks_on(b, plan, &device)).collect::<Result<_>>()?;
                return Ok(StackedLinear::Separate(linears));
            }
            return StackedLinear::from_blocks(blocks, plan, source.device());
        }
    }
    let linears = parts
        .iter()
        .map(|&(name, out_dim, bias)| source.linear(name, out_dim, in_dim, bias))
        .collect::<Result<Vec<_>>>()?;
    StackedLinear::new(linears)
}

/// Fails with a clear error when a tensor's shape differs from what the config implies.
pub(crate) fn check_shape(path: &Path, name: &str, expected: &[usize], actual: &[usize]) -> Result<()> {
    if expected == actual {
        Ok(())
    } else {
        Err(crate::error::ModelError::TensorShape {
            path: path.to_path_buf(),
            tensor: name.to_string(),
            expected: expected.to_vec(),
            actual: actual.to_vec(),
        })
    }
}

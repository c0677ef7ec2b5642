//! A linear layer over quantized, dense or both forms of a weight, `y = x W^T (+ b)`, and
//! [`StackedLinear`], several projections of one input run as one matmul.

use std::sync::Arc;

use candle_core::quantized::QMatMul;
use candle_core::{DType, Module, Tensor};
use pagoda_ops::{PanelPrecision, PanelWeight, QuantizedWeight};

use crate::error::Result;

/// Steps of at most this many tokens multiply [`LinearWeight::Packed`] blocks directly; larger
/// ones use the dense copy. From `cargo bench -p pagoda-bench --bench matmul` on a 2-core
/// AVX-512 machine, SmolLM2's 30 layers: the block kernel takes 5.7 / 12.2 / 24.9 / 37.4 ms at
/// 1 / 8 / 16 / 24 tokens against 12.3 / 14.0 / 30.3 / 29.1 ms for the panel GEMM.
pub const PACKED_MAX_TOKENS: usize = 16;

#[derive(Debug, Clone)]
pub enum LinearWeight {
    /// Quantized blocks multiplied by candle's quantized matmul (activations rounded to 8 bits).
    Quantized(QMatMul),
    /// A dense `[out, in]` matrix.
    Dense(Tensor),
    /// GGUF blocks multiplied with exact f32 activations for small steps, plus their dense form
    /// (the same values in f32, or rounded to bfloat16) packed in panels for large ones. CPU
    /// only.
    Packed { blocks: Arc<QuantizedWeight>, panels: Arc<PanelWeight> },
}

#[derive(Debug, Clone)]
pub struct Linear {
    weight: LinearWeight,
    bias: Option<Tensor>,
}

impl Linear {
    pub fn new(weight: LinearWeight, bias: Option<Tensor>) -> Self {
        Self { weight, bias }
    }

    /// `x`: `[tokens, in]` -> `[tokens, out]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = match &self.weight {
            LinearWeight::Quantized(q) => q.forward(x)?,
            LinearWeight::Dense(w) => x.matmul(&w.t()?)?,
            LinearWeight::Packed { blocks, panels } => {
                let x = &x.to_dtype(DType::F32)?;
                // Int8 panels beat the blocks at every step size (benches/README.md); float ones
                // only past PACKED_MAX_TOKENS. Int8 is a precision the user chose for all steps.
                if panels.precision() != PanelPrecision::Int8 && x.dim(0)? <= PACKED_MAX_TOKENS {
                    pagoda_ops::quant_matmul(x, blocks)?
                } else {
                    pagoda_ops::panel_matmul(x, panels)?
                }
            }
        };
        Ok(match &self.bias {
            Some(b) => y.broadcast_add(b)?,
            None => y,
        })
    }

    /// Blocks for the few-token steps plus their dense form, packed in panels of `precision`,
    /// for larger ones (dequantized here, in parallel).
    pub fn packed(blocks: QuantizedWeight, precision: PanelPrecision) -> Self {
        let panels = Arc::new(PanelWeight::from_quantized(&blocks, precision));
        Self::new(LinearWeight::Packed { blocks: Arc::new(blocks), panels }, None)
    }

    /// The GGUF blocks of a packed weight.
    pub fn blocks(&self) -> Option<&Arc<QuantizedWeight>> {
        match &self.weight {
            LinearWeight::Packed { blocks, .. } => Some(blocks),
            LinearWeight::Dense(_) | LinearWeight::Quantized(_) => None,
        }
    }

    pub fn is_quantized(&self) -> bool {
        matches!(self.weight, LinearWeight::Quantized(QMatMul::QTensor(_)))
    }

    /// Rows of the output.
    fn out_dim(&self) -> Result<usize> {
        Ok(match &self.weight {
            LinearWeight::Quantized(QMatMul::QTensor(q)) => q.shape().dims()[0],
            LinearWeight::Quantized(QMatMul::Tensor(t) | QMatMul::TensorF16(t)) => t.dim(0)?,
            LinearWeight::Dense(t) => t.dim(0)?,
            LinearWeight::Packed { blocks, .. } => blocks.rows(),
        })
    }

    /// One projection computing `parts` at once (their outputs side by side), or `None` when
    /// their weights cannot be stacked (candle's quantized blocks, mixed kinds or biases).
    fn stack(parts: &[&Linear]) -> Result<Option<Linear>> {
        let bias = match parts.iter().filter(|p| p.bias.is_some()).count() {
            0 => None,
            n if n == parts.len() => {
                let biases: Vec<&Tensor> = parts.iter().filter_map(|p| p.bias.as_ref()).collect();
                Some(Tensor::cat(&biases, 0)?)
            }
            _ => return Ok(None),
        };
        let packed: Option<Vec<(&QuantizedWeight, PanelPrecision)>> = parts
            .iter()
            .map(|p| match &p.weight {
                LinearWeight::Packed { blocks, panels } => Some((&**blocks, panels.precision())),
                _ => None,
            })
            .collect();
        if let Some(packed) =
            packed.filter(|ps| ps.iter().all(|(b, p)| (b.format(), *p) == (ps[0].0.format(), ps[0].1)))
        {
            let blocks: Vec<&QuantizedWeight> = packed.iter().map(|(b, _)| *b).collect();
            let stacked = Linear::packed(QuantizedWeight::concat_rows(&blocks)?, packed[0].1);
            return Ok(Some(Linear::new(stacked.weight, bias)));
        }
        let denses: Option<Vec<&Tensor>> = parts
            .iter()
            .map(|p| match &p.weight {
                LinearWeight::Dense(d) => Some(d),
                LinearWeight::Packed { .. } | LinearWeight::Quantized(_) => None,
            })
            .collect();
        let Some(denses) = denses else { return Ok(None) };
        Ok(Some(Linear::new(LinearWeight::Dense(Tensor::cat(&denses, 0)?), bias)))
    }
}

/// Projections of the same input (Q/K/V, or gate/up), stacked into one matmul when their
/// weights allow it: one pass over the input and one kernel launch instead of several.
#[derive(Debug, Clone)]
pub enum StackedLinear {
    Stacked { linear: Linear, widths: Vec<usize> },
    Separate(Vec<Linear>),
}

impl StackedLinear {
    pub fn new(parts: Vec<Linear>) -> Result<Self> {
        let refs: Vec<&Linear> = parts.iter().collect();
        Ok(match Linear::stack(&refs)? {
            Some(linear) => {
                let widths = parts.iter().map(Linear::out_dim).collect::<Result<_>>()?;
                StackedLinear::Stacked { linear, widths }
            }
            None => StackedLinear::Separate(parts),
        })
    }

    /// A weight stored fused (Phi-3's `qkv_proj`, `gate_up_proj`) whose output rows are the
    /// parts of `widths`, in order.
    pub fn fused(linear: Linear, widths: Vec<usize>) -> Self {
        StackedLinear::Stacked { linear, widths }
    }

    /// Block-quantized parts stacked into one weight, dequantized once.
    pub fn from_blocks(parts: Vec<QuantizedWeight>, precision: PanelPrecision) -> Result<Self> {
        let widths: Vec<usize> = parts.iter().map(QuantizedWeight::rows).collect();
        let blocks = match parts.len() {
            1 => parts.into_iter().next().expect("one part"),
            _ => QuantizedWeight::concat_rows(&parts.iter().collect::<Vec<_>>())?,
        };
        Ok(StackedLinear::Stacked { linear: Linear::packed(blocks, precision), widths })
    }

    /// The projection of a one-part stack.
    pub fn into_single(self) -> Linear {
        match self {
            StackedLinear::Stacked { linear, .. } => linear,
            StackedLinear::Separate(mut parts) => parts.swap_remove(0),
        }
    }

    /// Each part's output, `[tokens, width]` (views of one tensor when stacked).
    pub fn forward(&self, x: &Tensor) -> Result<Vec<Tensor>> {
        match self {
            StackedLinear::Separate(parts) => parts.iter().map(|p| p.forward(x)).collect(),
            StackedLinear::Stacked { linear, widths } => {
                let y = linear.forward(x)?;
                let mut offset = 0;
                widths
                    .iter()
                    .map(|&w| {
                        let part = y.narrow(1, offset, w)?;
                        offset += w;
                        Ok(part)
                    })
                    .collect()
            }
        }
    }

    /// Like [`StackedLinear::forward`], with each part shaped `[tokens, heads, head_dim]` for the
    /// given head counts. Stacked outputs are split along the head dim, so the parts stay views.
    pub fn forward_heads(&self, x: &Tensor, heads: &[usize], head_dim: usize) -> Result<Vec<Tensor>> {
        let tokens = x.dim(0)?;
        match self {
            StackedLinear::Separate(parts) => parts
                .iter()
                .zip(heads)
                .map(|(p, &h)| Ok(p.forward(x)?.reshape((tokens, h, head_dim))?))
                .collect(),
            StackedLinear::Stacked { linear, .. } => {
                let y = linear.forward(x)?.reshape((tokens, heads.iter().sum::<usize>(), head_dim))?;
                let mut offset = 0;
                heads
                    .iter()
                    .map(|&h| {
                        let part = y.narrow(1, offset, h)?;
                        offset += h;
                        Ok(part)
                    })
                    .collect()
            }
        }
    }

    pub fn is_quantized(&self) -> bool {
        match self {
            StackedLinear::Stacked { linear, .. } => linear.is_quantized(),
            StackedLinear::Separate(parts) => parts.iter().any(Linear::is_quantized),
        }
    }

    pub fn is_stacked(&self) -> bool {
        matches!(self, StackedLinear::Stacked { .. })
    }
}

#[cfg(test)]
mod tests {
    use candle_core::Device;
    use half::f16;
    use pagoda_ops::QuantFormat;

    use super::*;

    /// A Q4_1 weight of `rows x cols` with varied codes, scales and minimums.
    fn packed(rows: usize, cols: usize, seed: u32) -> Linear {
        let mut bytes = Vec::new();
        for b in 0..rows * cols / 32 {
            let v = b as u32 * 7 + seed;
            bytes.extend(f16::from_f32(0.01 + (v % 5) as f32 * 0.003).to_le_bytes());
            bytes.extend(f16::from_f32(-0.05 * (v % 3) as f32).to_le_bytes());
            bytes.extend((0..16).map(|j| ((v + j * 13) % 251) as u8));
        }
        Linear::packed(
            QuantizedWeight::from_gguf(QuantFormat::Q4_1, rows, cols, &bytes).unwrap(),
            PanelPrecision::F32,
        )
    }

    fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
        (a - b).unwrap().abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar().unwrap()
    }

    #[test]
    fn packed_block_and_dense_paths_agree() {
        let l = packed(48, 64, 1);
        let LinearWeight::Packed { blocks, .. } = &l.weight else { unreachable!() };
        let dense = Tensor::from_vec(blocks.dequantize(), (48, 64), &Device::Cpu).unwrap();
        // Rows up to the cutoff take the block kernel, the whole batch the panel GEMM.
        let x = Tensor::randn(0f32, 1.0, (PACKED_MAX_TOKENS + 1, 64), &Device::Cpu).unwrap();
        let dense_y = x.matmul(&dense.t().unwrap()).unwrap();
        let small = l.forward(&x.narrow(0, 0, PACKED_MAX_TOKENS).unwrap()).unwrap();
        assert!(max_diff(&small, &dense_y.narrow(0, 0, PACKED_MAX_TOKENS).unwrap()) < 1e-4);
        assert!(max_diff(&l.forward(&x).unwrap(), &dense_y) < 1e-5);
    }

    #[test]
    fn stacked_projections_equal_separate_ones() {
        let parts = vec![packed(64, 64, 1), packed(32, 64, 2), packed(32, 64, 3)];
        let stacked = StackedLinear::new(parts.clone()).unwrap();
        assert!(stacked.is_stacked());
        let separate = StackedLinear::Separate(parts);
        for tokens in [3, PACKED_MAX_TOKENS + 5] {
            let x = Tensor::randn(0f32, 1.0, (tokens, 64), &Device::Cpu).unwrap();
            let a = stacked.forward_heads(&x, &[4, 2, 2], 16).unwrap();
            let b = separate.forward_heads(&x, &[4, 2, 2], 16).unwrap();
            for (a, b) in a.iter().zip(&b) {
                assert_eq!(a.dims(), b.dims());
                assert!(max_diff(a, b) < 1e-4);
            }
            let a = stacked.forward(&x).unwrap();
            assert_eq!(a.iter().map(|t| t.dim(1).unwrap()).collect::<Vec<_>>(), [64, 32, 32]);
        }
    }

    #[test]
    fn quantized_and_mixed_bias_projections_stay_separate() {
        let with_bias = Linear::new(
            LinearWeight::Dense(Tensor::zeros((4, 32), DType::F32, &Device::Cpu).unwrap()),
            Some(Tensor::zeros(4, DType::F32, &Device::Cpu).unwrap()),
        );
        let without =
            Linear::new(LinearWeight::Dense(Tensor::zeros((4, 32), DType::F32, &Device::Cpu).unwrap()), None);
        assert!(!StackedLinear::new(vec![with_bias.clone(), without]).unwrap().is_stacked());
        let both = StackedLinear::new(vec![with_bias.clone(), with_bias]).unwrap();
        assert!(both.is_stacked());
    }
}

//! A linear layer over quantized, dense or both forms of a weight, `y = x W^T (+ b)`, and
//! [`StackedLinear`], several projections of one input run as one matmul.
//!
//! On the CPU, the [`KernelPlan`] says which kernel a step of each size runs: the exact blocks,
//! or panels of some precision (`crate::kernel_plan`).
//!
//! On CUDA a dense weight multiplies steps of up to 8 rows on our skinny kernel and larger ones
//! on cuBLAS; a batch-invariant model takes the skinny kernel at every step
//! ([`LinearWeight::RowInvariant`]). GGUF blocks stay quantized on the device
//! ([`LinearWeight::DeviceBlocks`]): decode steps multiply them directly, larger steps a copy
//! dequantized for the call; so do FP8 weights ([`LinearWeight::DeviceFp8`], `linear_fp8`).

use std::sync::Arc;

use candle_core::quantized::QMatMul;
use candle_core::{DType, Device, Module, Tensor};
use pagoda_ops::{DeviceFp8Weight, DeviceQuantWeight, PanelPrecision, PanelWeight, QuantizedWeight};

use crate::error::Result;
use crate::kernel_plan::{CpuKernel, KernelPlan};

#[derive(Debug, Clone)]
pub enum LinearWeight {
    /// Quantized blocks multiplied by candle's quantized matmul (activations rounded to 8 bits).
    Quantized(QMatMul),
    /// A dense `[out, in]` matrix.
    Dense(Tensor),
    /// GGUF blocks, plus a copy packed in panels for each panel kernel the plan runs. CPU only.
    Packed { blocks: Arc<QuantizedWeight>, panels: Vec<Arc<PanelWeight>>, plan: KernelPlan },
    /// A dense weight packed in panels: what a batch-invariant CPU model multiplies dense
    /// weights with.
    Panels(Arc<PanelWeight>),
    /// GGUF blocks on a CUDA device, multiplied by our quantized kernel at decode-sized steps
    /// and dequantized per call for larger ones.
    DeviceBlocks(Arc<DeviceQuantWeight>),
    /// FP8 codes with a scale per row on a CUDA device (`--quantization fp8`), multiplied by our
    /// FP8 kernel at decode-sized steps and dequantized per call for larger ones.
    DeviceFp8(Arc<DeviceFp8Weight>),
    /// A dense `[out, in]` matrix of a batch-invariant CUDA model, multiplied by
    /// [`pagoda_ops::row_invariant_matmul`] at every step (the skinny kernel, a grid row per 16
    /// rows), so a row's output does not depend on the rows beside it.
    RowInvariant(Tensor),
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
            // A decode step's few rows on CUDA: our kernel, rows independent of each other.
            LinearWeight::Dense(w) if pagoda_ops::skinny_matmul_preferred(x, w) => {
                pagoda_ops::skinny_matmul(x, w)?
            }
            LinearWeight::Dense(w) => x.matmul(&w.t()?)?,
            LinearWeight::RowInvariant(w) => pagoda_ops::row_invariant_matmul(x, w)?,
            LinearWeight::DeviceBlocks(w) => w.forward(x)?,
            LinearWeight::DeviceFp8(w) => w.forward(x)?,
            LinearWeight::Packed { blocks, panels, plan } => {
                let x = &x.to_dtype(DType::F32)?;
                match plan.kernel_for(x.dim(0)?) {
                    CpuKernel::Blocks if plan.batch_invariant => {
                        pagoda_ops::quant_matmul_batch_invariant(x, blocks)?
                    }
                    CpuKernel::Blocks => pagoda_ops::quant_matmul(x, blocks)?,
                    CpuKernel::Panels(precision) => {
                        let panels = panels
                            .iter()
                            .find(|p| p.precision() == precision)
                            .expect("`packed` makes a copy for each panel kernel of the plan");
                        pagoda_ops::panel_matmul(x, panels)?
                    }
                }
            }
            LinearWeight::Panels(panels) => pagoda_ops::panel_matmul(&x.to_dtype(DType::F32)?, panels)?,
        };
        Ok(match &self.bias {
            Some(b) => y.broadcast_add(b)?,
            None => y,
        })
    }

    /// The same weight with `bias` added after the matmul.
    pub fn with_bias(self, bias: Option<Tensor>) -> Self {
        Self { bias, ..self }
    }

    /// GGUF blocks for `device`: on CUDA uploaded as they are ([`LinearWeight::DeviceBlocks`]);
    /// on the CPU [`Linear::packed`].
    pub fn blocks_on(blocks: QuantizedWeight, plan: KernelPlan, device: &Device) -> Result<Self> {
        if device.is_cuda() {
            let weight = DeviceQuantWeight::new(&blocks, device)?;
            return Ok(Self::new(LinearWeight::DeviceBlocks(Arc::new(weight)), None));
        }
        Ok(Self::packed(blocks, plan))
    }

    /// GGUF blocks, packed (dequantized here, in parallel) in panels of each precision the
    /// plan's kernels use; the blocks alone when they serve every step.
    pub fn packed(blocks: QuantizedWeight, plan: KernelPlan) -> Self {
        let mut precisions: Vec<PanelPrecision> = Vec::new();
        for kernel in [plan.decode_sized, plan.prefill_sized] {
            if let CpuKernel::Panels(p) = kernel {
                if !precisions.contains(&p) {
                    precisions.push(p);
                }
            }
        }
        let panels =
            precisions.into_iter().map(|p| Arc::new(PanelWeight::from_quantized(&blocks, p))).collect();
        Self::new(LinearWeight::Packed { blocks: Arc::new(blocks), panels, plan }, None)
    }

    /// A dense `[out, in]` weight: candle's matmul, or for a batch-invariant model on CUDA
    /// [`LinearWeight::RowInvariant`], and on the CPU an f32 weight packed in panels of the
    /// plan's precision (int8 has no codes to keep, so it packs as
    /// [`PanelPrecision::auto_float`]).
    pub fn dense(weight: Tensor, bias: Option<Tensor>, plan: KernelPlan) -> Result<Self> {
        if plan.batch_invariant && weight.device().is_cuda() {
            return Ok(Self::new(LinearWeight::RowInvariant(weight), bias));
        }
        if !(plan.batch_invariant && weight.device().is_cpu() && weight.dtype() == DType::F32) {
            return Ok(Self::new(LinearWeight::Dense(weight), bias));
        }
        let (rows, cols) = weight.dims2()?;
        let values = weight.flatten_all()?.to_vec1::<f32>()?;
        let panels = PanelWeight::from_rows(rows, cols, &values, plan.dense_precision());
        Ok(Self::new(LinearWeight::Panels(Arc::new(panels)), bias))
    }

    /// The GGUF blocks of a packed weight.
    pub fn blocks(&self) -> Option<&Arc<QuantizedWeight>> {
        match &self.weight {
            LinearWeight::Packed { blocks, .. } => Some(blocks),
            LinearWeight::Dense(_)
            | LinearWeight::RowInvariant(_)
            | LinearWeight::Quantized(_)
            | LinearWeight::DeviceBlocks(_)
            | LinearWeight::DeviceFp8(_)
            | LinearWeight::Panels(_) => None,
        }
    }

    /// The weight and the bias.
    pub(crate) fn into_parts(self) -> (LinearWeight, Option<Tensor>) {
        (self.weight, self.bias)
    }

    /// Whether the weight stays in quantized blocks that the matmul reads directly (candle's
    /// quantized matmul, or our CUDA kernel).
    pub fn is_quantized(&self) -> bool {
        matches!(
            self.weight,
            LinearWeight::Quantized(QMatMul::QTensor(_))
                | LinearWeight::DeviceBlocks(_)
                | LinearWeight::DeviceFp8(_)
        )
    }

    /// Rows of the output.
    fn out_dim(&self) -> Result<usize> {
        Ok(match &self.weight {
            LinearWeight::Quantized(QMatMul::QTensor(q)) => q.shape().dims()[0],
            LinearWeight::Quantized(QMatMul::Tensor(t) | QMatMul::TensorF16(t)) => t.dim(0)?,
            LinearWeight::Dense(t) | LinearWeight::RowInvariant(t) => t.dim(0)?,
            LinearWeight::Packed { blocks, .. } => blocks.rows(),
            LinearWeight::Panels(panels) => panels.rows(),
            LinearWeight::DeviceBlocks(w) => w.rows(),
            LinearWeight::DeviceFp8(w) => w.rows(),
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
        let packed: Option<Vec<(&QuantizedWeight, KernelPlan)>> = parts
            .iter()
            .map(|p| match &p.weight {
                LinearWeight::Packed { blocks, plan, .. } => Some((&**blocks, *plan)),
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
        // Dense parts of one kind (all plain, or all row-invariant) stack into that kind.
        let denses: Option<Vec<(&Tensor, bool)>> = parts
            .iter()
            .map(|p| match &p.weight {
                LinearWeight::Dense(d) => Some((d, false)),
                LinearWeight::RowInvariant(d) => Some((d, true)),
                LinearWeight::Packed { .. }
                | LinearWeight::Quantized(_)
                | LinearWeight::DeviceBlocks(_)
                | LinearWeight::DeviceFp8(_)
                | LinearWeight::Panels(_) => None,
            })
            .collect();
        let Some(denses) = denses.filter(|ds| ds.iter().all(|d| d.1 == ds[0].1)) else { return Ok(None) };
        let stacked = Tensor::cat(&denses.iter().map(|d| d.0).collect::<Vec<_>>(), 0)?;
        let weight = match denses[0].1 {
            true => LinearWeight::RowInvariant(stacked),
            false => LinearWeight::Dense(stacked),
        };
        Ok(Some(Linear::new(weight, bias)))
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

    /// Block-quantized parts stacked into one weight, for `device` as [`Linear::blocks_on`]
    /// keeps them.
    pub fn from_blocks(parts: Vec<QuantizedWeight>, plan: KernelPlan, device: &Device) -> Result<Self> {
        let widths: Vec<usize> = parts.iter().map(QuantizedWeight::rows).collect();
        let blocks = match parts.len() {
            1 => parts.into_iter().next().expect("one part"),
            _ => QuantizedWeight::concat_rows(&parts.iter().collect::<Vec<_>>())?,
        };
        Ok(StackedLinear::Stacked { linear: Linear::blocks_on(blocks, plan, device)?, widths })
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
    use crate::kernel_plan::DECODE_SIZED_MAX_TOKENS;

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
            KernelPlan::default(),
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
        let x = Tensor::randn(0f32, 1.0, (DECODE_SIZED_MAX_TOKENS + 1, 64), &Device::Cpu).unwrap();
        let dense_y = x.matmul(&dense.t().unwrap()).unwrap();
        let small = l.forward(&x.narrow(0, 0, DECODE_SIZED_MAX_TOKENS).unwrap()).unwrap();
        assert!(max_diff(&small, &dense_y.narrow(0, 0, DECODE_SIZED_MAX_TOKENS).unwrap()) < 1e-4);
        assert!(max_diff(&l.forward(&x).unwrap(), &dense_y) < 1e-5);
    }

    #[test]
    fn stacked_projections_equal_separate_ones() {
        let parts = vec![packed(64, 64, 1), packed(32, 64, 2), packed(32, 64, 3)];
        let stacked = StackedLinear::new(parts.clone()).unwrap();
        assert!(stacked.is_stacked());
        let separate = StackedLinear::Separate(parts);
        for tokens in [3, DECODE_SIZED_MAX_TOKENS + 5] {
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

    /// Under `batch_invariant` every row's output has the same bits alone and among any number
    /// of other rows, for each panel precision and for dense weights, across the step size at
    /// which the default switches from the block kernel to the panels.
    #[test]
    fn batch_invariant_rows_do_not_depend_on_the_rows_beside_them() {
        let x = Tensor::randn(0f32, 1.0, (2 * DECODE_SIZED_MAX_TOKENS + 7, 64), &Device::Cpu).unwrap();
        let bits = |t: &Tensor| -> Vec<Vec<u32>> {
            t.to_vec2::<f32>().unwrap().iter().map(|r| r.iter().map(|v| v.to_bits()).collect()).collect()
        };
        let check = |l: &Linear, what: &str| {
            let alone: Vec<Vec<u32>> = (0..x.dim(0).unwrap())
                .map(|r| bits(&l.forward(&x.narrow(0, r, 1).unwrap()).unwrap()).remove(0))
                .collect();
            for tokens in [2, 5, DECODE_SIZED_MAX_TOKENS, DECODE_SIZED_MAX_TOKENS + 1, x.dim(0).unwrap()] {
                for start in [0, 3] {
                    let n = tokens.min(x.dim(0).unwrap() - start);
                    let got = bits(&l.forward(&x.narrow(0, start, n).unwrap()).unwrap());
                    for (i, row) in got.iter().enumerate() {
                        assert_eq!(row, &alone[start + i], "{what}: row {} of a {n}-row step", start + i);
                    }
                }
            }
        };
        let LinearWeight::Packed { blocks, .. } = &packed(48, 64, 1).weight else { unreachable!() };
        for precision in
            [PanelPrecision::F32, PanelPrecision::Bf16, PanelPrecision::Int8, PanelPrecision::Int16]
        {
            let plan = KernelPlan::batch_invariant(precision);
            let linear = Linear::packed((**blocks).clone(), plan);
            // f32: the exact block kernel at every size, without a panel copy.
            let LinearWeight::Packed { panels, .. } = &linear.weight else { unreachable!() };
            assert_eq!(panels.is_empty(), precision == PanelPrecision::F32);
            check(&linear, &format!("packed {precision:?}"));
            let dense = Tensor::from_vec(blocks.dequantize(), (48, 64), &Device::Cpu).unwrap();
            let linear = Linear::dense(dense, None, plan).unwrap();
            assert!(matches!(linear.weight, LinearWeight::Panels(_)));
            check(&linear, &format!("dense {precision:?}"));
        }
    }

    /// With int16 small steps, every step of up to 16 tokens gives each row the bits it gets
    /// alone (the verified positions of a speculative step equal one-token steps), within the
    /// 16-bit rounding of the exact product; larger steps take the float panels.
    #[test]
    fn int16_small_steps_give_a_row_its_one_token_bits() {
        let x = Tensor::randn(0f32, 1.0, (DECODE_SIZED_MAX_TOKENS + 8, 64), &Device::Cpu).unwrap();
        let LinearWeight::Packed { blocks, .. } = &packed(48, 64, 3).weight else { unreachable!() };
        let plan = KernelPlan::panels(PanelPrecision::F32).with_int16_decode();
        let linear = Linear::packed((**blocks).clone(), plan);
        let LinearWeight::Packed { panels, .. } = &linear.weight else { unreachable!() };
        let precisions: Vec<PanelPrecision> = panels.iter().map(|p| p.precision()).collect();
        assert_eq!(precisions, [PanelPrecision::Int16, PanelPrecision::F32]);
        let exact = Linear::packed((**blocks).clone(), KernelPlan::default());
        let rows = |n: usize| linear.forward(&x.narrow(0, 0, n).unwrap()).unwrap().to_vec2::<f32>().unwrap();
        let alone: Vec<Vec<f32>> = (0..DECODE_SIZED_MAX_TOKENS)
            .map(|r| linear.forward(&x.narrow(0, r, 1).unwrap()).unwrap().to_vec2::<f32>().unwrap().remove(0))
            .collect();
        for n in [2, 5, 9, DECODE_SIZED_MAX_TOKENS] {
            for (r, row) in rows(n).iter().enumerate() {
                let same = row.iter().zip(&alone[r]).all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "row {r} of a {n}-token step");
            }
        }
        let small_step = x.narrow(0, 0, 4).unwrap();
        let diff = max_diff(&linear.forward(&small_step).unwrap(), &exact.forward(&small_step).unwrap());
        assert!(diff > 0.0 && diff < 1e-3, "16-bit activations: {diff}");
        // Past 16 tokens both take the f32 panels.
        assert_eq!(max_diff(&linear.forward(&x).unwrap(), &exact.forward(&x).unwrap()), 0.0);
        // Under batch_invariant one kernel serves every step: one copy.
        let invariant =
            Linear::packed((**blocks).clone(), KernelPlan::batch_invariant(PanelPrecision::Int16));
        assert!(matches!(&invariant.weight, LinearWeight::Packed { panels, .. } if panels.len() == 1));
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

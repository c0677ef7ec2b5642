//! `quant_matmul`: `y = x W^T` with `W` in GGUF block format (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K,
//! Q5_K, Q6_K; see [`QuantizedWeight`] for the layout in memory) and `x` in f32.
//!
//! Unlike llama.cpp (and candle's `QMatMul`), `x` is not rounded to 8 bits: each block's codes
//! are widened to f32 and multiplied with the exact activations, so the result equals the
//! dequantized f32 matmul up to summation order. This is the matmul for the few-token steps of
//! decoding, where the time is spent streaming weights: a Q4_1 matrix is 6.4x smaller than its
//! f32 form. For larger batches a dense GEMM over the dequantized weights does fewer operations
//! per weight, so the model keeps both and chooses per step.
//!
//! Work is split over rayon by weight rows; each task walks its rows once for every group of up
//! to [`GROUP`] activation rows, so a block is unpacked once per group. The batch-invariant
//! variant caps groups at [`INVARIANT_GROUP`], below which every kernel sums a row in the same
//! order whatever the group's size. x86 kernels (AVX-512 or
//! AVX2 with FMA, chosen at run time) live in `quant_matmul_x86`; the portable kernel here is
//! the fallback and the tests' reference.

use std::ops::Range;
use std::sync::Arc;

use candle_core::{Result, Tensor};
use rayon::prelude::*;

use crate::matmul::cpu_matmul::{self, CpuWeight, OutPtr};
use crate::matmul::quant_weight::{QuantFormat, QuantizedWeight, QUANT_BLOCK};

/// Activation rows computed together per pass over the weights.
pub(crate) const GROUP: usize = 8;

/// The largest group whose kernels sum each row exactly as a group of one does (the AVX-512
/// tile keeps two accumulators per row up to 4 rows and one past that).
pub(crate) const INVARIANT_GROUP: usize = 4;

/// Weight rows per rayon task at least: below this, splitting costs more than it saves.
const MIN_ROWS_PER_TASK: usize = 32;

/// Up to `GROUP` activation rows and, for formats with minimums, their per-block sums.
pub(crate) struct XGroup<'a> {
    pub rows: &'a [&'a [f32]],
    pub block_sums: &'a [&'a [f32]],
}

/// Writes `out[g * rows.len() + i] = x_g . W[rows.start + i]` for every activation row `g` of the
/// group. Implementations may assume `x.rows.len()` is in `1..=GROUP` and every row holds
/// `w.cols()` values.
pub(crate) type RowsKernel = fn(w: &QuantizedWeight, rows: Range<usize>, x: &XGroup<'_>, out: &mut [f32]);

/// `x @ w^T`: `x` is f32 `[tokens, cols]` on the CPU (rows contiguous); returns f32
/// `[tokens, w.rows()]`.
pub fn quant_matmul(x: &Tensor, w: &Arc<QuantizedWeight>) -> Result<Tensor> {
    cpu_matmul::apply(x, w)
}

/// [`quant_matmul`] computing every row in the same order whatever the number of rows (groups
/// of at most 4), so a row's bits do not depend on the rows beside it. Costs
/// a block decode per 4 rows instead of per 8 on many-row steps.
pub fn quant_matmul_batch_invariant(x: &Tensor, w: &Arc<QuantizedWeight>) -> Result<Tensor> {
    cpu_matmul::apply(x, &Arc::new(InvariantBlocks(Arc::clone(w))))
}

/// A block-quantized weight multiplied in groups of [`INVARIANT_GROUP`] rows.
struct InvariantBlocks(Arc<QuantizedWeight>);

impl CpuWeight for InvariantBlocks {
    const OP: &'static str = "quant_matmul";

    fn rows(&self) -> usize {
        self.0.rows()
    }

    fn cols(&self) -> usize {
        self.0.cols()
    }

    fn matmul(&self, x_rows: &[&[f32]]) -> Vec<f32> {
        matmul_grouped(&self.0, x_rows, kernel(self.0.format()), INVARIANT_GROUP)
    }
}

impl CpuWeight for QuantizedWeight {
    const OP: &'static str = "quant_matmul";

    fn rows(&self) -> usize {
        QuantizedWeight::rows(self)
    }

    fn cols(&self) -> usize {
        QuantizedWeight::cols(self)
    }

    fn matmul(&self, x_rows: &[&[f32]]) -> Vec<f32> {
        matmul(self, x_rows, kernel(self.format()))
    }
}

/// `[x_rows.len(), w.rows()]` row-major.
pub(crate) fn matmul(w: &QuantizedWeight, x_rows: &[&[f32]], kernel: RowsKernel) -> Vec<f32> {
    matmul_grouped(w, x_rows, kernel, GROUP)
}

/// [`matmul`] with activation rows taken `group_rows` (at most [`GROUP`]) at a time.
fn matmul_grouped(w: &QuantizedWeight, x_rows: &[&[f32]], kernel: RowsKernel, group_rows: usize) -> Vec<f32> {
    let (m, n) = (x_rows.len(), w.rows());
    let mut out = vec![0f32; m * n];
    if m == 0 || n == 0 {
        return out;
    }
    let sums: Vec<Vec<f32>> =
        if w.format().has_mins() { x_rows.iter().map(|r| block_sums(r)).collect() } else { Vec::new() };
    let sum_refs: Vec<&[f32]> = sums.iter().map(Vec::as_slice).collect();
    let threads = rayon::current_num_threads().max(1);
    // A few tasks per thread balance uneven progress; never tasks thinner than the minimum.
    let tasks = (n / MIN_ROWS_PER_TASK).clamp(1, threads * 4);
    let per_task = n.div_ceil(tasks);
    let ptr = OutPtr(out.as_mut_ptr());
    (0..n.div_ceil(per_task)).into_par_iter().for_each(|t| {
        let rows = t * per_task..((t + 1) * per_task).min(n);
        let mut buf = vec![0f32; group_rows * rows.len()];
        for g0 in (0..m).step_by(group_rows) {
            let g1 = (g0 + group_rows).min(m);
            let group = XGroup {
                rows: &x_rows[g0..g1],
                block_sums: if sum_refs.is_empty() { &[] } else { &sum_refs[g0..g1] },
            };
            let buf = &mut buf[..(g1 - g0) * rows.len()];
            kernel(w, rows.clone(), &group, buf);
            for (g, vals) in buf.chunks_exact(rows.len()).enumerate() {
                let start = (g0 + g) * n + rows.start;
                let p = ptr;
                // SAFETY: `start..start + rows.len()` is inside `out` and belongs to this task only.
                unsafe { std::ptr::copy_nonoverlapping(vals.as_ptr(), p.0.add(start), vals.len()) };
            }
        }
    });
    out
}

/// Sum of each 32-element block of `x` (a block's minimum multiplies it).
fn block_sums(x: &[f32]) -> Vec<f32> {
    x.chunks_exact(QUANT_BLOCK).map(|b| b.iter().sum()).collect()
}

/// The fastest kernel this CPU runs for `format`.
pub(crate) fn kernel(format: QuantFormat) -> RowsKernel {
    #[cfg(target_arch = "x86_64")]
    if let Some(k) = crate::matmul::quant_matmul_x86::kernel(format) {
        return k;
    }
    portable_kernel(format)
}

pub(crate) fn portable_kernel(_format: QuantFormat) -> RowsKernel {
    portable_rows
}

/// The portable row loop: per block, the codes are decoded once and dotted with each activation
/// row's block, half by half (Q6_K's halves have their own scales); a minimum adds
/// `m * sum(x_block)`.
fn portable_rows(w: &QuantizedWeight, rows: Range<usize>, x: &XGroup<'_>, out: &mut [f32]) {
    let bpr = w.blocks_per_row();
    let len = rows.len();
    let half = QUANT_BLOCK / 2;
    let has_mins = w.format().has_mins();
    for (i, r) in rows.enumerate() {
        let mut acc = [0f32; GROUP];
        for b in 0..bpr {
            let block = r * bpr + b;
            let codes = w.block_codes(block).map(f32::from);
            let (s0, s1) = w.block_scales(block);
            for (g, xr) in x.rows.iter().enumerate() {
                let xb = &xr[b * QUANT_BLOCK..(b + 1) * QUANT_BLOCK];
                let lo: f32 = codes[..half].iter().zip(&xb[..half]).map(|(c, v)| c * v).sum();
                let hi: f32 = codes[half..].iter().zip(&xb[half..]).map(|(c, v)| c * v).sum();
                acc[g] += s0 * lo + s1 * hi;
                if has_mins {
                    acc[g] += w.mins()[block] * x.block_sums[g][b];
                }
            }
        }
        for (g, a) in acc.iter().take(x.rows.len()).enumerate() {
            out[g * len + i] = *a;
        }
    }
}

#[cfg(test)]
#[path = "quant_matmul_tests.rs"]
pub(crate) mod tests;

//! `panel_matmul`: `y = x W^T` over a dense f32 weight packed once, at load time, into column
//! panels ([`PanelWeight`]), for the many-token steps (prefill chunks, large decode batches).
//!
//! A general GEMM (candle's, through the `gemm` crate) repacks the right-hand matrix on every
//! call; for a model whose weights are read once per step that copy costs as much as the
//! multiplication. Here the weight is already in the order the microkernel reads: panel `p`
//! holds output columns `p * PANEL .. (p + 1) * PANEL`, one `PANEL`-wide row per input
//! element. The kernel keeps a tile of up to [`TILE_ROWS`] activation rows x `PANEL` outputs in
//! registers and walks the shared dimension once, so each weight value is loaded once per tile.
//!
//! Work is split over rayon by panels; each task runs every activation row against its panels
//! (a panel stays in L1/L2 while the activations stream past it). x86 kernels (AVX-512, AVX2
//! with FMA, chosen at run time) live in `panel_matmul_x86`; the portable kernel here is the
//! fallback and the tests' reference. The sums run in f32 in the order of the shared dimension.

use std::sync::Arc;

use candle_core::{Result, Tensor};
use rayon::prelude::*;

use crate::cpu_matmul::{self, CpuWeight, OutPtr};
use crate::quant_weight::QuantizedWeight;
use crate::simd::{MulAdd, Separate};

/// Output columns per panel: two AVX-512 vectors (four AVX2 ones).
pub const PANEL: usize = 32;

/// Activation rows per register tile: 2 x 12 accumulators plus the two weight vectors fit in
/// AVX-512's 32 registers.
pub(crate) const TILE_ROWS: usize = 12;

/// A dense `[rows (outputs), cols (inputs)]` f32 matrix stored as `ceil(rows / PANEL)` panels of
/// `[cols, PANEL]`, zero-padded past the last row.
#[derive(Debug, Clone)]
pub struct PanelWeight {
    rows: usize,
    cols: usize,
    data: Vec<f32>,
}

impl PanelWeight {
    /// Packs a matrix given row by row: `fill_row(r, out)` writes row `r` (`cols` values).
    pub fn from_row_fn(rows: usize, cols: usize, fill_row: impl Fn(usize, &mut [f32]) + Sync) -> Self {
        let panels = rows.div_ceil(PANEL);
        let mut data = vec![0f32; panels * cols * PANEL];
        if cols > 0 {
            data.par_chunks_mut(cols * PANEL).enumerate().for_each(|(p, panel)| {
                let mut row = vec![0f32; cols];
                for j in 0..PANEL.min(rows - p * PANEL) {
                    fill_row(p * PANEL + j, &mut row);
                    for (k, &v) in row.iter().enumerate() {
                        panel[k * PANEL + j] = v;
                    }
                }
            });
        }
        Self { rows, cols, data }
    }

    /// The dequantized form of a block-quantized weight (the same values as
    /// [`QuantizedWeight::dequantize`]).
    pub fn from_quantized(w: &QuantizedWeight) -> Self {
        Self::from_row_fn(w.rows(), w.cols(), |r, out| w.dequantize_row(r, out))
    }

    /// From a row-major `[rows, cols]` slice.
    pub fn from_rows(rows: usize, cols: usize, values: &[f32]) -> Self {
        assert_eq!(values.len(), rows * cols, "{rows}x{cols} matrix");
        Self::from_row_fn(rows, cols, |r, out| out.copy_from_slice(&values[r * cols..(r + 1) * cols]))
    }

    /// Outputs of the matmul.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// The shared (input) dimension.
    pub fn cols(&self) -> usize {
        self.cols
    }

    pub(crate) fn num_panels(&self) -> usize {
        self.rows.div_ceil(PANEL)
    }

    /// Panel `p`: `cols` rows of `PANEL` values.
    pub(crate) fn panel(&self, p: usize) -> &[f32] {
        &self.data[p * self.cols * PANEL..(p + 1) * self.cols * PANEL]
    }

    /// Bytes of packed values.
    pub fn size_in_bytes(&self) -> usize {
        self.data.len() * std::mem::size_of::<f32>()
    }
}

/// Computes one tile: `out_rows[i][c] = x_rows[i] . W[panel column c]` for `c < width`, where
/// `panel` is one panel of a weight with `x_rows[i].len()` columns. Implementations may assume
/// `x_rows.len()` is in `1..=TILE_ROWS`, `width` in `1..=PANEL`, every x row holds
/// `panel.len() / PANEL` values and every out row `width`.
pub(crate) type TileKernel = fn(x_rows: &[&[f32]], panel: &[f32], out_rows: &mut [&mut [f32]], width: usize);

/// `x @ w^T`: `x` is f32 `[tokens, cols]` on the CPU (rows contiguous, any row stride); returns
/// f32 `[tokens, w.rows()]`.
pub fn panel_matmul(x: &Tensor, w: &Arc<PanelWeight>) -> Result<Tensor> {
    cpu_matmul::apply(x, w)
}

impl CpuWeight for PanelWeight {
    const OP: &'static str = "panel_matmul";

    fn rows(&self) -> usize {
        PanelWeight::rows(self)
    }

    fn cols(&self) -> usize {
        PanelWeight::cols(self)
    }

    fn matmul(&self, x_rows: &[&[f32]]) -> Vec<f32> {
        matmul(self, x_rows, kernel())
    }
}

/// `[x_rows.len(), w.rows()]` row-major.
pub(crate) fn matmul(w: &PanelWeight, x_rows: &[&[f32]], kernel: TileKernel) -> Vec<f32> {
    let (m, n) = (x_rows.len(), w.rows());
    let mut out = vec![0f32; m * n];
    if m == 0 || n == 0 || w.cols() == 0 {
        return out;
    }
    let panels = w.num_panels();
    let threads = rayon::current_num_threads().max(1);
    // A few tasks per thread balance uneven progress.
    let per_task = panels.div_ceil(threads * 4).max(1);
    let ptr = OutPtr(out.as_mut_ptr());
    (0..panels.div_ceil(per_task)).into_par_iter().for_each(|t| {
        let p = ptr;
        for panel in t * per_task..((t + 1) * per_task).min(panels) {
            let col0 = panel * PANEL;
            let width = PANEL.min(n - col0);
            for r0 in (0..m).step_by(TILE_ROWS) {
                let r1 = (r0 + TILE_ROWS).min(m);
                // SAFETY: row `r` columns `col0..col0 + width` lie inside `out` and belong to this
                // task's panel only; no other reference to them exists while the kernel runs.
                let mut out_rows: Vec<&mut [f32]> = (r0..r1)
                    .map(|r| unsafe { std::slice::from_raw_parts_mut(p.0.add(r * n + col0), width) })
                    .collect();
                kernel(&x_rows[r0..r1], w.panel(panel), &mut out_rows, width);
            }
        }
    });
    out
}

/// The fastest kernel this CPU runs.
pub(crate) fn kernel() -> TileKernel {
    #[cfg(target_arch = "x86_64")]
    if let Some(k) = crate::panel_matmul_x86::kernel() {
        return k;
    }
    portable_kernel
}

/// Plain Rust: a `TILE_ROWS x PANEL` accumulator walked over the shared dimension.
pub(crate) fn portable_kernel(x_rows: &[&[f32]], panel: &[f32], out_rows: &mut [&mut [f32]], width: usize) {
    tile_rows::<Separate, TILE_ROWS>(x_rows, panel, out_rows, width);
}

/// The tile loop for up to `ROWS` activation rows at a time, written so LLVM vectorises it for
/// whatever target features its caller enables (see `panel_matmul_x86`'s AVX2 kernel).
#[inline(always)]
pub(crate) fn tile_rows<M: MulAdd, const ROWS: usize>(
    x_rows: &[&[f32]],
    panel: &[f32],
    out_rows: &mut [&mut [f32]],
    width: usize,
) {
    for (xs, outs) in x_rows.chunks(ROWS).zip(out_rows.chunks_mut(ROWS)) {
        let mut acc = [[0f32; PANEL]; ROWS];
        for (k, wk) in panel.chunks_exact(PANEL).enumerate() {
            for (acc_row, x) in acc.iter_mut().zip(xs) {
                let xv = x[k];
                for (a, &wv) in acc_row.iter_mut().zip(wk) {
                    *a = M::mul_add(xv, wv, *a);
                }
            }
        }
        for (out, acc_row) in outs.iter_mut().zip(&acc) {
            out[..width].copy_from_slice(&acc_row[..width]);
        }
    }
}

#[cfg(test)]
#[path = "panel_matmul_tests.rs"]
mod tests;

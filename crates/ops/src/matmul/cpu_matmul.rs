//! What the CPU-only matmul ops (`quant_matmul`, `panel_matmul`) share: the candle op that
//! checks `x @ W^T` for an f32 `x` on the CPU and views `x` as rows (any row stride), and the
//! output pointer their parallel tasks write through.

use std::sync::Arc;

use candle_core::{CpuStorage, CustomOp1, DType, Layout, Result, Shape, Tensor};

use crate::check::{self, invalid};

/// A weight kept in a CPU-only layout that multiplies f32 activation rows.
pub(crate) trait CpuWeight: Send + Sync {
    /// The op's name in errors.
    const OP: &'static str;
    /// Outputs of the matmul.
    fn rows(&self) -> usize;
    /// The shared (input) dimension.
    fn cols(&self) -> usize;
    /// `[x_rows.len(), self.rows()]` row-major; every row holds `self.cols()` values.
    fn matmul(&self, x_rows: &[&[f32]]) -> Vec<f32>;
}

/// `x @ w^T`: `x` is f32 `[tokens, w.cols()]` on the CPU with contiguous rows; returns f32
/// `[tokens, w.rows()]`.
pub(crate) fn apply<W: CpuWeight + 'static>(x: &Tensor, w: &Arc<W>) -> Result<Tensor> {
    let [_, cols] = check::dims::<2>(x)?;
    if cols != w.cols() {
        return Err(invalid(W::OP, format!("x has {cols} columns but the weight has {}", w.cols())));
    }
    check::dtype_is(x, DType::F32, W::OP)?;
    if !x.device().is_cpu() {
        return Err(invalid(W::OP, "the weight lives on the CPU; x is on another device"));
    }
    x.apply_op1_no_bwd(&CpuMatmul(Arc::clone(w)))
}

struct CpuMatmul<W>(Arc<W>);

impl<W: CpuWeight> CustomOp1 for CpuMatmul<W> {
    fn name(&self) -> &'static str {
        W::OP
    }

    fn cpu_fwd(&self, x: &CpuStorage, x_l: &Layout) -> Result<(CpuStorage, Shape)> {
        let w = &*self.0;
        let rows = check::rows(x_l, 1, W::OP)?;
        let xs = x.as_slice::<f32>()?;
        if rows.end() > xs.len() {
            return Err(invalid(W::OP, "x's view does not match its storage"));
        }
        let x_rows: Vec<&[f32]> = (0..rows.rows).map(|i| &xs[rows.range(i)]).collect();
        let out = w.matmul(&x_rows);
        Ok((CpuStorage::F32(out), Shape::from_dims(&[rows.rows, w.rows()])))
    }
}

/// Raw output pointer shared by a matmul's parallel tasks, each of which writes a disjoint set
/// of elements.
#[derive(Clone, Copy)]
pub(crate) struct OutPtr(pub *mut f32);
// SAFETY: users write disjoint elements from each task and keep the buffer alive for the scope.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

//! `rms_norm` and the fused `add_rms_norm` (residual add + RMSNorm in one pass over memory).
//!
//! `y = x / sqrt(mean(x^2) + eps) * weight` over the last dim, in f32, rounded once to the
//! input's dtype.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

use crate::check::{self, invalid};
use crate::dtype::{check_float, storage_to_f32, with_float, Float};
use crate::par_rows::{par_rows_with, zeroed};

const OP: &str = "rms_norm";
const ADD_OP: &str = "add_rms_norm";

/// Rows per rayon task at least this many elements, so small batches stay on one thread.
const MIN_ELEMS_PER_TASK: usize = 1 << 14;

/// RMSNorm of `x` (`[..., hidden]`, f32/f16/bf16) over its last dim, scaled by `weight`
/// (`[hidden]`, any float dtype). Returns a contiguous tensor in `x`'s dtype. `x` may be a view
/// whose rows are contiguous.
pub fn rms_norm(x: &Tensor, weight: &Tensor, eps: f32) -> Result<Tensor> {
    check_args(x, weight, eps, OP)?;
    x.apply_op2_no_bwd(weight, &RmsNorm { eps })
}

/// Fused residual add + RMSNorm: returns `(normed, new_residual)` where
/// `new_residual = x + residual` (rounded to the dtype) and `normed = rms_norm(new_residual,
/// weight, eps)`, bit-identical to calling the two separately. `x` and `residual` must have the
/// same shape and dtype. Both results are views into one allocation.
pub fn add_rms_norm(x: &Tensor, residual: &Tensor, weight: &Tensor, eps: f32) -> Result<(Tensor, Tensor)> {
    check_args(x, weight, eps, ADD_OP)?;
    if x.dims() != residual.dims() {
        return Err(candle_core::Error::ShapeMismatchBinaryOp {
            lhs: x.shape().clone(),
            rhs: residual.shape().clone(),
            op: ADD_OP,
        });
    }
    check::dtype_is(residual, x.dtype(), ADD_OP)?;
    check::same_device(x, residual, ADD_OP)?;
    let packed = x.apply_op3_no_bwd(residual, weight, &AddRmsNorm { eps })?;
    Ok((packed.get(0)?, packed.get(1)?))
}

fn check_args(x: &Tensor, weight: &Tensor, eps: f32, op: &'static str) -> Result<()> {
    let hidden = match x.dims().last() {
        Some(&h) => h,
        None => return Err(invalid(op, "x must have at least one dim")),
    };
    check::shape_is(weight, &[hidden], op, "weight")?;
    check_float(x.dtype(), op)?;
    check_float(weight.dtype(), op)?;
    check::same_device(x, weight, op)?;
    if !(eps.is_finite() && eps >= 0.0) {
        return Err(invalid(op, format!("eps {eps} must be finite and non-negative")));
    }
    Ok(())
}

/// Weight as f32 (the kernels read it once per row).
fn weight_f32(w: &CpuStorage, w_l: &Layout, op: &'static str) -> Result<Vec<f32>> {
    let (start, end) = check::contiguous_range(w_l, op)?;
    storage_to_f32(w, start, end - start, op)
}

/// Normalises `x` (f32) into `out`.
#[inline]
fn normalize_row<T: Float>(x: &[f32], weight: &[f32], eps: f32, out: &mut [T]) {
    let mean_sq = crate::simd::dot::<crate::simd::Separate>(x, x) / x.len() as f32;
    let inv = 1.0 / (mean_sq + eps).sqrt();
    for ((o, v), w) in out.iter_mut().zip(x).zip(weight) {
        *o = T::from_f32(v * inv * w);
    }
}

struct RmsNorm {
    eps: f32,
}

impl RmsNorm {
    fn run<T: Float>(&self, x: &CpuStorage, x_l: &Layout, weight: &[f32]) -> Result<CpuStorage> {
        let rows = check::rows(x_l, 1, OP)?;
        let src = x.as_slice::<T>()?;
        if rows.end() > src.len() {
            return Err(invalid(OP, "x view exceeds its storage"));
        }
        let h = rows.row_len;
        let out = par_rows_with(
            rows.rows,
            h,
            MIN_ELEMS_PER_TASK / h.max(1) + 1,
            T::from_f32(0.0),
            || vec![0f32; h],
            |row, i, dst| {
                T::to_f32_slice(&src[rows.range(i)], row);
                normalize_row(row, weight, self.eps, dst);
            },
        );
        Ok(T::to_cpu_storage_owned(out))
    }
}

impl CustomOp2 for RmsNorm {
    fn name(&self) -> &'static str {
        OP
    }

    fn cpu_fwd(
        &self,
        x: &CpuStorage,
        x_l: &Layout,
        w: &CpuStorage,
        w_l: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let weight = weight_f32(w, w_l, OP)?;
        let out = with_float!(x.dtype(), OP, T => self.run::<T>(x, x_l, &weight))?;
        Ok((out, x_l.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        x: &candle_core::CudaStorage,
        x_l: &Layout,
        w: &candle_core::CudaStorage,
        w_l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        crate::cuda::norm::rms_norm(self.eps, x, x_l, w, w_l)
    }
}

/// Output is `[2, ...x.shape]`: `normed` then `new_residual`.
struct AddRmsNorm {
    eps: f32,
}

impl AddRmsNorm {
    fn run<T: Float>(
        &self,
        x: &CpuStorage,
        x_l: &Layout,
        r: &CpuStorage,
        r_l: &Layout,
        weight: &[f32],
    ) -> Result<CpuStorage> {
        let x_rows = check::rows(x_l, 1, ADD_OP)?;
        let r_rows = check::rows(r_l, 1, ADD_OP)?;
        let (xs, rs) = (x.as_slice::<T>()?, r.as_slice::<T>()?);
        if x_rows.end() > xs.len() || r_rows.end() > rs.len() || x_rows.rows != r_rows.rows {
            return Err(invalid(ADD_OP, "x / residual views do not match their storage"));
        }
        let (n, h) = (x_rows.rows, x_rows.row_len);
        let zero = T::from_f32(0.0);
        // Both outputs in one buffer, rows zeroed by the task that fills them (see `par_rows`).
        let mut out: Vec<T> = Vec::with_capacity(2 * n * h);
        if h == 0 {
            return Ok(T::to_cpu_storage_owned(out));
        }
        let (normed, summed) = out.spare_capacity_mut()[..2 * n * h].split_at_mut(n * h);
        normed
            .par_chunks_mut(h)
            .zip(summed.par_chunks_mut(h))
            .with_min_len(MIN_ELEMS_PER_TASK / h + 1)
            .enumerate()
            .for_each_init(
                || vec![0f32; h],
                |row, (i, (normed, summed))| {
                    let (normed, summed) = (zeroed(normed, zero), zeroed(summed, zero));
                    let (x, r) = (&xs[x_rows.range(i)], &rs[r_rows.range(i)]);
                    for ((s, f), (a, b)) in summed.iter_mut().zip(row.iter_mut()).zip(x.iter().zip(r)) {
                        *s = T::from_f32(a.to_f32() + b.to_f32());
                        // Normalise the rounded sum, so `normed` equals rms_norm(new_residual).
                        *f = s.to_f32();
                    }
                    normalize_row(row, weight, self.eps, normed);
                },
            );
        // SAFETY: the tasks above initialised every row of both halves.
        unsafe { out.set_len(2 * n * h) };
        Ok(T::to_cpu_storage_owned(out))
    }
}

impl CustomOp3 for AddRmsNorm {
    fn name(&self) -> &'static str {
        ADD_OP
    }

    fn cpu_fwd(
        &self,
        x: &CpuStorage,
        x_l: &Layout,
        r: &CpuStorage,
        r_l: &Layout,
        w: &CpuStorage,
        w_l: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        if x.dtype() != r.dtype() {
            return Err(candle_core::Error::DTypeMismatchBinaryOp {
                lhs: x.dtype(),
                rhs: r.dtype(),
                op: ADD_OP,
            });
        }
        let weight = weight_f32(w, w_l, ADD_OP)?;
        let out = with_float!(x.dtype(), ADD_OP, T => self.run::<T>(x, x_l, r, r_l, &weight))?;
        let mut dims = vec![2];
        dims.extend_from_slice(x_l.dims());
        Ok((out, Shape::from(dims)))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        x: &candle_core::CudaStorage,
        x_l: &Layout,
        r: &candle_core::CudaStorage,
        r_l: &Layout,
        w: &candle_core::CudaStorage,
        w_l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        crate::cuda::norm::add_rms_norm(self.eps, x, x_l, r, r_l, w, w_l)
    }
}

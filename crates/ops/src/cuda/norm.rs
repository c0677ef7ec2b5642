//! CUDA implementations of `rms_norm` and `add_rms_norm` (kernels/rms_norm.cu).

use candle_core::backend::BackendStorage;
use candle_core::{CudaStorage, Layout, Result, Shape};

use super::device;
use super::launch::{self, NormArgs};
use crate::check::{self, invalid};

/// `rms_norm` of the rows of `x` with `weight`; returns a contiguous tensor in x's dtype.
pub(crate) fn rms_norm(
    eps: f32,
    x: &CudaStorage,
    x_l: &Layout,
    w: &CudaStorage,
    w_l: &Layout,
) -> Result<(CudaStorage, Shape)> {
    const OP: &str = "rms_norm";
    let rows = check::rows(x_l, 1, OP)?;
    let (w0, w1) = check::contiguous_range(w_l, OP)?;
    if w1 - w0 != rows.row_len {
        return Err(invalid(OP, "weight length differs from the hidden size"));
    }
    let dev = x.device().clone();
    let stream = dev.cuda_stream();
    let mut out = device::alloc(&dev, x.dtype(), rows.rows * rows.row_len)?;
    {
        let (x_ptr, _xg) = device::ptr(x, rows.start, &stream)?;
        let (w_ptr, _wg) = device::ptr(w, w0, &stream)?;
        let (out_ptr, _og) = device::ptr_mut(&mut out, 0, &stream)?;
        let args = NormArgs {
            x_dtype: x.dtype(),
            w_dtype: w.dtype(),
            x: x_ptr,
            x_row_stride: rows.row_stride,
            weight: w_ptr,
            out: out_ptr,
            rows: rows.rows,
            hidden: rows.row_len,
            eps,
        };
        if let Some(l) = launch::rms_norm(&args)? {
            device::launch(&dev, &l)?;
        }
    }
    Ok((out, x_l.shape().clone()))
}

/// Fused residual add + `rms_norm`; returns `[2, ...x.shape]`: normed rows, then the sums.
pub(crate) fn add_rms_norm(
    eps: f32,
    x: &CudaStorage,
    x_l: &Layout,
    r: &CudaStorage,
    r_l: &Layout,
    w: &CudaStorage,
    w_l: &Layout,
) -> Result<(CudaStorage, Shape)> {
    const OP: &str = "add_rms_norm";
    if x.dtype() != r.dtype() {
        return Err(candle_core::Error::DTypeMismatchBinaryOp { lhs: x.dtype(), rhs: r.dtype(), op: OP });
    }
    let x_rows = check::rows(x_l, 1, OP)?;
    let r_rows = check::rows(r_l, 1, OP)?;
    if x_rows.rows != r_rows.rows || x_rows.row_len != r_rows.row_len {
        return Err(invalid(OP, "x and residual rows differ"));
    }
    let (w0, w1) = check::contiguous_range(w_l, OP)?;
    if w1 - w0 != x_rows.row_len {
        return Err(invalid(OP, "weight length differs from the hidden size"));
    }
    let dev = x.device().clone();
    let stream = dev.cuda_stream();
    let mut out = device::alloc(&dev, x.dtype(), 2 * x_rows.rows * x_rows.row_len)?;
    {
        let (x_ptr, _xg) = device::ptr(x, x_rows.start, &stream)?;
        let (r_ptr, _rg) = device::ptr(r, r_rows.start, &stream)?;
        let (w_ptr, _wg) = device::ptr(w, w0, &stream)?;
        let (out_ptr, _og) = device::ptr_mut(&mut out, 0, &stream)?;
        let args = NormArgs {
            x_dtype: x.dtype(),
            w_dtype: w.dtype(),
            x: x_ptr,
            x_row_stride: x_rows.row_stride,
            weight: w_ptr,
            out: out_ptr,
            rows: x_rows.rows,
            hidden: x_rows.row_len,
            eps,
        };
        if let Some(l) = launch::add_rms_norm(&args, r_ptr, r_rows.row_stride)? {
            device::launch(&dev, &l)?;
        }
    }
    let mut dims = vec![2];
    dims.extend_from_slice(x_l.dims());
    Ok((out, Shape::from(dims)))
}

//! CUDA implementation of `skinny_matmul` (kernels/skinny_matmul.cu).

use candle_core::backend::BackendStorage;
use candle_core::{CudaStorage, Layout, Result, Shape};

use super::device;
use super::skinny::{self, SkinnyArgs, SkinnyLaunch};
use crate::check::{self, invalid};

const OP: &str = "skinny_matmul";

/// `x [M, K] . w [N, K]^T` into a new contiguous `[M, N]`; `launch` overrides the kernel's
/// rule (timing only).
pub(crate) fn skinny_matmul(
    launch: Option<SkinnyLaunch>,
    x: &CudaStorage,
    x_l: &Layout,
    w: &CudaStorage,
    w_l: &Layout,
) -> Result<(CudaStorage, Shape)> {
    if x.dtype() != w.dtype() {
        return Err(candle_core::Error::DTypeMismatchBinaryOp { lhs: x.dtype(), rhs: w.dtype(), op: OP });
    }
    let xr = check::rows(x_l, 1, OP)?;
    let wr = check::rows(w_l, 1, OP)?;
    if xr.row_len != wr.row_len {
        return Err(invalid(OP, format!("x has {} columns, w {}", xr.row_len, wr.row_len)));
    }
    let dev = x.device().clone();
    let stream = dev.cuda_stream();
    let mut out = device::alloc(&dev, x.dtype(), xr.rows * wr.rows)?;
    {
        let (x_ptr, _xg) = device::ptr(x, xr.start, &stream)?;
        let (w_ptr, _wg) = device::ptr(w, wr.start, &stream)?;
        let (out_ptr, _og) = device::ptr_mut(&mut out, 0, &stream)?;
        let elem = x.dtype().size_in_bytes() as u64;
        // The kernel reads rows in 16-byte vectors.
        let aligned =
            |ptr: u64, stride: usize| ptr.is_multiple_of(16) && (stride as u64 * elem).is_multiple_of(16);
        if !aligned(x_ptr, xr.row_stride) || !aligned(w_ptr, wr.row_stride) {
            return Err(invalid(OP, "rows of x and w must start on 16-byte boundaries"));
        }
        let args = SkinnyArgs {
            dtype: x.dtype(),
            x: x_ptr,
            x_row_stride: xr.row_stride,
            w: w_ptr,
            w_row_stride: wr.row_stride,
            out: out_ptr,
            out_row_stride: wr.rows,
            m: xr.rows,
            n: wr.rows,
            k: xr.row_len,
            launch,
        };
        if let Some(l) = skinny::skinny_matmul(&args)? {
            device::launch(&dev, &l)?;
        }
    }
    Ok((out, Shape::from((xr.rows, wr.rows))))
}

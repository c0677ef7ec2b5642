//! CUDA implementation of `silu_and_mul` (kernels/silu_and_mul.cu).

use candle_core::backend::BackendStorage;
use candle_core::{CudaStorage, Layout, Result, Shape};

use super::device;
use super::launch::{self, SiluArgs};
use crate::check::{self, invalid};

const OP: &str = "silu_and_mul";

pub(crate) fn silu_and_mul(
    gate: &CudaStorage,
    g_l: &Layout,
    up: &CudaStorage,
    u_l: &Layout,
) -> Result<(CudaStorage, Shape)> {
    if gate.dtype() != up.dtype() {
        return Err(candle_core::Error::DTypeMismatchBinaryOp { lhs: gate.dtype(), rhs: up.dtype(), op: OP });
    }
    // A 0-d tensor is one row of one element.
    let row_dims = g_l.dims().len().min(1);
    let g_rows = check::rows(g_l, row_dims, OP)?;
    let u_rows = check::rows(u_l, row_dims, OP)?;
    if g_rows.rows != u_rows.rows || g_rows.row_len != u_rows.row_len {
        return Err(invalid(OP, "gate and up rows differ"));
    }
    let dev = gate.device().clone();
    let stream = dev.cuda_stream();
    let mut out = device::alloc(&dev, gate.dtype(), g_rows.rows * g_rows.row_len)?;
    {
        let (g_ptr, _gg) = device::ptr(gate, g_rows.start, &stream)?;
        let (u_ptr, _ug) = device::ptr(up, u_rows.start, &stream)?;
        let (out_ptr, _og) = device::ptr_mut(&mut out, 0, &stream)?;
        let args = SiluArgs {
            dtype: gate.dtype(),
            gate: g_ptr,
            gate_row_stride: g_rows.row_stride,
            up: u_ptr,
            up_row_stride: u_rows.row_stride,
            out: out_ptr,
            rows: g_rows.rows,
            width: g_rows.row_len,
        };
        if let Some(l) = launch::silu_and_mul(&args)? {
            device::launch(&dev, &l)?;
        }
    }
    Ok((out, g_l.shape().clone()))
}

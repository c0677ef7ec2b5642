//! CUDA implementation of `rotary_embedding` (kernels/rotary.cu).

use candle_core::backend::{BackendDevice, BackendStorage};
use candle_core::{CudaStorage, DType, Layout, Result, Shape, Storage, Tensor};

use super::device;
use super::launch::{self, RotaryArgs};
use crate::check::{self, invalid};
use crate::RotaryStyle;

const OP: &str = "rotary_embedding";

/// Rotates `x` (`[T, H, D]`, token rows contiguous) by the cos/sin rows at `positions` (a u32
/// tensor on the same device). Positions are not read back to the host: one out of range
/// yields NaN rows (the model runner keeps positions inside the tables; the CPU op reports
/// them).
#[allow(clippy::too_many_arguments)]
pub(crate) fn rotary(
    positions: &Tensor,
    style: RotaryStyle,
    x: &CudaStorage,
    x_l: &Layout,
    cos: &CudaStorage,
    cos_l: &Layout,
    sin: &CudaStorage,
    sin_l: &Layout,
) -> Result<(CudaStorage, Shape)> {
    let &[num_tokens, num_heads, head_dim] = x_l.dims() else {
        return Err(invalid(OP, "x must be [num_tokens, num_heads, head_dim]"));
    };
    let (c0, c1) = check::contiguous_range(cos_l, OP)?;
    let (s0, _) = check::contiguous_range(sin_l, OP)?;
    let half = head_dim / 2;
    let max_positions = (c1 - c0) / half.max(1);
    let rows = check::rows(x_l, 2, OP)?;
    let (pos_storage, pos_l) = positions.storage_and_layout();
    let Storage::Cuda(pos) = &*pos_storage else {
        return Err(candle_core::Error::DeviceMismatchBinaryOp {
            lhs: x.device().location(),
            rhs: positions.device().location(),
            op: OP,
        });
    };
    if pos.dtype() != DType::U32 {
        return Err(candle_core::Error::DTypeMismatchBinaryOp { lhs: DType::U32, rhs: pos.dtype(), op: OP });
    }
    let (p0, p1) = check::contiguous_range(pos_l, OP)?;
    if p1 - p0 != num_tokens {
        return Err(invalid(OP, "positions do not match the tokens"));
    }
    let dev = x.device().clone();
    let stream = dev.cuda_stream();
    let mut out = device::alloc(&dev, x.dtype(), num_tokens * num_heads * head_dim)?;
    {
        let (x_ptr, _xg) = device::ptr(x, rows.start, &stream)?;
        let (pos_ptr, _pg) = device::ptr(pos, p0, &stream)?;
        let (cos_ptr, _cg) = device::ptr(cos, c0, &stream)?;
        let (sin_ptr, _sg) = device::ptr(sin, s0, &stream)?;
        let (out_ptr, _og) = device::ptr_mut(&mut out, 0, &stream)?;
        let args = RotaryArgs {
            dtype: x.dtype(),
            x: x_ptr,
            x_row_stride: rows.row_stride,
            positions: pos_ptr,
            cos: cos_ptr,
            sin: sin_ptr,
            max_positions,
            out: out_ptr,
            num_tokens,
            num_heads,
            head_dim,
            interleaved: style == RotaryStyle::Interleaved,
        };
        if let Some(l) = launch::rotary(&args)? {
            device::launch(&dev, &l)?;
        }
    }
    Ok((out, x_l.shape().clone()))
}

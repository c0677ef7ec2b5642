//! CUDA implementations of the matmul and dequantization over GGUF blocks kept on the device
//! (kernels/quant_matmul.cu); the launches are built in `quant`.

use candle_core::backend::BackendStorage;
use candle_core::{CudaStorage, DType, Layout, Result, Shape};

use super::device;
use super::quant::{self, QuantLaunch, QuantPointers};
use crate::check::{self, invalid};

/// `x [M, K] . w^T` for M <= 8 into a new contiguous `[M, rows]`; `pointers` gives the
/// weight's arrays from the address its bytes start at; `launch` overrides the rule.
pub(crate) fn quant_matmul(
    launch: Option<QuantLaunch>,
    pointers: &dyn Fn(u64) -> QuantPointers,
    x: &CudaStorage,
    x_l: &Layout,
    w: &CudaStorage,
    w_l: &Layout,
) -> Result<(CudaStorage, Shape)> {
    const OP: &str = "quant_matmul";
    let xr = check::rows(x_l, 1, OP)?;
    let dev = x.device().clone();
    let stream = dev.cuda_stream();
    let (x_ptr, _xg) = device::ptr(x, xr.start, &stream)?;
    let (w_base, _wg) = device::ptr(w, w_l.start_offset(), &stream)?;
    let weight = pointers(w_base);
    let elem = x.dtype().size_in_bytes() as u64;
    if !x_ptr.is_multiple_of(16)
        || !(xr.row_stride as u64 * elem).is_multiple_of(16)
        || !w_base.is_multiple_of(16)
    {
        return Err(invalid(OP, "rows of x and the weight's bytes must start on 16-byte boundaries"));
    }
    let mut out = device::alloc(&dev, x.dtype(), xr.rows * weight.rows)?;
    {
        let (out_ptr, _og) = device::ptr_mut(&mut out, 0, &stream)?;
        let launch = quant::quant_matmul(
            x.dtype(),
            x_ptr,
            xr.row_stride,
            &weight,
            out_ptr,
            weight.rows,
            xr.rows,
            launch,
        )?;
        if let Some(l) = launch {
            device::launch(&dev, &l)?;
        }
    }
    Ok((out, Shape::from((xr.rows, weight.rows))))
}

/// The whole weight as a new dense `[rows, blocks_per_row * 32]` of `dtype`.
pub(crate) fn quant_dequantize(
    pointers: &dyn Fn(u64) -> QuantPointers,
    dtype: DType,
    w: &CudaStorage,
    w_l: &Layout,
) -> Result<(CudaStorage, Shape)> {
    let dev = w.device().clone();
    let stream = dev.cuda_stream();
    let (w_base, _wg) = device::ptr(w, w_l.start_offset(), &stream)?;
    let weight = pointers(w_base);
    let cols = weight.blocks_per_row * crate::QUANT_BLOCK;
    let mut out = device::alloc(&dev, dtype, weight.rows * cols)?;
    {
        let (out_ptr, _og) = device::ptr_mut(&mut out, 0, &stream)?;
        if let Some(l) = quant::quant_dequantize(dtype, &weight, out_ptr)? {
            device::launch(&dev, &l)?;
        }
    }
    Ok((out, Shape::from((weight.rows, cols))))
}

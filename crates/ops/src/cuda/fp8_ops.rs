//! CUDA implementations of the matmul and dequantization over FP8 weights kept on the device
//! (kernels/fp8_matmul.cu); the launches are built in `fp8`.

use candle_core::backend::BackendStorage;
use candle_core::{CudaStorage, DType, Layout, Result, Shape};

use super::device;
use super::fp8::{self, Fp8Pointers};
use crate::check::{self, invalid};

/// `x [M, K] . w^T` for M <= 32 into a new contiguous `[M, rows]`; `pointers` gives the
/// weight's arrays from the address its bytes start at.
pub(crate) fn fp8_matmul(
    pointers: &dyn Fn(u64) -> Fp8Pointers,
    x: &CudaStorage,
    x_l: &Layout,
    w: &CudaStorage,
    w_l: &Layout,
) -> Result<(CudaStorage, Shape)> {
    const OP: &str = "fp8_matmul";
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
        let launch =
            fp8::fp8_matmul(x.dtype(), x_ptr, xr.row_stride, &weight, out_ptr, weight.rows, xr.rows)?;
        if let Some(l) = launch {
            device::launch(&dev, &l)?;
        }
    }
    Ok((out, Shape::from((xr.rows, weight.rows))))
}

/// The whole weight as a new dense `[rows, cols]` of `dtype`.
pub(crate) fn fp8_dequantize(
    pointers: &dyn Fn(u64) -> Fp8Pointers,
    dtype: DType,
    w: &CudaStorage,
    w_l: &Layout,
) -> Result<(CudaStorage, Shape)> {
    let dev = w.device().clone();
    let stream = dev.cuda_stream();
    let (w_base, _wg) = device::ptr(w, w_l.start_offset(), &stream)?;
    let weight = pointers(w_base);
    let mut out = device::alloc(&dev, dtype, weight.rows * weight.cols)?;
    {
        let (out_ptr, _og) = device::ptr_mut(&mut out, 0, &stream)?;
        if let Some(l) = fp8::fp8_dequantize(dtype, &weight, out_ptr)? {
            device::launch(&dev, &l)?;
        }
    }
    Ok((out, Shape::from((weight.rows, weight.cols))))
}

/// A dense contiguous `[rows, cols]` weight quantized into a new buffer of `bytes` bytes, laid
/// out as `pointers` gives from its start.
pub(crate) fn fp8_quantize(
    pointers: &dyn Fn(u64) -> Fp8Pointers,
    bytes: usize,
    w: &CudaStorage,
    w_l: &Layout,
) -> Result<(CudaStorage, Shape)> {
    let dev = w.device().clone();
    let stream = dev.cuda_stream();
    let (w_ptr, _wg) = device::ptr(w, w_l.start_offset(), &stream)?;
    let mut out = device::alloc(&dev, DType::U8, bytes)?;
    {
        let (out_ptr, _og) = device::ptr_mut(&mut out, 0, &stream)?;
        if let Some(l) = fp8::fp8_quantize(w.dtype(), w_ptr, &pointers(out_ptr))? {
            device::launch(&dev, &l)?;
        }
    }
    Ok((out, Shape::from(bytes)))
}

//! CUDA implementation of `reshape_and_cache` (kernels/reshape_and_cache.cu).

use candle_core::backend::BackendStorage;
use candle_core::{CudaStorage, DType, Layout, Result};

use super::{device, launch};
use crate::check::{self, invalid};

const OP: &str = "reshape_and_cache";

/// Copies row `t` of `src` into slot `slots[t]` of `cache` (`num_slots` slots of `row_len`
/// elements); into an FP8 cache, each value times `inv_scale` encoded. Slots are not read back
/// to the host: an out-of-range slot is skipped by the kernel (the model runner only builds
/// in-range slots; the CPU op reports them).
#[allow(clippy::too_many_arguments)]
pub(crate) fn reshape_and_cache(
    num_slots: usize,
    row_len: usize,
    inv_scale: f32,
    cache: &mut CudaStorage,
    cache_l: &Layout,
    src: &CudaStorage,
    src_l: &Layout,
    slots: &CudaStorage,
    slots_l: &Layout,
) -> Result<()> {
    let fp8 = cache.dtype() == DType::F8E4M3;
    if src.dtype() != cache.dtype() && !fp8 {
        return Err(candle_core::Error::DTypeMismatchBinaryOp {
            lhs: cache.dtype(),
            rhs: src.dtype(),
            op: OP,
        });
    }
    if slots.dtype() != DType::U32 {
        return Err(candle_core::Error::DTypeMismatchBinaryOp {
            lhs: DType::U32,
            rhs: slots.dtype(),
            op: OP,
        });
    }
    let (c0, c1) = check::contiguous_range(cache_l, OP)?;
    if c1 - c0 != num_slots * row_len {
        return Err(invalid(OP, "cache storage does not match its shape"));
    }
    let rows = check::rows(src_l, 2, OP)?;
    let (s0, s1) = check::contiguous_range(slots_l, OP)?;
    if rows.rows != s1 - s0 || rows.row_len != row_len {
        return Err(invalid(OP, "source rows do not match slot_mapping and the cache row size"));
    }
    let esize = cache.dtype().size_in_bytes();
    let dev = cache.device().clone();
    let stream = dev.cuda_stream();
    let (src_ptr, _src_guard) = device::ptr(src, rows.start, &stream)?;
    let (slots_ptr, _slots_guard) = device::ptr(slots, s0, &stream)?;
    let (cache_ptr, _cache_guard) = device::ptr_mut(cache, c0, &stream)?;
    let l = match fp8 {
        true => launch::reshape_and_cache_fp8(
            src_ptr,
            src.dtype(),
            rows.row_stride,
            cache_ptr,
            slots_ptr,
            rows.rows,
            row_len,
            num_slots,
            inv_scale,
        )?,
        false => launch::reshape_and_cache(
            src_ptr,
            rows.row_stride * esize,
            cache_ptr,
            slots_ptr,
            rows.rows,
            row_len * esize,
            num_slots,
        )?,
    };
    match l {
        Some(l) => device::launch(&dev, &l),
        None => Ok(()),
    }
}

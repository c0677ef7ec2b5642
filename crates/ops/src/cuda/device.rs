//! Running a [`KernelLaunch`] on candle's CUDA device, and the storage plumbing the ops need:
//! device addresses of candle storages (with cudarc's read/write tracking) and output
//! allocation.
//!
//! Modules are loaded once per device through `CudaDevice::get_or_load_custom_func` and
//! launched on candle's own stream, so they order with candle's kernels like any other op.

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::sys::{CUdevice_attribute, CUfunction_attribute};
use candle_core::cuda_backend::cudarc::driver::{
    CudaStream, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg, SyncOnDrop,
};
use candle_core::cuda_backend::{CudaStorageSlice, WrapErr};
use candle_core::{CudaDevice, CudaStorage, DType, Result};

use super::launch::{Arg, KernelLaunch};

/// Shared memory a block gets without opting in, static and dynamic together.
const DEFAULT_SHARED_BYTES: u32 = 48 * 1024;
/// Room kept for static shared memory beside a dynamic buffer. The tensor-core attention kernel
/// declares none today; a CUDA-core variant with about 1 KiB of it failed to launch at 48 KiB of
/// dynamic memory without the opt-in (benches/reports/2026-11-26-split-kv-decode-h200.md).
const STATIC_SHARED_ALLOWANCE: u32 = 16 * 1024;

/// The device's compute capability (major, minor).
pub(crate) fn compute_capability(dev: &CudaDevice) -> Result<(i32, i32)> {
    dev.cuda_stream().context().compute_capability().w()
}

/// Streaming multiprocessors on the device (for launch planning).
pub(crate) fn num_sms(dev: &CudaDevice) -> Result<usize> {
    let n = dev
        .cuda_stream()
        .context()
        .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        .w()?;
    Ok(n.max(1) as usize)
}

/// Launches `l` on `dev`'s stream. Fails on devices older than sm_80 (the kernels use
/// cp.async and bf16 tensor cores).
pub(crate) fn launch(dev: &CudaDevice, l: &KernelLaunch) -> Result<()> {
    let (major, minor) = compute_capability(dev)?;
    if major < 8 {
        candle_core::bail!(
            "{}: the device has compute capability {major}.{minor}; Pagoda's CUDA kernels need 8.0 or newer",
            l.function
        );
    }
    let sm90 = major >= 9;
    let module = format!("pagoda_{}_{}", l.module.stem(), if sm90 { "sm90" } else { "sm80" });
    let func = dev.get_or_load_custom_func(&l.function, &module, super::ptx::source(l.module, sm90))?;
    // The opt-in is needed as soon as static plus dynamic memory passes the default.
    if l.shared_mem_bytes + STATIC_SHARED_ALLOWANCE > DEFAULT_SHARED_BYTES {
        func.set_attribute(
            CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            l.shared_mem_bytes as i32,
        )
        .w()?;
    }
    let mut builder = func.builder();
    for arg in &l.args {
        match arg {
            Arg::Ptr(p) => builder.arg(p),
            Arg::I64(v) => builder.arg(v),
            Arg::I32(v) => builder.arg(v),
            Arg::F32(v) => builder.arg(v),
        };
    }
    let cfg = LaunchConfig {
        grid_dim: (l.grid[0], l.grid[1], l.grid[2]),
        block_dim: (l.block[0], l.block[1], l.block[2]),
        shared_mem_bytes: l.shared_mem_bytes,
    };
    // SAFETY: the launch builders in `launch` pass exactly the parameters of the kernel they
    // name, and the ops check every shape, stride and index the kernels rely on.
    unsafe { builder.launch(cfg) }.w()?;
    Ok(())
}

/// The device address of element `offset` of `s`, and a guard that records the kernel's read
/// when dropped (drop it after the launch).
pub(crate) fn ptr<'a>(
    s: &'a CudaStorage,
    offset: usize,
    stream: &'a CudaStream,
) -> Result<(u64, SyncOnDrop<'a>)> {
    let bytes = offset * s.dtype().size_in_bytes();
    let (base, guard) = match &s.slice {
        CudaStorageSlice::F32(v) => v.device_ptr(stream),
        CudaStorageSlice::F16(v) => v.device_ptr(stream),
        CudaStorageSlice::BF16(v) => v.device_ptr(stream),
        CudaStorageSlice::U32(v) => v.device_ptr(stream),
        CudaStorageSlice::U8(v) => v.device_ptr(stream),
        CudaStorageSlice::F8E4M3(v) => v.device_ptr(stream),
        _ => return Err(candle_core::Error::UnsupportedDTypeForOp(s.dtype(), "pagoda cuda kernel")),
    };
    Ok((base + bytes as u64, guard))
}

/// As [`ptr`], for a storage the kernel writes.
pub(crate) fn ptr_mut<'a>(
    s: &'a mut CudaStorage,
    offset: usize,
    stream: &'a CudaStream,
) -> Result<(u64, SyncOnDrop<'a>)> {
    let dtype = s.dtype();
    let bytes = offset * dtype.size_in_bytes();
    let (base, guard) = match &mut s.slice {
        CudaStorageSlice::F32(v) => v.device_ptr_mut(stream),
        CudaStorageSlice::F16(v) => v.device_ptr_mut(stream),
        CudaStorageSlice::BF16(v) => v.device_ptr_mut(stream),
        CudaStorageSlice::U32(v) => v.device_ptr_mut(stream),
        CudaStorageSlice::U8(v) => v.device_ptr_mut(stream),
        CudaStorageSlice::F8E4M3(v) => v.device_ptr_mut(stream),
        _ => return Err(candle_core::Error::UnsupportedDTypeForOp(dtype, "pagoda cuda kernel")),
    };
    Ok((base + bytes as u64, guard))
}

/// An uninitialised storage of `len` elements (at least one, so empty outputs still have an
/// allocation) that a kernel fills.
pub(crate) fn alloc(dev: &CudaDevice, dtype: DType, len: usize) -> Result<CudaStorage> {
    let len = len.max(1);
    // SAFETY: every caller launches a kernel that writes all `len` elements it reads back.
    let storage = unsafe {
        match dtype {
            DType::F32 => CudaStorage::wrap_cuda_slice(dev.alloc::<f32>(len)?, dev.clone()),
            DType::F16 => CudaStorage::wrap_cuda_slice(dev.alloc::<half::f16>(len)?, dev.clone()),
            DType::BF16 => CudaStorage::wrap_cuda_slice(dev.alloc::<half::bf16>(len)?, dev.clone()),
            DType::U32 => CudaStorage::wrap_cuda_slice(dev.alloc::<u32>(len)?, dev.clone()),
            other => return Err(candle_core::Error::UnsupportedDTypeForOp(other, "pagoda cuda kernel")),
        }
    };
    Ok(storage)
}

/// The device address of an uploaded u32 list (work items), with its read guard.
pub(crate) fn ptr_u32<'a>(
    s: &'a candle_core::cuda_backend::cudarc::driver::CudaSlice<u32>,
    stream: &'a CudaStream,
) -> (u64, SyncOnDrop<'a>) {
    s.device_ptr(stream)
}

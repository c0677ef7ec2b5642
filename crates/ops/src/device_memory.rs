//! What the device's memory holds, for sizing the KV cache from free GPU memory: free and total
//! bytes, and the high watermark of the stream-ordered pool that candle's CUDA allocations
//! come from (so a profiling pass can measure its peak even though it frees everything before
//! returning). On the CPU there is nothing to report (`None`).

use candle_core::{Device, Result};

/// Free and total bytes of a device's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceMemory {
    pub free: u64,
    pub total: u64,
}

/// The device's free and total memory; `None` on the CPU.
pub fn device_memory(device: &Device) -> Result<Option<DeviceMemory>> {
    match device {
        #[cfg(feature = "cuda")]
        Device::Cuda(dev) => cuda::memory(dev).map(Some),
        _ => Ok(None),
    }
}

/// Restarts the pool's high watermark at what it holds now, and returns that; `None` on the CPU.
pub fn reset_peak_memory(device: &Device) -> Result<Option<u64>> {
    match device {
        #[cfg(feature = "cuda")]
        Device::Cuda(dev) => cuda::reset_peak(dev).map(Some),
        _ => Ok(None),
    }
}

/// The most the pool has held since [`reset_peak_memory`]; `None` on the CPU.
pub fn peak_memory(device: &Device) -> Result<Option<u64>> {
    match device {
        #[cfg(feature = "cuda")]
        Device::Cuda(dev) => cuda::peak(dev).map(Some),
        _ => Ok(None),
    }
}

#[cfg(feature = "cuda")]
mod cuda {
    use std::ffi::c_void;

    use candle_core::cuda_backend::cudarc::driver::sys;
    use candle_core::cuda_backend::WrapErr;
    use candle_core::{CudaDevice, Result};

    use super::DeviceMemory;

    pub(super) fn memory(dev: &CudaDevice) -> Result<DeviceMemory> {
        let (free, total) = dev.cuda_stream().context().mem_get_info().w()?;
        Ok(DeviceMemory { free: free as u64, total: total as u64 })
    }

    /// The device's default memory pool (where cuMemAllocAsync allocates).
    fn pool(dev: &CudaDevice) -> Result<sys::CUmemoryPool> {
        let stream = dev.cuda_stream();
        let ctx = stream.context();
        ctx.bind_to_thread().w()?;
        let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
        // SAFETY: `pool` is a valid out-pointer and the device handle comes from a live context.
        unsafe { sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device()) }.result().w()?;
        Ok(pool)
    }

    fn attribute(dev: &CudaDevice, attr: sys::CUmemPool_attribute) -> Result<u64> {
        let pool = pool(dev)?;
        let mut value: u64 = 0;
        // SAFETY: the used-memory attributes are 64-bit values written to `value`.
        unsafe { sys::cuMemPoolGetAttribute(pool, attr, &mut value as *mut u64 as *mut c_void) }
            .result()
            .w()?;
        Ok(value)
    }

    pub(super) fn reset_peak(dev: &CudaDevice) -> Result<u64> {
        dev.cuda_stream().synchronize().w()?;
        let pool = pool(dev)?;
        let mut zero: u64 = 0;
        // SAFETY: setting USED_MEM_HIGH takes a 64-bit zero, which resets it to the current use.
        unsafe {
            sys::cuMemPoolSetAttribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH,
                &mut zero as *mut u64 as *mut c_void,
            )
        }
        .result()
        .w()?;
        attribute(dev, sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT)
    }

    pub(super) fn peak(dev: &CudaDevice) -> Result<u64> {
        dev.cuda_stream().synchronize().w()?;
        attribute(dev, sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH)
    }
}

//! Runs a [`KernelLaunch`] on the CPU kernel simulator (kernels/sim, built by build.rs with
//! the `kernel-sim` feature): the same kernels, entry points and arguments as on a GPU, with
//! host memory standing in for device memory (pointers are host addresses).

use std::ffi::{c_char, c_int, c_void, CString};

use super::launch::{Arg, KernelLaunch};

extern "C" {
    fn pagoda_sim_launch(
        name: *const c_char,
        grid: *const u32,
        block: *const u32,
        shared_mem_bytes: u32,
        params: *mut *mut c_void,
        error: *mut c_char,
        error_len: usize,
    ) -> c_int;
}

/// Runs `l` to completion; `Err` carries the simulator's message (a hang at a barrier, a
/// divergent warp collective, an unknown kernel).
pub(crate) fn run(l: &KernelLaunch) -> Result<(), String> {
    // Each parameter's value, 8-byte aligned; params[i] points at value i, as for cuLaunchKernel.
    let mut values: Vec<u64> = l
        .args
        .iter()
        .map(|a| match *a {
            Arg::Ptr(p) => p,
            Arg::I64(v) => v as u64,
            Arg::I32(v) => v as u32 as u64,
            Arg::F32(v) => v.to_bits() as u64,
        })
        .collect();
    // Little-endian: a 4-byte parameter read from the start of its u64 slot is the value.
    let mut params: Vec<*mut c_void> = values.iter_mut().map(|v| v as *mut u64 as *mut c_void).collect();
    let name = CString::new(l.function.as_str()).map_err(|e| e.to_string())?;
    let mut error = vec![0 as c_char; 512];
    // SAFETY: the pointers in `values` address host buffers the caller keeps alive for the
    // call, and the launch builders pass exactly the parameters of the kernel they name.
    let rc = unsafe {
        pagoda_sim_launch(
            name.as_ptr(),
            l.grid.as_ptr(),
            l.block.as_ptr(),
            l.shared_mem_bytes,
            params.as_mut_ptr(),
            error.as_mut_ptr(),
            error.len(),
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        // SAFETY: the simulator writes a NUL-terminated message into `error`.
        let msg = unsafe { std::ffi::CStr::from_ptr(error.as_ptr()) };
        Err(format!("{}: {}", l.function, msg.to_string_lossy()))
    }
}

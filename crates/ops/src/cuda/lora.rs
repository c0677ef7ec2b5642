//! The CUDA side of `lora_add` (kernels/lora.cu): its launch as plain data (always compiled,
//! so the simulator tests run exactly this launch) and, with the `cuda` feature, the op's
//! `cuda_fwd`, which uploads the segment descriptors and launches it on candle's stream.

use candle_core::{DType, Result};

use super::launch::{dtype_suffix, to_grid, to_i32, Arg, KernelLaunch, KernelModule};

/// `lora_add` (kernels/lora.cu) over `rows` rows of `width` outputs from inputs `input` wide;
/// `segments` addresses `num_segments` descriptors of 5 int64 (first row, rows, rank, A, B).
#[derive(Debug, Clone, Copy)]
pub(crate) struct LoraArgs {
    pub dtype: DType,
    pub base: u64,
    pub x: u64,
    pub out: u64,
    pub segments: u64,
    pub num_segments: usize,
    pub rows: usize,
    pub input: usize,
    pub width: usize,
    pub max_rank: usize,
}

/// Threads of a `lora_add` block (one block per row).
pub(crate) const LORA_THREADS: u32 = 128;

pub(crate) fn lora_launch(a: &LoraArgs) -> Result<Option<KernelLaunch>> {
    const OP: &str = "lora_add";
    if a.rows == 0 || a.width == 0 {
        return Ok(None);
    }
    Ok(Some(KernelLaunch {
        module: KernelModule::Lora,
        function: format!("pagoda_lora_add_{}", dtype_suffix(a.dtype, OP)?),
        grid: [to_grid(a.rows, "rows", OP)?, 1, 1],
        block: [LORA_THREADS, 1, 1],
        shared_mem_bytes: (4 * a.max_rank.max(1)) as u32,
        args: vec![
            Arg::Ptr(a.base),
            Arg::Ptr(a.x),
            Arg::Ptr(a.out),
            Arg::Ptr(a.segments),
            Arg::I32(to_i32(a.num_segments, "segments", OP)?),
            Arg::I32(to_i32(a.input, "input width", OP)?),
            Arg::I32(to_i32(a.width, "width", OP)?),
        ],
    }))
}

/// `base + delta` on the GPU: `base` `[rows, width]` and `x` `[rows, in]` with contiguous rows
/// of the same dtype; every segment's matrices contiguous on the same device.
#[cfg(feature = "cuda")]
pub(crate) fn lora_add(
    base: &candle_core::CudaStorage,
    b_l: &candle_core::Layout,
    x: &candle_core::CudaStorage,
    x_l: &candle_core::Layout,
    segments: &[crate::LoraSegment],
) -> Result<(candle_core::CudaStorage, candle_core::Shape)> {
    use candle_core::backend::BackendStorage;
    use candle_core::Storage;

    use super::device;
    use crate::check::{self, invalid};

    const OP: &str = "lora_add";
    let (b_rows, x_rows) = (check::rows(b_l, 1, OP)?, check::rows(x_l, 1, OP)?);
    if b_rows.row_stride != b_rows.row_len || x_rows.row_stride != x_rows.row_len {
        return Err(invalid(OP, "base and x rows must be contiguous"));
    }
    let dev = base.device().clone();
    let stream = dev.cuda_stream();
    let guards: Vec<_> =
        segments.iter().map(|s| (s.a.storage_and_layout(), s.b.storage_and_layout())).collect();
    let mut descriptors = Vec::with_capacity(5 * segments.len());
    let mut read_guards = Vec::with_capacity(2 * segments.len());
    let mut max_rank = 0;
    for (s, ((a, a_l), (b, b_l))) in segments.iter().zip(&guards) {
        let (Storage::Cuda(a), Storage::Cuda(b)) = (&**a, &**b) else {
            return Err(invalid(OP, "adapter matrices must be on the GPU with x"));
        };
        let (a_start, _) = check::contiguous_range(a_l, OP)?;
        let (b_start, _) = check::contiguous_range(b_l, OP)?;
        let (a_ptr, a_guard) = device::ptr(a, a_start, &stream)?;
        let (b_ptr, b_guard) = device::ptr(b, b_start, &stream)?;
        read_guards.push(a_guard);
        read_guards.push(b_guard);
        let rank = s.a.dim(0)?;
        max_rank = max_rank.max(rank);
        descriptors.extend([s.start as i64, s.rows as i64, rank as i64, a_ptr as i64, b_ptr as i64]);
    }
    let table = dev.clone_htod(&descriptors)?;
    let mut out = device::alloc(&dev, base.dtype(), b_rows.rows * b_rows.row_len)?;
    {
        use candle_core::cuda_backend::cudarc::driver::DevicePtr;
        let (table_ptr, _tg) = table.device_ptr(&stream);
        let (base_ptr, _bg) = device::ptr(base, b_rows.start, &stream)?;
        let (x_ptr, _xg) = device::ptr(x, x_rows.start, &stream)?;
        let (out_ptr, _og) = device::ptr_mut(&mut out, 0, &stream)?;
        let args = LoraArgs {
            dtype: base.dtype(),
            base: base_ptr,
            x: x_ptr,
            out: out_ptr,
            segments: table_ptr,
            num_segments: segments.len(),
            rows: b_rows.rows,
            input: x_rows.row_len,
            width: b_rows.row_len,
            max_rank,
        };
        if let Some(l) = lora_launch(&args)? {
            device::launch(&dev, &l)?;
        }
    }
    drop(read_guards);
    Ok((out, b_l.shape().clone()))
}

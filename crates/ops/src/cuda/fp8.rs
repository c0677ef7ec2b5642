//! The launches of kernels/fp8_matmul.cu as plain data: the decode-step matmul over FP8 codes
//! with a scale per row, and the dequantization of a whole weight for larger steps. Pure Rust,
//! always compiled: the simulator tests run exactly these launches.

use candle_core::{DType, Result};

use super::launch::{dtype_suffix, to_i32, Arg, KernelLaunch, KernelModule};

const OP: &str = "fp8_matmul";

/// The most rows of x the kernel takes: four tiles of 8 (the `_t2` and `_t4` entries).
pub const FP8_KERNEL_MAX_ROWS: usize = 32;

/// Elements of K per warp fetch (16 codes per lane quad): the kernel's K must be a multiple.
pub const FP8_KERNEL_K_STEP: usize = 64;

/// Output features per block (one mma tile's rows).
const FEATURES_PER_BLOCK: usize = 16;

/// Threads per block of the dequantization, each taking 16 codes.
const DEQUANTIZE_THREADS: usize = 256;

/// Device addresses of a weight's codes (`[rows, cols]` bytes) and scales (`[rows]` f32).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fp8Pointers {
    pub codes: u64,
    pub scales: u64,
    pub rows: usize,
    pub cols: usize,
}

/// Warps per block for a weight of `n` rows and `cols` columns: quant_matmul's rule (8 for at
/// most 4096 rows, else 4), never more than the row has fetches. A function of the weight
/// alone, so a row's result does not depend on M.
pub(crate) fn fp8_warps(n: usize, cols: usize) -> usize {
    let wanted: usize = if n <= 4096 { 8 } else { 4 };
    let fetches = (cols / FP8_KERNEL_K_STEP).max(1);
    wanted.min(1 << fetches.ilog2())
}

/// `out [m, w.rows] = x [m, K] . w^T` for `m <= 32`; x rows `x_row_stride` elements apart, out
/// rows `out_row_stride`. `None` when there is nothing to compute.
#[allow(clippy::too_many_arguments)]
pub(crate) fn fp8_matmul(
    dtype: DType,
    x: u64,
    x_row_stride: usize,
    w: &Fp8Pointers,
    out: u64,
    out_row_stride: usize,
    m: usize,
) -> Result<Option<KernelLaunch>> {
    let suffix = match dtype {
        DType::F16 | DType::BF16 => dtype_suffix(dtype, OP)?,
        other => return Err(candle_core::Error::UnsupportedDTypeForOp(other, OP)),
    };
    if m > FP8_KERNEL_MAX_ROWS {
        candle_core::bail!("{OP}: takes at most {FP8_KERNEL_MAX_ROWS} rows, got {m}");
    }
    if !w.cols.is_multiple_of(FP8_KERNEL_K_STEP) {
        candle_core::bail!("{OP}: the weight's {} columns are not a multiple of {FP8_KERNEL_K_STEP}", w.cols);
    }
    if m == 0 || w.rows == 0 || w.cols == 0 {
        return Ok(None);
    }
    let warps = fp8_warps(w.rows, w.cols);
    let tiles = [1, 2, 4].into_iter().find(|t| m <= 8 * t).unwrap_or(4);
    let entry = if tiles == 1 { String::new() } else { format!("_t{tiles}") };
    let blocks = w.rows.div_ceil(FEATURES_PER_BLOCK);
    Ok(Some(KernelLaunch {
        module: KernelModule::Fp8Matmul,
        function: format!("pagoda_fp8_matmul_{suffix}{entry}"),
        grid: [
            u32::try_from(blocks).map_err(|_| candle_core::Error::Msg(format!("{OP}: {} rows", w.rows)))?,
            1,
            1,
        ],
        block: [32 * warps as u32, 1, 1],
        shared_mem_bytes: 0,
        args: vec![
            Arg::Ptr(x),
            Arg::I64(x_row_stride as i64),
            Arg::Ptr(w.codes),
            Arg::Ptr(w.scales),
            Arg::I32(to_i32(w.cols, "columns", OP)?),
            Arg::Ptr(out),
            Arg::I64(out_row_stride as i64),
            Arg::I32(to_i32(m, "rows", OP)?),
            Arg::I32(to_i32(w.rows, "features", OP)?),
        ],
    }))
}

/// The whole weight as dense `[rows, cols]` rows of `dtype` at `out` (`cols % 16 == 0`).
pub(crate) fn fp8_dequantize(dtype: DType, w: &Fp8Pointers, out: u64) -> Result<Option<KernelLaunch>> {
    let suffix = dtype_suffix(dtype, "fp8_dequantize")?;
    if !w.cols.is_multiple_of(16) {
        candle_core::bail!("fp8_dequantize: the weight's {} columns are not a multiple of 16", w.cols);
    }
    let groups = w.rows * w.cols / 16;
    if groups == 0 {
        return Ok(None);
    }
    // Grid-stride past a quarter million blocks of threads.
    let grid = groups.div_ceil(DEQUANTIZE_THREADS).min(1 << 18) as u32;
    Ok(Some(KernelLaunch {
        module: KernelModule::Fp8Matmul,
        function: format!("pagoda_fp8_dequantize_{suffix}"),
        grid: [grid, 1, 1],
        block: [DEQUANTIZE_THREADS as u32, 1, 1],
        shared_mem_bytes: 0,
        args: vec![
            Arg::Ptr(w.codes),
            Arg::Ptr(w.scales),
            Arg::I32(to_i32(w.cols, "columns", "fp8_dequantize")?),
            Arg::I64(groups as i64),
            Arg::Ptr(out),
        ],
    }))
}

/// Threads per block of the quantization, one block per row.
const QUANTIZE_THREADS: usize = 256;

/// A dense contiguous `[rows, cols]` weight of `dtype` at `w` quantized into codes and scales at
/// `out`'s addresses.
pub(crate) fn fp8_quantize(dtype: DType, w: u64, out: &Fp8Pointers) -> Result<Option<KernelLaunch>> {
    let suffix = dtype_suffix(dtype, "fp8_quantize")?;
    if out.rows == 0 || out.cols == 0 {
        return Ok(None);
    }
    Ok(Some(KernelLaunch {
        module: KernelModule::Fp8Matmul,
        function: format!("pagoda_fp8_quantize_{suffix}"),
        grid: [
            u32::try_from(out.rows)
                .map_err(|_| candle_core::Error::Msg(format!("fp8_quantize: {} rows", out.rows)))?,
            1,
            1,
        ],
        block: [QUANTIZE_THREADS as u32, 1, 1],
        shared_mem_bytes: 0,
        args: vec![
            Arg::Ptr(w),
            Arg::I32(to_i32(out.cols, "columns", "fp8_quantize")?),
            Arg::Ptr(out.codes),
            Arg::Ptr(out.scales),
        ],
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pointers(rows: usize, cols: usize) -> Fp8Pointers {
        Fp8Pointers { codes: 16, scales: 32, rows, cols }
    }

    #[test]
    fn warps_depend_on_the_weight_only() {
        // Llama-3.1-8B: QKV and gate+up 4 warps, O and down 8.
        assert_eq!(fp8_warps(6144, 4096), 4);
        assert_eq!(fp8_warps(4096, 14_336), 8);
        // SmolLM2's 576 columns: 9 fetches.
        assert_eq!(fp8_warps(960, 576), 8);
        assert_eq!(fp8_warps(65_536, 128), 2);
        assert_eq!(fp8_warps(16, 64), 1);
    }

    #[test]
    fn launches_pick_tiles_by_rows_and_refuse_what_the_kernel_lacks() {
        let w = pointers(6144, 4096);
        let l = fp8_matmul(DType::BF16, 1, 4096, &w, 2, 6144, 8).unwrap().unwrap();
        assert_eq!(l.function, "pagoda_fp8_matmul_bf16");
        assert_eq!((l.grid, l.block, l.shared_mem_bytes), ([384, 1, 1], [128, 1, 1], 0));
        assert_eq!(l.args.len(), 9);
        assert_eq!(l.args[4], Arg::I32(4096));
        let t2 = fp8_matmul(DType::F16, 1, 4096, &w, 2, 6144, 9).unwrap().unwrap();
        assert_eq!(t2.function, "pagoda_fp8_matmul_f16_t2");
        let t4 = fp8_matmul(DType::F16, 1, 4096, &w, 2, 6144, 32).unwrap().unwrap();
        assert_eq!(t4.function, "pagoda_fp8_matmul_f16_t4");
        assert!(fp8_matmul(DType::BF16, 1, 4096, &w, 2, 6144, 33).is_err());
        assert!(fp8_matmul(DType::F32, 1, 4096, &w, 2, 6144, 1).is_err());
        assert!(fp8_matmul(DType::BF16, 1, 96, &pointers(16, 96), 2, 16, 1).is_err());
        assert!(fp8_matmul(DType::BF16, 1, 4096, &w, 2, 6144, 0).unwrap().is_none());
        let d = fp8_dequantize(DType::F32, &pointers(3, 32), 7).unwrap().unwrap();
        assert_eq!(
            (d.function.as_str(), d.grid, d.block),
            ("pagoda_fp8_dequantize_f32", [1, 1, 1], [256, 1, 1])
        );
        assert_eq!(d.args[3], Arg::I64(6));
        assert!(fp8_dequantize(DType::BF16, &pointers(3, 24), 7).is_err());
        assert!(fp8_dequantize(DType::U32, &w, 7).is_err());
        let q = fp8_quantize(DType::BF16, 9, &pointers(3, 32)).unwrap().unwrap();
        assert_eq!(
            (q.function.as_str(), q.grid, q.block),
            ("pagoda_fp8_quantize_bf16", [3, 1, 1], [256, 1, 1])
        );
        assert_eq!(q.args, vec![Arg::Ptr(9), Arg::I32(32), Arg::Ptr(16), Arg::Ptr(32)]);
        assert!(fp8_quantize(DType::BF16, 9, &pointers(0, 32)).unwrap().is_none());
    }
}

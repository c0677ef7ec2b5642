//! The launches of kernels/quant_matmul.cu as plain data: the decode-step matmul over GGUF
//! blocks kept on the device, and the dequantization of a whole weight for larger steps. Pure
//! Rust, always compiled: the simulator tests run exactly these launches.

use candle_core::{DType, Result};

use super::launch::{dtype_suffix, to_i32, Arg, KernelLaunch, KernelModule};
use crate::QuantFormat;

const OP: &str = "quant_matmul";

/// The most rows of x models give the kernel: one mma tile's columns. Larger steps run on a
/// dequantized copy until a GPU run times the kernel's two- and four-tile entries against it.
pub const QUANT_MATMUL_MAX_ROWS: usize = 8;

/// The most rows of x the kernel takes: four tiles of 8 (the `_t2` and `_t4` entries).
pub const QUANT_KERNEL_MAX_ROWS: usize = 32;

/// Output features per block (one mma tile's rows).
const FEATURES_PER_BLOCK: usize = 16;

/// 32-element blocks per warp fetch: one per lane quad.
const BLOCKS_PER_FETCH: usize = 4;

/// Threads per block of the dequantization.
const DEQUANTIZE_THREADS: usize = 256;

/// The kernels' name for a format (their template argument).
fn format_suffix(format: QuantFormat) -> &'static str {
    match format {
        QuantFormat::Q4_0 => "Q4_0",
        QuantFormat::Q4_1 => "Q4_1",
        QuantFormat::Q5_0 => "Q5_0",
        QuantFormat::Q8_0 => "Q8_0",
        QuantFormat::Q4K => "Q4K",
        QuantFormat::Q5K => "Q5K",
        QuantFormat::Q6K => "Q6K",
    }
}

/// Device addresses of a weight's arrays, as `QuantizedWeight` lays them out (0 for arrays the
/// format has none of).
#[derive(Debug, Clone, Copy)]
pub(crate) struct QuantPointers {
    pub format: QuantFormat,
    pub codes: u64,
    pub high: u64,
    pub scales: u64,
    pub mins: u64,
    pub rows: usize,
    pub blocks_per_row: usize,
}

impl QuantPointers {
    fn args(&self) -> [Arg; 4] {
        [Arg::Ptr(self.codes), Arg::Ptr(self.high), Arg::Ptr(self.scales), Arg::Ptr(self.mins)]
    }
}

/// How a quantized matmul is spread: warps per block (1, 2, 4, 8 or 16), and whether each warp
/// issues a group's loads before multiplying the group before it (the `_pipelined` entries).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuantLaunch {
    pub warps: usize,
    pub pipelined: bool,
}

/// The rule's spread for a `format` weight of `n` rows and `blocks_per_row` blocks: from the
/// sweep of every spread on an H200 (benches/reports/2026-11-28-quantized-cuda-h200.md), 8 warps
/// for weights of at most 4096 rows (Llama-3.1-8B's O and down: 256 blocks of 16 rows, too few
/// to fill the GPU with 4 warps each), else 4; the pipelined loop for Q8_0 and Q6_K, whose
/// fetches are the largest (up to 1.08x on the large shapes), not for the 4-bit formats (0.97x).
/// Never more warps than the row has fetches. A function of the weight alone, so a row's
/// result does not depend on M.
pub(crate) fn quant_launch(format: QuantFormat, n: usize, blocks_per_row: usize) -> QuantLaunch {
    let wanted: usize = if n <= 4096 { 8 } else { 4 };
    let fetches = blocks_per_row.div_ceil(BLOCKS_PER_FETCH).max(1);
    QuantLaunch {
        warps: wanted.min(1 << fetches.ilog2()),
        pipelined: matches!(format, QuantFormat::Q8_0 | QuantFormat::Q6K),
    }
}

/// `out [m, w.rows] = x [m, K] . w^T` for `m <= 32` (one, two or four tiles of 8 rows per
/// fetch of W); x rows `x_row_stride` elements apart, out rows `out_row_stride`; `launch`
/// overrides the rule (timing only; `pipelined` applies to one tile). `None` when there is
/// nothing to compute.
#[allow(clippy::too_many_arguments)]
pub(crate) fn quant_matmul(
    dtype: DType,
    x: u64,
    x_row_stride: usize,
    w: &QuantPointers,
    out: u64,
    out_row_stride: usize,
    m: usize,
    launch: Option<QuantLaunch>,
) -> Result<Option<KernelLaunch>> {
    let suffix = match dtype {
        DType::F16 | DType::BF16 => dtype_suffix(dtype, OP)?,
        other => return Err(candle_core::Error::UnsupportedDTypeForOp(other, OP)),
    };
    if m > QUANT_KERNEL_MAX_ROWS {
        candle_core::bail!("{OP}: takes at most {QUANT_KERNEL_MAX_ROWS} rows, got {m}");
    }
    if m == 0 || w.rows == 0 || w.blocks_per_row == 0 {
        return Ok(None);
    }
    let QuantLaunch { warps, pipelined } =
        launch.unwrap_or_else(|| quant_launch(w.format, w.rows, w.blocks_per_row));
    // One tile per 8 rows; the warps' partial tiles share 4096 floats of shared memory.
    let tiles = [1, 2, 4].into_iter().find(|t| m <= 8 * t).unwrap_or(4);
    if !matches!(warps, 1 | 2 | 4 | 8 | 16) || warps * tiles > 32 {
        candle_core::bail!("{OP}: no launch of {warps} warps per block over {tiles} tiles of rows");
    }
    // Only one tile has a pipelined entry.
    let entry = match (tiles, pipelined) {
        (1, true) => "_pipelined".to_string(),
        (1, false) => String::new(),
        (t, _) => format!("_t{t}"),
    };
    let blocks = w.rows.div_ceil(FEATURES_PER_BLOCK);
    let [codes, high, scales, mins] = w.args();
    Ok(Some(KernelLaunch {
        module: KernelModule::QuantMatmul,
        function: format!("pagoda_quant_matmul_{suffix}_{}{entry}", format_suffix(w.format)),
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
            codes,
            high,
            scales,
            mins,
            Arg::I32(to_i32(w.blocks_per_row, "blocks per row", OP)?),
            Arg::Ptr(out),
            Arg::I64(out_row_stride as i64),
            Arg::I32(to_i32(m, "rows", OP)?),
            Arg::I32(to_i32(w.rows, "features", OP)?),
        ],
    }))
}

/// The whole weight as dense `[rows, blocks_per_row * 32]` rows of `dtype` at `out`.
pub(crate) fn quant_dequantize(dtype: DType, w: &QuantPointers, out: u64) -> Result<Option<KernelLaunch>> {
    let suffix = dtype_suffix(dtype, "quant_dequantize")?;
    let blocks = w.rows * w.blocks_per_row;
    if blocks == 0 {
        return Ok(None);
    }
    let [codes, high, scales, mins] = w.args();
    // Grid-stride past a quarter million blocks of threads (64 Mi weight blocks).
    let grid = blocks.div_ceil(DEQUANTIZE_THREADS).min(1 << 18) as u32;
    Ok(Some(KernelLaunch {
        module: KernelModule::QuantMatmul,
        function: format!("pagoda_quant_dequantize_{suffix}_{}", format_suffix(w.format)),
        grid: [grid, 1, 1],
        block: [DEQUANTIZE_THREADS as u32, 1, 1],
        shared_mem_bytes: 0,
        args: vec![codes, high, scales, mins, Arg::I64(blocks as i64), Arg::Ptr(out)],
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pointers(format: QuantFormat, rows: usize, blocks_per_row: usize) -> QuantPointers {
        QuantPointers { format, codes: 16, high: 32, scales: 48, mins: 64, rows, blocks_per_row }
    }

    #[test]
    fn spreads_depend_on_the_weight_only() {
        let warps = |n, bpr| quant_launch(QuantFormat::Q4K, n, bpr).warps;
        // Llama-3.1-8B: QKV, gate+up and the lm head 4 warps, O and down 8.
        assert_eq!(warps(6144, 128), 4);
        assert_eq!(warps(28_672, 128), 4);
        assert_eq!(warps(128_256, 128), 4);
        assert_eq!(warps(4096, 128), 8);
        assert_eq!(warps(4096, 448), 8);
        // SmolLM2's 576 columns: 18 blocks, 5 fetches.
        assert_eq!(warps(960, 18), 4);
        assert_eq!(warps(65_536, 4), 1);
        assert_eq!(warps(16, 9), 2);
        assert!(quant_launch(QuantFormat::Q8_0, 6144, 128).pipelined);
        assert!(quant_launch(QuantFormat::Q6K, 6144, 128).pipelined);
        assert!(!quant_launch(QuantFormat::Q4K, 6144, 128).pipelined);
    }

    #[test]
    fn launches_name_the_format_and_refuse_what_the_kernel_lacks() {
        let w = pointers(QuantFormat::Q4K, 6144, 128);
        let l = quant_matmul(DType::BF16, 1, 4096, &w, 2, 6144, 8, None).unwrap().unwrap();
        assert_eq!(l.function, "pagoda_quant_matmul_bf16_Q4K");
        assert_eq!((l.grid, l.block, l.shared_mem_bytes), ([384, 1, 1], [128, 1, 1], 0));
        assert_eq!(l.args.len(), 11);
        assert!(quant_matmul(DType::BF16, 1, 4096, &w, 2, 6144, 33, None).is_err());
        // Two and four tiles past 8 and 16 rows, never pipelined; at most 32 warp-tiles.
        let t2 = quant_matmul(DType::BF16, 1, 4096, &w, 2, 6144, 9, None).unwrap().unwrap();
        assert_eq!(t2.function, "pagoda_quant_matmul_bf16_Q4K_t2");
        let q8 = pointers(QuantFormat::Q8_0, 6144, 128);
        let t4 = quant_matmul(DType::F16, 1, 4096, &q8, 2, 6144, 32, None).unwrap().unwrap();
        assert_eq!((t4.function.as_str(), t4.block), ("pagoda_quant_matmul_f16_Q8_0_t4", [128, 1, 1]));
        let spread = |warps, pipelined| Some(QuantLaunch { warps, pipelined });
        assert!(quant_matmul(DType::BF16, 1, 4096, &w, 2, 6144, 8, spread(3, false)).is_err());
        assert!(quant_matmul(DType::BF16, 1, 4096, &w, 2, 6144, 17, spread(16, false)).is_err());
        let eight = quant_matmul(DType::BF16, 1, 4096, &w, 2, 6144, 8, spread(8, true)).unwrap().unwrap();
        assert_eq!(
            (eight.function.as_str(), eight.block),
            ("pagoda_quant_matmul_bf16_Q4K_pipelined", [256, 1, 1])
        );
        assert!(quant_matmul(DType::F32, 1, 4096, &w, 2, 6144, 1, None).is_err());
        assert!(quant_matmul(DType::F16, 1, 4096, &w, 2, 6144, 0, None).unwrap().is_none());
        let d = quant_dequantize(DType::F32, &pointers(QuantFormat::Q6K, 3, 8), 7).unwrap().unwrap();
        assert_eq!(
            (d.function.as_str(), d.grid, d.block),
            ("pagoda_quant_dequantize_f32_Q6K", [1, 1, 1], [256, 1, 1])
        );
        assert_eq!(d.args[4], Arg::I64(24));
        assert!(quant_dequantize(DType::U32, &w, 7).is_err());
    }
}

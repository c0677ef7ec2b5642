//! The launch of kernels/skinny_matmul.cu (`x [M, K] . w [N, K]^T` on tensor cores, up to 16
//! rows of x per grid row) as plain data, and the rule that sizes it. Pure Rust, always
//! compiled: the simulator tests run exactly these launches.

use candle_core::{DType, Result};

use super::launch::{dtype_suffix, to_i32, Arg, KernelLaunch, KernelModule};

const OP: &str = "skinny_matmul";

/// The most rows of x one block takes (two tiles of 8). Larger M launches a grid row per 16
/// rows, each reading all of W: what batch-invariant models do at every step.
pub const SKINNY_MAX_ROWS: usize = 16;

/// The most rows models give the kernel: one tile. On an H100
/// (benches/reports/2026-11-27-skinny-matmul-h100.md) a batch-1
/// decode step of Llama-3.1-8B's shape took 2 % less time than on cuBLAS and a batch-8 step 1 %
/// more (both within the run's noise), and up to here a row's result is the same bits whatever
/// the rows beside it. With two tiles each warp's ring holds a third more, fewer warps
/// fit an SM, and cuBLAS was 7 % faster over the matmuls of a 16-row step.
pub const SKINNY_MODEL_ROWS: usize = 8;

/// Output features per block (one mma tile's rows).
const FEATURES_PER_BLOCK: usize = 16;

/// Elements per chunk of K, the unit a warp's range is counted in.
pub(crate) const SKINNY_K_CHUNK: usize = 32;

/// Weights of at least this many rows (output features) get 8 warps per block, others 2.
const WIDE_WEIGHT_ROWS: usize = 16_384;

/// Warps per block for N output features of K inputs. From a sweep of every spread on an H100,
/// weights cold (benches/reports/2026-11-27-skinny-matmul-h100.md): Llama-3.1-8B's
/// QKV, O and down (N <= 6144, a few hundred blocks) ran fastest with 2 to 4 warps, each
/// streaming a long range of K; gate+up and the lm head (N >= 28672, thousands of blocks) with
/// 8. Never more warps than K has groups of chunks. A function of the weight's shape only, so
/// every M splits K alike (the results then do not depend on M).
pub(crate) fn skinny_warps(n: usize, k: usize) -> usize {
    let wanted: usize = if n >= WIDE_WEIGHT_ROWS { 8 } else { 2 };
    let groups = (k / (SKINNY_K_CHUNK * skinny_group(k))).max(1);
    // The largest power of two not above the group count.
    wanted.min(1 << groups.ilog2())
}

/// Chunks per fetch: four (256 contiguous bytes of each of a lane group's rows, 1.03-1.3x the
/// one-chunk fetches on the sweep) where K allows, else two or one; the stages keep 16, 8 or 8
/// chunks in flight per warp.
pub(crate) fn skinny_group(k: usize) -> usize {
    [4, 2, 1].into_iter().find(|g| k.is_multiple_of(SKINNY_K_CHUNK * g)).unwrap_or(1)
}

/// The rule's spread for a weight of N rows and K columns.
pub(crate) fn skinny_launch(n: usize, k: usize) -> SkinnyLaunch {
    let group = skinny_group(k);
    SkinnyLaunch { warps: skinny_warps(n, k), stages: if group == 1 { 8 } else { 4 }, group }
}

/// One skinny matmul: `m` rows of x (`x_row_stride` elements apart), `n` rows of w, `k`
/// columns each; out rows `out_row_stride` apart. Pointers are device addresses of the first
/// element.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SkinnyArgs {
    pub dtype: DType,
    pub x: u64,
    pub x_row_stride: usize,
    pub w: u64,
    pub w_row_stride: usize,
    pub out: u64,
    pub out_row_stride: usize,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    /// Warps per block and chunks in flight per warp; `None` for the rule ([`skinny_launch`]).
    pub launch: Option<SkinnyLaunch>,
}

/// How a skinny matmul is spread: warps per block (1, 2, 4, 8 or 16), and per warp `stages`
/// fetches in flight of `group` chunks of 32 elements each; (stages, group) one of (8, 1),
/// (4, 2), (2, 4), (4, 4), the pairs kernels/skinny_matmul.cu instantiates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SkinnyLaunch {
    pub warps: usize,
    pub stages: usize,
    pub group: usize,
}

/// The most shared memory one block may opt into on sm_90 (sm_80: 163 KiB).
const MAX_SHARED_BYTES: usize = 227 * 1024;

/// Shared memory of one block: each warp's ring of `stages * group` chunks, 16 bytes per lane
/// for each of its two W rows and `tiles` x rows.
fn shared_bytes(l: SkinnyLaunch, tiles: usize) -> usize {
    l.warps * l.stages * l.group * (2 + tiles) * 32 * 16
}

/// The launch, `None` when there is nothing to compute. Errors on shapes the kernel does not
/// take (K not a multiple of 32, f32, more than 65535 grid rows). Up to 8 rows one tile, else
/// two tiles per grid row.
pub(crate) fn skinny_matmul(a: &SkinnyArgs) -> Result<Option<KernelLaunch>> {
    let suffix = match a.dtype {
        DType::F16 | DType::BF16 => dtype_suffix(a.dtype, OP)?,
        other => return Err(candle_core::Error::UnsupportedDTypeForOp(other, OP)),
    };
    if !a.k.is_multiple_of(SKINNY_K_CHUNK) || a.m.div_ceil(SKINNY_MAX_ROWS) > u16::MAX as usize {
        candle_core::bail!(
            "{OP}: takes K a multiple of 32 and at most {} rows, got {}x{}",
            u16::MAX as usize * SKINNY_MAX_ROWS,
            a.m,
            a.k
        );
    }
    if a.m == 0 || a.n == 0 {
        return Ok(None);
    }
    let launch = a.launch.unwrap_or_else(|| skinny_launch(a.n, a.k));
    let SkinnyLaunch { warps, stages, group } = launch;
    let tiles = if a.m <= 8 { 1 } else { 2 };
    let shared = shared_bytes(launch, tiles);
    if !matches!(warps, 1 | 2 | 4 | 8 | 16)
        || !matches!((stages, group), (8, 1) | (4, 2) | (2, 4) | (4, 4))
        || !a.k.is_multiple_of(SKINNY_K_CHUNK * group)
        || shared > MAX_SHARED_BYTES
    {
        candle_core::bail!("{OP}: no kernel for {launch:?} at {tiles} tiles and K = {}", a.k);
    }
    let blocks = a.n.div_ceil(FEATURES_PER_BLOCK);
    Ok(Some(KernelLaunch {
        module: KernelModule::SkinnyMatmul,
        function: format!("pagoda_skinny_matmul_{suffix}_t{tiles}_s{stages}_g{group}"),
        grid: [
            u32::try_from(blocks).map_err(|_| candle_core::Error::Msg(format!("{OP}: {} rows", a.n)))?,
            a.m.div_ceil(8 * tiles) as u32,
            1,
        ],
        block: [32 * warps as u32, 1, 1],
        shared_mem_bytes: shared as u32,
        args: vec![
            Arg::Ptr(a.x),
            Arg::I64(a.x_row_stride as i64),
            Arg::Ptr(a.w),
            Arg::I64(a.w_row_stride as i64),
            Arg::Ptr(a.out),
            Arg::I64(a.out_row_stride as i64),
            Arg::I32(to_i32(a.m, "rows", OP)?),
            Arg::I32(to_i32(a.n, "features", OP)?),
            Arg::I32(to_i32(a.k, "inputs", OP)?),
        ],
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warps_fill_the_gpu_and_depend_on_the_shape_only() {
        // Llama-3.1-8B's projections: QKV, O and down get 2 warps, gate+up and the lm head 8.
        assert_eq!(skinny_warps(6144, 4096), 2);
        assert_eq!(skinny_warps(4096, 4096), 2);
        assert_eq!(skinny_warps(4096, 14336), 2);
        assert_eq!(skinny_warps(28672, 4096), 8);
        assert_eq!(skinny_warps(128_256, 4096), 8);
        // Never more warps than groups of chunks in K.
        assert_eq!(skinny_warps(65536, 96), 2);
        assert_eq!(skinny_warps(65536, 256), 2);
        assert_eq!(skinny_warps(16, 32), 1);
        // Four chunks per fetch where K allows (SmolLM2's 576 takes two).
        assert_eq!(skinny_launch(4096, 14336), SkinnyLaunch { warps: 2, stages: 4, group: 4 });
        assert_eq!(skinny_launch(960, 576), SkinnyLaunch { warps: 2, stages: 4, group: 2 });
        assert_eq!(skinny_launch(16, 96), SkinnyLaunch { warps: 2, stages: 8, group: 1 });
    }

    #[test]
    fn launches_pick_the_tile_count_by_rows() {
        let a = SkinnyArgs {
            dtype: DType::BF16,
            x: 1,
            x_row_stride: 4096,
            w: 2,
            w_row_stride: 4096,
            out: 3,
            out_row_stride: 6144,
            m: 9,
            n: 6144,
            k: 4096,
            launch: None,
        };
        let l = skinny_matmul(&a).unwrap().unwrap();
        assert_eq!(l.function, "pagoda_skinny_matmul_bf16_t2_s4_g4");
        assert_eq!((l.grid, l.block, l.shared_mem_bytes), ([384, 1, 1], [64, 1, 1], 2 * 16 * 4 * 512));
        assert_eq!(l.args.len(), 9);
        let two = Some(SkinnyLaunch { warps: 2, stages: 4, group: 2 });
        let one = skinny_matmul(&SkinnyArgs { m: 1, dtype: DType::F16, launch: two, ..a }).unwrap().unwrap();
        assert_eq!((one.function.as_str(), one.block), ("pagoda_skinny_matmul_f16_t1_s4_g2", [64, 1, 1]));
        // Past 16 rows, a grid row of two tiles per 16 rows.
        let many = skinny_matmul(&SkinnyArgs { m: 33, ..a }).unwrap().unwrap();
        assert_eq!((many.function.as_str(), many.grid), ("pagoda_skinny_matmul_bf16_t2_s4_g4", [384, 3, 1]));
        assert!(skinny_matmul(&SkinnyArgs { m: 16 * 65536, ..a }).is_err());
        assert!(skinny_matmul(&SkinnyArgs { k: 100, ..a }).is_err());
        assert!(skinny_matmul(&SkinnyArgs { dtype: DType::F32, ..a }).is_err());
        let odd =
            |warps, stages, group| SkinnyArgs { launch: Some(SkinnyLaunch { warps, stages, group }), ..a };
        assert!(skinny_matmul(&odd(3, 8, 1)).is_err());
        assert!(skinny_matmul(&odd(8, 5, 1)).is_err());
        assert!(skinny_matmul(&odd(8, 2, 2)).is_err());
        // Four chunks per fetch need K in whole groups of 128.
        assert!(skinny_matmul(&SkinnyArgs { k: 4096 + 64, ..odd(8, 4, 4) }).is_err());
        // 16 warps of 8 chunks over two tiles need more shared memory than a block gets.
        assert!(skinny_matmul(&odd(16, 8, 1)).is_err());
        assert!(skinny_matmul(&SkinnyArgs { m: 8, ..odd(16, 8, 1) }).is_ok());
        assert!(skinny_matmul(&SkinnyArgs { m: 0, ..a }).unwrap().is_none());
    }
}

//! The inner loops of the CPU LoRA op ([`crate::lora_cpu`]) for one block of rows of one
//! adapter, in tiles of up to four rows: the shrink `t = A x` and the expansion `base + B^T t`
//! over a column range.
//!
//! With AVX2 the shrink is register-blocked: rows x ranks of dot products in ymm registers (1 x 8,
//! 2 x 4, else rows x 2: enough independent add chains to keep the adders busy), each element of
//! `A` and `x` loaded once per tile. With AVX-512F the expansion is too: 4 rows x 64 columns of
//! sums in zmm registers, each row of `B^T` read once per tile, with the tiles ahead prefetched
//! (its reads jump between the rank's rows). Otherwise a row at a time in arrays LLVM vectorizes.
//!
//! Every path computes every value in the same order (see [`crate::lora_cpu`]): 8 partial sums
//! per dot product (element `i` in lane `i % 8`) added in lane order, plus the leftover
//! elements' own sum; each output `base + sum_k t[k] B[k]` with `k` ascending; multiplies and
//! adds separate. The path changes the speed, not the bits.
//!
//! The adapter's matrices are f32 or bfloat16 ([`Weight`]); bfloat16 values are widened to f32
//! exactly (16 bits shifted up) as they are loaded, and every product and sum is the f32 one,
//! so a bfloat16 adapter gives the bits of an f32 adapter holding the same values. (AVX-512
//! BF16's `vdpbf16ps` would need `x` and `t` rounded to bfloat16 too: fewer bits, and other
//! sums than the f32 path's.)

// Tiles index several arrays with the same row, rank and lane counters.
#![allow(clippy::needless_range_loop)]

use half::bf16;

use crate::dtype::Float;
use crate::lora_cpu::Block;

/// The width of an expansion vector (one zmm register).
const LANES: usize = 16;
/// Partial sums of a shrink dot product (one ymm register).
const DOT_LANES: usize = 8;

/// An element of an adapter's matrices: f32, or bfloat16 widened exactly as it is loaded.
pub(crate) trait Weight: Copy + Send + Sync + 'static {
    fn widen(self) -> f32;
    /// 8 values from `p` as f32. SAFETY: needs AVX2 and 8 readable values at `p`.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256;
    /// 16 values from `p` as f32. SAFETY: needs AVX-512F and 16 readable values at `p`.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load16(p: *const Self) -> std::arch::x86_64::__m512;
}

impl Weight for f32 {
    #[inline(always)]
    fn widen(self) -> f32 {
        self
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256 {
        // SAFETY: passed on from the caller.
        unsafe { std::arch::x86_64::_mm256_loadu_ps(p) }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const Self) -> std::arch::x86_64::__m512 {
        // SAFETY: passed on from the caller.
        unsafe { std::arch::x86_64::_mm512_loadu_ps(p) }
    }
}

/// A bfloat16 is the upper half of the f32 of the same value: zero-extend, shift up 16.
impl Weight for bf16 {
    #[inline(always)]
    fn widen(self) -> f32 {
        f32::from_bits((self.to_bits() as u32) << 16)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        // SAFETY: passed on from the caller: 16 readable bytes at `p`.
        unsafe {
            let h = _mm_loadu_si128(p.cast::<__m128i>());
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
        }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const Self) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::*;
        // SAFETY: passed on from the caller: 32 readable bytes at `p`.
        unsafe {
            let h = _mm256_loadu_si256(p.cast::<__m256i>());
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
        }
    }
}

/// The loops [`add_block`] can run: portable, or with the instructions named.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Path {
    Portable,
    /// AVX2 shrink, the portable expansion compiled for AVX2.
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// AVX2 shrink, AVX-512F expansion.
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

/// The widest path this CPU runs, within `PAGODA_CPU_ISA`.
fn chosen_path() -> Path {
    #[cfg(target_arch = "x86_64")]
    {
        use crate::simd::{level, Level};
        match level() {
            Level::Avx512 if is_x86_feature_detected!("avx2") => return Path::Avx512,
            Level::Avx2 => return Path::Avx2,
            Level::Avx512 | Level::None => {}
        }
    }
    Path::Portable
}

/// Every path this CPU can run, whatever `PAGODA_CPU_ISA` says: for tests.
#[cfg(test)]
pub(crate) fn available_paths() -> Vec<Path> {
    #[allow(unused_mut)]
    let mut paths = vec![Path::Portable];
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx2") {
            paths.push(Path::Avx2);
            if is_x86_feature_detected!("avx512f") {
                paths.push(Path::Avx512);
            }
        }
    }
    paths
}

/// `dst[j] = bases[j] + delta` of block row `j` over `block.columns`.
pub(crate) fn add_block<T: Float, W: Weight>(block: &Block<'_, T, W>, dst: &mut [&mut [T]]) {
    add_block_on(chosen_path(), block, dst);
}

/// Rows a kernel tile holds: blocks of more rows run in pieces of this many, the later
/// pieces reading the adapter's matrices from cache rather than memory.
const TILE_ROWS: usize = 4;

/// [`add_block`] on `path`, which the CPU must have (else the portable loops run).
pub(crate) fn add_block_on<T: Float, W: Weight>(path: Path, block: &Block<'_, T, W>, dst: &mut [&mut [T]]) {
    assert!(
        block.xs.len() == dst.len() && block.bases.len() == dst.len(),
        "lora_add: a block's rows disagree"
    );
    for (i, dst) in dst.chunks_mut(TILE_ROWS).enumerate() {
        let rows = i * TILE_ROWS..i * TILE_ROWS + dst.len();
        let piece = Block {
            xs: &block.xs[rows.clone()],
            a: block.a,
            b: block.b,
            rank: block.rank,
            out: block.out,
            columns: block.columns.clone(),
            bases: &block.bases[rows],
        };
        add_tile_rows(path, &piece, dst);
    }
}

/// [`add_block_on`] of up to [`TILE_ROWS`] rows.
fn add_tile_rows<T: Float, W: Weight>(path: Path, block: &Block<'_, T, W>, dst: &mut [&mut [T]]) {
    let (rank, out, width) = (block.rank, block.out, block.columns.len());
    let input = block.xs.first().map_or(0, |x| x.len());
    // What the unchecked loads of the AVX-512 path rely on.
    assert!(
        (1..=TILE_ROWS).contains(&dst.len())
            && block.a.len() >= rank * input
            && block.b.len() >= rank * out
            && block.columns.end <= out
            && block.xs.len() == dst.len()
            && block.bases.len() == dst.len()
            && block.xs.iter().all(|x| x.len() == input)
            && block.bases.iter().all(|b| b.len() == width)
            && dst.iter().all(|d| d.len() == width),
        "lora_add: a block's slices do not fit its shape"
    );
    let mut stack = [0f32; TILE_ROWS * 64];
    let mut heap = Vec::new();
    let t: &mut [f32] = if dst.len() * rank <= stack.len() {
        &mut stack[..dst.len() * rank]
    } else {
        heap.resize(dst.len() * rank, 0f32);
        &mut heap
    };
    #[cfg(target_arch = "x86_64")]
    match path {
        // SAFETY: the CPU has AVX-512F and AVX2 (checked); the slices fit (asserted above).
        Path::Avx512 if is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx2") => {
            return unsafe {
                avx512::prefetch_start(block);
                avx2::shrink_block(block, t);
                avx512::expand_block(block, t, dst);
            }
        }
        // SAFETY: the CPU has AVX2 (checked); the slices fit (asserted above).
        Path::Avx2 if is_x86_feature_detected!("avx2") => {
            return unsafe {
                avx2::shrink_block(block, t);
                expand_rows_avx2(block, t, dst);
            }
        }
        _ => {}
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = path;
    shrink_rows(block, t);
    expand_rows(block, t, dst);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn expand_rows_avx2<T: Float, W: Weight>(block: &Block<'_, T, W>, t: &[f32], dst: &mut [&mut [T]]) {
    expand_rows(block, t, dst);
}

/// `t[j * rank + k]` of every block row `j` and rank `k`, a dot product at a time.
fn shrink_rows<T, W: Weight>(block: &Block<'_, T, W>, t: &mut [f32]) {
    let rank = block.rank;
    for (j, x) in block.xs.iter().enumerate() {
        let input = x.len();
        for (k, tk) in t[j * rank..(j + 1) * rank].iter_mut().enumerate() {
            let a = &block.a[k * input..(k + 1) * input];
            let mut acc = [0f32; DOT_LANES];
            for (xc, ac) in x.chunks_exact(DOT_LANES).zip(a.chunks_exact(DOT_LANES)) {
                for l in 0..DOT_LANES {
                    acc[l] += xc[l] * ac[l].widen();
                }
            }
            let full = input / DOT_LANES * DOT_LANES;
            *tk = lane_sum(acc) + tail_dot(&x[full..], &a[full..]);
        }
    }
}

/// The partial sums of a dot product added in lane order.
#[inline(always)]
fn lane_sum(acc: [f32; DOT_LANES]) -> f32 {
    acc.iter().sum::<f32>()
}

/// The dot product of the leftover elements, in order.
#[inline(always)]
fn tail_dot<W: Weight>(x: &[f32], a: &[W]) -> f32 {
    x.iter().zip(a).map(|(x, a)| x * a.widen()).sum::<f32>()
}

/// The block's outputs a row at a time, in 16-wide arrays.
#[inline(always)]
fn expand_rows<T: Float, W: Weight>(block: &Block<'_, T, W>, t: &[f32], dst: &mut [&mut [T]]) {
    let rank = block.rank;
    for (j, d) in dst.iter_mut().enumerate() {
        let t = &t[j * rank..(j + 1) * rank];
        let (base, width) = (block.bases[j], block.columns.len());
        let full = width / LANES * LANES;
        for c in (0..full).step_by(LANES) {
            let mut acc = [0f32; LANES];
            for (k, &tk) in t.iter().enumerate() {
                let b = &block.b[k * block.out + block.columns.start + c..][..LANES];
                for l in 0..LANES {
                    acc[l] += tk * b[l].widen();
                }
            }
            for l in 0..LANES {
                d[c + l] = T::from_f32(base[c + l].to_f32() + acc[l]);
            }
        }
        for c in full..width {
            let mut acc = 0f32;
            for (k, &tk) in t.iter().enumerate() {
                acc += tk * block.b[k * block.out + block.columns.start + c].widen();
            }
            d[c] = T::from_f32(base[c].to_f32() + acc);
        }
    }
}

/// Calls `$f::<N>` with `N` the block's rows (1 to 4) as a constant.
#[cfg(target_arch = "x86_64")]
macro_rules! by_rows {
    ($rows:expr, $f:ident, $($arg:expr),*) => {
        match $rows {
            1 => $f::<1, _, _>($($arg),*),
            2 => $f::<2, _, _>($($arg),*),
            3 => $f::<3, _, _>($($arg),*),
            4 => $f::<4, _, _>($($arg),*),
            _ => unreachable!("blocks hold 1 to 4 rows"),
        }
    };
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{lane_sum, tail_dot, Weight, DOT_LANES};
    use crate::lora_cpu::Block;

    /// Ranks of one shrink tile of `rows` rows. Each sum is a chain of dependent adds (4
    /// cycles each), so a tile needs several in flight: 1 row x 8 ranks, 2 x 4, else rows x 2
    /// (8 to 4 chains). `A`'s loads fold into the multiplies where registers run short
    /// (16 ymm: at most 8 sums, the rows of `x` and a few temporaries).
    const fn ranks(rows: usize) -> usize {
        match rows {
            1 => 8,
            2 => 4,
            _ => 2,
        }
    }

    /// `t[j * rank + k]` of every block row `j` and rank `k`.
    ///
    /// SAFETY: needs AVX2 and the slices [`super::add_block`] asserts; `t` holds
    /// `rows * rank`.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn shrink_block<T, W: Weight>(block: &Block<'_, T, W>, t: &mut [f32]) {
        // SAFETY: passed on from the caller.
        unsafe { by_rows!(block.xs.len(), rows, block, t) }
    }

    #[target_feature(enable = "avx2")]
    unsafe fn rows<const N: usize, T, W: Weight>(block: &Block<'_, T, W>, t: &mut [f32]) {
        let (rank, input) = (block.rank, block.xs[0].len());
        let mut x = [std::ptr::null::<f32>(); N];
        for (j, p) in x.iter_mut().enumerate() {
            *p = block.xs[j].as_ptr();
        }
        let a = block.a.as_ptr();
        let mut k = 0;
        // SAFETY: every tile's ranks `k..k + K` are below `rank`; `a` holds `rank * input`.
        unsafe {
            match ranks(N) {
                8 => {
                    while k + 8 <= rank {
                        tile::<N, 8, W>(&x, input, a.add(k * input), t, k, rank);
                        k += 8;
                    }
                }
                4 => {
                    while k + 4 <= rank {
                        tile::<N, 4, W>(&x, input, a.add(k * input), t, k, rank);
                        k += 4;
                    }
                }
                _ => {}
            }
            while k + 2 <= rank {
                tile::<N, 2, W>(&x, input, a.add(k * input), t, k, rank);
                k += 2;
            }
            while k < rank {
                tile::<N, 1, W>(&x, input, a.add(k * input), t, k, rank);
                k += 1;
            }
        }
    }

    /// `t[j * rank + k0 + i]` for rows `j < N` (at `x[j]`, `input` long) and ranks `i < K`
    /// (rows of `A` from `a`).
    #[target_feature(enable = "avx2")]
    unsafe fn tile<const N: usize, const K: usize, W: Weight>(
        x: &[*const f32; N],
        input: usize,
        a: *const W,
        t: &mut [f32],
        k0: usize,
        rank: usize,
    ) {
        let full = input / DOT_LANES * DOT_LANES;
        let mut acc = [[_mm256_setzero_ps(); K]; N];
        let mut d = 0;
        // SAFETY: `d + DOT_LANES <= full <= input` for every row of x and of A.
        unsafe {
            while d < full {
                let mut av = [_mm256_setzero_ps(); K];
                for (i, v) in av.iter_mut().enumerate() {
                    *v = W::load8(a.add(i * input + d));
                }
                for j in 0..N {
                    let xv = _mm256_loadu_ps(x[j].add(d));
                    for i in 0..K {
                        acc[j][i] = _mm256_add_ps(acc[j][i], _mm256_mul_ps(xv, av[i]));
                    }
                }
                d += DOT_LANES;
            }
            for j in 0..N {
                let x_tail = std::slice::from_raw_parts(x[j].add(full), input - full);
                for i in 0..K {
                    let mut lanes = [0f32; DOT_LANES];
                    _mm256_storeu_ps(lanes.as_mut_ptr(), acc[j][i]);
                    let a_tail = std::slice::from_raw_parts(a.add(i * input + full), input - full);
                    t[j * rank + k0 + i] = lane_sum(lanes) + tail_dot(x_tail, a_tail);
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::{Weight, LANES};
    use crate::dtype::Float;
    use crate::lora_cpu::Block;

    /// 16-column vectors of one expansion tile: 4 rows x 4 vectors of sums, 16 of the 32 zmm
    /// registers.
    const VECTORS: usize = 4;

    /// Tiles the expansion prefetches ahead. Its loads jump between the `rank` rows of `B^T`,
    /// a tile's few lines from each: streams too short and too many for the hardware
    /// prefetchers, so a decode step's expansion waited on memory.
    const AHEAD: usize = 2;

    /// Prefetches the first [`AHEAD`] tiles of the block's expansion, to arrive while it shrinks.
    ///
    /// SAFETY: needs the slices [`super::add_block`] asserts.
    #[inline(always)]
    pub(super) unsafe fn prefetch_start<T, W: Weight>(block: &Block<'_, T, W>) {
        for tile in 0..AHEAD {
            // SAFETY: passed on from the caller.
            unsafe { prefetch_tile(block, tile * VECTORS * LANES) };
        }
    }

    /// Prefetches columns `c..c + VECTORS * LANES` of the block's range from every row of
    /// `B^T`, when they lie inside the range.
    ///
    /// SAFETY: needs the slices [`super::add_block`] asserts.
    #[inline(always)]
    unsafe fn prefetch_tile<T, W: Weight>(block: &Block<'_, T, W>, c: usize) {
        if c + VECTORS * LANES > block.columns.len() {
            return;
        }
        let first = block.columns.start + c;
        let bytes = VECTORS * LANES * std::mem::size_of::<W>();
        for k in 0..block.rank {
            // SAFETY: row `k` holds columns `first..first + VECTORS * LANES` (inside the range,
            // inside `out`); prefetching never faults or writes.
            unsafe {
                let row = block.b.as_ptr().add(k * block.out + first).cast::<i8>();
                for line in (0..bytes).step_by(64) {
                    _mm_prefetch::<_MM_HINT_T0>(row.add(line));
                }
            }
        }
    }

    /// `dst[j] = bases[j] + sum_k t[j * rank + k] B^T[k]` over the block's columns.
    ///
    /// SAFETY: needs AVX-512F and the slices [`super::add_block`] asserts.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn expand_block<T: Float, W: Weight>(
        block: &Block<'_, T, W>,
        t: &[f32],
        dst: &mut [&mut [T]],
    ) {
        // SAFETY: passed on from the caller.
        unsafe { by_rows!(dst.len(), rows, block, t, dst) }
    }

    #[target_feature(enable = "avx512f")]
    unsafe fn rows<const N: usize, T: Float, W: Weight>(
        block: &Block<'_, T, W>,
        t: &[f32],
        dst: &mut [&mut [T]],
    ) {
        let (rank, width) = (block.rank, block.columns.len());
        let mut c = 0;
        // SAFETY: columns `c..c + tile` lie inside the block's range, which lies inside `out`.
        unsafe {
            while c + VECTORS * LANES <= width {
                prefetch_tile(block, c + AHEAD * VECTORS * LANES);
                expand::<T, W, N, VECTORS>(block, t, dst, c);
                c += VECTORS * LANES;
            }
            while c + LANES <= width {
                expand::<T, W, N, 1>(block, t, dst, c);
                c += LANES;
            }
        }
        for col in c..width {
            let column = block.columns.start + col;
            for j in 0..N {
                let mut acc = 0f32;
                for k in 0..rank {
                    acc += t[j * rank + k] * block.b[k * block.out + column].widen();
                }
                dst[j][col] = T::from_f32(block.bases[j][col].to_f32() + acc);
            }
        }
    }

    /// Columns `c..c + V * LANES` of the block's range, for rows `j < N`.
    #[target_feature(enable = "avx512f")]
    unsafe fn expand<T: Float, W: Weight, const N: usize, const V: usize>(
        block: &Block<'_, T, W>,
        t: &[f32],
        dst: &mut [&mut [T]],
        c: usize,
    ) {
        let (rank, out) = (block.rank, block.out);
        let first = block.columns.start + c;
        let mut acc = [[_mm512_setzero_ps(); V]; N];
        // SAFETY: row `k` of B^T holds columns `first..first + V * LANES` (inside `out`).
        unsafe {
            for k in 0..rank {
                let row = block.b.as_ptr().add(k * out + first);
                let mut bv = [_mm512_setzero_ps(); V];
                for (v, b) in bv.iter_mut().enumerate() {
                    *b = W::load16(row.add(v * LANES));
                }
                for j in 0..N {
                    let tk = _mm512_set1_ps(t[j * rank + k]);
                    for v in 0..V {
                        acc[j][v] = _mm512_add_ps(acc[j][v], _mm512_mul_ps(tk, bv[v]));
                    }
                }
            }
        }
        for j in 0..N {
            let base = &block.bases[j][c..c + V * LANES];
            let d = &mut dst[j][c..c + V * LANES];
            match (T::as_f32(base), T::as_f32_mut(&mut d[..])) {
                (Some(base), Some(d)) => {
                    for v in 0..V {
                        // SAFETY: both slices hold `V * LANES` values.
                        unsafe {
                            let sum = _mm512_add_ps(_mm512_loadu_ps(base.as_ptr().add(v * LANES)), acc[j][v]);
                            _mm512_storeu_ps(d.as_mut_ptr().add(v * LANES), sum);
                        }
                    }
                }
                (_, _) => {
                    let mut lanes = [0f32; LANES];
                    for v in 0..V {
                        // SAFETY: `lanes` holds LANES values.
                        unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), acc[j][v]) };
                        for l in 0..LANES {
                            let i = v * LANES + l;
                            d[i] = T::from_f32(base[i].to_f32() + lanes[l]);
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
#[path = "lora_kernels_tests.rs"]
mod tests;

//! The inner loops of the CPU LoRA op ([`crate::lora_cpu`]) for one block of up to four rows
//! of one adapter: the shrink `t = A x` and the expansion `base + B^T t` over a column range.
//!
//! With AVX2 the shrink is register-blocked: 4 rows x 2 ranks of dot products in ymm registers,
//! each element of `A` and `x` loaded once per tile. With AVX-512F the expansion is too: 4 rows
//! x 64 columns of sums in zmm registers, each row of `B^T` read once per block. Otherwise a row
//! at a time in arrays LLVM vectorizes.
//!
//! Every path computes every value in the same order (see [`crate::lora_cpu`]): 8 partial sums
//! per dot product (element `i` in lane `i % 8`) added in lane order, plus the leftover
//! elements' own sum; each output `base + sum_k t[k] B[k]` with `k` ascending; multiplies and
//! adds separate. The path changes the speed, not the bits.

// Tiles index several arrays with the same row, rank and lane counters.
#![allow(clippy::needless_range_loop)]

use crate::dtype::Float;
use crate::lora_cpu::Block;

/// The width of an expansion vector (one zmm register).
const LANES: usize = 16;
/// Partial sums of a shrink dot product (one ymm register).
const DOT_LANES: usize = 8;

/// `dst[j] = bases[j] + delta` of block row `j` over `block.columns`.
pub(crate) fn add_block<T: Float>(block: &Block<'_, T>, dst: &mut [&mut [T]]) {
    let (rank, out, width) = (block.rank, block.out, block.columns.len());
    let input = block.xs.first().map_or(0, |x| x.len());
    // What the unchecked loads of the AVX-512 path rely on.
    assert!(
        (1..=4).contains(&dst.len())
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
    let mut stack = [0f32; 4 * 64];
    let mut heap = Vec::new();
    let t: &mut [f32] = if dst.len() * rank <= stack.len() {
        &mut stack[..dst.len() * rank]
    } else {
        heap.resize(dst.len() * rank, 0f32);
        &mut heap
    };
    #[cfg(target_arch = "x86_64")]
    {
        use crate::simd::{level, Level};
        match level() {
            // SAFETY: the CPU has AVX-512F and AVX2 (checked); the slices fit (asserted above).
            Level::Avx512 if is_x86_feature_detected!("avx2") => {
                return unsafe {
                    avx2::shrink_block(block, t);
                    avx512::expand_block(block, t, dst);
                }
            }
            // SAFETY: the CPU has AVX2 (checked once); the slices fit (asserted above).
            Level::Avx2 => {
                return unsafe {
                    avx2::shrink_block(block, t);
                    expand_rows_avx2(block, t, dst);
                }
            }
            Level::Avx512 | Level::None => {}
        }
    }
    shrink_rows(block, t);
    expand_rows(block, t, dst);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn expand_rows_avx2<T: Float>(block: &Block<'_, T>, t: &[f32], dst: &mut [&mut [T]]) {
    expand_rows(block, t, dst);
}

/// `t[j * rank + k]` of every block row `j` and rank `k`, a dot product at a time.
fn shrink_rows<T>(block: &Block<'_, T>, t: &mut [f32]) {
    let rank = block.rank;
    for (j, x) in block.xs.iter().enumerate() {
        let input = x.len();
        for (k, tk) in t[j * rank..(j + 1) * rank].iter_mut().enumerate() {
            let a = &block.a[k * input..(k + 1) * input];
            let mut acc = [0f32; DOT_LANES];
            for (xc, ac) in x.chunks_exact(DOT_LANES).zip(a.chunks_exact(DOT_LANES)) {
                for l in 0..DOT_LANES {
                    acc[l] += xc[l] * ac[l];
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
fn tail_dot(x: &[f32], a: &[f32]) -> f32 {
    x.iter().zip(a).map(|(x, a)| x * a).sum::<f32>()
}

/// The block's outputs a row at a time, in 16-wide arrays.
#[inline(always)]
fn expand_rows<T: Float>(block: &Block<'_, T>, t: &[f32], dst: &mut [&mut [T]]) {
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
                    acc[l] += tk * b[l];
                }
            }
            for l in 0..LANES {
                d[c + l] = T::from_f32(base[c + l].to_f32() + acc[l]);
            }
        }
        for c in full..width {
            let mut acc = 0f32;
            for (k, &tk) in t.iter().enumerate() {
                acc += tk * block.b[k * block.out + block.columns.start + c];
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
            1 => $f::<1, _>($($arg),*),
            2 => $f::<2, _>($($arg),*),
            3 => $f::<3, _>($($arg),*),
            4 => $f::<4, _>($($arg),*),
            _ => unreachable!("blocks hold 1 to 4 rows"),
        }
    };
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{lane_sum, tail_dot, DOT_LANES};
    use crate::lora_cpu::Block;

    /// Ranks of one shrink tile: 4 rows x 2 ranks of sums, 2 rows of `A` and one of `x`
    /// loaded: 11 of the 16 ymm registers.
    const RANKS: usize = 2;

    /// `t[j * rank + k]` of every block row `j` and rank `k`.
    ///
    /// SAFETY: needs AVX2 and the slices [`super::add_block`] asserts; `t` holds
    /// `rows * rank`.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn shrink_block<T>(block: &Block<'_, T>, t: &mut [f32]) {
        // SAFETY: passed on from the caller.
        unsafe { by_rows!(block.xs.len(), rows, block, t) }
    }

    #[target_feature(enable = "avx2")]
    unsafe fn rows<const N: usize, T>(block: &Block<'_, T>, t: &mut [f32]) {
        let (rank, input) = (block.rank, block.xs[0].len());
        let mut x = [std::ptr::null::<f32>(); N];
        for (j, p) in x.iter_mut().enumerate() {
            *p = block.xs[j].as_ptr();
        }
        let mut k = 0;
        // SAFETY: ranks `k..k + RANKS` (or `k`) are below `rank`; `a` holds `rank * input`.
        unsafe {
            while k + RANKS <= rank {
                tile::<N, RANKS>(&x, input, block.a.as_ptr().add(k * input), t, k, rank);
                k += RANKS;
            }
            while k < rank {
                tile::<N, 1>(&x, input, block.a.as_ptr().add(k * input), t, k, rank);
                k += 1;
            }
        }
    }

    /// `t[j * rank + k0 + i]` for rows `j < N` (at `x[j]`, `input` long) and ranks `i < K`
    /// (rows of `A` from `a`).
    #[target_feature(enable = "avx2")]
    unsafe fn tile<const N: usize, const K: usize>(
        x: &[*const f32; N],
        input: usize,
        a: *const f32,
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
                    *v = _mm256_loadu_ps(a.add(i * input + d));
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

    use super::LANES;
    use crate::dtype::Float;
    use crate::lora_cpu::Block;

    /// 16-column vectors of one expansion tile: 4 rows x 4 vectors of sums, 16 of the 32 zmm
    /// registers.
    const VECTORS: usize = 4;

    /// `dst[j] = bases[j] + sum_k t[j * rank + k] B^T[k]` over the block's columns.
    ///
    /// SAFETY: needs AVX-512F and the slices [`super::add_block`] asserts.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn expand_block<T: Float>(block: &Block<'_, T>, t: &[f32], dst: &mut [&mut [T]]) {
        // SAFETY: passed on from the caller.
        unsafe { by_rows!(dst.len(), rows, block, t, dst) }
    }

    #[target_feature(enable = "avx512f")]
    unsafe fn rows<const N: usize, T: Float>(block: &Block<'_, T>, t: &[f32], dst: &mut [&mut [T]]) {
        let (rank, width) = (block.rank, block.columns.len());
        let mut c = 0;
        // SAFETY: columns `c..c + tile` lie inside the block's range, which lies inside `out`.
        unsafe {
            while c + VECTORS * LANES <= width {
                expand::<T, N, VECTORS>(block, t, dst, c);
                c += VECTORS * LANES;
            }
            while c + LANES <= width {
                expand::<T, N, 1>(block, t, dst, c);
                c += LANES;
            }
        }
        for col in c..width {
            let column = block.columns.start + col;
            for j in 0..N {
                let mut acc = 0f32;
                for k in 0..rank {
                    acc += t[j * rank + k] * block.b[k * block.out + column];
                }
                dst[j][col] = T::from_f32(block.bases[j][col].to_f32() + acc);
            }
        }
    }

    /// Columns `c..c + V * LANES` of the block's range, for rows `j < N`.
    #[target_feature(enable = "avx512f")]
    unsafe fn expand<T: Float, const N: usize, const V: usize>(
        block: &Block<'_, T>,
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
                    *b = _mm512_loadu_ps(row.add(v * LANES));
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
mod tests {
    use super::*;

    fn values(seed: u64, n: usize) -> Vec<f32> {
        let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5
            })
            .collect()
    }

    /// Every path of this CPU gives the bits of the portable one, for every block height, ranks
    /// that are and are not multiples of the tile, and widths with leftover columns and inputs.
    #[test]
    fn the_vector_paths_give_the_portable_bits() {
        for (input, out, rank, columns) in [(37, 150, 5, 3..150), (64, 64, 16, 0..64), (200, 97, 8, 16..81)] {
            let x = values(1, 4 * input);
            let (a, b) = (values(2, rank * input), values(3, rank * out));
            let base = values(4, 4 * columns.len());
            for rows in 1..=4 {
                let xs: Vec<&[f32]> = x.chunks_exact(input).take(rows).collect();
                let bases: Vec<&[f32]> = base.chunks_exact(columns.len()).take(rows).collect();
                let block =
                    Block { xs: &xs, a: &a, b: &b, rank, out, columns: columns.clone(), bases: &bases };
                let mut want = vec![0f32; rows * columns.len()];
                let mut dst: Vec<&mut [f32]> = want.chunks_exact_mut(columns.len()).collect();
                let mut t = vec![0f32; rows * rank];
                shrink_rows(&block, &mut t);
                expand_rows(&block, &t, &mut dst);
                let mut got = vec![0f32; rows * columns.len()];
                let mut dst: Vec<&mut [f32]> = got.chunks_exact_mut(columns.len()).collect();
                add_block(&block, &mut dst);
                assert_eq!(
                    got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    "{input} {out} {rank} {rows}"
                );
                // And it is the sum it claims to be.
                for j in 0..rows {
                    for (c, col) in columns.clone().enumerate() {
                        let t: Vec<f64> = (0..rank)
                            .map(|k| {
                                (0..input).map(|e| x[j * input + e] as f64 * a[k * input + e] as f64).sum()
                            })
                            .collect();
                        let delta: f64 = (0..rank).map(|k| t[k] * b[k * out + col] as f64).sum();
                        let exact = base[j * columns.len() + c] as f64 + delta;
                        assert!((got[j * columns.len() + c] as f64 - exact).abs() < 1e-4, "{j} {col}");
                    }
                }
            }
        }
    }
}

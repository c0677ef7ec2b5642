//! x86-64 kernels of [`crate::matmul::quant_matmul`]: AVX-512 and AVX2+FMA versions for every format,
//! chosen once at run time from what the CPU reports (a binary built for a generic x86-64 still
//! uses them). This file holds the dispatch and the row loops shared by all formats, and the
//! block decoders of Q4_1 (which Q4_K's layout in memory shares) and Q8_0; those of Q4_0,
//! Q5_0, Q5_K and Q6_K are in `quant_matmul_kquant_x86`.
//!
//! AVX-512: per 32-element block the weights are dequantized in registers once (codes widened
//! to f32, times the scale, plus the minimum) and multiplied with each activation row of the
//! group. AVX2: the codes are widened to f32 once, dotted with each activation row, and the sum
//! scaled by the block's scale; minimums contribute `m * sum(x_block)`, a short dot product
//! with the block sums the caller precomputed. Lanes are added up once per weight row.

use std::arch::x86_64::*;
use std::ops::Range;

use crate::matmul::quant_matmul::{RowsKernel, XGroup, GROUP};
use crate::matmul::quant_weight::{QuantFormat, QuantizedWeight, QUANT_BLOCK};
use crate::simd::{dot, level, prefetch, Fused, Level};

/// The best kernel for `format` on this CPU, if it has AVX2 and FMA at least.
pub(crate) fn kernel(format: QuantFormat) -> Option<RowsKernel> {
    match level() {
        Level::Avx512 => Some(avx512_kernel(format)),
        Level::Avx2 => Some(avx2_kernel_for(format)),
        Level::None => None,
    }
}

fn avx512_kernel(format: QuantFormat) -> RowsKernel {
    match format {
        // Q4_K is held as Q4_1 is: nibbles, a scale and a minimum per block.
        QuantFormat::Q4_1 | QuantFormat::Q4K => q4_1_avx512,
        QuantFormat::Q8_0 => q8_0_avx512,
        QuantFormat::Q4_0 => kquant::q4_0_avx512,
        QuantFormat::Q5_0 => kquant::q5_0_avx512,
        QuantFormat::Q5K => kquant::q5_k_avx512,
        QuantFormat::Q6K => kquant::q6_k_avx512,
    }
}

fn avx2_kernel_for(format: QuantFormat) -> RowsKernel {
    match format {
        QuantFormat::Q4_1 | QuantFormat::Q4K => q4_1_avx2,
        QuantFormat::Q8_0 => q8_0_avx2,
        QuantFormat::Q4_0 => kquant::q4_0_avx2,
        QuantFormat::Q5_0 => kquant::q5_0_avx2,
        QuantFormat::Q5K => kquant::q5_k_avx2,
        QuantFormat::Q6K => kquant::q6_k_avx2,
    }
}

/// The AVX2 kernel (for tests on AVX-512 machines, which otherwise never run them).
#[cfg(test)]
pub(crate) fn avx2_kernel(format: QuantFormat) -> Option<RowsKernel> {
    (level() != Level::None).then(|| avx2_kernel_for(format))
}

/// The bounds the unchecked loads rely on; a violation is a bug in the caller.
fn check_args(w: &QuantizedWeight, rows: &Range<usize>, x: &XGroup<'_>, out: &[f32]) {
    let g = x.rows.len();
    assert!((1..=GROUP).contains(&g), "group of {g} rows");
    assert!(rows.end <= w.rows() && out.len() >= g * rows.len());
    assert!(x.rows.iter().all(|r| r.len() >= w.cols()));
    if w.format().has_mins() {
        assert!(x.block_sums.len() == g && x.block_sums.iter().all(|s| s.len() >= w.blocks_per_row()));
    }
}

/// Safe entry points: check the arguments, then run the kernel instantiated for the group size.
/// AVX2 kernels take at most 4 rows at once (16 ymm registers), so larger groups are split.
macro_rules! dispatch {
    ($name:ident, $inner:ident, Avx2) => {
        pub(super) fn $name(w: &QuantizedWeight, rows: Range<usize>, x: &XGroup<'_>, out: &mut [f32]) {
            check_args(w, &rows, x, out);
            assert!(level() != Level::None);
            let len = rows.len();
            let mut g0 = 0;
            while g0 < x.rows.len() {
                let g1 = (g0 + 4).min(x.rows.len());
                let sums = if x.block_sums.is_empty() { &[][..] } else { &x.block_sums[g0..g1] };
                let sub = XGroup { rows: &x.rows[g0..g1], block_sums: sums };
                let out = &mut out[g0 * len..g1 * len];
                // SAFETY: the CPU has AVX2 and FMA (checked above) and `check_args` holds.
                unsafe {
                    match g1 - g0 {
                        1 => $inner::<1>(w, rows.clone(), &sub, out),
                        2 => $inner::<2>(w, rows.clone(), &sub, out),
                        3 => $inner::<3>(w, rows.clone(), &sub, out),
                        _ => $inner::<4>(w, rows.clone(), &sub, out),
                    }
                }
                g0 = g1;
            }
        }
    };
    ($name:ident, $inner:ident, Avx512) => {
        pub(super) fn $name(w: &QuantizedWeight, rows: Range<usize>, x: &XGroup<'_>, out: &mut [f32]) {
            check_args(w, &rows, x, out);
            assert!(level() == Level::Avx512);
            // SAFETY: the CPU has AVX-512 and FMA (checked above) and `check_args` holds.
            unsafe {
                match x.rows.len() {
                    1 => $inner::<1>(w, rows, x, out),
                    2 => $inner::<2>(w, rows, x, out),
                    3 => $inner::<3>(w, rows, x, out),
                    4 => $inner::<4>(w, rows, x, out),
                    5 => $inner::<5>(w, rows, x, out),
                    6 => $inner::<6>(w, rows, x, out),
                    7 => $inner::<7>(w, rows, x, out),
                    _ => $inner::<8>(w, rows, x, out),
                }
            }
        }
    };
}

dispatch!(q4_1_avx2, q4_1_avx2_rows, Avx2);
dispatch!(q8_0_avx2, q8_0_avx2_rows, Avx2);
dispatch!(q4_1_avx512, q4_1_avx512_rows, Avx512);
dispatch!(q8_0_avx512, q8_0_avx512_rows, Avx512);

#[inline]
#[target_feature(enable = "avx2,fma")]
fn hsum256(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps::<0b01>(s, s));
    _mm_cvtss_f32(s)
}

/// Widens 8 bytes (the low half of `v`) to 8 f32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn u8x8_to_f32(v: __m128i) -> __m256 {
    _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v))
}

/// The codes of block `block` (counted over the whole matrix) as f32, unscaled: elements
/// 0..8, 8..16, 16..24, 24..32.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn q4_1_codes_avx2(w: &QuantizedWeight, block: usize) -> [__m256; 4] {
    let mask = _mm_set1_epi8(0x0F);
    // SAFETY: `block` is a block of the matrix (the callers iterate over checked rows).
    let raw = unsafe { _mm_loadu_si128(w.codes().as_ptr().add(block * 16).cast()) };
    let lo = _mm_and_si128(raw, mask);
    let hi = _mm_and_si128(_mm_srli_epi16::<4>(raw), mask);
    [
        u8x8_to_f32(lo),
        u8x8_to_f32(_mm_unpackhi_epi64(lo, lo)),
        u8x8_to_f32(hi),
        u8x8_to_f32(_mm_unpackhi_epi64(hi, hi)),
    ]
}

#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn q8_0_codes_avx2(w: &QuantizedWeight, block: usize) -> [__m256; 4] {
    // SAFETY: as above; each load reads 8 of the block's 32 bytes.
    let c = unsafe { w.codes().as_ptr().add(block * 32) };
    let widen =
        |o: usize| _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(unsafe { _mm_loadl_epi64(c.add(o).cast()) }));
    [widen(0), widen(8), widen(16), widen(24)]
}

/// AVX2 rows: per block, the codes widened once, dotted with each of the `G` activation rows,
/// and the sum scaled by the block's scale (Q6_K, `split`: each half by its own); minimums add
/// `sum(m * block_sum)` per row at the end.
macro_rules! avx2_rows {
    ($name:ident, $codes:ident) => {
        avx2_rows!($name, $codes, false);
    };
    ($name:ident, $codes:ident, $split:literal) => {
        #[target_feature(enable = "avx2,fma")]
        unsafe fn $name<const G: usize>(
            w: &QuantizedWeight,
            rows: Range<usize>,
            x: &XGroup<'_>,
            out: &mut [f32],
        ) {
            let (bpr, len) = (w.blocks_per_row(), rows.len());
            let xp: [*const f32; G] = std::array::from_fn(|g| x.rows[g].as_ptr());
            for (i, r) in rows.enumerate() {
                let mut acc = [_mm256_setzero_ps(); G];
                for b in 0..bpr {
                    let block = r * bpr + b;
                    // SAFETY: row `r` and block `b` are in the matrix (`check_args`).
                    let [w0, w1, w2, w3] = unsafe { $codes(w, block) };
                    let (d0, d1) = if $split {
                        (_mm256_set1_ps(w.scales()[2 * block]), _mm256_set1_ps(w.scales()[2 * block + 1]))
                    } else {
                        let d = _mm256_set1_ps(w.scales()[block]);
                        (d, d)
                    };
                    for g in 0..G {
                        // SAFETY: columns `32b..32b+32` of each x row exist (`check_args`).
                        let p = unsafe { xp[g].add(b * QUANT_BLOCK) };
                        let mut t = _mm256_mul_ps(w0, unsafe { _mm256_loadu_ps(p) });
                        t = _mm256_fmadd_ps(w1, unsafe { _mm256_loadu_ps(p.add(8)) }, t);
                        if $split {
                            acc[g] = _mm256_fmadd_ps(t, d0, acc[g]);
                            t = _mm256_mul_ps(w2, unsafe { _mm256_loadu_ps(p.add(16)) });
                        } else {
                            t = _mm256_fmadd_ps(w2, unsafe { _mm256_loadu_ps(p.add(16)) }, t);
                        }
                        t = _mm256_fmadd_ps(w3, unsafe { _mm256_loadu_ps(p.add(24)) }, t);
                        acc[g] = _mm256_fmadd_ps(t, d1, acc[g]);
                    }
                }
                for g in 0..G {
                    let mut v = hsum256(acc[g]);
                    if w.format().has_mins() {
                        v += dot::<Fused>(&w.mins()[r * bpr..(r + 1) * bpr], x.block_sums[g]);
                    }
                    out[g * len + i] = v;
                }
            }
        }
    };
}

avx2_rows!(q4_1_avx2_rows, q4_1_codes_avx2);
avx2_rows!(q8_0_avx2_rows, q8_0_codes_avx2);

/// The nibbles of block `block` (counted over the whole matrix) as i32 lanes: elements 0..16
/// and 16..32. The 16 bytes are widened once and split in the wide lanes (one shuffle-port
/// widening per block instead of two).
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn nibbles_avx512(w: &QuantizedWeight, block: usize) -> (__m512i, __m512i) {
    // SAFETY: `block` is a block of the matrix (the callers iterate over checked rows), and
    // every format decoded with this keeps 16 bytes of nibbles per block.
    let raw = unsafe { _mm_loadu_si128(w.codes().as_ptr().add(block * 16).cast()) };
    let bytes = _mm512_cvtepu8_epi32(raw);
    (_mm512_and_si512(bytes, _mm512_set1_epi32(0x0F)), _mm512_srli_epi32::<4>(bytes))
}

/// Block `block` dequantized to f32: elements 0..16 and 16..32.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn q4_1_block_avx512(w: &QuantizedWeight, block: usize) -> (__m512, __m512) {
    // SAFETY: as for `nibbles_avx512`.
    let (lo, hi) = unsafe { nibbles_avx512(w, block) };
    let (d, m) = (_mm512_set1_ps(w.scales()[block]), _mm512_set1_ps(w.mins()[block]));
    (_mm512_fmadd_ps(_mm512_cvtepi32_ps(lo), d, m), _mm512_fmadd_ps(_mm512_cvtepi32_ps(hi), d, m))
}

#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn q8_0_block_avx512(w: &QuantizedWeight, block: usize) -> (__m512, __m512) {
    // SAFETY: as above.
    let c = unsafe { w.codes().as_ptr().add(block * 32) };
    let d = _mm512_set1_ps(w.scales()[block]);
    let lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(unsafe { _mm_loadu_si128(c.cast()) }));
    let hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(unsafe { _mm_loadu_si128(c.add(16).cast()) }));
    (_mm512_mul_ps(lo, d), _mm512_mul_ps(hi, d))
}

/// Starts loading weight row `row`'s codes, high bits, scales and minimums into cache.
#[inline(always)]
fn prefetch_row(w: &QuantizedWeight, row: usize) {
    let (bpr, f) = (w.blocks_per_row(), w.format());
    let part = |per_block: usize| row * bpr * per_block..(row + 1) * bpr * per_block;
    prefetch(&w.codes()[part(f.code_bytes())]);
    prefetch(&w.high()[part(f.high_planes())]);
    prefetch(&w.scales()[part(f.scales_per_block())]);
    prefetch(&w.mins()[part(usize::from(f.has_mins()))]);
}

/// AVX-512 tile: two weight rows at a time, each block dequantized in registers once and
/// multiplied with all `G` activation rows (4G independent multiply-adds per block). Small
/// groups keep separate accumulators for the two block halves so that the multiply-add chains
/// stay short; large ones share one per (row, activation) to fit in the 32 registers.
macro_rules! avx512_tile {
    ($name:ident, $block:ident) => {
        #[target_feature(enable = "avx512f,avx2,fma")]
        unsafe fn $name<const G: usize>(
            w: &QuantizedWeight,
            rows: Range<usize>,
            x: &XGroup<'_>,
            out: &mut [f32],
        ) {
            let (bpr, start, len) = (w.blocks_per_row(), rows.start, rows.len());
            let split = G <= 4;
            let xp: [*const f32; G] = std::array::from_fn(|g| x.rows[g].as_ptr());
            let mut r = rows.start;
            while r < rows.end {
                // An odd last row is computed twice and stored once.
                let r1 = (r + 1).min(rows.end - 1);
                // Few-token steps wait on memory: start loading the next pair of rows.
                for next in (r + 2..r + 4).filter(|&n| n < rows.end) {
                    prefetch_row(w, next);
                }
                let mut acc = [[_mm512_setzero_ps(); G]; 4];
                for b in 0..bpr {
                    // SAFETY: rows `r`, `r1` and block `b` are in the matrix (`check_args`).
                    let (lo0, hi0) = unsafe { $block(w, r * bpr + b) };
                    let (lo1, hi1) = unsafe { $block(w, r1 * bpr + b) };
                    for g in 0..G {
                        // SAFETY: columns `32b..32b+32` of each x row exist (`check_args`).
                        let p = unsafe { xp[g].add(b * QUANT_BLOCK) };
                        let (xl, xh) = unsafe { (_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16))) };
                        acc[0][g] = _mm512_fmadd_ps(lo0, xl, acc[0][g]);
                        acc[1][g] = _mm512_fmadd_ps(lo1, xl, acc[1][g]);
                        if split {
                            acc[2][g] = _mm512_fmadd_ps(hi0, xh, acc[2][g]);
                            acc[3][g] = _mm512_fmadd_ps(hi1, xh, acc[3][g]);
                        } else {
                            acc[0][g] = _mm512_fmadd_ps(hi0, xh, acc[0][g]);
                            acc[1][g] = _mm512_fmadd_ps(hi1, xh, acc[1][g]);
                        }
                    }
                }
                for g in 0..G {
                    let (a0, a1) = if split {
                        (_mm512_add_ps(acc[0][g], acc[2][g]), _mm512_add_ps(acc[1][g], acc[3][g]))
                    } else {
                        (acc[0][g], acc[1][g])
                    };
                    out[g * len + r - start] = _mm512_reduce_add_ps(a0);
                    out[g * len + r1 - start] = _mm512_reduce_add_ps(a1);
                }
                r += 2;
            }
        }
    };
}

avx512_tile!(q4_1_avx512_rows, q4_1_block_avx512);
avx512_tile!(q8_0_avx512_rows, q8_0_block_avx512);

#[path = "quant_matmul_kquant_x86.rs"]
mod kquant;

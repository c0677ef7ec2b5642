//! The pass over 4-bit codes that the 256-bit int8 and int16 kernels share
//! ([`crate::matmul::int8_matmul_avx2`], [`crate::matmul::int16_matmul_avx2`]).
//!
//! Activations arrive as byte planes: one for 8-bit activations (`q`), two for 16-bit ones
//! (`q = 256 * high + low`). Each code byte (0..=15) meets each plane's 4 bytes of a quad,
//! broadcast; a block's sum is each plane's sum shifted by its weight, plus the row's
//! correction `-offset * sum(q)`. AVX2's `vpmaddubsw` sums product pairs into 16-bit lanes,
//! which hold a whole block there (a pair is at most `2 * 15 * 128`, eight pairs stay under
//! 2^15), so a code byte costs one multiply and one add per plane and is never widened; the
//! lanes reach int32 once per block. AVX-VNNI's `vpdpbusd` adds into int32 lanes directly.
//!
//! A pass covers 8 columns (one vector; its codes are 32 bytes per group of 4 inputs, low
//! nibbles for inputs 0..16 of the block and high ones for 16..32) for up to as many rows as
//! AVX2's 16 registers hold: per row one sum per plane and an f32 accumulator.
//!
//! The int32 sums are exact, so they equal the AVX-512 kernels'; the f32 updates (one fused
//! multiply-add per block, one for its minimums) run in their order, so the outputs are their
//! bits.

use std::arch::x86_64::*;

use crate::matmul::int8_matmul::Int8Panel;
use crate::matmul::int8_matmul_avx2::store8;
use crate::matmul::panel_matmul::PANEL;
use crate::matmul::panel_prefetch::NextPanel;
use crate::matmul::quant_weight::QUANT_BLOCK;

/// Rounded activation rows as byte planes, with what every block's sum needs.
pub(crate) struct NibbleRows<'a, const P: usize> {
    pub cols: usize,
    /// `[rows][cols]` per plane.
    pub planes: [&'a [i8]; P],
    /// Each plane's weight in the code: its sums are shifted left by this many bits.
    pub shifts: [i32; P],
    /// `[rows][blocks]`: `sum(q over the block)`; a block's sum starts from `-offset` times it.
    pub code_sums: &'a [i32],
    /// `[rows][blocks]`: the scale `d` of each block.
    pub scales: &'a [f32],
    /// `[rows][blocks]`: `d * sum(q)`, for minimums.
    pub sums: &'a [f32],
}

/// How a pass multiplies 32 code bytes by a plane's 4 bytes broadcast, and reads the sums.
pub(crate) trait NibbleDot {
    /// `acc` plus, per column, the products of its 4 codes and the 4 bytes of `x`.
    ///
    /// # Safety
    /// The CPU has the instructions of the implementation.
    unsafe fn dot(acc: __m256i, w: __m256i, x: __m256i) -> __m256i;

    /// Per column, `acc`'s sum times `2^shift`, in int32 lanes in column order.
    ///
    /// # Safety
    /// As [`NibbleDot::dot`].
    unsafe fn column_sums(acc: __m256i, shift: i32) -> __m256i;
}

/// AVX2: `vpmaddubsw` into 16-bit lanes, `vpmaddwd` once per block.
pub(crate) struct NibbleAvx2;

/// AVX-VNNI: `vpdpbusd` into int32 lanes.
pub(crate) struct NibbleAvxVnni;

impl NibbleDot for NibbleAvx2 {
    #[inline(always)]
    unsafe fn dot(acc: __m256i, w: __m256i, x: __m256i) -> __m256i {
        // SAFETY: the caller's contract (AVX2).
        unsafe { _mm256_add_epi16(acc, _mm256_maddubs_epi16(w, x)) }
    }

    #[inline(always)]
    unsafe fn column_sums(acc: __m256i, shift: i32) -> __m256i {
        // `2^shift` is at most 256: a lane's pair times it stays far inside int32.
        // SAFETY: the caller's contract (AVX2).
        unsafe { _mm256_madd_epi16(acc, _mm256_set1_epi16(1 << shift)) }
    }
}

impl NibbleDot for NibbleAvxVnni {
    #[inline(always)]
    unsafe fn dot(acc: __m256i, w: __m256i, x: __m256i) -> __m256i {
        // SAFETY: the caller's contract (AVX-VNNI).
        unsafe { _mm256_dpbusd_avx_epi32(acc, w, x) }
    }

    #[inline(always)]
    unsafe fn column_sums(acc: __m256i, shift: i32) -> __m256i {
        // SAFETY: the caller's contract (AVX2).
        unsafe { _mm256_sll_epi32(acc, _mm_cvtsi32_si128(shift)) }
    }
}

/// Rows `row0..row0 + out_rows.len()` against a nibble panel with one scale per block, into
/// the first `width` columns: passes of up to `MAX_ROWS` rows (split as evenly as they go)
/// over each 8 columns that `width` reaches.
///
/// # Safety
/// The CPU has AVX2, FMA and what `B` uses; the caller checked that `rows` covers the rows'
/// planes, sums and scales for `panel.blocks` blocks, that `panel` holds nibble codes with one
/// scale per block, `width <= PANEL` and every out row holds `width` values.
#[inline(always)]
pub(crate) unsafe fn nibble_passes<B: NibbleDot, const P: usize, const MAX_ROWS: usize>(
    rows: &NibbleRows<'_, P>,
    row0: usize,
    panel: &Int8Panel<'_>,
    out_rows: &mut [&mut [f32]],
    width: usize,
) {
    let n = out_rows.len();
    let passes = n.div_ceil(MAX_ROWS);
    let vectors = width.div_ceil(8);
    let next = NextPanel::after(panel, vectors * panel.blocks);
    for v in 0..vectors {
        let mut start = 0;
        for p in 0..passes {
            // The rows left, split evenly over this pass and the later ones.
            let take = (n - start).div_ceil(passes - p);
            let outs = &mut out_rows[start..start + take];
            let first = row0 + start;
            // The first pass over each vector prefetches a share of the next panel.
            let next = (p == 0).then_some(&next);
            // SAFETY: the caller's contract; `outs` holds `take <= MAX_ROWS` rows.
            unsafe {
                match take {
                    1 => pass::<B, P, 1>(rows, first, panel, v, outs, width, next),
                    2 => pass::<B, P, 2>(rows, first, panel, v, outs, width, next),
                    3 => pass::<B, P, 3>(rows, first, panel, v, outs, width, next),
                    4 => pass::<B, P, 4>(rows, first, panel, v, outs, width, next),
                    _ => pass::<B, P, 5>(rows, first, panel, v, outs, width, next),
                }
            }
            start += take;
        }
    }
}

/// `R` rows x the 8 columns of vector `v`, prefetching share `v * blocks + b` of `next` at
/// block `b` when given.
#[inline(always)]
unsafe fn pass<B: NibbleDot, const P: usize, const R: usize>(
    rows: &NibbleRows<'_, P>,
    row0: usize,
    panel: &Int8Panel<'_>,
    v: usize,
    out_rows: &mut [&mut [f32]],
    width: usize,
    next: Option<&NextPanel>,
) {
    let blocks = panel.blocks;
    let planes: [[*const i8; P]; R] =
        std::array::from_fn(|i| std::array::from_fn(|p| rows.planes[p][(row0 + i) * rows.cols..].as_ptr()));
    let (codes, scales, mins) = (panel.codes.as_ptr(), panel.scales.as_ptr(), panel.mins.as_ptr());
    let has_mins = !panel.mins.is_empty();
    let col0 = v * 8;
    // SAFETY: the caller's contract bounds every offset: block `b < blocks`, group < 4, rows
    // below `row0 + R`, columns below 32.
    unsafe {
        let mask = _mm256_set1_epi8(0x0F);
        let mut acc = [_mm256_setzero_ps(); R];
        for b in 0..blocks {
            if let Some(next) = next {
                next.fetch(v * blocks + b);
            }
            let mut sums = [[_mm256_setzero_si256(); P]; R];
            for g in 0..4 {
                let w = _mm256_loadu_si256(codes.add((b * 4 + g) * PANEL * 4 + v * 32).cast());
                let low_nibbles = _mm256_and_si256(w, mask);
                let high_nibbles = _mm256_and_si256(_mm256_srli_epi16::<4>(w), mask);
                let at = b * QUANT_BLOCK + g * 4;
                for (row_planes, row_sums) in planes.iter().zip(sums.iter_mut()) {
                    for (plane, sum) in row_planes.iter().zip(row_sums.iter_mut()) {
                        let x0 = _mm256_set1_epi32((plane.add(at) as *const i32).read_unaligned());
                        let x1 = _mm256_set1_epi32((plane.add(at + 16) as *const i32).read_unaligned());
                        *sum = B::dot(B::dot(*sum, low_nibbles, x0), high_nibbles, x1);
                    }
                }
            }
            let sc = _mm256_loadu_ps(scales.add(b * PANEL + col0));
            for (i, (acc_row, row_sums)) in acc.iter_mut().zip(&sums).enumerate() {
                let r = row0 + i;
                let mut sum = _mm256_set1_epi32(-panel.offset * rows.code_sums[r * blocks + b]);
                for (plane_sum, &shift) in row_sums.iter().zip(&rows.shifts) {
                    sum = _mm256_add_epi32(sum, B::column_sums(*plane_sum, shift));
                }
                let d = _mm256_set1_ps(rows.scales[r * blocks + b]);
                *acc_row = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(sc, d), *acc_row);
            }
            if has_mins {
                let m = _mm256_loadu_ps(mins.add(b * PANEL + col0));
                for (i, acc_row) in acc.iter_mut().enumerate() {
                    let row_sum = _mm256_set1_ps(rows.sums[(row0 + i) * blocks + b]);
                    *acc_row = _mm256_fmadd_ps(m, row_sum, *acc_row);
                }
            }
        }
        for (out, acc_row) in out_rows.iter_mut().zip(&acc) {
            store8(*acc_row, out, col0, width);
        }
    }
}

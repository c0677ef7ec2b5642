//! The 256-bit kernels of [`crate::matmul::int16_matmul`], for CPUs without AVX512-VNNI: AVX2,
//! and AVX-VNNI where the CPU has it.
//!
//! Nibble codes (Q4_0, Q4_1, Q4_K: most of a 4-bit model) run [`crate::matmul::nibble_avx2`]'s
//! pass on the activations' two byte planes (`q = 256 * high + low`), as the AVX-512 kernel's
//! two byte passes do, up to [`NIBBLE_PASS_ROWS`] rows at a time.
//!
//! Byte codes (up to 255: Q8_0, Q5, Q6_K) would saturate `vpmaddubsw`'s pairs, so they are
//! widened to 16 bits and multiplied with the whole 16-bit activations (`q`, kept beside their
//! byte split): per quad, 4 columns' codes (16 values) meet the row's 4 values of `q`
//! broadcast, `vpmaddwd` (or AVX-VNNI's `vpdpwssd`, which also adds) sums pairs of products
//! into int32 lanes, two per column, which are added once per sub-block. No lane overflows:
//! `|sum| <= 32 * 255 * 32639 < 2^28`. A pass covers 16 columns for up to [`PASS_ROWS`] rows.
//!
//! The int32 sums are exact, so they equal the AVX-512 kernel's; the f32 updates run in its
//! order, so the outputs are its bits.

use std::arch::x86_64::*;

use crate::matmul::int16_matmul::{
    Int16Activations, Int16TileKernel, QuantizeBlock16, INT16_MAX_CODE, INT16_TILE_ROWS,
};
use crate::matmul::int8_matmul::Int8Panel;
use crate::matmul::int8_matmul_avx2::{
    block_amax, check_tile_bounds, quad_codes8, store8, sum_lanes, ActivationShape,
};
use crate::matmul::nibble_avx2::{nibble_passes, NibbleAvx2, NibbleAvxVnni, NibbleDot, NibbleRows};
use crate::matmul::panel_matmul::PANEL;
use crate::matmul::panel_prefetch::NextPanel;
use crate::matmul::quant_weight::QUANT_BLOCK;
use crate::simd::{avx_vnni, level, Level};

/// Rows per pass: two rows' partial sums (8 vectors) and accumulators (4) leave room for the
/// widened codes and the broadcasts.
const PASS_ROWS: usize = 2;

/// Rows per nibble pass: per row two plane sums and an accumulator of 8 columns.
const NIBBLE_PASS_ROWS: usize = 3;

/// Columns per pass: two vectors of 8.
const HALF: usize = PANEL / 2;

/// The AVX2 kernel, if this CPU has AVX2 and FMA.
pub(crate) fn avx2_kernel() -> Option<Int16TileKernel> {
    (level() != Level::None).then_some(tile_avx2 as Int16TileKernel)
}

/// The AVX-VNNI kernel, if this CPU has AVX-VNNI (and AVX2).
pub(crate) fn avx_vnni_kernel() -> Option<Int16TileKernel> {
    avx_vnni().then_some(tile_avx_vnni as Int16TileKernel)
}

/// The AVX2 activation rounding, if this CPU has AVX2.
pub(crate) fn quantize_block() -> Option<QuantizeBlock16> {
    (level() != Level::None).then_some(quantize_block_checked as QuantizeBlock16)
}

fn quantize_block_checked(x: &[f32], high: &mut [i8], low: &mut [i8]) -> (f32, [i32; 2]) {
    assert!(x.len() == QUANT_BLOCK && high.len() == QUANT_BLOCK && low.len() == QUANT_BLOCK);
    assert!(level() != Level::None);
    // SAFETY: the CPU has AVX2 (checked) and every slice holds 32 elements.
    unsafe { quantize_block_avx2(x, high, low) }
}

/// As `quantize_block16_portable`: `d = max|x| / 32639`, `q = x * (1 / d)` rounded to nearest
/// even, clamped, split into `high` and `low` bytes.
#[target_feature(enable = "avx2")]
unsafe fn quantize_block_avx2(x: &[f32], high: &mut [i8], low: &mut [i8]) -> (f32, [i32; 2]) {
    // SAFETY: the caller checked the lengths.
    unsafe {
        let (amax, v) = block_amax(x.as_ptr());
        let d = amax / INT16_MAX_CODE as f32;
        let inv = _mm256_set1_ps(if d > 0.0 { 1.0 / d } else { 0.0 });
        let (top, bottom) = (_mm256_set1_epi32(INT16_MAX_CODE), _mm256_set1_epi32(-INT16_MAX_CODE));
        let (offset, byte) = (_mm256_set1_epi32(128), _mm256_set1_epi32(255));
        let mut h = [_mm256_setzero_si256(); 4];
        let mut l = [_mm256_setzero_si256(); 4];
        let mut q = [_mm256_setzero_si256(); 4];
        for i in 0..4 {
            let rounded = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inv));
            q[i] = _mm256_max_epi32(_mm256_min_epi32(rounded, top), bottom);
            l[i] = _mm256_sub_epi32(_mm256_and_si256(_mm256_add_epi32(q[i], offset), byte), offset);
            h[i] = _mm256_srai_epi32::<8>(_mm256_sub_epi32(q[i], l[i]));
        }
        let sums = [sum_lanes(_mm256_add_epi32(q[0], q[1])), sum_lanes(_mm256_add_epi32(q[2], q[3]))];
        // Narrowing interleaves 128-bit lanes; the permute puts the 32 bytes back in order.
        let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        let hb = _mm256_packs_epi16(_mm256_packs_epi32(h[0], h[1]), _mm256_packs_epi32(h[2], h[3]));
        let lb = _mm256_packs_epi16(_mm256_packs_epi32(l[0], l[1]), _mm256_packs_epi32(l[2], l[3]));
        _mm256_storeu_si256(high.as_mut_ptr().cast(), _mm256_permutevar8x32_epi32(hb, order));
        _mm256_storeu_si256(low.as_mut_ptr().cast(), _mm256_permutevar8x32_epi32(lb, order));
        (d, sums)
    }
}

/// How a pass multiplies 16 widened codes by a row's 4 values of `q` (broadcast twice).
trait WordDot {
    /// The nibble pass's multiply on the same instructions.
    type Nibble: NibbleDot;

    /// `acc` plus, per pair of adjacent 16-bit lanes, the sum of their two products.
    ///
    /// # Safety
    /// The CPU has the instructions of the implementation.
    unsafe fn dot(acc: __m256i, w: __m256i, x: __m256i) -> __m256i;
}

struct Avx2;
struct AvxVnni;

impl WordDot for Avx2 {
    type Nibble = NibbleAvx2;

    #[inline(always)]
    unsafe fn dot(acc: __m256i, w: __m256i, x: __m256i) -> __m256i {
        // SAFETY: the caller's contract (AVX2).
        unsafe { _mm256_add_epi32(acc, _mm256_madd_epi16(w, x)) }
    }
}

impl WordDot for AvxVnni {
    type Nibble = NibbleAvxVnni;

    #[inline(always)]
    unsafe fn dot(acc: __m256i, w: __m256i, x: __m256i) -> __m256i {
        // SAFETY: the caller's contract (AVX-VNNI).
        unsafe { _mm256_dpwssd_avx_epi32(acc, w, x) }
    }
}

fn tile_avx2(
    acts: &Int16Activations,
    rows: std::ops::Range<usize>,
    panel: &Int8Panel<'_>,
    out_rows: &mut [&mut [f32]],
    width: usize,
) {
    assert!(level() != Level::None);
    check_bounds(acts, &rows, panel, out_rows, width);
    // SAFETY: the CPU has AVX2 and FMA (asserted) and the bounds hold (checked).
    unsafe { tile_features_avx2(acts, rows, panel, out_rows, width) }
}

fn tile_avx_vnni(
    acts: &Int16Activations,
    rows: std::ops::Range<usize>,
    panel: &Int8Panel<'_>,
    out_rows: &mut [&mut [f32]],
    width: usize,
) {
    assert!(avx_vnni());
    check_bounds(acts, &rows, panel, out_rows, width);
    // SAFETY: the CPU has AVX2, FMA and AVX-VNNI (asserted) and the bounds hold (checked).
    unsafe { tile_features_avx_vnni(acts, rows, panel, out_rows, width) }
}

/// The bounds the unchecked loads and stores rely on.
fn check_bounds(
    acts: &Int16Activations,
    rows: &std::ops::Range<usize>,
    panel: &Int8Panel<'_>,
    out_rows: &[&mut [f32]],
    width: usize,
) {
    let shape = ActivationShape {
        cols: acts.cols,
        subs: acts.subs,
        codes: acts.codes.len(),
        code_sums: acts.code_sums.len(),
        scales: acts.scales.len(),
        sums: acts.sums.len(),
    };
    check_tile_bounds(&shape, rows, INT16_TILE_ROWS, panel, out_rows, width);
}

#[target_feature(enable = "avx2,fma")]
unsafe fn tile_features_avx2(
    acts: &Int16Activations,
    rows: std::ops::Range<usize>,
    panel: &Int8Panel<'_>,
    out_rows: &mut [&mut [f32]],
    width: usize,
) {
    // SAFETY: the caller's contract.
    unsafe { tile_passes::<Avx2>(acts, rows, panel, out_rows, width) }
}

#[target_feature(enable = "avx2,fma,avxvnni")]
unsafe fn tile_features_avx_vnni(
    acts: &Int16Activations,
    rows: std::ops::Range<usize>,
    panel: &Int8Panel<'_>,
    out_rows: &mut [&mut [f32]],
    width: usize,
) {
    // SAFETY: the caller's contract.
    unsafe { tile_passes::<AvxVnni>(acts, rows, panel, out_rows, width) }
}

/// Nibble codes: passes of up to [`NIBBLE_PASS_ROWS`] rows (as even as they split) over each
/// 8 columns that `width` reaches. Byte codes: passes of up to [`PASS_ROWS`] rows over each
/// 16-column half.
#[inline(always)]
unsafe fn tile_passes<D: WordDot>(
    acts: &Int16Activations,
    rows: std::ops::Range<usize>,
    panel: &Int8Panel<'_>,
    out_rows: &mut [&mut [f32]],
    width: usize,
) {
    if panel.nibbles {
        let nibble_rows = NibbleRows {
            cols: acts.cols,
            planes: [&acts.high, &acts.low],
            shifts: [8, 0],
            code_sums: &acts.code_sums,
            scales: &acts.scales,
            sums: &acts.sums,
        };
        // SAFETY: the caller's contract; nibble panels have one scale per block (checked).
        return unsafe {
            nibble_passes::<D::Nibble, 2, NIBBLE_PASS_ROWS>(&nibble_rows, rows.start, panel, out_rows, width)
        };
    }
    let halves = width.div_ceil(HALF);
    let next = NextPanel::after(panel, halves * panel.blocks);
    for half in 0..halves {
        for (g, outs) in out_rows.chunks_mut(PASS_ROWS).enumerate() {
            let row0 = rows.start + g * PASS_ROWS;
            // The first pass over each half prefetches a share of the next panel.
            let next = (g == 0).then_some(&next);
            macro_rules! pass {
                ($r:literal) => {
                    // SAFETY: the caller's contract; `outs` holds `$r` rows.
                    unsafe {
                        match panel.subs {
                            1 => pass::<D, $r, 1>(acts, row0, panel, half, outs, width, next),
                            _ => pass::<D, $r, 2>(acts, row0, panel, half, outs, width, next),
                        }
                    }
                };
            }
            if outs.len() == 2 {
                pass!(2)
            } else {
                pass!(1)
            }
        }
    }
}

/// Adds the two lanes of each column: `lo` holds columns 0..4 and `hi` columns 4..8 of a
/// vector, two lanes per column in order.
#[inline(always)]
unsafe fn column_sums(lo: __m256i, hi: __m256i) -> __m256i {
    // SAFETY: the caller has AVX2.
    unsafe {
        // [c0 c1 c4 c5 | c2 c3 c6 c7], then the 64-bit pairs in order.
        let pairs = _mm256_hadd_epi32(lo, hi);
        _mm256_permute4x64_epi64::<0b11_01_10_00>(pairs)
    }
}

/// `R` rows x the 16 columns of `half`, byte codes, `SUBS` scales per block, prefetching share
/// `half * blocks + b` of `next` at block `b` when given.
#[inline(always)]
unsafe fn pass<D: WordDot, const R: usize, const SUBS: usize>(
    acts: &Int16Activations,
    row0: usize,
    panel: &Int8Panel<'_>,
    half: usize,
    out_rows: &mut [&mut [f32]],
    width: usize,
    next: Option<&NextPanel>,
) {
    let blocks = panel.blocks;
    let quads_per_sub = QUANT_BLOCK / 4 / SUBS;
    let q: [*const i16; R] = std::array::from_fn(|i| acts.codes[(row0 + i) * acts.cols..].as_ptr());
    let (codes, scales, mins) = (panel.codes.as_ptr(), panel.scales.as_ptr(), panel.mins.as_ptr());
    let has_mins = !panel.mins.is_empty();
    let col0 = half * HALF;
    // SAFETY: the caller's contract bounds every offset: block `b < blocks`, quad < 8,
    // sub < SUBS, rows below `row0 + R`, columns below 32.
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); 2]; R];
        for b in 0..blocks {
            if let Some(next) = next {
                next.fetch(half * blocks + b);
            }
            for s in 0..SUBS {
                // Per row: vector 0's columns 0..4 and 4..8, then vector 1's.
                let mut part = [[_mm256_setzero_si256(); 4]; R];
                for quad in s * quads_per_sub..(s + 1) * quads_per_sub {
                    for v in 0..2 {
                        let w = quad_codes8(codes, b, quad, 2 * half + v);
                        let w_lo = _mm256_cvtepu8_epi16(_mm256_castsi256_si128(w));
                        let w_hi = _mm256_cvtepu8_epi16(_mm256_extracti128_si256::<1>(w));
                        for (i, row_part) in part.iter_mut().enumerate() {
                            let four = (q[i].add(b * QUANT_BLOCK + quad * 4) as *const i64).read_unaligned();
                            let x = _mm256_set1_epi64x(four);
                            row_part[2 * v] = D::dot(row_part[2 * v], w_lo, x);
                            row_part[2 * v + 1] = D::dot(row_part[2 * v + 1], w_hi, x);
                        }
                    }
                }
                let at = scales.add((b * SUBS + s) * PANEL + col0);
                let sc = [_mm256_loadu_ps(at), _mm256_loadu_ps(at.add(8))];
                for (i, (acc_row, row_part)) in acc.iter_mut().zip(&part).enumerate() {
                    let r = row0 + i;
                    let c = _mm256_set1_epi32(-panel.offset * acts.code_sums[(r * blocks + b) * SUBS + s]);
                    let d = _mm256_set1_ps(acts.scales[r * blocks + b]);
                    for v in 0..2 {
                        let sum = _mm256_add_epi32(column_sums(row_part[2 * v], row_part[2 * v + 1]), c);
                        acc_row[v] =
                            _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(sc[v], d), acc_row[v]);
                    }
                }
            }
            if has_mins {
                let at = mins.add(b * PANEL + col0);
                let m = [_mm256_loadu_ps(at), _mm256_loadu_ps(at.add(8))];
                for (i, acc_row) in acc.iter_mut().enumerate() {
                    let row_sum = _mm256_set1_ps(acts.sums[(row0 + i) * blocks + b]);
                    for v in 0..2 {
                        acc_row[v] = _mm256_fmadd_ps(m[v], row_sum, acc_row[v]);
                    }
                }
            }
        }
        for (out, acc_row) in out_rows.iter_mut().zip(&acc) {
            store8(acc_row[0], out, col0, width);
            store8(acc_row[1], out, col0 + 8, width);
        }
    }
}

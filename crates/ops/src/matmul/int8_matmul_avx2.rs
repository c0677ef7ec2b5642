//! The 256-bit kernels of [`crate::matmul::int8_matmul`], for CPUs without AVX512-VNNI (AMD Zen
//! 2/3, Intel client parts, most cloud VMs): AVX2, and AVX-VNNI where the CPU has it.
//!
//! Nibble codes (at most 15) run [`crate::matmul::nibble_avx2`]'s pass, up to
//! [`NIBBLE_PASS_ROWS`] rows of 8 columns at a time.
//!
//! Byte codes: each pass covers 16 of a panel's 32 columns (two vectors of 8) for up to
//! [`PASS_ROWS`] rows, so the sums, the f32 accumulators and a quad's codes fit AVX2's 16
//! registers. Per quad (4 inputs) and 8 columns, 32 bytes of codes meet 4 activation bytes
//! broadcast:
//! - AVX-VNNI: `vpdpbusd` on the stored (offset, unsigned) codes, from the row's correction, as
//!   the AVX-512 kernel does;
//! - AVX2: the codes turned signed (`c = stored - 128`, whose correction is then zero) and
//!   `vpmaddubsw` on `|c|` times the activations carrying `c`'s sign (at most 128 * 127 * 2, no
//!   saturation, since activations stay within -127..=127), `vpmaddwd` with ones adding the
//!   pairs into each column's int32 sum.
//!
//! Every int32 sum is exact, so it equals the AVX-512 kernel's; the f32 updates (one fused
//! multiply-add per sub-block, one per block's minimums) run in the same order, so the outputs
//! are the AVX-512 kernel's bits.

use std::arch::x86_64::*;

use crate::matmul::int8_matmul::{
    block_code_bytes, Int8Activations, Int8Panel, Int8TileKernel, QuantizeBlock, INT8_TILE_ROWS,
};
use crate::matmul::nibble_avx2::{nibble_passes, NibbleAvx2, NibbleAvxVnni, NibbleDot, NibbleRows};
use crate::matmul::panel_matmul::PANEL;
use crate::matmul::panel_prefetch::NextPanel;
use crate::matmul::quant_weight::QUANT_BLOCK;
use crate::simd::{avx_vnni, level, Level};

/// Rows per pass: two rows' sums and accumulators (8 vectors) plus a quad's codes in both forms
/// and the broadcasts stay within 16 registers.
pub(crate) const PASS_ROWS: usize = 2;

/// Rows per nibble pass: per row one sum and an accumulator of 8 columns.
const NIBBLE_PASS_ROWS: usize = 5;

/// Columns per pass: two vectors of 8.
const HALF: usize = PANEL / 2;

/// The AVX2 kernel, if this CPU has AVX2 and FMA.
pub(crate) fn avx2_kernel() -> Option<Int8TileKernel> {
    (level() != Level::None).then_some(tile_avx2 as Int8TileKernel)
}

/// The AVX-VNNI kernel, if this CPU has AVX-VNNI (and AVX2).
pub(crate) fn avx_vnni_kernel() -> Option<Int8TileKernel> {
    avx_vnni().then_some(tile_avx_vnni as Int8TileKernel)
}

/// The AVX2 activation rounding, if this CPU has AVX2.
pub(crate) fn quantize_block() -> Option<QuantizeBlock> {
    (level() != Level::None).then_some(quantize_block_checked as QuantizeBlock)
}

fn quantize_block_checked(x: &[f32], codes: &mut [i8]) -> (f32, [i32; 2]) {
    assert!(x.len() == QUANT_BLOCK && codes.len() == QUANT_BLOCK && level() != Level::None);
    // SAFETY: the CPU has AVX2 (checked) and both slices hold 32 elements.
    unsafe { quantize_block_avx2(x, codes) }
}

/// The largest `|x|` of 32 values, in lanes (every lane holds it).
///
/// # Safety
/// The CPU has AVX2; `x` holds 32 values.
#[target_feature(enable = "avx2")]
#[inline]
pub(crate) unsafe fn block_amax(x: *const f32) -> (f32, [__m256; 4]) {
    // SAFETY: the caller's contract.
    unsafe {
        let v = [
            _mm256_loadu_ps(x),
            _mm256_loadu_ps(x.add(8)),
            _mm256_loadu_ps(x.add(16)),
            _mm256_loadu_ps(x.add(24)),
        ];
        // Written out, not as a closure: a closure would not inherit this function's features.
        let sign = _mm256_set1_ps(-0.0);
        let m01 = _mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1]));
        let m23 = _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3]));
        let m = _mm256_max_ps(m01, m23);
        let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        let m = _mm_max_ss(m, _mm_shuffle_ps::<1>(m, m));
        (_mm_cvtss_f32(m), v)
    }
}

/// The sum of 8 int32 lanes.
#[target_feature(enable = "avx2")]
#[inline]
pub(crate) fn sum_lanes(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
    _mm_cvtsi128_si32(s)
}

/// As `quantize_block_portable`: `d = max|x| / 127`, `q = x * (1 / d)` rounded to nearest even
/// (`vcvtps2dq` under the default rounding mode), clamped to -127..=127.
#[target_feature(enable = "avx2")]
unsafe fn quantize_block_avx2(x: &[f32], codes: &mut [i8]) -> (f32, [i32; 2]) {
    // SAFETY: the caller checked the lengths.
    unsafe {
        let (amax, v) = block_amax(x.as_ptr());
        let d = amax / 127.0;
        let inv = _mm256_set1_ps(if d > 0.0 { 1.0 / d } else { 0.0 });
        let (top, bottom) = (_mm256_set1_epi32(127), _mm256_set1_epi32(-127));
        let mut q = [_mm256_setzero_si256(); 4];
        for (q, v) in q.iter_mut().zip(v) {
            let rounded = _mm256_cvtps_epi32(_mm256_mul_ps(v, inv));
            *q = _mm256_max_epi32(_mm256_min_epi32(rounded, top), bottom);
        }
        let sums = [sum_lanes(_mm256_add_epi32(q[0], q[1])), sum_lanes(_mm256_add_epi32(q[2], q[3]))];
        // Narrowing interleaves 128-bit lanes; the permute puts the 32 bytes back in order.
        let words = [_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3])];
        let bytes = _mm256_packs_epi16(words[0], words[1]);
        let bytes = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256(codes.as_mut_ptr().cast(), bytes);
        (d, sums)
    }
}

/// How a pass multiplies a quad's codes by a row's 4 activation bytes.
trait ByteDot {
    /// The nibble pass's multiply on the same instructions.
    type Nibble: NibbleDot;

    /// Whether byte codes are used signed (their correction is then zero).
    const SIGNED_BYTES: bool;

    /// `acc` plus, per column (int32 lane), the sum of its 4 codes times the 4 bytes of `x`.
    /// `w` is the unsigned codes, or `|c|` for signed byte codes; `signs` is `c` then (else
    /// unused).
    ///
    /// # Safety
    /// The CPU has the instructions of the implementation.
    unsafe fn dot(acc: __m256i, w: __m256i, signs: __m256i, x: __m256i) -> __m256i;
}

struct Avx2;
struct AvxVnni;

impl ByteDot for Avx2 {
    type Nibble = NibbleAvx2;
    const SIGNED_BYTES: bool = true;

    #[inline(always)]
    unsafe fn dot(acc: __m256i, w: __m256i, signs: __m256i, x: __m256i) -> __m256i {
        // SAFETY: the caller's contract (AVX2).
        unsafe {
            let pairs = _mm256_maddubs_epi16(w, _mm256_sign_epi8(x, signs));
            _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
        }
    }
}

impl ByteDot for AvxVnni {
    type Nibble = NibbleAvxVnni;
    const SIGNED_BYTES: bool = false;

    #[inline(always)]
    unsafe fn dot(acc: __m256i, w: __m256i, _signs: __m256i, x: __m256i) -> __m256i {
        // SAFETY: the caller's contract (AVX-VNNI).
        unsafe { _mm256_dpbusd_avx_epi32(acc, w, x) }
    }
}

/// The byte codes of quad `quad` of block `b` for 8-column vector `v` (0..4) of the panel.
///
/// # Safety
/// The CPU has AVX2; block `b` lies inside `codes`.
#[inline(always)]
pub(crate) unsafe fn quad_codes8(codes: *const u8, b: usize, quad: usize, v: usize) -> __m256i {
    // SAFETY: the caller's contract.
    unsafe { _mm256_loadu_si256(codes.add((b * (QUANT_BLOCK / 4) + quad) * PANEL * 4 + v * 32).cast()) }
}

/// Stores `acc` (8 columns starting at `col`) into the first `width` columns of `out`.
#[inline(always)]
pub(crate) unsafe fn store8(acc: __m256, out: &mut [f32], col: usize, width: usize) {
    if col >= width {
        return;
    }
    let n = (width - col).min(8);
    let mut tmp = [0f32; 8];
    // SAFETY: `tmp` holds 8 values; the caller has AVX.
    unsafe { _mm256_storeu_ps(tmp.as_mut_ptr(), acc) };
    out[col..col + n].copy_from_slice(&tmp[..n]);
}

fn tile_avx2(
    acts: &Int8Activations,
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
    acts: &Int8Activations,
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
    acts: &Int8Activations,
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
    check_tile_bounds(&shape, rows, INT8_TILE_ROWS, panel, out_rows, width);
}

/// The lengths of a tile kernel's rounded activations (8- or 16-bit).
pub(crate) struct ActivationShape {
    pub cols: usize,
    pub subs: usize,
    /// Codes, one per activation.
    pub codes: usize,
    pub code_sums: usize,
    pub scales: usize,
    pub sums: usize,
}

/// The bounds a 256-bit tile kernel's unchecked loads and stores rely on: `rows` of activations
/// of `shape` (at most `tile_rows`) against `panel`, into `width` columns of `out_rows`.
pub(crate) fn check_tile_bounds(
    shape: &ActivationShape,
    rows: &std::ops::Range<usize>,
    tile_rows: usize,
    panel: &Int8Panel<'_>,
    out_rows: &[&mut [f32]],
    width: usize,
) {
    let (blocks, subs) = (panel.blocks, panel.subs);
    assert!((1..=tile_rows).contains(&rows.len()) && out_rows.len() == rows.len());
    assert!((1..=PANEL).contains(&width) && out_rows.iter().all(|r| r.len() >= width));
    assert!(subs == 1 || subs == 2);
    assert!(shape.cols == blocks * QUANT_BLOCK && shape.codes >= rows.end * shape.cols);
    assert!(shape.subs == subs && shape.code_sums >= rows.end * blocks * subs);
    assert!(shape.scales >= rows.end * blocks && shape.sums >= rows.end * blocks);
    assert!(panel.codes.len() == blocks * block_code_bytes(panel.nibbles) && (subs == 1 || !panel.nibbles));
    assert!(panel.scales.len() == blocks * subs * PANEL);
    assert!(panel.mins.is_empty() || panel.mins.len() == blocks * PANEL);
}

#[target_feature(enable = "avx2,fma")]
unsafe fn tile_features_avx2(
    acts: &Int8Activations,
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
    acts: &Int8Activations,
    rows: std::ops::Range<usize>,
    panel: &Int8Panel<'_>,
    out_rows: &mut [&mut [f32]],
    width: usize,
) {
    // SAFETY: the caller's contract.
    unsafe { tile_passes::<AvxVnni>(acts, rows, panel, out_rows, width) }
}

/// Nibble codes: [`crate::matmul::nibble_avx2`]'s passes of up to [`NIBBLE_PASS_ROWS`] rows.
/// Byte codes: passes of up to [`PASS_ROWS`] rows over each 16-column half that `width`
/// reaches.
#[inline(always)]
unsafe fn tile_passes<D: ByteDot>(
    acts: &Int8Activations,
    rows: std::ops::Range<usize>,
    panel: &Int8Panel<'_>,
    out_rows: &mut [&mut [f32]],
    width: usize,
) {
    if panel.nibbles {
        let nibble_rows = NibbleRows {
            cols: acts.cols,
            planes: [&acts.codes],
            shifts: [0],
            code_sums: &acts.code_sums,
            scales: &acts.scales,
            sums: &acts.sums,
        };
        // SAFETY: the caller's contract; nibble panels have one scale per block (checked).
        return unsafe {
            nibble_passes::<D::Nibble, 1, NIBBLE_PASS_ROWS>(&nibble_rows, rows.start, panel, out_rows, width)
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

/// `R` rows x the 16 columns of `half`, byte codes, `SUBS` scales per block, prefetching share
/// `half * blocks + b` of `next` at block `b` when given.
#[inline(always)]
unsafe fn pass<D: ByteDot, const R: usize, const SUBS: usize>(
    acts: &Int8Activations,
    row0: usize,
    panel: &Int8Panel<'_>,
    half: usize,
    out_rows: &mut [&mut [f32]],
    width: usize,
    next: Option<&NextPanel>,
) {
    let blocks = panel.blocks;
    let quads_per_sub = QUANT_BLOCK / 4 / SUBS;
    let signed = D::SIGNED_BYTES;
    // Signed byte codes need no correction; the others start from `-offset * sum(q)`.
    let offset = if signed { 0 } else { panel.offset };
    let a: [*const i8; R] = std::array::from_fn(|i| acts.codes[(row0 + i) * acts.cols..].as_ptr());
    let (codes, scales, mins) = (panel.codes.as_ptr(), panel.scales.as_ptr(), panel.mins.as_ptr());
    let has_mins = !panel.mins.is_empty();
    let (v0, v1) = (2 * half, 2 * half + 1);
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
                let mut sum = [[_mm256_setzero_si256(); 2]; R];
                for (i, row) in sum.iter_mut().enumerate() {
                    let c = _mm256_set1_epi32(-offset * acts.code_sums[((row0 + i) * blocks + b) * SUBS + s]);
                    *row = [c, c];
                }
                for quad in s * quads_per_sub..(s + 1) * quads_per_sub {
                    let mut w = [quad_codes8(codes, b, quad, v0), quad_codes8(codes, b, quad, v1)];
                    let mut signs = w;
                    if signed {
                        let flip = _mm256_set1_epi8(-128);
                        for (w, sign) in w.iter_mut().zip(signs.iter_mut()) {
                            *sign = _mm256_xor_si256(*w, flip);
                            *w = _mm256_abs_epi8(*sign);
                        }
                    }
                    for (i, row_sum) in sum.iter_mut().enumerate() {
                        let four = (a[i].add(b * QUANT_BLOCK + quad * 4) as *const i32).read_unaligned();
                        let x = _mm256_set1_epi32(four);
                        row_sum[0] = D::dot(row_sum[0], w[0], signs[0], x);
                        row_sum[1] = D::dot(row_sum[1], w[1], signs[1], x);
                    }
                }
                let at = scales.add((b * SUBS + s) * PANEL + col0);
                let sc = [_mm256_loadu_ps(at), _mm256_loadu_ps(at.add(8))];
                for (i, (acc_row, row_sum)) in acc.iter_mut().zip(&sum).enumerate() {
                    let d = _mm256_set1_ps(acts.scales[(row0 + i) * blocks + b]);
                    for v in 0..2 {
                        acc_row[v] = _mm256_fmadd_ps(
                            _mm256_cvtepi32_ps(row_sum[v]),
                            _mm256_mul_ps(sc[v], d),
                            acc_row[v],
                        );
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

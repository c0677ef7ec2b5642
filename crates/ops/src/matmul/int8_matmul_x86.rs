//! The AVX512-VNNI kernel of [`crate::matmul::int8_matmul`]: per block and tile row, `vpdpbusd` sums
//! the unsigned (offset) codes of 16 columns times 32 signed activation bytes into int32 lanes
//! (starting from the row's correction), then one convert and one fused multiply-add scale the
//! block into the row's f32 accumulators. [`quad_codes`] loads a quad's codes from either
//! panel layout (bytes, or nibbles masked or shifted out), for this kernel and the int16 one.

use std::arch::x86_64::*;

use crate::matmul::int8_matmul::{
    block_code_bytes, Int8Activations, Int8Panel, Int8TileKernel, QuantizeBlock, INT8_TILE_ROWS,
};
use crate::matmul::panel_matmul::PANEL;
use crate::matmul::quant_weight::QUANT_BLOCK;
use crate::simd::{level, Level};

fn has_vnni() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| {
        level() == Level::Avx512
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vnni")
    })
}

/// The VNNI kernel, if this CPU has AVX-512F, AVX-512BW and AVX512-VNNI.
pub(crate) fn kernel() -> Option<Int8TileKernel> {
    has_vnni().then_some(tile_vnni as Int8TileKernel)
}

/// The AVX-512 activation rounding (libm's `rintf` per element took a seventh of a step), on
/// the CPUs that run the VNNI kernel.
pub(crate) fn quantize_block() -> Option<QuantizeBlock> {
    has_vnni().then_some(quantize_block_checked as QuantizeBlock)
}

fn quantize_block_checked(x: &[f32], codes: &mut [i8]) -> (f32, [i32; 2]) {
    assert!(x.len() == QUANT_BLOCK && codes.len() == QUANT_BLOCK && has_vnni());
    // SAFETY: the CPU has AVX-512F (checked) and both slices hold 32 elements.
    unsafe { quantize_block_avx512(x, codes) }
}

/// As `quantize_block_portable`: `d = max|x| / 127`, `q = x * (1 / d)` rounded to nearest even
/// (`vcvtps2dq` under the default rounding mode), clamped to -127..=127.
#[target_feature(enable = "avx512f")]
unsafe fn quantize_block_avx512(x: &[f32], codes: &mut [i8]) -> (f32, [i32; 2]) {
    // SAFETY: the caller checked the lengths.
    unsafe {
        let lo = _mm512_loadu_ps(x.as_ptr());
        let hi = _mm512_loadu_ps(x.as_ptr().add(16));
        let amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(lo), _mm512_abs_ps(hi)));
        let d = amax / 127.0;
        let inv = _mm512_set1_ps(if d > 0.0 { 1.0 / d } else { 0.0 });
        let (top, bottom) = (_mm512_set1_epi32(127), _mm512_set1_epi32(-127));
        // Written out for both halves: a closure would not inherit this function's features.
        let q_lo = _mm512_cvtps_epi32(_mm512_mul_ps(lo, inv));
        let q_hi = _mm512_cvtps_epi32(_mm512_mul_ps(hi, inv));
        let q_lo = _mm512_max_epi32(_mm512_min_epi32(q_lo, top), bottom);
        let q_hi = _mm512_max_epi32(_mm512_min_epi32(q_hi, top), bottom);
        let sums = [_mm512_reduce_add_epi32(q_lo), _mm512_reduce_add_epi32(q_hi)];
        _mm_storeu_si128(codes.as_mut_ptr().cast(), _mm512_cvtepi32_epi8(q_lo));
        _mm_storeu_si128(codes.as_mut_ptr().add(16).cast(), _mm512_cvtepi32_epi8(q_hi));
        (d, sums)
    }
}

fn tile_vnni(
    acts: &Int8Activations,
    rows: std::ops::Range<usize>,
    panel: &Int8Panel<'_>,
    out_rows: &mut [&mut [f32]],
    width: usize,
) {
    // The bounds the unchecked loads and stores rely on.
    let (blocks, subs) = (panel.blocks, panel.subs);
    assert!((1..=INT8_TILE_ROWS).contains(&rows.len()) && out_rows.len() == rows.len());
    assert!((1..=PANEL).contains(&width) && out_rows.iter().all(|r| r.len() >= width));
    assert!(subs == 1 || subs == 2);
    assert!(acts.cols == blocks * QUANT_BLOCK && acts.codes.len() >= rows.end * acts.cols);
    assert!(acts.subs == subs && acts.code_sums.len() >= rows.end * blocks * subs);
    assert!(acts.scales.len() >= rows.end * blocks && acts.sums.len() >= rows.end * blocks);
    assert!(panel.codes.len() == blocks * block_code_bytes(panel.nibbles) && (subs == 1 || !panel.nibbles));
    assert!(panel.scales.len() == blocks * subs * PANEL);
    assert!(panel.mins.is_empty() || panel.mins.len() == blocks * PANEL);
    assert!(kernel().is_some());
    macro_rules! run {
        ($subs:literal, $nib:literal) => {
            // SAFETY: the CPU has the features (checked above) and the asserts bound every access.
            unsafe {
                match rows.len() {
                    1 => tile::<1, $subs, $nib>(acts, rows.start, panel, out_rows, width),
                    2 => tile::<2, $subs, $nib>(acts, rows.start, panel, out_rows, width),
                    3 => tile::<3, $subs, $nib>(acts, rows.start, panel, out_rows, width),
                    4 => tile::<4, $subs, $nib>(acts, rows.start, panel, out_rows, width),
                    5 => tile::<5, $subs, $nib>(acts, rows.start, panel, out_rows, width),
                    _ => tile::<6, $subs, $nib>(acts, rows.start, panel, out_rows, width),
                }
            }
        };
    }
    match (subs, panel.nibbles) {
        (1, true) => run!(1, true),
        (1, false) => run!(1, false),
        _ => run!(2, false),
    }
}

/// Blocks ahead of the current one that a tile prefetches.
const PREFETCH_BLOCKS: usize = 2;

/// Prefetches the codes of quad `quad` of the block `PREFETCH_BLOCKS` ahead of `b` (nibble
/// panels: both cache lines of a quad pair, once per pair).
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) unsafe fn prefetch_codes<const NIB: bool>(codes: *const u8, b: usize, quad: usize) {
    if NIB && quad >= 4 {
        return;
    }
    let quads_per_block = if NIB { 4 } else { QUANT_BLOCK / 4 };
    let at = codes.wrapping_add(((b + PREFETCH_BLOCKS) * quads_per_block + quad) * PANEL * 4);
    _mm_prefetch::<_MM_HINT_T0>(at.cast());
    _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(64).cast());
}

/// The stored codes of quad `quad` of block `b`, for columns 0..16 and 16..32 (64 bytes each,
/// 4 per column).
///
/// # Safety
/// The CPU has AVX-512F and AVX-512BW, and block `b` lies inside `codes`.
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
pub(crate) unsafe fn quad_codes<const NIB: bool>(
    codes: *const u8,
    b: usize,
    quad: usize,
) -> (__m512i, __m512i) {
    // SAFETY: the caller's contract.
    unsafe {
        if NIB {
            let w = codes.add((b * 4 + quad % 4) * PANEL * 4);
            let (v0, v1) = (_mm512_loadu_si512(w.cast()), _mm512_loadu_si512(w.add(64).cast()));
            let mask = _mm512_set1_epi8(0x0F);
            if quad < 4 {
                (_mm512_and_si512(v0, mask), _mm512_and_si512(v1, mask))
            } else {
                (
                    _mm512_and_si512(_mm512_srli_epi16::<4>(v0), mask),
                    _mm512_and_si512(_mm512_srli_epi16::<4>(v1), mask),
                )
            }
        } else {
            let w = codes.add((b * (QUANT_BLOCK / 4) + quad) * PANEL * 4);
            (_mm512_loadu_si512(w.cast()), _mm512_loadu_si512(w.add(64).cast()))
        }
    }
}

/// `acc += float(sum) * (scale * d)` for each row: a sub-block's int32 sums of 32 columns
/// (halves `0` and `1`) scaled by the column scales at `scales` and the rows' activation scales.
///
/// # Safety
/// The CPU has AVX-512F; `scales` holds 32 values.
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) unsafe fn scale_sums<const R: usize>(
    sums: ([__m512i; R], [__m512i; R]),
    scales: *const f32,
    d: [f32; R],
    acc: (&mut [__m512; R], &mut [__m512; R]),
) {
    // SAFETY: the caller's contract.
    unsafe {
        let (s0, s1) = (_mm512_loadu_ps(scales), _mm512_loadu_ps(scales.add(16)));
        let rows = acc.0.iter_mut().zip(acc.1.iter_mut()).zip(sums.0.iter().zip(&sums.1)).zip(d);
        for (((a0, a1), (&sum0, &sum1)), di) in rows {
            let di = _mm512_set1_ps(di);
            *a0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum0), _mm512_mul_ps(s0, di), *a0);
            *a1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum1), _mm512_mul_ps(s1, di), *a1);
        }
    }
}

/// `acc += min * row_sum` for each row: a block's column minimums at `mins` (32 values) times
/// the rows' rounded activation sums.
///
/// # Safety
/// The CPU has AVX-512F; `mins` holds 32 values.
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) unsafe fn add_mins<const R: usize>(
    mins: *const f32,
    row_sums: [f32; R],
    acc: (&mut [__m512; R], &mut [__m512; R]),
) {
    // SAFETY: the caller's contract.
    unsafe {
        let (m0, m1) = (_mm512_loadu_ps(mins), _mm512_loadu_ps(mins.add(16)));
        for ((a0, a1), si) in acc.0.iter_mut().zip(acc.1.iter_mut()).zip(row_sums) {
            let si = _mm512_set1_ps(si);
            *a0 = _mm512_fmadd_ps(m0, si, *a0);
            *a1 = _mm512_fmadd_ps(m1, si, *a1);
        }
    }
}

/// Stores each row's accumulators into the first `width` columns of its out row.
///
/// # Safety
/// The CPU has AVX-512F; every out row holds at least `width` (at most 32) values.
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) unsafe fn store_rows<const R: usize>(
    acc: (&[__m512; R], &[__m512; R]),
    out_rows: &mut [&mut [f32]],
    width: usize,
) {
    let mask0: __mmask16 = if width >= 16 { 0xFFFF } else { (1u16 << width) - 1 };
    let mask1: __mmask16 =
        if width >= PANEL { 0xFFFF } else { ((1u32 << width.saturating_sub(16)) - 1) as u16 };
    // SAFETY: the caller's contract bounds the masked stores.
    unsafe {
        for ((out, &a0), &a1) in out_rows.iter_mut().zip(acc.0).zip(acc.1) {
            let out = out.as_mut_ptr();
            _mm512_mask_storeu_ps(out, mask0, a0);
            _mm512_mask_storeu_ps(out.add(16), mask1, a1);
        }
    }
}

/// `R` rows x 32 columns, `SUBS` scales per block, nibble codes when `NIB`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn tile<const R: usize, const SUBS: usize, const NIB: bool>(
    acts: &Int8Activations,
    row0: usize,
    panel: &Int8Panel<'_>,
    out_rows: &mut [&mut [f32]],
    width: usize,
) {
    let blocks = panel.blocks;
    let quads_per_sub = QUANT_BLOCK / 4 / SUBS;
    let a: [*const i8; R] = std::array::from_fn(|i| acts.codes[(row0 + i) * acts.cols..].as_ptr());
    let code_sums: [*const i32; R] =
        std::array::from_fn(|i| acts.code_sums[(row0 + i) * blocks * SUBS..].as_ptr());
    let offset = panel.offset;
    let d: [*const f32; R] = std::array::from_fn(|i| acts.scales[(row0 + i) * blocks..].as_ptr());
    let sums: [*const f32; R] = std::array::from_fn(|i| acts.sums[(row0 + i) * blocks..].as_ptr());
    let (codes, scales) = (panel.codes.as_ptr(), panel.scales.as_ptr());
    let has_mins = !panel.mins.is_empty();
    // SAFETY: the caller's asserts bound every offset below: block `b < blocks`, quad < 8,
    // sub < SUBS, rows below `row0 + R`.
    unsafe {
        let mut lo = [_mm512_setzero_ps(); R];
        let mut hi = [_mm512_setzero_ps(); R];
        for b in 0..blocks {
            for s in 0..SUBS {
                let at = (b * SUBS + s) * PANEL;
                let mut sum_lo = [_mm512_setzero_si512(); R];
                for i in 0..R {
                    sum_lo[i] = _mm512_set1_epi32(-offset * *code_sums[i].add(b * SUBS + s));
                }
                let mut sum_hi = sum_lo;
                for quad in s * quads_per_sub..(s + 1) * quads_per_sub {
                    // Ahead of use: with several rows the loop issues its loads too slowly for
                    // the hardware prefetcher alone to keep DRAM busy.
                    prefetch_codes::<NIB>(codes, b, quad);
                    let (w_lo, w_hi) = quad_codes::<NIB>(codes, b, quad);
                    for i in 0..R {
                        let four = (a[i].add(b * QUANT_BLOCK + quad * 4) as *const i32).read_unaligned();
                        let x = _mm512_set1_epi32(four);
                        sum_lo[i] = _mm512_dpbusd_epi32(sum_lo[i], w_lo, x);
                        sum_hi[i] = _mm512_dpbusd_epi32(sum_hi[i], w_hi, x);
                    }
                }
                let di = std::array::from_fn(|i| *d[i].add(b));
                scale_sums::<R>((sum_lo, sum_hi), scales.add(at), di, (&mut lo, &mut hi));
            }
            if has_mins {
                let row_sums = std::array::from_fn(|i| *sums[i].add(b));
                add_mins::<R>(panel.mins.as_ptr().add(b * PANEL), row_sums, (&mut lo, &mut hi));
            }
        }
        store_rows::<R>((&lo, &hi), out_rows, width);
    }
}

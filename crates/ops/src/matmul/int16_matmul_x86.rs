//! The AVX512-VNNI kernel of [`crate::matmul::int16_matmul`]: per block and tile row, `vpdpbusd` sums
//! the unsigned (offset) codes of 16 columns times the activations' high bytes, the int32 sums
//! are shifted left by 8 bits and take the correction, then a second pass adds the low bytes;
//! one convert and one fused multiply-add scale the block into the row's f32 accumulators.
//! Both passes read the block's codes from L1, so weights are fetched from memory once. Tiles
//! of one or two rows sum even and odd quads in separate chains, so `vpdpbusd`'s latency does
//! not bound them (`benches/examples/tile_rate.rs`).

use std::arch::x86_64::*;

use crate::matmul::int16_matmul::{
    Int16Activations, Int16TileKernel, QuantizeBlock16, INT16_MAX_CODE, INT16_TILE_ROWS,
};
use crate::matmul::int8_matmul::{block_code_bytes, Int8Panel};
use crate::matmul::int8_matmul_x86::{add_mins, prefetch_codes, quad_codes, scale_sums, store_rows};
use crate::matmul::panel_matmul::PANEL;
use crate::matmul::quant_weight::QUANT_BLOCK;

/// The VNNI kernel, if this CPU has AVX-512F, AVX-512BW and AVX512-VNNI.
pub(crate) fn kernel() -> Option<Int16TileKernel> {
    crate::matmul::int8_matmul_x86::kernel().is_some().then_some(tile_vnni as Int16TileKernel)
}

/// The AVX-512 rounding, on the CPUs that run the VNNI kernel.
pub(crate) fn quantize_block() -> Option<QuantizeBlock16> {
    kernel().is_some().then_some(quantize_block_checked as QuantizeBlock16)
}

fn quantize_block_checked(x: &[f32], high: &mut [i8], low: &mut [i8]) -> (f32, [i32; 2]) {
    assert!(x.len() == QUANT_BLOCK && high.len() == QUANT_BLOCK && low.len() == QUANT_BLOCK);
    assert!(kernel().is_some());
    // SAFETY: the CPU has AVX-512F (checked) and every slice holds 32 elements.
    unsafe { quantize_block_avx512(x, high, low) }
}

/// As `quantize_block16_portable`: `d = max|x| / 32639`, `q = x * (1 / d)` rounded to nearest
/// even, clamped, split into `high` and `low` bytes.
#[target_feature(enable = "avx512f")]
unsafe fn quantize_block_avx512(x: &[f32], high: &mut [i8], low: &mut [i8]) -> (f32, [i32; 2]) {
    // SAFETY: the caller checked the lengths.
    unsafe {
        let first = _mm512_loadu_ps(x.as_ptr());
        let second = _mm512_loadu_ps(x.as_ptr().add(16));
        let amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(first), _mm512_abs_ps(second)));
        let d = amax / INT16_MAX_CODE as f32;
        let inv = _mm512_set1_ps(if d > 0.0 { 1.0 / d } else { 0.0 });
        let (top, bottom) = (_mm512_set1_epi32(INT16_MAX_CODE), _mm512_set1_epi32(-INT16_MAX_CODE));
        let (offset, byte) = (_mm512_set1_epi32(128), _mm512_set1_epi32(255));
        let mut sums = [0i32; 2];
        // Written out per half: a closure would not inherit this function's features.
        for (h, v) in [first, second].into_iter().enumerate() {
            let q = _mm512_cvtps_epi32(_mm512_mul_ps(v, inv));
            let q = _mm512_max_epi32(_mm512_min_epi32(q, top), bottom);
            sums[h] = _mm512_reduce_add_epi32(q);
            let l = _mm512_sub_epi32(_mm512_and_si512(_mm512_add_epi32(q, offset), byte), offset);
            let hi = _mm512_srai_epi32::<8>(_mm512_sub_epi32(q, l));
            _mm_storeu_si128(high.as_mut_ptr().add(16 * h).cast(), _mm512_cvtepi32_epi8(hi));
            _mm_storeu_si128(low.as_mut_ptr().add(16 * h).cast(), _mm512_cvtepi32_epi8(l));
        }
        (d, sums)
    }
}

fn tile_vnni(
    acts: &Int16Activations,
    rows: std::ops::Range<usize>,
    panel: &Int8Panel<'_>,
    out_rows: &mut [&mut [f32]],
    width: usize,
) {
    // The bounds the unchecked loads and stores rely on.
    let (blocks, subs) = (panel.blocks, panel.subs);
    assert!((1..=INT16_TILE_ROWS).contains(&rows.len()) && out_rows.len() == rows.len());
    assert!((1..=PANEL).contains(&width) && out_rows.iter().all(|r| r.len() >= width));
    assert!(subs == 1 || subs == 2);
    assert!(acts.cols == blocks * QUANT_BLOCK);
    assert!(acts.high.len() >= rows.end * acts.cols && acts.low.len() >= rows.end * acts.cols);
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

/// `R` rows x 32 columns (two halves of 16: `0` and `1`), `SUBS` scales per block, nibble
/// codes when `NIB`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn tile<const R: usize, const SUBS: usize, const NIB: bool>(
    acts: &Int16Activations,
    row0: usize,
    panel: &Int8Panel<'_>,
    out_rows: &mut [&mut [f32]],
    width: usize,
) {
    let blocks = panel.blocks;
    let quads_per_sub = QUANT_BLOCK / 4 / SUBS;
    let cols = acts.cols;
    let high: [*const i8; R] = std::array::from_fn(|i| acts.high[(row0 + i) * cols..].as_ptr());
    let low: [*const i8; R] = std::array::from_fn(|i| acts.low[(row0 + i) * cols..].as_ptr());
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
        let mut acc0 = [_mm512_setzero_ps(); R];
        let mut acc1 = [_mm512_setzero_ps(); R];
        for b in 0..blocks {
            for s in 0..SUBS {
                let at = (b * SUBS + s) * PANEL;
                let quads = s * quads_per_sub..(s + 1) * quads_per_sub;
                let mut sum0 = [_mm512_setzero_si512(); R];
                let mut sum1 = [_mm512_setzero_si512(); R];
                // With one or two rows, odd quads sum into second chains (added back below;
                // integer sums, so the same bits) to hide `vpdpbusd`'s latency.
                let mut odd0 = [_mm512_setzero_si512(); R];
                let mut odd1 = [_mm512_setzero_si512(); R];
                // The high bytes, then x256 and the correction, then the low bytes.
                for quad in quads.clone() {
                    prefetch_codes::<NIB>(codes, b, quad);
                    let w = quad_codes::<NIB>(codes, b, quad);
                    let odd = R <= 2 && quad & 1 == 1;
                    add_quad::<R>(
                        &high,
                        b * QUANT_BLOCK + quad * 4,
                        w,
                        odd,
                        (&mut sum0, &mut sum1),
                        (&mut odd0, &mut odd1),
                    );
                }
                for i in 0..R {
                    if R <= 2 {
                        sum0[i] = _mm512_add_epi32(sum0[i], odd0[i]);
                        sum1[i] = _mm512_add_epi32(sum1[i], odd1[i]);
                        (odd0[i], odd1[i]) = (_mm512_setzero_si512(), _mm512_setzero_si512());
                    }
                    sum0[i] = _mm512_slli_epi32::<8>(sum0[i]);
                    sum1[i] = _mm512_slli_epi32::<8>(sum1[i]);
                    // Formats whose codes are stored unshifted (Q4_1, Q4_K) need no correction.
                    if offset != 0 {
                        let c = _mm512_set1_epi32(-offset * *code_sums[i].add(b * SUBS + s));
                        sum0[i] = _mm512_add_epi32(sum0[i], c);
                        sum1[i] = _mm512_add_epi32(sum1[i], c);
                    }
                }
                for quad in quads {
                    let w = quad_codes::<NIB>(codes, b, quad);
                    let odd = R <= 2 && quad & 1 == 1;
                    add_quad::<R>(
                        &low,
                        b * QUANT_BLOCK + quad * 4,
                        w,
                        odd,
                        (&mut sum0, &mut sum1),
                        (&mut odd0, &mut odd1),
                    );
                }
                if R <= 2 {
                    for i in 0..R {
                        sum0[i] = _mm512_add_epi32(sum0[i], odd0[i]);
                        sum1[i] = _mm512_add_epi32(sum1[i], odd1[i]);
                    }
                }
                let di = std::array::from_fn(|i| *d[i].add(b));
                scale_sums::<R>((sum0, sum1), scales.add(at), di, (&mut acc0, &mut acc1));
            }
            if has_mins {
                let row_sums = std::array::from_fn(|i| *sums[i].add(b));
                add_mins::<R>(panel.mins.as_ptr().add(b * PANEL), row_sums, (&mut acc0, &mut acc1));
            }
        }
        store_rows::<R>((&acc0, &acc1), out_rows, width);
    }
}

/// `sums += codes * bytes` for each row (or `odds +=` when `odd`): the four activation bytes at
/// `at` of each row, broadcast, times a quad's codes of the two column halves `w`.
///
/// # Safety
/// The CPU has AVX-512F and AVX512-VNNI; each row's pointer is valid for 4 bytes at `at`.
#[target_feature(enable = "avx512f,avx512vnni")]
#[inline]
unsafe fn add_quad<const R: usize>(
    bytes: &[*const i8; R],
    at: usize,
    (w0, w1): (__m512i, __m512i),
    odd: bool,
    sums: (&mut [__m512i; R], &mut [__m512i; R]),
    odds: (&mut [__m512i; R], &mut [__m512i; R]),
) {
    // SAFETY: the caller's contract.
    unsafe {
        for (i, row) in bytes.iter().enumerate() {
            let x = _mm512_set1_epi32((row.add(at) as *const i32).read_unaligned());
            // Selecting the arrays per row, not per call, keeps them in registers.
            if odd {
                odds.0[i] = _mm512_dpbusd_epi32(odds.0[i], w0, x);
                odds.1[i] = _mm512_dpbusd_epi32(odds.1[i], w1, x);
            } else {
                sums.0[i] = _mm512_dpbusd_epi32(sums.0[i], w0, x);
                sums.1[i] = _mm512_dpbusd_epi32(sums.1[i], w1, x);
            }
        }
    }
}

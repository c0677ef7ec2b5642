//! x86-64 kernels of [`crate::matmul::panel_matmul`]: AVX-512 (two 16-lane accumulators per activation
//! row), AVX2+FMA (three rows of four 8-lane accumulators) and, for bfloat16 panels,
//! AVX512-BF16 (the AVX-512 tile with `vdpbf16ps`), chosen once at run time from what the CPU
//! reports, so a generic x86-64 build still uses them.

use std::arch::x86_64::*;

use crate::matmul::panel_matmul::{Bf16TileKernel, TileKernel, PANEL, TILE_ROWS};
use crate::simd::{level, Level};

/// The best kernel on this CPU, if it has AVX2 and FMA at least.
pub(crate) fn kernel() -> Option<TileKernel> {
    match level() {
        Level::Avx512 => Some(tile_avx512),
        Level::Avx2 => Some(tile_avx2),
        Level::None => None,
    }
}

/// The AVX2 kernel (for tests on AVX-512 machines, which otherwise never run it).
#[cfg(test)]
pub(crate) fn avx2_kernel() -> Option<TileKernel> {
    (level() != Level::None).then_some(tile_avx2 as TileKernel)
}

/// The bounds the unchecked loads and stores rely on; a violation is a bug in the caller.
fn check_args<X, W>(x_rows: &[&[X]], panel: &[W], out_rows: &[&mut [f32]], width: usize) {
    let k = panel.len() / PANEL;
    assert!((1..=TILE_ROWS).contains(&x_rows.len()) && out_rows.len() == x_rows.len());
    assert!((1..=PANEL).contains(&width) && panel.len() == k * PANEL);
    assert!(x_rows.iter().all(|r| r.len() >= k) && out_rows.iter().all(|r| r.len() >= width));
}

/// Calls `kernel::<R>(args)` with `R` = the tile's row count (1 to `TILE_ROWS`), so every row
/// count gets a build with its accumulators in registers.
macro_rules! by_rows {
    ($kernel:ident($x_rows:expr, $($arg:expr),*)) => {
        match $x_rows.len() {
            1 => $kernel::<1>($x_rows, $($arg),*),
            2 => $kernel::<2>($x_rows, $($arg),*),
            3 => $kernel::<3>($x_rows, $($arg),*),
            4 => $kernel::<4>($x_rows, $($arg),*),
            5 => $kernel::<5>($x_rows, $($arg),*),
            6 => $kernel::<6>($x_rows, $($arg),*),
            7 => $kernel::<7>($x_rows, $($arg),*),
            8 => $kernel::<8>($x_rows, $($arg),*),
            9 => $kernel::<9>($x_rows, $($arg),*),
            10 => $kernel::<10>($x_rows, $($arg),*),
            11 => $kernel::<11>($x_rows, $($arg),*),
            _ => $kernel::<12>($x_rows, $($arg),*),
        }
    };
}

fn tile_avx512(x_rows: &[&[f32]], panel: &[f32], out_rows: &mut [&mut [f32]], width: usize) {
    check_args(x_rows, panel, out_rows, width);
    assert!(level() == Level::Avx512);
    // SAFETY: the CPU has AVX-512F and FMA (checked above) and `check_args` holds.
    unsafe { by_rows!(tile_avx512_rows(x_rows, panel, out_rows, width)) }
}

/// `R` rows x 32 columns: 2R accumulators, two weight loads and R broadcasts per input element.
#[target_feature(enable = "avx512f,fma")]
unsafe fn tile_avx512_rows<const R: usize>(
    x_rows: &[&[f32]],
    panel: &[f32],
    out_rows: &mut [&mut [f32]],
    width: usize,
) {
    let k_len = panel.len() / PANEL;
    let xs: [*const f32; R] = std::array::from_fn(|i| x_rows[i].as_ptr());
    let w = panel.as_ptr();
    // SAFETY: `check_args` bounds every load (k < panel rows, k < x row length) and store
    // (masks cover `width` lanes of each out row).
    unsafe {
        let mut lo = [_mm512_setzero_ps(); R];
        let mut hi = [_mm512_setzero_ps(); R];
        for k in 0..k_len {
            let w_lo = _mm512_loadu_ps(w.add(k * PANEL));
            let w_hi = _mm512_loadu_ps(w.add(k * PANEL + 16));
            for i in 0..R {
                let xv = _mm512_set1_ps(*xs[i].add(k));
                lo[i] = _mm512_fmadd_ps(xv, w_lo, lo[i]);
                hi[i] = _mm512_fmadd_ps(xv, w_hi, hi[i]);
            }
        }
        store_tile(&lo, &hi, out_rows, width);
    }
}

/// Writes the first `width` columns of an `R x 32` tile held as low and high 16-column halves.
///
/// # Safety
/// The CPU has AVX-512F and every out row holds `width` values.
#[inline(always)]
unsafe fn store_tile<const R: usize>(
    lo: &[__m512; R],
    hi: &[__m512; R],
    out_rows: &mut [&mut [f32]],
    width: usize,
) {
    let mask_lo: __mmask16 = if width >= 16 { 0xFFFF } else { (1u16 << width) - 1 };
    let mask_hi: __mmask16 =
        if width >= PANEL { 0xFFFF } else { ((1u32 << width.saturating_sub(16)) - 1) as u16 };
    for i in 0..R {
        let out = out_rows[i].as_mut_ptr();
        // SAFETY: the masks cover `width` lanes, which the caller guarantees each row holds.
        unsafe {
            _mm512_mask_storeu_ps(out, mask_lo, lo[i]);
            _mm512_mask_storeu_ps(out.add(16), mask_hi, hi[i]);
        }
    }
}

fn tile_avx2(x_rows: &[&[f32]], panel: &[f32], out_rows: &mut [&mut [f32]], width: usize) {
    check_args(x_rows, panel, out_rows, width);
    assert!(level() != Level::None);
    for (xs, outs) in x_rows.chunks(AVX2_ROWS).zip(out_rows.chunks_mut(AVX2_ROWS)) {
        // SAFETY: the CPU has AVX2 and FMA (checked above) and `check_args` holds for each
        // chunk of rows.
        unsafe {
            match xs.len() {
                1 => tile_avx2_rows::<1>(xs, panel, outs, width),
                2 => tile_avx2_rows::<2>(xs, panel, outs, width),
                _ => tile_avx2_rows::<3>(xs, panel, outs, width),
            }
        }
    }
}

/// Rows per pass of the AVX2 kernel: 3 x 4 accumulators, the panel's 4 vectors of an input and
/// a broadcast fit AVX2's 16 registers (more rows spill the accumulators to the stack, which
/// had halved the kernel's rate).
const AVX2_ROWS: usize = 3;

/// `R` rows x 32 columns: per input, the panel's 4 vectors times each row's value broadcast,
/// fused into the row's accumulators, inputs in order (a row's bits do not depend on the rows
/// beside it).
#[target_feature(enable = "avx2,fma")]
unsafe fn tile_avx2_rows<const R: usize>(
    x_rows: &[&[f32]],
    panel: &[f32],
    out_rows: &mut [&mut [f32]],
    width: usize,
) {
    let k = panel.len() / PANEL;
    let xs: [*const f32; R] = std::array::from_fn(|r| x_rows[r].as_ptr());
    let w = panel.as_ptr();
    // SAFETY: the caller's `check_args`: the panel holds `k * PANEL` values and every row at
    // least `k`.
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); 4]; R];
        for kk in 0..k {
            let wk = w.add(kk * PANEL);
            let wv = [
                _mm256_loadu_ps(wk),
                _mm256_loadu_ps(wk.add(8)),
                _mm256_loadu_ps(wk.add(16)),
                _mm256_loadu_ps(wk.add(24)),
            ];
            for (acc_row, x) in acc.iter_mut().zip(xs) {
                let xb = _mm256_set1_ps(*x.add(kk));
                for (a, &wj) in acc_row.iter_mut().zip(&wv) {
                    *a = _mm256_fmadd_ps(xb, wj, *a);
                }
            }
        }
        for (out, acc_row) in out_rows.iter_mut().zip(&acc) {
            let mut row = [0f32; PANEL];
            for (j, &a) in acc_row.iter().enumerate() {
                _mm256_storeu_ps(row.as_mut_ptr().add(8 * j), a);
            }
            out[..width].copy_from_slice(&row[..width]);
        }
    }
}

/// The AVX512-BF16 kernel, if this CPU has it.
pub(crate) fn bf16_kernel() -> Option<Bf16TileKernel> {
    (level() == Level::Avx512 && has_avx512_bf16()).then_some(tile_bf16 as Bf16TileKernel)
}

fn has_avx512_bf16() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| is_x86_feature_detected!("avx512bf16"))
}

fn tile_bf16(x_rows: &[&[u32]], panel: &[u32], out_rows: &mut [&mut [f32]], width: usize) {
    check_args(x_rows, panel, out_rows, width);
    assert!(level() == Level::Avx512 && has_avx512_bf16());
    // SAFETY: the CPU has AVX-512F and AVX512-BF16 (checked above) and `check_args` holds.
    unsafe { by_rows!(tile_bf16_rows(x_rows, panel, out_rows, width)) }
}

/// `R` rows x 32 columns over bfloat16 pairs: per pair of inputs, two weight loads, `R`
/// broadcasts and `2R` `vdpbf16ps` (each two multiply-adds on 16 lanes).
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn tile_bf16_rows<const R: usize>(
    x_rows: &[&[u32]],
    panel: &[u32],
    out_rows: &mut [&mut [f32]],
    width: usize,
) {
    let pairs = panel.len() / PANEL;
    let xs: [*const u32; R] = std::array::from_fn(|i| x_rows[i].as_ptr());
    let w = panel.as_ptr();
    // SAFETY: `check_args` bounds every load (pair < panel rows, pair < x row length) and store
    // (masks cover `width` lanes of each out row). `__m512bh` and `__m512i` are both 64 bytes
    // of plain lanes, so the transmutes only relabel them.
    unsafe {
        let mut lo = [_mm512_setzero_ps(); R];
        let mut hi = [_mm512_setzero_ps(); R];
        for kp in 0..pairs {
            let w_lo: __m512bh = std::mem::transmute(_mm512_loadu_si512(w.add(kp * PANEL).cast()));
            let w_hi: __m512bh = std::mem::transmute(_mm512_loadu_si512(w.add(kp * PANEL + 16).cast()));
            for i in 0..R {
                let xv: __m512bh = std::mem::transmute(_mm512_set1_epi32(*xs[i].add(kp) as i32));
                lo[i] = _mm512_dpbf16_ps(lo[i], xv, w_lo);
                hi[i] = _mm512_dpbf16_ps(hi[i], xv, w_hi);
            }
        }
        store_tile(&lo, &hi, out_rows, width);
    }
}

/// Rounds `src` to bfloat16 pairs with `vcvtne2ps2bf16` when the CPU has it; `false` (nothing
/// written) when it does not.
pub(crate) fn to_bf16_pairs(src: &[f32], dst: &mut [u32]) -> bool {
    if !(level() == Level::Avx512 && has_avx512_bf16()) {
        return false;
    }
    assert!(dst.len() >= src.len().div_ceil(2));
    // SAFETY: the CPU has AVX-512F and AVX512-BF16; `dst` holds a pair for every two values.
    unsafe { to_bf16_pairs_avx512(src, dst) };
    true
}

#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn to_bf16_pairs_avx512(src: &[f32], dst: &mut [u32]) {
    let whole = src.len() / 32 * 32;
    for (s, d) in src[..whole].chunks_exact(32).zip(dst.chunks_exact_mut(16)) {
        // SAFETY: `s` holds 32 values and `d` 16 pairs; the result's low half rounds the
        // second argument (inputs 0..16), its high half the first (16..32).
        unsafe {
            let low = _mm512_loadu_ps(s.as_ptr());
            let high = _mm512_loadu_ps(s.as_ptr().add(16));
            let packed: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(high, low));
            _mm512_storeu_si512(d.as_mut_ptr().cast(), packed);
        }
    }
    crate::matmul::panel_matmul::to_bf16_pairs_portable(&src[whole..], &mut dst[whole / 2..]);
}

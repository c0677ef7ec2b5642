//! x86-64 kernels of [`crate::panel_matmul`]: AVX-512 (two 16-lane accumulators per activation
//! row) and AVX2+FMA (the portable loop compiled for 256-bit vectors), chosen once at run time
//! from what the CPU reports, so a generic x86-64 build still uses them.

use std::arch::x86_64::*;

use crate::panel_matmul::{tile_rows, TileKernel, PANEL, TILE_ROWS};
use crate::simd::{level, Fused, Level};

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
fn check_args(x_rows: &[&[f32]], panel: &[f32], out_rows: &[&mut [f32]], width: usize) {
    let k = panel.len() / PANEL;
    assert!((1..=TILE_ROWS).contains(&x_rows.len()) && out_rows.len() == x_rows.len());
    assert!((1..=PANEL).contains(&width) && panel.len() == k * PANEL);
    assert!(x_rows.iter().all(|r| r.len() >= k) && out_rows.iter().all(|r| r.len() >= width));
}

fn tile_avx512(x_rows: &[&[f32]], panel: &[f32], out_rows: &mut [&mut [f32]], width: usize) {
    check_args(x_rows, panel, out_rows, width);
    assert!(level() == Level::Avx512);
    // SAFETY: the CPU has AVX-512F and FMA (checked above) and `check_args` holds.
    unsafe {
        match x_rows.len() {
            1 => tile_avx512_rows::<1>(x_rows, panel, out_rows, width),
            2 => tile_avx512_rows::<2>(x_rows, panel, out_rows, width),
            3 => tile_avx512_rows::<3>(x_rows, panel, out_rows, width),
            4 => tile_avx512_rows::<4>(x_rows, panel, out_rows, width),
            5 => tile_avx512_rows::<5>(x_rows, panel, out_rows, width),
            6 => tile_avx512_rows::<6>(x_rows, panel, out_rows, width),
            7 => tile_avx512_rows::<7>(x_rows, panel, out_rows, width),
            8 => tile_avx512_rows::<8>(x_rows, panel, out_rows, width),
            9 => tile_avx512_rows::<9>(x_rows, panel, out_rows, width),
            10 => tile_avx512_rows::<10>(x_rows, panel, out_rows, width),
            11 => tile_avx512_rows::<11>(x_rows, panel, out_rows, width),
            _ => tile_avx512_rows::<12>(x_rows, panel, out_rows, width),
        }
    }
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
        let mask_lo: __mmask16 = if width >= 16 { 0xFFFF } else { (1u16 << width) - 1 };
        let mask_hi: __mmask16 =
            if width >= PANEL { 0xFFFF } else { ((1u32 << width.saturating_sub(16)) - 1) as u16 };
        for i in 0..R {
            let out = out_rows[i].as_mut_ptr();
            _mm512_mask_storeu_ps(out, mask_lo, lo[i]);
            _mm512_mask_storeu_ps(out.add(16), mask_hi, hi[i]);
        }
    }
}

fn tile_avx2(x_rows: &[&[f32]], panel: &[f32], out_rows: &mut [&mut [f32]], width: usize) {
    check_args(x_rows, panel, out_rows, width);
    assert!(level() != Level::None);
    // SAFETY: the CPU has AVX2 and FMA (checked above).
    unsafe { tile_avx2_inner(x_rows, panel, out_rows, width) }
}

/// The portable loop with 256-bit vectors and fused multiply-adds enabled. Six rows at a time
/// keep the 6 x 4 accumulators in AVX2's 16 registers.
#[target_feature(enable = "avx2,fma")]
unsafe fn tile_avx2_inner(x_rows: &[&[f32]], panel: &[f32], out_rows: &mut [&mut [f32]], width: usize) {
    tile_rows::<Fused, 6>(x_rows, panel, out_rows, width);
}

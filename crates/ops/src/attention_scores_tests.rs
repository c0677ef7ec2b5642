//! The AVX-512 transposes and score blocks against the portable loops: transposes are moves, and
//! every score is one fused multiply-add chain over the head in order, so both must agree to the
//! bit, for head sizes with partial vectors, key counts around the vector widths and row blocks.

use super::*;
use crate::simd::Fused;

const STRIDE: usize = 64;

fn values(n: usize, seed: usize) -> Vec<f32> {
    (0..n).map(|i| (((i + seed) * 2654435761) % 1000) as f32 / 500.0 - 1.0).collect()
}

/// Rows of `width` values, `n` of them, and their transposes of columns `at..at + head_dim`.
fn transposes(n: usize, width: usize, at: usize, head_dim: usize) -> (Vec<f32>, Vec<f32>) {
    let data = values(n * width, 5);
    let rows: Vec<&[f32]> = data.chunks_exact(width).collect();
    let mut kt = vec![f32::NAN; head_dim * STRIDE];
    transpose_portable(&rows, at, head_dim, &mut kt, STRIDE);
    for d in 0..head_dim {
        for j in 0..n {
            assert_eq!(kt[d * STRIDE + j], rows[j][at + d]);
        }
    }
    (data, kt)
}

#[cfg(target_arch = "x86_64")]
#[test]
fn avx512_transposes_match_the_portable_one() {
    let avx512 = is_x86_feature_detected!("avx512f");
    for (width, at, head_dim) in
        [(64, 0, 64), (192, 64, 64), (40, 0, 40), (13, 0, 13), (256, 128, 128), (24, 8, 16)]
    {
        for n in [0, 1, 7, 8, 9, 15, 16, 17, 33, 64] {
            let (data, want) = transposes(n, width, at, head_dim);
            let rows: Vec<&[f32]> = data.chunks_exact(width).collect();
            if avx512 {
                let mut got = vec![f32::NAN; head_dim * STRIDE];
                // SAFETY: the CPU has AVX-512F; rows and kt are large enough.
                unsafe { transpose_avx512(&rows, at, head_dim, &mut got, STRIDE) };
                for d in 0..head_dim {
                    for j in 0..n {
                        let (g, w) = (got[d * STRIDE + j], want[d * STRIDE + j]);
                        assert_eq!(g.to_bits(), w.to_bits(), "width {width} hd {head_dim} n {n} d {d} j {j}");
                    }
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn avx512_score_blocks_match_the_fused_chain_to_the_bit() {
    let avx512 = is_x86_feature_detected!("fma") && is_x86_feature_detected!("avx512f");
    let stride = 70;
    for head_dim in [64, 40, 13, 128] {
        let kt = values(head_dim * STRIDE, 2);
        for rows in 1..=9 {
            let q = values(rows * head_dim, 1);
            for keys in [0..0, 0..1, 0..64, 3..9, 5..64, 16..33, 40..47, 63..64, 0..17] {
                let mut want = vec![0f32; rows * stride];
                scores_portable::<Fused>(&q, head_dim, &kt, STRIDE, keys.clone(), &mut want, stride);
                if avx512 {
                    let mut got = vec![0f32; rows * stride];
                    // SAFETY: the CPU has AVX-512F and FMA; the buffers are large enough.
                    unsafe { scores_avx512(&q, head_dim, &kt, STRIDE, keys.clone(), &mut got, stride) };
                    for g in 0..rows {
                        for j in keys.clone() {
                            let (a, b) = (got[g * stride + j], want[g * stride + j]);
                            assert_eq!(a.to_bits(), b.to_bits(), "hd {head_dim} rows {rows} keys {keys:?}");
                        }
                    }
                }
            }
        }
    }
}

/// The portable scores are plain dot products (up to rounding), so the transposed layout is
/// read the right way round.
#[test]
fn portable_scores_are_dot_products() {
    let (hd, n, rows) = (40, 23, 3);
    let (data, kt) = transposes(n, hd, 0, hd);
    let q = values(rows * hd, 9);
    let mut got = vec![0f32; rows * STRIDE];
    scores_portable::<crate::simd::Separate>(&q, hd, &kt, STRIDE, 0..n, &mut got, STRIDE);
    for g in 0..rows {
        for j in 0..n {
            let want: f64 = (0..hd).map(|d| q[g * hd + d] as f64 * data[j * hd + d] as f64).sum();
            assert!((got[g * STRIDE + j] as f64 - want).abs() < 1e-4, "row {g} key {j}");
        }
    }
}

/// The fused widen-and-transpose kernels give the widened rows' transposes exactly, for f16
/// (including subnormals, infinities) and bf16, scattered row offsets and partial key blocks.
#[cfg(target_arch = "x86_64")]
#[test]
fn avx512_half_transposes_widen_exactly() {
    use crate::dtype::{Float, Halves};
    use half::{bf16, f16};
    let avx512 = is_x86_feature_detected!("avx512f");
    let (width, rows_in_cache) = (3 * 64, 80);
    // Every 16-bit pattern but NaNs' (whose payload the hardware may quieten).
    let bits: Vec<u16> = (0..width * rows_in_cache).map(|i| ((i * 40503) % 65536) as u16).collect();
    let h16: Vec<f16> =
        bits.iter().map(|&b| f16::from_bits(b)).map(|h| if h.is_nan() { f16::ONE } else { h }).collect();
    let hb: Vec<bf16> =
        bits.iter().map(|&b| bf16::from_bits(b)).map(|h| if h.is_nan() { bf16::ONE } else { h }).collect();
    for n in [1, 7, 8, 15, 16, 17, 40, 64] {
        // Rows out of order, as block tables scatter them.
        let offsets: Vec<usize> = (0..n).map(|j| ((j * 37) % rows_in_cache) * width).collect();
        let ahead: Vec<usize> = (0..n.min(5)).map(|j| j * width).collect();
        for (head_dim, at) in [(64, 0), (64, 128), (128, 64), (16, 8), (32, 160)] {
            let check = |name: &str, src: Halves<'_>, wide: &[f32]| {
                let rows: Vec<&[f32]> = offsets.iter().map(|&o| &wide[o..o + width]).collect();
                let mut want = vec![f32::NAN; head_dim * STRIDE];
                transpose_portable(&rows, at, head_dim, &mut want, STRIDE);
                let half_rows = HalfRows { offsets: &offsets, at, ahead: &ahead, ahead_width: width };
                if avx512 {
                    let mut got = vec![f32::NAN; head_dim * STRIDE];
                    // SAFETY: the CPU has AVX-512F; head_dim is whole vectors, rows lie inside.
                    unsafe { transpose_halves_avx512(src, &half_rows, head_dim, &mut got, STRIDE) };
                    for d in 0..head_dim {
                        for j in 0..n {
                            let (g, w) = (got[d * STRIDE + j], want[d * STRIDE + j]);
                            assert_eq!(g.to_bits(), w.to_bits(), "{name} n {n} hd {head_dim} at {at}");
                        }
                    }
                }
            };
            let mut wide = vec![0f32; h16.len()];
            <f16 as Float>::to_f32_slice(&h16, &mut wide);
            check("f16", Halves::F16(&h16), &wide);
            <bf16 as Float>::to_f32_slice(&hb, &mut wide);
            check("bf16", Halves::Bf16(&hb), &wide);
        }
    }
}

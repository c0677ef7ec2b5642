//! `panel_matmul` against an f64 matmul, for every kernel this CPU can run (f32 and bfloat16), row
//! counts around the tile size, widths that leave a partial last panel, and strided activation
//! views.

use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use half::f16;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;
use crate::matmul::quant_weight::{QuantFormat, QUANT_BLOCK};

fn random_matrix(rng: &mut StdRng, rows: usize, cols: usize) -> Vec<f32> {
    (0..rows * cols).map(|_| rng.random_range(-1.0..1.0)).collect()
}

/// `x @ w^T` in f64, `w` row-major `[n, k]`.
fn reference(w: &[f32], n: usize, x: &[Vec<f32>]) -> Vec<f64> {
    let k = w.len() / n;
    let mut out = Vec::new();
    for xr in x {
        for row in w.chunks_exact(k) {
            out.push(row.iter().zip(xr).map(|(&a, &b)| a as f64 * b as f64).sum());
        }
    }
    out
}

fn assert_close(got: &[f32], want: &[f64], k: usize, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    // Terms are at most 2 in magnitude; f32 summation of k of them errs well below this.
    let tol = 1e-6 * 2.0 * k as f64 + 1e-5;
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!((g as f64 - w).abs() <= tol, "{what}: element {i}: {g} vs {w}");
    }
}

/// A Q4_1 matrix with random codes, scales and minimums.
fn random_q4_1(rng: &mut StdRng, rows: usize, cols: usize) -> QuantizedWeight {
    let mut bytes = Vec::new();
    for _ in 0..rows * cols / QUANT_BLOCK {
        bytes.extend(f16::from_f32(rng.random_range(0.001..0.02)).to_le_bytes());
        bytes.extend(f16::from_f32(rng.random_range(-0.15..0.0)).to_le_bytes());
        bytes.extend((0..16).map(|_| rng.random::<u8>()));
    }
    QuantizedWeight::from_gguf(QuantFormat::Q4_1, rows, cols, &bytes).unwrap()
}

fn kernels() -> Vec<(&'static str, TileKernel)> {
    let mut ks = vec![("portable", portable_kernel as TileKernel), ("best", kernel())];
    #[cfg(target_arch = "x86_64")]
    if let Some(k) = crate::matmul::panel_matmul_x86::avx2_kernel() {
        ks.push(("avx2", k));
    }
    ks
}

#[test]
fn every_kernel_matches_f64_for_partial_tiles_and_panels() {
    let mut rng = StdRng::seed_from_u64(3);
    for (n, k) in [(70, 64), (32, 96), (5, 33), (96, 128)] {
        let values = random_matrix(&mut rng, n, k);
        let w = PanelWeight::from_rows(n, k, &values, PanelPrecision::F32);
        assert_eq!(w.num_panels(), n.div_ceil(PANEL));
        for m in [1, 2, 5, 11, 12, 13, 25, 40] {
            let x: Vec<Vec<f32>> = (0..m).map(|_| random_matrix(&mut rng, 1, k)).collect();
            let rows: Vec<&[f32]> = x.iter().map(Vec::as_slice).collect();
            let want = reference(&values, n, &x);
            for (name, kern) in kernels() {
                let got = matmul(&w, &rows, kern);
                assert_close(&got, &want, k, &format!("{name} n={n} k={k} m={m}"));
            }
        }
    }
}

#[test]
fn padding_past_the_last_row_is_never_written_out() {
    // 40 outputs: the second panel holds 8 real columns and 24 zero ones. Neighbouring output
    // rows must not receive the padding columns' zeros.
    let mut rng = StdRng::seed_from_u64(5);
    let values = random_matrix(&mut rng, 40, 16);
    let w = PanelWeight::from_rows(40, 16, &values, PanelPrecision::F32);
    let x: Vec<Vec<f32>> = (0..3).map(|_| vec![1.0; 16]).collect();
    let rows: Vec<&[f32]> = x.iter().map(Vec::as_slice).collect();
    for (name, kern) in kernels() {
        let got = matmul(&w, &rows, kern);
        for (r, out) in got.chunks_exact(40).enumerate() {
            for (c, &v) in out.iter().enumerate() {
                let want: f32 = values[c * 16..(c + 1) * 16].iter().sum();
                assert!((v - want).abs() < 1e-5, "{name}: row {r} col {c}: {v} vs {want}");
            }
        }
    }
}

#[test]
fn op_reads_strided_views_and_checks_its_inputs() {
    let mut rng = StdRng::seed_from_u64(7);
    let (n, k) = (48, 64);
    let values = random_matrix(&mut rng, n, k);
    let w = Arc::new(PanelWeight::from_rows(n, k, &values, PanelPrecision::F32));
    // Columns 32..96 of a [9, 128] tensor: rows of 64 values, 128 apart.
    let wide = Tensor::randn(0f32, 1.0, (9, 128), &Device::Cpu).unwrap();
    let x = wide.narrow(1, 32, k).unwrap();
    let y = panel_matmul(&x, &w).unwrap();
    assert_eq!(y.dims(), [9, n]);
    let dense = Tensor::from_vec(values, (n, k), &Device::Cpu).unwrap();
    let want = x.contiguous().unwrap().matmul(&dense.t().unwrap()).unwrap();
    let diff: f32 = (y - want).unwrap().abs().unwrap().max_all().unwrap().to_scalar().unwrap();
    assert!(diff < 1e-4, "max diff {diff}");

    let wrong_cols = Tensor::zeros((2, 32), DType::F32, &Device::Cpu).unwrap();
    assert!(panel_matmul(&wrong_cols, &w).is_err());
    let wrong_dtype = Tensor::zeros((2, k), DType::F16, &Device::Cpu).unwrap();
    assert!(panel_matmul(&wrong_dtype, &w).is_err());
    let empty = Tensor::zeros((0, k), DType::F32, &Device::Cpu).unwrap();
    assert_eq!(panel_matmul(&empty, &w).unwrap().dims(), [0, n]);
}

#[test]
fn packing_blocks_gives_their_dequantized_values() {
    let mut rng = StdRng::seed_from_u64(9);
    let (rows, cols) = (40, 64);
    let q = random_q4_1(&mut rng, rows, cols);
    let dense = q.dequantize();
    let w = PanelWeight::from_quantized(&q, PanelPrecision::F32);
    for r in 0..rows {
        for c in 0..cols {
            let (p, j) = (r / PANEL, r % PANEL);
            assert_eq!(w.panel(p)[c * PANEL + j], dense[r * cols + c], "row {r} col {c}");
        }
    }
    // Padding rows of the last panel are zero.
    assert!((rows % PANEL..PANEL).all(|j| (0..cols).all(|c| w.panel(1)[c * PANEL + j] == 0.0)));
}

fn bf16_kernels() -> Vec<(&'static str, Bf16TileKernel)> {
    let mut ks = vec![("portable", portable_bf16_kernel as Bf16TileKernel)];
    #[cfg(target_arch = "x86_64")]
    if let Some(k) = crate::matmul::panel_matmul_x86::bf16_kernel() {
        ks.push(("avx512-bf16", k));
    }
    ks
}

fn round_bf16(v: f32) -> f32 {
    half::bf16::from_f32(v).to_f32()
}

#[test]
fn every_bf16_kernel_matches_f64_over_the_rounded_values() {
    let mut rng = StdRng::seed_from_u64(11);
    // Odd widths leave a half-filled last pair.
    for (n, k) in [(70, 64), (32, 96), (5, 33), (96, 577)] {
        let values = random_matrix(&mut rng, n, k);
        let w = PanelWeight::from_rows(n, k, &values, PanelPrecision::Bf16);
        assert_eq!(w.precision(), PanelPrecision::Bf16);
        assert_eq!(w.size_in_bytes(), n.div_ceil(PANEL) * k.div_ceil(2) * PANEL * 4);
        let rounded: Vec<f32> = values.iter().map(|&v| round_bf16(v)).collect();
        for m in [1, 2, 5, 12, 13, 25, 40] {
            let x: Vec<Vec<f32>> = (0..m).map(|_| random_matrix(&mut rng, 1, k)).collect();
            let rows: Vec<&[f32]> = x.iter().map(Vec::as_slice).collect();
            let x_rounded: Vec<Vec<f32>> =
                x.iter().map(|r| r.iter().map(|&v| round_bf16(v)).collect()).collect();
            let want = reference(&rounded, n, &x_rounded);
            for (name, kern) in bf16_kernels() {
                let got = matmul_bf16(&w, &rows, kern);
                assert_close(&got, &want, k, &format!("bf16 {name} n={n} k={k} m={m}"));
            }
            // Against the exact values the error is bfloat16's: 2^-9 relative per factor.
            let exact = reference(&values, n, &x);
            let got = w.matmul(&rows);
            for (g, e) in got.iter().zip(&exact) {
                assert!((*g as f64 - e).abs() <= 2.0 * k as f64 / 256.0, "{g} vs {e}");
            }
        }
    }
}

#[test]
fn activations_round_to_bf16_pairs_the_same_on_every_path() {
    let mut rng = StdRng::seed_from_u64(13);
    for len in [0, 1, 2, 31, 32, 33, 64, 99] {
        let mut src = random_matrix(&mut rng, 1, len);
        // Ties to even, huge and tiny values, infinities.
        for (i, v) in [1.0 + 1.0 / 256.0, 3.0e38, -1.0e-30, f32::INFINITY].into_iter().enumerate() {
            if i < len {
                src[i] = v;
            }
        }
        let mut want = vec![0u32; len.div_ceil(2)];
        to_bf16_pairs_portable(&src, &mut want);
        for (i, &v) in src.iter().enumerate() {
            let bits = if i % 2 == 0 { want[i / 2] & 0xFFFF } else { want[i / 2] >> 16 };
            assert_eq!(bits as u16, half::bf16::from_f32(v).to_bits(), "len {len} index {i}");
        }
        let mut got = vec![0u32; len.div_ceil(2)];
        to_bf16_pairs(&src, &mut got);
        assert_eq!(got, want, "len {len}");
    }
}

#[test]
fn bf16_packing_of_blocks_rounds_their_dequantized_values() {
    let mut rng = StdRng::seed_from_u64(17);
    let (rows, cols) = (40, 64);
    let q = random_q4_1(&mut rng, rows, cols);
    let dense = q.dequantize();
    let w = PanelWeight::from_quantized(&q, PanelPrecision::Bf16);
    for r in 0..rows {
        for c in 0..cols {
            let pair = w.bf16_panel(r / PANEL)[c / 2 * PANEL + r % PANEL];
            let bits = if c % 2 == 0 { pair & 0xFFFF } else { pair >> 16 };
            assert_eq!(bits as u16, half::bf16::from_f32(dense[r * cols + c]).to_bits(), "row {r} col {c}");
        }
    }
    assert!((rows % PANEL..PANEL).all(|j| (0..cols / 2).all(|c| w.bf16_panel(1)[c * PANEL + j] == 0)));
}

#[test]
fn bf16_op_reads_strided_views() {
    let mut rng = StdRng::seed_from_u64(19);
    let (n, k) = (48, 64);
    let values = random_matrix(&mut rng, n, k);
    let w = Arc::new(PanelWeight::from_rows(n, k, &values, PanelPrecision::Bf16));
    let wide = Tensor::randn(0f32, 1.0, (9, 128), &Device::Cpu).unwrap();
    let x = wide.narrow(1, 32, k).unwrap();
    let y = panel_matmul(&x, &w).unwrap();
    let dense = Tensor::from_vec(values, (n, k), &Device::Cpu).unwrap();
    let want = x.contiguous().unwrap().matmul(&dense.t().unwrap()).unwrap();
    let diff: f32 = (y - want).unwrap().abs().unwrap().max_all().unwrap().to_scalar().unwrap();
    // Inputs within 4 in magnitude: each of 64 products errs by at most 2^-8 of 4.
    assert!(diff < 1.0, "max diff {diff}");
    assert!(diff > 0.0, "bfloat16 rounding leaves no trace: the f32 path ran");
}

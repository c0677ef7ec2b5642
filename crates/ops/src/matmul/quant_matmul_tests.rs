//! `quant_matmul` against an f64 matmul of the dequantized weights, for every kernel this CPU
//! can run, several batch sizes and every format.

use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use half::f16;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;
use crate::matmul::quant_weight::tests::random_gguf;

/// A matrix of random GGUF bytes of `format`, with scales and minimums (either sign) of a real
/// model's magnitude.
pub(crate) fn random_weight(
    rng: &mut StdRng,
    format: QuantFormat,
    rows: usize,
    cols: usize,
) -> QuantizedWeight {
    // K-quants multiply `d` by 6- or 8-bit sub-block scales.
    let scale = if format.gguf_block_elems() == QUANT_BLOCK { 0.02 } else { 0.001 };
    let half = |rng: &mut StdRng| {
        let v: f32 = rng.random_range(0.05 * scale..scale);
        f16::from_f32(if rng.random() { v } else { -v })
    };
    let bytes = random_gguf(rng, format, rows, cols, half);
    QuantizedWeight::from_gguf(format, rows, cols, &bytes).unwrap()
}

fn random_rows(rng: &mut StdRng, m: usize, cols: usize) -> Vec<Vec<f32>> {
    (0..m).map(|_| (0..cols).map(|_| rng.random_range(-2.0..2.0)).collect()).collect()
}

/// `x @ dequantize(w)^T` in f64, with the sum of the terms' magnitudes (the scale of f32
/// rounding errors).
fn reference(w: &QuantizedWeight, x: &[Vec<f32>]) -> Vec<(f64, f64)> {
    let dense = w.dequantize();
    let mut out = Vec::new();
    for xr in x {
        for row in dense.chunks_exact(w.cols()) {
            let terms = row.iter().zip(xr).map(|(&a, &b)| a as f64 * b as f64);
            out.push(terms.fold((0.0, 0.0), |(s, m), t| (s + t, m + t.abs())));
        }
    }
    out
}

/// Each result within `1e-5` of the sum of its terms' magnitudes (f32 sums of a few thousand
/// terms stay well inside that).
fn assert_close(got: &[f32], want: &[(f64, f64)], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (&g, &(w, mag))) in got.iter().zip(want).enumerate() {
        let tol = 1e-5 * mag + 1e-30;
        assert!((g as f64 - w).abs() <= tol, "{what}: element {i}: {g} vs {w} (magnitude {mag})");
    }
}

fn kernels(format: QuantFormat) -> Vec<(&'static str, RowsKernel)> {
    let mut ks = vec![("portable", portable_kernel(format)), ("best", kernel(format))];
    #[cfg(target_arch = "x86_64")]
    if let Some(k) = crate::matmul::quant_matmul_x86::avx2_kernel(format) {
        ks.push(("avx2", k));
    }
    ks
}

#[test]
fn every_kernel_matches_the_dequantized_matmul() {
    let mut rng = StdRng::seed_from_u64(7);
    for format in QuantFormat::ALL {
        // Row counts below, at and above the task split (and odd); widths of 1 to 48 blocks of
        // 32 (1 to 6 super-blocks of 256 for K-quants).
        let shapes: &[(usize, usize)] = if format.gguf_block_elems() == QUANT_BLOCK {
            &[(1, 32), (33, 576), (200, 1536), (7, 64), (65, 96)]
        } else {
            &[(1, 256), (33, 512), (200, 1536), (7, 768), (65, 256)]
        };
        for &(rows, cols) in shapes {
            let w = random_weight(&mut rng, format, rows, cols);
            for m in [1, 2, 3, 4, 5, 7, 8, 9, 17] {
                let x = random_rows(&mut rng, m, cols);
                let want = reference(&w, &x);
                let x_refs: Vec<&[f32]> = x.iter().map(Vec::as_slice).collect();
                for (name, k) in kernels(format) {
                    let got = matmul(&w, &x_refs, k);
                    assert_close(&got, &want, &format!("{format:?} {name} [{rows}x{cols}] m={m}"));
                }
            }
        }
    }
}

#[test]
fn the_op_reads_strided_rows_and_stacked_weights() {
    let mut rng = StdRng::seed_from_u64(11);
    for (format, cols) in
        [(QuantFormat::Q4_1, 64), (QuantFormat::Q5_0, 64), (QuantFormat::Q4K, 256), (QuantFormat::Q6K, 256)]
    {
        let (a, b) = (random_weight(&mut rng, format, 40, cols), random_weight(&mut rng, format, 24, cols));
        let ab = Arc::new(QuantizedWeight::concat_rows(&[&a, &b]).unwrap());
        let x = random_rows(&mut rng, 3, cols + 32);
        let flat: Vec<f32> = x.concat();
        // Columns 16..16+cols of a [3, cols + 32] tensor: rows with a stride, read in place.
        let xt = Tensor::from_vec(flat, (3, cols + 32), &Device::Cpu).unwrap().narrow(1, 16, cols).unwrap();
        let y = quant_matmul(&xt, &ab).unwrap();
        assert_eq!(y.dims(), &[3, 64]);
        let narrowed: Vec<Vec<f32>> = x.iter().map(|r| r[16..16 + cols].to_vec()).collect();
        let want_a = reference(&a, &narrowed);
        let want_b = reference(&b, &narrowed);
        let got = y.to_vec2::<f32>().unwrap();
        for (i, row) in got.iter().enumerate() {
            assert_close(&row[..40], &want_a[i * 40..(i + 1) * 40], &format!("{format:?} stacked part a"));
            assert_close(&row[40..], &want_b[i * 24..(i + 1) * 24], &format!("{format:?} stacked part b"));
        }
    }
}

#[test]
fn bad_inputs_are_errors() {
    let mut rng = StdRng::seed_from_u64(3);
    let w = Arc::new(random_weight(&mut rng, QuantFormat::Q8_0, 4, 64));
    let wrong_width = Tensor::zeros((2, 32), DType::F32, &Device::Cpu).unwrap();
    assert!(quant_matmul(&wrong_width, &w).unwrap_err().to_string().contains("columns"));
    let wrong_dtype = Tensor::zeros((2, 64), DType::F16, &Device::Cpu).unwrap();
    assert!(quant_matmul(&wrong_dtype, &w).is_err());
    let wrong_rank = Tensor::zeros(64, DType::F32, &Device::Cpu).unwrap();
    assert!(quant_matmul(&wrong_rank, &w).is_err());
    let empty = Tensor::zeros((0, 64), DType::F32, &Device::Cpu).unwrap();
    assert_eq!(quant_matmul(&empty, &w).unwrap().dims(), &[0, 4]);
}

/// `quant_matmul_batch_invariant`: every format, every kernel this CPU runs, any number of rows
/// and any thread count give each row the bits it gets alone, and match the dequantized matmul.
#[test]
fn batch_invariant_rows_have_the_bits_they_have_alone() {
    let mut rng = StdRng::seed_from_u64(23);
    for format in QuantFormat::ALL {
        let cols = if format.gguf_block_elems() == QUANT_BLOCK { 96 } else { 512 };
        let w = random_weight(&mut rng, format, 45, cols);
        let x = random_rows(&mut rng, 21, cols);
        let x_refs: Vec<&[f32]> = x.iter().map(Vec::as_slice).collect();
        let want = reference(&w, &x);
        for (name, k) in kernels(format) {
            let alone: Vec<Vec<f32>> =
                x_refs.iter().map(|r| matmul_grouped(&w, &[r], k, INVARIANT_GROUP)).collect();
            for threads in [1, 3] {
                let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
                for m in [2, 4, 5, 9, 21] {
                    let got = pool.install(|| matmul_grouped(&w, &x_refs[..m], k, INVARIANT_GROUP));
                    assert_close(&got, &want[..m * 45], &format!("{format:?} {name} m={m}"));
                    for (i, row) in got.chunks_exact(45).enumerate() {
                        let same = row.iter().zip(&alone[i]).all(|(a, b)| a.to_bits() == b.to_bits());
                        assert!(
                            same,
                            "{format:?} {name}: row {i} of {m} ({threads} threads) differs from alone"
                        );
                    }
                }
            }
        }
    }
    // The op itself takes the same path.
    let w = Arc::new(random_weight(&mut rng, QuantFormat::Q4_1, 40, 64));
    let x = Tensor::from_vec(random_rows(&mut rng, 9, 64).concat(), (9, 64), &Device::Cpu).unwrap();
    let all = quant_matmul_batch_invariant(&x, &w).unwrap().to_vec2::<f32>().unwrap();
    let last =
        quant_matmul_batch_invariant(&x.narrow(0, 8, 1).unwrap(), &w).unwrap().to_vec2::<f32>().unwrap();
    assert!(all[8].iter().zip(&last[0]).all(|(a, b)| a.to_bits() == b.to_bits()));
}

//! `quant_matmul` against an f64 matmul of the dequantized weights, for every kernel this CPU
//! can run, several batch sizes and both formats.

use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use half::f16;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;

/// Random GGUF bytes of `format` with scales and minimums of a real model's magnitude.
fn random_weight(rng: &mut StdRng, format: QuantFormat, rows: usize, cols: usize) -> QuantizedWeight {
    let mut bytes = Vec::new();
    for _ in 0..rows * cols / QUANT_BLOCK {
        bytes.extend(f16::from_f32(rng.random_range(0.001..0.02)).to_le_bytes());
        if format == QuantFormat::Q4_1 {
            bytes.extend(f16::from_f32(rng.random_range(-0.15..0.0)).to_le_bytes());
        }
        let code_bytes = format.code_bytes();
        bytes.extend((0..code_bytes).map(|_| rng.random::<u8>()));
    }
    QuantizedWeight::from_gguf(format, rows, cols, &bytes).unwrap()
}

fn random_rows(rng: &mut StdRng, m: usize, cols: usize) -> Vec<Vec<f32>> {
    (0..m).map(|_| (0..cols).map(|_| rng.random_range(-2.0..2.0)).collect()).collect()
}

/// `x @ dequantize(w)^T` in f64.
fn reference(w: &QuantizedWeight, x: &[Vec<f32>]) -> Vec<f64> {
    let dense = w.dequantize();
    let mut out = Vec::new();
    for xr in x {
        for row in dense.chunks_exact(w.cols()) {
            out.push(row.iter().zip(xr).map(|(&a, &b)| a as f64 * b as f64).sum());
        }
    }
    out
}

fn assert_close(got: &[f32], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let tol = 1e-4 * (1.0 + w.abs());
        assert!((g as f64 - w).abs() <= tol, "{what}: element {i}: {g} vs {w}");
    }
}

fn kernels(format: QuantFormat) -> Vec<(&'static str, RowsKernel)> {
    let mut ks = vec![("portable", portable_kernel(format)), ("best", kernel(format))];
    #[cfg(target_arch = "x86_64")]
    if let Some(k) = crate::quant_matmul_x86::avx2_kernel(format) {
        ks.push(("avx2", k));
    }
    ks
}

#[test]
fn every_kernel_matches_the_dequantized_matmul() {
    let mut rng = StdRng::seed_from_u64(7);
    for format in [QuantFormat::Q4_1, QuantFormat::Q8_0] {
        // Row counts below, at and above the task split; widths of 1, 18 and 48 blocks.
        for (rows, cols) in [(1, 32), (33, 576), (200, 1536), (7, 64)] {
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
    let (a, b) = (
        random_weight(&mut rng, QuantFormat::Q4_1, 40, 64),
        random_weight(&mut rng, QuantFormat::Q4_1, 24, 64),
    );
    let ab = Arc::new(QuantizedWeight::concat_rows(&[&a, &b]).unwrap());
    let x = random_rows(&mut rng, 3, 96);
    let flat: Vec<f32> = x.concat();
    // Columns 16..80 of a [3, 96] tensor: rows with a stride, read in place.
    let xt = Tensor::from_vec(flat, (3, 96), &Device::Cpu).unwrap().narrow(1, 16, 64).unwrap();
    let y = quant_matmul(&xt, &ab).unwrap();
    assert_eq!(y.dims(), &[3, 64]);
    let narrowed: Vec<Vec<f32>> = x.iter().map(|r| r[16..80].to_vec()).collect();
    let want_a = reference(&a, &narrowed);
    let want_b = reference(&b, &narrowed);
    let got = y.to_vec2::<f32>().unwrap();
    for (i, row) in got.iter().enumerate() {
        assert_close(&row[..40], &want_a[i * 40..(i + 1) * 40], "stacked part a");
        assert_close(&row[40..], &want_b[i * 24..(i + 1) * 24], "stacked part b");
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

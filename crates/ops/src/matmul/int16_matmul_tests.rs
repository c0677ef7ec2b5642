//! The 16-bit-activation matmul against an f64 product of the exact dequantized weights with
//! the activations rounded as the module documents (computed here independently), for every
//! format, every kernel this CPU runs, partial tiles and panels; its drift from the exact
//! product; and that the kernels agree bit for bit whatever the rows beside a row.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;
use crate::matmul::int8_matmul::tests as int8_tests;
use crate::matmul::int8_matmul::tests::reference;
use crate::matmul::quant_matmul::tests::random_weight;
use crate::matmul::quant_weight::QuantFormat;

/// Rows of random activations; row 1 (when present) has an all-zero first block, row 2 one
/// large outlier per block.
fn random_rows(rng: &mut StdRng, m: usize, cols: usize) -> Vec<Vec<f32>> {
    let mut x = int8_tests::random_rows(rng, m, cols);
    if m > 2 {
        for b in 0..cols / QUANT_BLOCK {
            x[2][b * QUANT_BLOCK + b % QUANT_BLOCK] = -300.0;
        }
    }
    x
}

/// The activations as this path sees them, per block of 32: `d = max|x| / 32639`,
/// `d * round(x * (1 / d))`, ties to even.
fn rounded(x: &[f32]) -> Vec<f64> {
    x.chunks(QUANT_BLOCK)
        .flat_map(|b| {
            let d = b.iter().fold(0f32, |a, &v| a.max(v.abs())) / 32639.0;
            b.iter().map(
                move |&v| if d > 0.0 { d as f64 * (v * (1.0 / d)).round_ties_even() as f64 } else { 0.0 },
            )
        })
        .collect()
}

/// Every kernel this CPU runs, whatever the others: the 256-bit ones run on an AVX-512 box too.
fn kernels() -> Vec<(&'static str, Int16TileKernel)> {
    let mut ks = vec![("portable", portable_kernel as Int16TileKernel)];
    #[cfg(target_arch = "x86_64")]
    {
        use crate::matmul::{int16_matmul_avx2 as avx2, int16_matmul_x86 as x86};
        let native =
            [("vnni", x86::kernel()), ("avx-vnni", avx2::avx_vnni_kernel()), ("avx2", avx2::avx2_kernel())];
        ks.extend(native.into_iter().filter_map(|(name, k)| Some((name, k?))));
    }
    ks
}

/// Every block rounding this CPU runs.
fn roundings() -> Vec<(&'static str, QuantizeBlock16)> {
    let mut rs = vec![("portable", quantize_block16_portable as QuantizeBlock16)];
    #[cfg(target_arch = "x86_64")]
    {
        use crate::matmul::{int16_matmul_avx2 as avx2, int16_matmul_x86 as x86};
        let native = [("avx512", x86::quantize_block()), ("avx2", avx2::quantize_block())];
        rs.extend(native.into_iter().filter_map(|(name, r)| Some((name, r?))));
    }
    rs
}

#[test]
fn every_kernel_matches_the_rounded_activation_product_for_every_format() {
    let mut rng = StdRng::seed_from_u64(31);
    for format in QuantFormat::ALL {
        let k = if format.gguf_block_elems() == QUANT_BLOCK { 96 } else { 512 };
        // 70 outputs: two whole panels and a partial one.
        let w = random_weight(&mut rng, format, 70, k);
        let panels = Int8Weight::from_quantized(&w);
        for m in [1usize, 2, 5, 6, 7, 13] {
            let x = random_rows(&mut rng, m, k);
            let rows: Vec<&[f32]> = x.iter().map(Vec::as_slice).collect();
            let want = reference(&w, &x.iter().map(|r| rounded(r)).collect::<Vec<_>>());
            let mut first: Option<Vec<f32>> = None;
            for (name, kern) in kernels() {
                let got = panels.matmul_int16_with(&rows, kern);
                assert_eq!(got.len(), want.len());
                for (i, (&g, &(v, mag))) in got.iter().zip(&want).enumerate() {
                    // f32 rounding of a few hundred scaled block sums.
                    let tol = 2e-6 * mag + 1e-30;
                    assert!((g as f64 - v).abs() <= tol, "{format:?} {name} m={m} element {i}: {g} vs {v}");
                }
                // Every kernel runs the same integer sums and the same fused f32 updates.
                match &first {
                    None => first = Some(got),
                    Some(f) => assert!(
                        f.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{format:?} {name} m={m}: not the portable kernel's bits"
                    ),
                }
            }
        }
    }
}

#[test]
fn drift_from_the_exact_product_is_that_of_16_bit_activations() {
    // Rounding to 16 bits errs by at most half a step (max|x| / 65278) per element: each output
    // is within sum_k |w_k| * step_k / 2 of the exact product, far inside 8-bit's bound.
    let mut rng = StdRng::seed_from_u64(32);
    let (n, k) = (64, 256);
    let w = random_weight(&mut rng, QuantFormat::Q4_1, n, k);
    let x = random_rows(&mut rng, 9, k);
    let rows: Vec<&[f32]> = x.iter().map(Vec::as_slice).collect();
    let got = Int8Weight::from_quantized(&w).matmul_int16(&rows);
    let int8 = Int8Weight::from_quantized(&w).matmul(&rows);
    let exact = reference(&w, &x.iter().map(|r| r.iter().map(|&v| v as f64).collect()).collect::<Vec<_>>());
    let dense = w.dequantize();
    let (mut max_err, mut max_err8) = (0f64, 0f64);
    for (r, xr) in x.iter().enumerate() {
        let steps: Vec<f64> = xr
            .chunks(QUANT_BLOCK)
            .flat_map(|b| {
                let step = b.iter().fold(0f32, |a, &v| a.max(v.abs())) as f64 / 32639.0;
                std::iter::repeat_n(step, QUANT_BLOCK)
            })
            .collect();
        for (c, wr) in dense.chunks_exact(k).enumerate() {
            let bound: f64 = wr.iter().zip(&steps).map(|(&a, &s)| a.abs() as f64 * s / 2.0).sum();
            let mag = exact[r * n + c].1;
            let err = (got[r * n + c] as f64 - exact[r * n + c].0).abs();
            // Plus the f32 rounding of the block sums.
            assert!(err <= bound * 1.001 + 2e-6 * mag, "row {r} col {c}: error {err} above {bound}");
            max_err = max_err.max(err);
            max_err8 = max_err8.max((int8[r * n + c] as f64 - exact[r * n + c].0).abs());
        }
    }
    assert!(max_err * 50.0 < max_err8, "16-bit drift {max_err} against 8-bit {max_err8}");
}

#[test]
fn activation_rounding_follows_the_definition() {
    let x: Vec<f32> = (0..64).map(|i| if i < 32 { (i as f32 - 10.0) * 0.25 } else { 0.0 }).collect();
    let acts = quantize_activations16(&[&x], 64, 2);
    let d = 21.0 * 0.25 / 32639.0;
    assert_eq!(acts.scales, vec![d, 0.0]);
    let mut q = vec![0i32; 64];
    for i in 0..64 {
        let (h, l) = (i32::from(acts.high[i]), i32::from(acts.low[i]));
        q[i] = 256 * h + l;
        let want = if i < 32 { (x[i] * (1.0 / d)).round_ties_even() as i32 } else { 0 };
        assert_eq!(q[i], want, "element {i}");
    }
    assert_eq!(q[31], INT16_MAX_CODE, "the largest magnitude maps to 32639");
    let first: i32 = q[..16].iter().sum();
    let second: i32 = q[16..32].iter().sum();
    assert_eq!(acts.code_sums, vec![first, second, 0, 0]);
    assert!((acts.sums[0] - d * (first + second) as f32).abs() < 1e-6);
    let one_sub = quantize_activations16(&[&x], 64, 1);
    assert_eq!(one_sub.code_sums, vec![first + second, 0]);
}

#[test]
fn every_code_splits_into_two_signed_bytes() {
    for q in -INT16_MAX_CODE..=INT16_MAX_CODE {
        let (h, l) = split(q);
        assert_eq!(256 * i32::from(h) + i32::from(l), q);
    }
}

#[test]
fn every_rounding_build_gives_the_same_bytes_and_many_rows_round_as_one() {
    let mut rng = StdRng::seed_from_u64(34);
    let mut blocks: Vec<Vec<f32>> =
        (0..200).map(|_| (0..32).map(|_| rng.random_range(-3.0..3.0)).collect()).collect();
    blocks.push(vec![0.0; 32]);
    // A lone large value and exact half steps.
    blocks.push((0..32).map(|i| if i == 5 { -1e6 } else { 1e-3 * i as f32 }).collect());
    blocks.push((0..32).map(|i| if i == 0 { 32639.0 } else { i as f32 - 0.5 }).collect());
    for x in &blocks {
        let (mut want_h, mut want_l, mut got_h, mut got_l) = ([0i8; 32], [0i8; 32], [0i8; 32], [0i8; 32]);
        let want = quantize_block16_portable(x, &mut want_h, &mut want_l);
        for (name, rounding) in roundings() {
            let got = rounding(x, &mut got_h, &mut got_l);
            assert_eq!((got, got_h, got_l), (want, want_h, want_l), "{name}: {x:?}");
        }
    }
    // 40 x 2048 values: past the size below which rounding stays on the calling thread.
    let rows = random_rows(&mut rng, 40, 2048);
    let refs: Vec<&[f32]> = rows.iter().map(Vec::as_slice).collect();
    let all = quantize_activations16(&refs, 2048, 1);
    for (r, row) in refs.iter().enumerate() {
        let one = quantize_activations16(&[row], 2048, 1);
        assert_eq!(&all.high[r * 2048..(r + 1) * 2048], one.high.as_slice(), "row {r}");
        assert_eq!(&all.low[r * 2048..(r + 1) * 2048], one.low.as_slice(), "row {r}");
        assert_eq!(&all.code_sums[r * 64..(r + 1) * 64], one.code_sums.as_slice());
        assert_eq!(&all.codes[r * 2048..(r + 1) * 2048], one.codes.as_slice(), "row {r}");
        let whole = |k: usize| 256 * i32::from(one.high[k]) + i32::from(one.low[k]);
        assert!((0..2048).all(|k| i32::from(one.codes[k]) == whole(k)), "row {r}: q = 256 high + low");
    }
}

#[test]
fn a_row_gives_the_same_bits_alone_and_in_any_tile() {
    let mut rng = StdRng::seed_from_u64(35);
    let w = random_weight(&mut rng, QuantFormat::Q4_1, 70, 256);
    let panels = Int8Weight::from_quantized(&w);
    let x = random_rows(&mut rng, 17, 256);
    let rows: Vec<&[f32]> = x.iter().map(Vec::as_slice).collect();
    let together = panels.matmul_int16(&rows);
    for (r, row) in rows.iter().enumerate() {
        let alone = panels.matmul_int16(&[row]);
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&together[r * 70..(r + 1) * 70]), bits(&alone), "row {r}");
    }
    assert!(panels.matmul_int16(&[]).is_empty());
}

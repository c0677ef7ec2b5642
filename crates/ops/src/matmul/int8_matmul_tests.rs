//! The int8 matmul against an f64 product of the exact dequantized weights with the
//! activations rounded as the module documents (computed here independently), for every format,
//! every kernel this CPU runs, partial tiles and panels; and its drift from the exact product.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;
use crate::matmul::quant_matmul::tests::random_weight;
use crate::matmul::quant_weight::QuantFormat;

/// Rows of random activations; row 1 (when present) has an all-zero first block.
pub(crate) fn random_rows(rng: &mut StdRng, m: usize, cols: usize) -> Vec<Vec<f32>> {
    let mut x: Vec<Vec<f32>> =
        (0..m).map(|_| (0..cols).map(|_| rng.random_range(-2.0..2.0)).collect()).collect();
    if m > 1 {
        x[1][..QUANT_BLOCK].fill(0.0);
    }
    x
}

/// The activations as the int8 path sees them: per 32, `d = max|x| / 127`, `d * round(x * (1 / d))`, ties to even.
fn rounded(x: &[f32]) -> Vec<f64> {
    x.chunks(QUANT_BLOCK)
        .flat_map(|b| {
            let d = b.iter().fold(0f32, |a, &v| a.max(v.abs())) / 127.0;
            b.iter().map(
                move |&v| if d > 0.0 { d as f64 * (v * (1.0 / d)).round_ties_even() as f64 } else { 0.0 },
            )
        })
        .collect()
}

/// `(x @ w^T, sum of |terms|)` in f64 over the exact weights, `x` given per row.
pub(crate) fn reference(w: &QuantizedWeight, x: &[Vec<f64>]) -> Vec<(f64, f64)> {
    let dense = w.dequantize();
    let mut out = Vec::new();
    for xr in x {
        for row in dense.chunks_exact(w.cols()) {
            let terms = row.iter().zip(xr).map(|(&a, &b)| a as f64 * b);
            out.push(terms.fold((0.0, 0.0), |(s, m), t| (s + t, m + t.abs())));
        }
    }
    out
}

/// Every kernel this CPU runs, whatever the others: the 256-bit ones run on an AVX-512 box too.
fn kernels() -> Vec<(&'static str, Int8TileKernel)> {
    let mut ks = vec![("portable", portable_kernel as Int8TileKernel)];
    ks.extend(native_kernels());
    ks
}

/// The vector kernels this CPU runs: they give the same bits as each other.
fn native_kernels() -> Vec<(&'static str, Int8TileKernel)> {
    #[cfg(target_arch = "x86_64")]
    {
        use crate::matmul::{int8_matmul_avx2 as avx2, int8_matmul_x86 as x86};
        let native =
            [("vnni", x86::kernel()), ("avx-vnni", avx2::avx_vnni_kernel()), ("avx2", avx2::avx2_kernel())];
        native.into_iter().filter_map(|(name, k)| Some((name, k?))).collect()
    }
    #[cfg(not(target_arch = "x86_64"))]
    Vec::new()
}

#[test]
fn the_vector_kernels_give_the_same_bits_for_every_format_and_extreme_codes() {
    let mut rng = StdRng::seed_from_u64(15);
    for format in QuantFormat::ALL {
        let k = if format.gguf_block_elems() == QUANT_BLOCK { 96 } else { 512 };
        let w = random_weight(&mut rng, format, 45, k);
        let mut panels = Int8Weight::from_quantized(&w);
        // The extreme stored codes (0 and 255 for bytes): the AVX2 kernel's signed products
        // must not saturate.
        if !panels.nibbles {
            for (i, c) in panels.codes.iter_mut().enumerate().step_by(7) {
                *c = if i % 2 == 0 { 0 } else { 255 };
            }
        }
        for m in [1usize, 2, 3, 6, 7] {
            let mut x = random_rows(&mut rng, m, k);
            // Activations at +-127 after rounding.
            x[0].iter_mut().step_by(3).for_each(|v| *v = if *v < 0.0 { -2.0 } else { 2.0 });
            let rows: Vec<&[f32]> = x.iter().map(Vec::as_slice).collect();
            let mut first: Option<(&str, Vec<u32>)> = None;
            for (name, kern) in native_kernels() {
                let got: Vec<u32> = panels.matmul_with(&rows, kern).iter().map(|v| v.to_bits()).collect();
                match &first {
                    None => first = Some((name, got)),
                    Some((first_name, f)) => {
                        assert!(*f == got, "{format:?} m={m}: {name} differs from {first_name}")
                    }
                }
            }
            // And the portable kernel within f32 rounding of them.
            if let Some((_, f)) = &first {
                let portable = panels.matmul_with(&rows, portable_kernel);
                for (&p, &b) in portable.iter().zip(f) {
                    let v = f32::from_bits(b);
                    assert!((p - v).abs() <= 1e-4 * (1.0 + v.abs()), "{format:?} m={m}: {p} vs {v}");
                }
            }
        }
    }
}

#[test]
fn every_kernel_matches_the_rounded_activation_product_for_every_format() {
    let mut rng = StdRng::seed_from_u64(11);
    for format in QuantFormat::ALL {
        let k = if format.gguf_block_elems() == QUANT_BLOCK { 96 } else { 512 };
        // 70 outputs: two whole panels and a partial one.
        let w = random_weight(&mut rng, format, 70, k);
        let int8 = Int8Weight::from_quantized(&w);
        for m in [1usize, 2, 5, 6, 7, 13] {
            let x = random_rows(&mut rng, m, k);
            let rows: Vec<&[f32]> = x.iter().map(Vec::as_slice).collect();
            let want = reference(&w, &x.iter().map(|r| rounded(r)).collect::<Vec<_>>());
            for (name, kern) in kernels() {
                let got = int8.matmul_with(&rows, kern);
                assert_eq!(got.len(), want.len());
                for (i, (&g, &(v, mag))) in got.iter().zip(&want).enumerate() {
                    // f32 rounding of a few hundred scaled block sums.
                    let tol = 2e-6 * mag + 1e-30;
                    assert!((g as f64 - v).abs() <= tol, "{format:?} {name} m={m} element {i}: {g} vs {v}");
                }
            }
        }
    }
}

#[test]
fn drift_from_the_exact_product_is_that_of_8_bit_activations() {
    // Rounding activations to 8 bits errs by at most half a step (max|x| / 254) per element, so
    // each output is within sum_k |w_k| * step_k / 2 of the exact product, and not exact.
    let mut rng = StdRng::seed_from_u64(12);
    let (n, k) = (64, 256);
    let w = random_weight(&mut rng, QuantFormat::Q8_0, n, k);
    let x = random_rows(&mut rng, 9, k);
    let rows: Vec<&[f32]> = x.iter().map(Vec::as_slice).collect();
    let got = Int8Weight::from_quantized(&w).matmul(&rows);
    let exact = reference(&w, &x.iter().map(|r| r.iter().map(|&v| v as f64).collect()).collect::<Vec<_>>());
    let dense = w.dequantize();
    let mut max_err = 0f64;
    for (r, xr) in x.iter().enumerate() {
        let steps: Vec<f64> = xr
            .chunks(QUANT_BLOCK)
            .flat_map(|b| {
                let step = b.iter().fold(0f32, |a, &v| a.max(v.abs())) as f64 / 127.0;
                std::iter::repeat_n(step, QUANT_BLOCK)
            })
            .collect();
        for (c, wr) in dense.chunks_exact(k).enumerate() {
            let bound: f64 = wr.iter().zip(&steps).map(|(&a, &s)| a.abs() as f64 * s / 2.0).sum();
            let err = (got[r * n + c] as f64 - exact[r * n + c].0).abs();
            assert!(err <= bound * 1.001 + 1e-6, "row {r} col {c}: error {err} above {bound}");
            max_err = max_err.max(err);
        }
    }
    assert!(max_err > 1e-5, "8-bit activations cannot be exact: {max_err}");
}

#[test]
fn activation_rounding_follows_the_definition() {
    let x: Vec<f32> = (0..64).map(|i| if i < 32 { (i as f32 - 10.0) * 0.25 } else { 0.0 }).collect();
    let acts = quantize_activations(&[&x], 64, 2);
    let d = 21.0 * 0.25 / 127.0;
    assert_eq!(acts.scales, vec![d, 0.0]);
    for (i, &c) in acts.codes.iter().enumerate() {
        let q = if i < 32 { (x[i] / d).round_ties_even() as i32 } else { 0 };
        assert_eq!(i32::from(c), q, "element {i}");
    }
    assert_eq!(acts.codes[31], 127, "the largest magnitude maps to 127");
    let low: i32 = acts.codes[..16].iter().map(|&c| i32::from(c)).sum();
    let high: i32 = acts.codes[16..32].iter().map(|&c| i32::from(c)).sum();
    assert_eq!(acts.code_sums, vec![low, high, 0, 0]);
    assert!((acts.sums[0] - d * (low + high) as f32).abs() < 1e-6);
    let one_sub = quantize_activations(&[&x], 64, 1);
    assert_eq!(one_sub.code_sums, vec![low + high, 0]);
}

#[test]
fn many_rows_round_in_parallel_to_the_bytes_of_one_row_at_a_time() {
    let mut rng = StdRng::seed_from_u64(21);
    // 40 x 2048 values: past the size below which rounding stays on the calling thread.
    let rows = random_rows(&mut rng, 40, 2048);
    let refs: Vec<&[f32]> = rows.iter().map(Vec::as_slice).collect();
    for subs in [1, 2] {
        let all = quantize_activations(&refs, 2048, subs);
        for (r, row) in refs.iter().enumerate() {
            let one = quantize_activations(&[row], 2048, subs);
            assert_eq!(&all.codes[r * 2048..(r + 1) * 2048], one.codes.as_slice(), "row {r}");
            assert_eq!(&all.scales[r * 64..(r + 1) * 64], one.scales.as_slice());
            assert_eq!(&all.code_sums[r * 64 * subs..(r + 1) * 64 * subs], one.code_sums.as_slice());
            assert_eq!(&all.sums[r * 64..(r + 1) * 64], one.sums.as_slice());
        }
    }
}

#[test]
fn padding_columns_are_never_written_and_empty_inputs_work() {
    let mut rng = StdRng::seed_from_u64(13);
    let w = random_weight(&mut rng, QuantFormat::Q4_1, 40, 64);
    let int8 = Int8Weight::from_quantized(&w);
    let x = random_rows(&mut rng, 3, 64);
    let rows: Vec<&[f32]> = x.iter().map(Vec::as_slice).collect();
    for (name, kern) in kernels() {
        let got = int8.matmul_with(&rows, kern);
        let want = reference(&w, &x.iter().map(|r| rounded(r)).collect::<Vec<_>>());
        for (i, (&g, &(v, mag))) in got.iter().zip(&want).enumerate() {
            assert!((g as f64 - v).abs() <= 2e-6 * mag + 1e-30, "{name} element {i}: {g} vs {v}");
        }
    }
    assert!(int8.matmul(&[]).is_empty());
    // Q8_0 codes plus a scale per block and column: 1.125 bytes per weight.
    let q8 = Int8Weight::from_quantized(&random_weight(&mut rng, QuantFormat::Q8_0, 64, 256));
    assert_eq!(q8.size_in_bytes(), 64 * 256 + 4 * 64 * 8);
    // 4-bit formats keep two codes per byte: with scales and minimums, 0.75 bytes per weight,
    // as their GGUF blocks in memory.
    let q4 = random_weight(&mut rng, QuantFormat::Q4_1, 64, 256);
    assert_eq!(Int8Weight::from_quantized(&q4).size_in_bytes(), 64 * 256 / 2 + 2 * 4 * 64 * 8);
    assert_eq!(Int8Weight::from_quantized(&q4).size_in_bytes(), q4.size_in_bytes());
}

#[test]
fn every_activation_rounding_build_gives_the_same_bytes() {
    let mut rng = StdRng::seed_from_u64(14);
    let mut blocks: Vec<Vec<f32>> =
        (0..200).map(|_| (0..32).map(|_| rng.random_range(-3.0..3.0)).collect()).collect();
    blocks.push(vec![0.0; 32]);
    // Exact ties of x / d at half steps, and a lone large value.
    blocks.push((0..32).map(|i| if i == 0 { 127.0 } else { i as f32 - 0.5 }).collect());
    blocks.push((0..32).map(|i| if i == 5 { -1e6 } else { 1e-3 * i as f32 }).collect());
    for x in &blocks {
        let mut want = [0i8; 32];
        let want_ds = quantize_block_portable(x, &mut want);
        let mut roundings = vec![("default", quantize_block())];
        #[cfg(target_arch = "x86_64")]
        roundings.extend(crate::matmul::int8_matmul_avx2::quantize_block().map(|r| ("avx2", r)));
        for (name, rounding) in roundings {
            let mut got = [0i8; 32];
            let got_ds = rounding(x, &mut got);
            assert_eq!((got, got_ds), (want, want_ds), "{name}: {x:?}");
        }
    }
}

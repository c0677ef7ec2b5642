//! kernels/fp8_matmul.cu on the CPU simulator, through the launches the CUDA path makes:
//! against the CPU references of `DeviceFp8Weight` (exact code values, f32 sums, the row's
//! scale), in f16 and bf16, with codes over e4m3's whole normal range, zero rows, strided x,
//! one to four tiles of rows and outputs poisoned with NaN; and the dequantization bit for bit.

use candle_core::{DType, Device};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::fp8::{self, Fp8Pointers};
use super::sim_tests::{f32_values, random, rel_err, run, tolerance, HostBuf};
use crate::{DeviceFp8Weight, Fp8Weight};

/// A random `[rows, cols]` weight whose elements span many binades (so the codes use most
/// exponents, and some round to zero or the smallest normal), with row 1 all zeros.
fn weight(rng: &mut StdRng, rows: usize, cols: usize) -> DeviceFp8Weight {
    let values: Vec<f32> = (0..rows * cols)
        .map(|i| {
            if i / cols == 1 {
                0.0
            } else {
                rng.random_range(-1.0f32..1.0) * 2f32.powi(-rng.random_range(0..14))
            }
        })
        .collect();
    DeviceFp8Weight::new(&Fp8Weight::quantize(rows, cols, &values).unwrap(), &Device::Cpu).unwrap()
}

/// The weight's bytes as a host buffer standing in for device memory, and its arrays there.
fn on_sim(w: &DeviceFp8Weight) -> (HostBuf, Fp8Pointers) {
    let bytes: Vec<u8> = w.bytes_and_pointers(0).0.to_vec1().unwrap();
    let words = bytes.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    let mut buf = HostBuf::words(words);
    let base = buf.addr(0);
    (buf, w.bytes_and_pointers(base).1)
}

#[test]
fn fp8_matmul_matches_cpu_and_ignores_the_other_rows() {
    let mut rng = StdRng::seed_from_u64(31);
    for dtype in [DType::F16, DType::BF16] {
        for (m, n, k) in [(1, 16, 64), (3, 40, 576), (8, 33, 128), (5, 17, 1024), (12, 24, 192), (32, 17, 64)]
        {
            let w = weight(&mut rng, n, k);
            let (_w_buf, pointers) = on_sim(&w);
            let pad = 8;
            let wide = random(&mut rng, &[m, k + pad], dtype);
            let x = wide.narrow(1, 0, k).unwrap();
            let want = f32_values(&w.matmul(&x).unwrap());
            let sim_matmul = |rows: usize, first: usize| {
                let mut xb = HostBuf::of(&wide);
                let mut out = HostBuf::poisoned(dtype, rows * n);
                let x_addr = xb.addr(first * (k + pad));
                run(fp8::fp8_matmul(dtype, x_addr, k + pad, &pointers, out.addr(0), n, rows).unwrap());
                out.to_f32()
            };
            let got = sim_matmul(m, 0);
            let err = rel_err(&got, &want);
            assert!(err <= tolerance(dtype), "{dtype:?} {m}x{n}x{k}: {err}");
            assert!(got[..m * n].iter().skip(1).step_by(n).all(|&v| v == 0.0), "row 1 is zeros");
            // The last row alone gives the same bits as among the others.
            let alone = sim_matmul(1, m - 1);
            assert_eq!(
                alone.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                got[(m - 1) * n..].iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "{dtype:?} {m}x{n}x{k}: last row alone"
            );
        }
    }
}

#[test]
fn fp8_dequantize_matches_cpu_bit_for_bit() {
    let mut rng = StdRng::seed_from_u64(32);
    let (rows, cols) = (7, 48);
    let w = weight(&mut rng, rows, cols);
    let (_w_buf, pointers) = on_sim(&w);
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let want = f32_values(&w.dequantize(dtype).unwrap());
        let mut out = HostBuf::poisoned(dtype, rows * cols);
        run(fp8::fp8_dequantize(dtype, &pointers, out.addr(0)).unwrap());
        let got = out.to_f32();
        assert_eq!(
            got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            "{dtype:?}"
        );
    }
}

#[test]
fn fp8_quantize_makes_the_cpus_codes_and_scales_bit_for_bit() {
    let mut rng = StdRng::seed_from_u64(33);
    let (rows, cols) = (7, 96);
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        // Many binades (codes near and below the smallest normal, ties), and a row of zeros.
        let values: Vec<f32> = (0..rows * cols)
            .map(|i| {
                if i / cols == 2 {
                    0.0
                } else {
                    rng.random_range(-1.0f32..1.0) * 2f32.powi(-rng.random_range(0..16))
                }
            })
            .collect();
        let dense = candle_core::Tensor::from_vec(values, (rows, cols), &Device::Cpu)
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        let want = DeviceFp8Weight::quantize(&dense).unwrap();
        let want_bytes: Vec<u8> = want.bytes_and_pointers(0).0.to_vec1().unwrap();
        let mut input = HostBuf::of(&dense);
        let mut out = HostBuf::poisoned(DType::U32, want_bytes.len() / 4);
        let pointers = want.bytes_and_pointers(out.addr(0)).1;
        run(fp8::fp8_quantize(dtype, input.addr(0), &pointers).unwrap());
        let HostBuf::U32(words) = &out else { unreachable!("a word buffer") };
        let got: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        // The padding between codes and scales is the kernel's to leave.
        let codes = rows * cols;
        assert_eq!(got[..codes], want_bytes[..codes], "{dtype:?} codes");
        let scales_at = want_bytes.len() - 4 * rows;
        assert_eq!(got[scales_at..], want_bytes[scales_at..], "{dtype:?} scales");
    }
}

//! kernels/quant_matmul.cu on the CPU simulator, through the launches the CUDA path makes:
//! every GGUF format the device keeps, against the CPU references of `DeviceQuantWeight`
//! (the weight rounded to the activations' dtype, f32 sums), with strided x, widths that end
//! in a partial fetch, one to four tiles of rows and outputs poisoned with NaN.

use candle_core::{DType, Device};
use rand::rngs::StdRng;
use rand::SeedableRng;

use super::quant;
use super::sim_tests::{f32_values, random, rel_err, run, tolerance, HostBuf};
use crate::matmul::quant_weight::tests::small_random_weight;
use crate::{DeviceQuantWeight, QuantFormat};

/// A random `[rows, cols]` weight of `format` with scales around 0.01.
fn weight(rng: &mut StdRng, format: QuantFormat, rows: usize, cols: usize) -> DeviceQuantWeight {
    DeviceQuantWeight::new(&small_random_weight(rng, format, rows, cols), &Device::Cpu).unwrap()
}

/// The weight's bytes as a host buffer standing in for device memory, and its arrays there.
fn on_sim(w: &DeviceQuantWeight) -> (HostBuf, quant::QuantPointers) {
    let bytes: Vec<u8> = w.bytes_and_pointers(0).0.to_vec1().unwrap();
    let words = bytes.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    let mut buf = HostBuf::words(words);
    let base = buf.addr(0);
    (buf, w.bytes_and_pointers(base).1)
}

/// The error allowed against the reference: the dtype's, twice over for the packed bf16
/// dequantization of the 4- to 6-bit formats (scale and minimum rounded to bf16, so a weight is
/// within about 1.5 bf16 units of the reference's instead of half a unit).
fn allowed(format: QuantFormat, dtype: DType) -> f32 {
    match (format, dtype) {
        (QuantFormat::Q8_0, _) | (_, DType::F16) => tolerance(dtype),
        _ => 2.0 * tolerance(dtype),
    }
}

/// Shapes `(m, n, cols)` a format takes: widths of whole fetches and of a partial last one.
fn shapes(format: QuantFormat) -> Vec<(usize, usize, usize)> {
    match format.gguf_block_elems() {
        256 => vec![(1, 16, 256), (3, 40, 512), (8, 33, 768), (5, 17, 2304), (12, 24, 512), (32, 17, 256)],
        _ => vec![(1, 16, 128), (3, 40, 96), (8, 33, 576), (6, 70, 32), (16, 20, 160), (27, 33, 96)],
    }
}

#[test]
fn quant_matmul_matches_cpu_in_every_format_and_ignores_the_other_rows() {
    let mut rng = StdRng::seed_from_u64(21);
    for format in QuantFormat::ALL {
        for dtype in [DType::F16, DType::BF16] {
            for (m, n, k) in shapes(format) {
                let w = weight(&mut rng, format, n, k);
                let (_w_buf, pointers) = on_sim(&w);
                let pad = 8;
                let wide = random(&mut rng, &[m, k + pad], dtype);
                let x = wide.narrow(1, 0, k).unwrap();
                let want = f32_values(&w.matmul(&x).unwrap());
                let sim_matmul = |rows: usize, first: usize, launch: Option<quant::QuantLaunch>| {
                    let mut xb = HostBuf::of(&wide);
                    let mut out = HostBuf::poisoned(dtype, rows * n);
                    let x_addr = xb.addr(first * (k + pad));
                    run(quant::quant_matmul(dtype, x_addr, k + pad, &pointers, out.addr(0), n, rows, launch)
                        .unwrap());
                    out.to_f32()
                };
                let got = sim_matmul(m, 0, None);
                let err = rel_err(&got, &want);
                assert!(err <= allowed(format, dtype), "{format:?} {dtype:?} {m}x{n}x{k}: {err}");
                // Other spreads (the timing sweep's; pipelined applies to one tile) split K
                // differently: the same values.
                for (warps, pipelined) in [(1, false), (8, false), (1, true), (4, true)] {
                    let launch = Some(quant::QuantLaunch { warps, pipelined });
                    let err = rel_err(&sim_matmul(m, 0, launch), &want);
                    assert!(
                        err <= allowed(format, dtype),
                        "{format:?} {dtype:?} {m}x{n}x{k} {launch:?}: {err}"
                    );
                }
                // The last row alone gives the same bits as among the others.
                let alone = sim_matmul(1, m - 1, None);
                assert_eq!(
                    alone.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    got[(m - 1) * n..].iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    "{format:?} {dtype:?} {m}x{n}x{k}: last row alone"
                );
            }
        }
    }
}

#[test]
fn quant_dequantize_matches_cpu_bit_for_bit() {
    let mut rng = StdRng::seed_from_u64(22);
    for format in QuantFormat::ALL {
        let (rows, cols) = (7, 2 * format.gguf_block_elems());
        let w = weight(&mut rng, format, rows, cols);
        let (_w_buf, pointers) = on_sim(&w);
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let want = f32_values(&w.dequantize(dtype).unwrap());
            let mut out = HostBuf::poisoned(dtype, rows * cols);
            run(quant::quant_dequantize(dtype, &pointers, out.addr(0)).unwrap());
            let got = out.to_f32();
            assert_eq!(
                got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "{format:?} {dtype:?}"
            );
        }
    }
}

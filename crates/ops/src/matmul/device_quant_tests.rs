//! `DeviceQuantWeight` on the CPU: the uploaded arrays read back to the same matrix, and the
//! references of its two ops agree with the host blocks' own dequantization.

use candle_core::{DType, Device, Tensor};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;
use crate::matmul::quant_weight::tests::small_random_weight as host_weight;

#[test]
fn uploaded_arrays_dequantize_to_the_blocks_values() {
    let mut rng = StdRng::seed_from_u64(5);
    for format in QuantFormat::ALL {
        let (rows, cols) = (9, 2 * format.gguf_block_elems());
        let host = host_weight(&mut rng, format, rows, cols);
        let w = DeviceQuantWeight::new(&host, &Device::Cpu).unwrap();
        assert_eq!((w.format(), w.rows(), w.cols()), (format, rows, cols));
        assert!(w.size_in_bytes() >= host.size_in_bytes() && w.size_in_bytes() <= host.size_in_bytes() + 64);
        let dense: Vec<f32> = w.dequantize(DType::F32).unwrap().flatten_all().unwrap().to_vec1().unwrap();
        assert_eq!(dense, host.dequantize(), "{format:?}");
        let bf: Vec<f32> = w
            .dequantize(DType::BF16)
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let rounded: Vec<f32> = host.dequantize().iter().map(|&v| half::bf16::from_f32(v).to_f32()).collect();
        assert_eq!(bf, rounded, "{format:?}");
    }
}

#[test]
fn matmul_and_forward_multiply_the_dequantized_weight() {
    let mut rng = StdRng::seed_from_u64(6);
    for format in QuantFormat::ALL {
        let (rows, cols) = (12, format.gguf_block_elems());
        let host = host_weight(&mut rng, format, rows, cols);
        let w = DeviceQuantWeight::new(&host, &Device::Cpu).unwrap();
        let dense = Tensor::from_vec(host.dequantize(), (rows, cols), &Device::Cpu).unwrap();
        for m in [1, 8, 13] {
            let values: Vec<f32> = (0..m * cols).map(|_| rng.random_range(-1.0f32..1.0)).collect();
            let x = Tensor::from_vec(values, (m, cols), &Device::Cpu).unwrap();
            let want: Vec<f32> =
                x.matmul(&dense.t().unwrap()).unwrap().flatten_all().unwrap().to_vec1().unwrap();
            for got in [w.matmul(&x).unwrap(), w.forward(&x).unwrap()] {
                assert_eq!(got.dims(), &[m, rows]);
                let got: Vec<f32> = got.flatten_all().unwrap().to_vec1().unwrap();
                let scale = want.iter().fold(1e-6f32, |a, v| a.max(v.abs()));
                let worst = got.iter().zip(&want).map(|(g, w)| (g - w).abs()).fold(0f32, f32::max);
                assert!(worst / scale < 1e-5, "{format:?} m = {m}: {worst}");
            }
        }
        // The CPU never takes the device kernel; a width that differs is an error.
        let x = Tensor::zeros((1, cols), DType::BF16, &Device::Cpu).unwrap();
        assert!(!w.kernel_takes(&x));
        assert!(w.matmul(&Tensor::zeros((1, cols + 32), DType::F32, &Device::Cpu).unwrap()).is_err());
    }
}

//! rms_norm / add_rms_norm against a straightforward candle reference, silu_and_mul against
//! candle's silu * mul.

mod common;

use candle_core::{DType, Device, Result, Tensor, D};
use common::{assert_close, random_tensor, rng, values};
use pagoda_ops::{add_rms_norm, rms_norm, silu_and_mul};

fn reference_rms_norm(x: &Tensor, w: &Tensor, eps: f32) -> Result<Tensor> {
    let xf = x.to_dtype(DType::F32)?;
    let rms = (xf.sqr()?.mean_keepdim(D::Minus1)? + eps as f64)?.sqrt()?;
    xf.broadcast_div(&rms)?.broadcast_mul(&w.to_dtype(DType::F32)?)?.to_dtype(x.dtype())
}

fn tolerance(dtype: DType) -> (f32, f32) {
    if dtype == DType::F32 {
        (1e-5, 1e-5)
    } else {
        (1e-2, 1e-2)
    }
}

#[test]
fn rms_norm_matches_reference() {
    for (seed, dtype) in [(1, DType::F32), (2, DType::BF16), (3, DType::F16)] {
        let mut rng = rng(seed);
        for shape in [vec![7usize, 576], vec![2, 5, 64], vec![1, 3]] {
            let x = (random_tensor(&mut rng, &shape, dtype).unwrap() * 3.0).unwrap();
            let w = random_tensor(&mut rng, &[*shape.last().unwrap()], DType::F32).unwrap();
            let out = rms_norm(&x, &w, 1e-5).unwrap();
            assert_eq!(out.dtype(), dtype);
            let (atol, rtol) = tolerance(dtype);
            let what = format!("{dtype:?} {shape:?}");
            assert_close(&out, &reference_rms_norm(&x, &w, 1e-5).unwrap(), atol, rtol, &what);
            // A weight stored in x's dtype gives the same result as the f32 copy of it.
            let w_same = w.to_dtype(dtype).unwrap().to_dtype(DType::F32).unwrap();
            let a = rms_norm(&x, &w_same.to_dtype(dtype).unwrap(), 1e-5).unwrap();
            let b = rms_norm(&x, &w_same, 1e-5).unwrap();
            assert_eq!(values(&a), values(&b));
        }
    }
}

#[test]
fn eps_matters_for_small_inputs() {
    let cpu = &Device::Cpu;
    let x = Tensor::new(&[[1e-3f32, -1e-3]], cpu).unwrap();
    let w = Tensor::new(&[1f32, 1.0], cpu).unwrap();
    // mean(x^2) = 1e-6; with eps 3e-6 the rms is 2e-3, so outputs are +-0.5.
    let out = rms_norm(&x, &w, 3e-6).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
    assert!((out[0] - 0.5).abs() < 1e-4 && (out[1] + 0.5).abs() < 1e-4, "{out:?}");
}

#[test]
fn add_rms_norm_returns_sum_and_its_norm() {
    for (seed, dtype) in [(4, DType::F32), (5, DType::BF16), (6, DType::F16)] {
        let mut rng = rng(seed);
        let x = random_tensor(&mut rng, &[9, 128], dtype).unwrap();
        let r = random_tensor(&mut rng, &[9, 128], dtype).unwrap();
        let w = random_tensor(&mut rng, &[128], dtype).unwrap();
        let (normed, sum) = add_rms_norm(&x, &r, &w, 1e-6).unwrap();
        assert_eq!((normed.dims(), sum.dims()), (&[9usize, 128][..], &[9usize, 128][..]));
        assert_eq!((normed.dtype(), sum.dtype()), (dtype, dtype));
        // The sum is computed in f32 and rounded once: exactly what candle's f32 add then cast gives.
        let expected_sum = (x.to_dtype(DType::F32).unwrap() + r.to_dtype(DType::F32).unwrap())
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        assert_eq!(values(&sum), values(&expected_sum), "{dtype:?}");
        // normed is bit-identical to the unfused rms_norm of the returned sum.
        assert_eq!(values(&normed), values(&rms_norm(&sum, &w, 1e-6).unwrap()), "{dtype:?}");
        let (atol, rtol) = tolerance(dtype);
        assert_close(&normed, &reference_rms_norm(&expected_sum, &w, 1e-6).unwrap(), atol, rtol, "normed");
    }
}

#[test]
fn strided_row_views_are_accepted() {
    let mut rng = rng(7);
    // x as the first 64 columns of a [5, 96] buffer.
    let wide = random_tensor(&mut rng, &[5, 96], DType::F32).unwrap();
    let x = wide.narrow(1, 0, 64).unwrap();
    let w = random_tensor(&mut rng, &[64], DType::F32).unwrap();
    assert_eq!(
        values(&rms_norm(&x, &w, 1e-5).unwrap()),
        values(&rms_norm(&x.contiguous().unwrap(), &w, 1e-5).unwrap())
    );
    let r = wide.narrow(1, 32, 64).unwrap();
    let (n1, s1) = add_rms_norm(&x, &r, &w, 1e-5).unwrap();
    let (n2, s2) = add_rms_norm(&x.contiguous().unwrap(), &r.contiguous().unwrap(), &w, 1e-5).unwrap();
    assert_eq!((values(&n1), values(&s1)), (values(&n2), values(&s2)));
}

#[test]
fn norm_arguments_are_validated() {
    let mut rng = rng(8);
    let x = random_tensor(&mut rng, &[3, 16], DType::F32).unwrap();
    let w = random_tensor(&mut rng, &[16], DType::F32).unwrap();
    let w_bad = random_tensor(&mut rng, &[15], DType::F32).unwrap();
    assert!(rms_norm(&x, &w_bad, 1e-5).is_err());
    assert!(rms_norm(&x, &w, -1.0).is_err());
    assert!(rms_norm(&x, &w, f32::NAN).is_err());
    assert!(rms_norm(&x.to_dtype(DType::U32).unwrap(), &w, 1e-5).is_err());
    let r_bad = random_tensor(&mut rng, &[2, 16], DType::F32).unwrap();
    assert!(add_rms_norm(&x, &r_bad, &w, 1e-5).is_err());
    let r16 = x.to_dtype(DType::BF16).unwrap();
    assert!(add_rms_norm(&x, &r16, &w, 1e-5).is_err());
    assert!(add_rms_norm(&x, &x, &w_bad, 1e-5).is_err());
}

#[test]
fn silu_and_mul_matches_candle() {
    for (seed, dtype) in [(9, DType::F32), (10, DType::BF16), (11, DType::F16)] {
        let mut rng = rng(seed);
        let gate = (random_tensor(&mut rng, &[13, 1536], dtype).unwrap() * 6.0).unwrap();
        let up = random_tensor(&mut rng, &[13, 1536], dtype).unwrap();
        let out = silu_and_mul(&gate, &up).unwrap();
        assert_eq!(out.dtype(), dtype);
        let expected = (gate.to_dtype(DType::F32).unwrap().silu().unwrap()
            * up.to_dtype(DType::F32).unwrap())
        .unwrap()
        .to_dtype(dtype)
        .unwrap();
        let (atol, rtol) = if dtype == DType::F32 { (1e-6, 1e-6) } else { (1e-2, 1e-2) };
        assert_close(&out, &expected, atol, rtol, &format!("{dtype:?}"));
    }
}

#[test]
fn silu_and_mul_reads_halves_of_a_fused_projection() {
    let mut rng = rng(12);
    let fused = random_tensor(&mut rng, &[4, 2 * 48], DType::F32).unwrap();
    let (gate, up) = (fused.narrow(1, 0, 48).unwrap(), fused.narrow(1, 48, 48).unwrap());
    let a = silu_and_mul(&gate, &up).unwrap();
    let b = silu_and_mul(&gate.contiguous().unwrap(), &up.contiguous().unwrap()).unwrap();
    assert!(a.is_contiguous());
    assert_eq!(values(&a), values(&b));
}

#[test]
fn silu_and_mul_arguments_are_validated() {
    let mut rng = rng(13);
    let g = random_tensor(&mut rng, &[2, 8], DType::F32).unwrap();
    let u = random_tensor(&mut rng, &[2, 7], DType::F32).unwrap();
    assert!(silu_and_mul(&g, &u).is_err());
    assert!(silu_and_mul(&g, &g.to_dtype(DType::F16).unwrap()).is_err());
    let gi = g.to_dtype(DType::U32).unwrap();
    assert!(silu_and_mul(&gi, &gi).is_err());
}

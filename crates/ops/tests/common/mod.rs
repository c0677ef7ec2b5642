//! Helpers shared by the integration tests: seeded random data and closeness checks.
#![allow(dead_code)] // each test binary uses a different subset

use candle_core::{DType, Device, Result, Tensor};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

pub fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

/// Uniform values in [-1, 1).
pub fn uniform(rng: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect()
}

/// A random f32 tensor of `shape`, converted to `dtype`.
pub fn random_tensor(rng: &mut StdRng, shape: &[usize], dtype: DType) -> Result<Tensor> {
    let n = shape.iter().product();
    Tensor::from_vec(uniform(rng, n), shape, &Device::Cpu)?.to_dtype(dtype)
}

/// Values as f32, flattened.
pub fn values(t: &Tensor) -> Vec<f32> {
    t.to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1().unwrap()
}

/// Fails with the worst element unless `|a - b| <= atol + rtol * |b|` everywhere.
pub fn assert_close(actual: &Tensor, expected: &Tensor, atol: f32, rtol: f32, what: &str) {
    assert_eq!(actual.dims(), expected.dims(), "{what}: shape");
    let (a, b) = (values(actual), values(expected));
    // Worst offending element (NaN counts as the worst), if any.
    let mut worst: Option<(usize, f32)> = None;
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        let excess = (x - y).abs() - (atol + rtol * y.abs());
        let bad = excess.is_nan() || excess > 0.0;
        let worse = match worst {
            None => true,
            Some((_, w)) => !w.is_nan() && (excess.is_nan() || excess > w),
        };
        if bad && worse {
            worst = Some((i, excess));
        }
    }
    if let Some((i, _)) = worst {
        panic!("{what}: element {i} is {} but expected {} (atol {atol}, rtol {rtol})", a[i], b[i]);
    }
}

/// The error message of a failed call, for checking what was reported.
pub fn err_text<T: std::fmt::Debug>(r: Result<T>) -> String {
    r.expect_err("expected an error").to_string()
}

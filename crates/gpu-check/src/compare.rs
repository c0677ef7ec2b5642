//! How CUDA results are compared with the CPU reference.

use candle_core::DType;

/// Largest absolute difference over the largest reference magnitude (a norm-wise relative
/// error, so values near zero do not dominate). A non-finite result counts as infinitely
/// wrong: outputs are poisoned with NaN before each run, so an unwritten element shows here.
pub fn rel_err(got: &[f32], want: &[f32]) -> f32 {
    if got.len() != want.len() {
        return f32::INFINITY;
    }
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
    let worst = got
        .iter()
        .zip(want)
        .map(|(g, w)| if g.is_finite() { (g - w).abs() } else { f32::INFINITY })
        .fold(0f32, f32::max);
    worst / scale
}

/// The largest acceptable [`rel_err`] of an op whose storage is `dtype`: f32 math in every
/// case, so the gap is rounding of the result (and, for tensor cores, of P) to the dtype.
pub fn tolerance(dtype: DType) -> f32 {
    match dtype {
        DType::BF16 => 1e-2,
        DType::F16 => 5e-3,
        _ => 1e-5,
    }
}

/// The index of a row's largest value (the first of equal ones): a greedy choice.
pub fn argmax(row: &[f32]) -> u32 {
    row.iter()
        .enumerate()
        .fold((0, f32::NEG_INFINITY), |(bi, bv), (i, &v)| if v > bv { (i, v) } else { (bi, bv) })
        .0 as u32
}

/// Fraction of positions where two token streams agree.
pub fn agreement(a: &[u32], b: &[u32]) -> f64 {
    let n = a.len().max(b.len());
    if n == 0 {
        return 1.0;
    }
    a.iter().zip(b).filter(|(x, y)| x == y).count() as f64 / n as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rel_err_is_normwise_and_flags_non_finite_values() {
        assert_eq!(rel_err(&[1.0, 2.0], &[1.0, 2.0]), 0.0);
        assert!((rel_err(&[1.0, 2.1], &[1.0, 2.0]) - 0.05).abs() < 1e-6);
        assert_eq!(rel_err(&[f32::NAN, 2.0], &[1.0, 2.0]), f32::INFINITY);
        assert_eq!(rel_err(&[1.0], &[1.0, 2.0]), f32::INFINITY);
        assert!(tolerance(DType::BF16) > tolerance(DType::F16));
        assert!(tolerance(DType::F16) > tolerance(DType::F32));
    }

    #[test]
    fn argmax_takes_the_first_largest() {
        assert_eq!(argmax(&[0.5, 2.0, -1.0, 2.0]), 1);
        assert_eq!(argmax(&[f32::NEG_INFINITY, -3.0]), 1);
    }

    #[test]
    fn agreement_counts_equal_positions() {
        assert_eq!(agreement(&[1, 2, 3, 4], &[1, 2, 0, 4]), 0.75);
        assert_eq!(agreement(&[1, 2], &[1, 2, 3, 4]), 0.5);
        assert_eq!(agreement(&[], &[]), 1.0);
    }
}

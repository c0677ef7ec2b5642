//! `erf` and the GELU against float64 references written here: the Taylor series of `erf`
//! below 2.5 and the continued fraction of `erfc` above.

use super::*;

/// `erf(x)` in f64 by its Taylor series (|x| < 2.5: at most ~1e-13 lost to cancellation).
fn erf_series(x: f64) -> f64 {
    let (mut term, mut sum, x2) = (x, x, x * x);
    for n in 1..200 {
        term *= -x2 / n as f64;
        let next = term / (2 * n + 1) as f64;
        sum += next;
        if next.abs() < 1e-18 * sum.abs() {
            break;
        }
    }
    sum * 2.0 / std::f64::consts::PI.sqrt()
}

/// `erfc(x)` in f64: `2 - erfc(-x)` below 0, the series below 2.5, the continued fraction
/// `e^-x^2 / sqrt(pi) / (x + (1/2) / (x + 1 / (x + (3/2) / (x + ...))))` at and above.
fn erfc_ref(x: f64) -> f64 {
    if x < 0.0 {
        return 2.0 - erfc_ref(-x);
    }
    if x < 2.5 {
        return 1.0 - erf_series(x);
    }
    let mut tail = x;
    for k in (1..300).rev() {
        tail = x + (k as f64 / 2.0) / tail;
    }
    (-x * x).exp() / std::f64::consts::PI.sqrt() / tail
}

fn erf_ref(x: f64) -> f64 {
    if x.abs() < 2.5 {
        erf_series(x)
    } else {
        x.signum() * (1.0 - erfc_ref(x.abs()))
    }
}

fn gelu_ref(x: f64) -> f64 {
    x * 0.5 * erfc_ref(-x / std::f64::consts::SQRT_2)
}

/// Inputs from -14 to 14, denser near 0, plus some tiny ones.
fn inputs() -> Vec<f32> {
    let mut xs: Vec<f32> = (-14_000..=14_000).map(|i| i as f32 * 1e-3).collect();
    xs.extend((0..2000).map(|i| (i as f32 - 1000.0) * 1.37e-5));
    xs.extend([1e-30, -1e-30, 1e-8, -3e-7, 0.5, -0.5, 0.499_999_97, -0.500_000_06]);
    xs
}

#[test]
fn erf_is_within_3e7_relative_of_f64() {
    assert!((erf_series(1.0) - 0.842_700_792_949_714_9).abs() < 1e-15);
    assert!((erfc_ref(3.0) - 2.209_049_699_858_544e-5).abs() < 1e-18);
    let mut worst = 0f64;
    for x in inputs() {
        let want = erf_ref(f64::from(x));
        let got = f64::from(erf(x));
        let rel = (got - want).abs() / want.abs().max(f64::MIN_POSITIVE);
        assert!(rel <= 3e-7 || x == 0.0 && got == 0.0, "erf({x}) = {got}, want {want}");
        worst = worst.max(rel);
    }
    eprintln!("erf: worst relative error {worst:.2e}");
}

#[test]
fn gelu_is_within_5e7_relative_of_f64() {
    let xs = inputs();
    let mut got = xs.clone();
    gelu_erf(&mut got);
    let mut worst = 0f64;
    for (&x, &g) in xs.iter().zip(&got) {
        let want = gelu_ref(f64::from(x));
        let err = (f64::from(g) - want).abs();
        // Values under 1e-35 (past x = -12.7, where erfc is taken as 0) are checked by size only.
        assert!(err <= 5e-7 * want.abs() || err < 1e-35, "gelu({x}) = {g}, want {want}");
        if want.abs() > 1e-30 {
            worst = worst.max(err / want.abs());
        }
    }
    eprintln!("gelu: worst relative error {worst:.2e}");
}

#[test]
fn the_portable_build_is_close_too() {
    // Without FMA the square's rounding error is dropped: the tail's error grows as x^2.
    for x in inputs() {
        let mut got = [x];
        gelu_in_place::<Separate>(&mut got);
        let want = gelu_ref(f64::from(x));
        let tolerance = 6e-7 * want.abs() * f64::from(x * x).max(1.0);
        assert!(
            (f64::from(got[0]) - want).abs() <= tolerance.max(1e-35),
            "gelu({x}) = {}, want {want}",
            got[0]
        );
    }
}

#[test]
fn the_bias_is_added_first_and_every_build_agrees() {
    let width = 96;
    let x: Vec<f32> = (0..width * 700).map(|i| (i as f32 * 0.7919).sin() * 6.0).collect();
    let bias: Vec<f32> = (0..width).map(|i| (i as f32 * 0.31).cos()).collect();
    let with_bias = add_bias_gelu_erf(&x, &bias);
    let mut summed: Vec<f32> = x.iter().zip(bias.iter().cycle()).map(|(x, b)| x + b).collect();
    gelu_erf(&mut summed);
    assert_eq!(with_bias, summed);
    #[cfg(target_arch = "x86_64")]
    if crate::simd::level() == crate::simd::Level::Avx512 {
        let (mut wide, mut narrow) = (vec![0f32; width], vec![0f32; width]);
        // SAFETY: the CPU has AVX-512F, AVX2 and FMA (checked just above).
        unsafe {
            bias_gelu_avx512(&x[..width], &bias, &mut wide);
            bias_gelu_avx2(&x[..width], &bias, &mut narrow);
        }
        assert_eq!(wide, narrow);
        assert_eq!(wide, with_bias[..width]);
    }
}

#[test]
fn special_values() {
    let mut xs = [0.0f32, -0.0, f32::INFINITY, f32::NAN, -40.0, 40.0, f32::MAX, -f32::MAX];
    gelu_erf(&mut xs);
    assert_eq!(xs[0], 0.0);
    assert_eq!(xs[1], 0.0);
    assert_eq!(xs[2], f32::INFINITY);
    assert!(xs[3].is_nan());
    assert_eq!(xs[4], 0.0);
    assert_eq!(xs[5], 40.0);
    assert_eq!(xs[6], f32::MAX);
    assert_eq!(xs[7], 0.0);
    assert_eq!(erf(0.0), 0.0);
    assert_eq!(erf(10.0), 1.0);
    assert_eq!(erf(-10.0), -1.0);
}

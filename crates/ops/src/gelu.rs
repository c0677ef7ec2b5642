//! The exact (erf) GELU, `gelu(x) = x * Phi(x)` with `Phi` the standard normal CDF, and the
//! error function it rests on, in f32 arithmetic that LLVM vectorises (the libm `erff` call
//! per element was a twelfth of a BERT encoder's step).
//!
//! `Phi(x) = erfc(-x / sqrt 2) / 2`, so the GELU is built on `erfc` of `u = |x| / sqrt 2`:
//! `Phi = erfc(u) / 2` below zero and `1 - erfc(u) / 2` above, which keeps the relative
//! accuracy of the small negative tail that `1 + erf(x / sqrt 2)` would cancel away.
//!
//! `erfc(u) = t exp(-u^2 + Q(t))` with `t = 1 / (1 + u / 2)` and `Q` a degree-9 polynomial,
//! fitted here (weighted least squares in 30-digit arithmetic, mpmath) to
//! `ln(erfc(u) / t) + u^2` over `0 <= u <= 10`: at most 5e-8 off, so `erfc` is good to about
//! 2e-7 relative once f32 rounding is counted. `u^2` is carried as two f32 values (the product
//! and its rounding error, from a fused multiply-add) into the exponential's range reduction,
//! so the large exponents of the tail lose nothing to rounding. Below `|x| = 0.5`, [`erf`]
//! uses its Taylor series instead, where `1 - erfc` would cancel.
//!
//! The slice functions pick the widest build the CPU runs (AVX-512, AVX2 with FMA) at run time.

use crate::par_rows::par_rows;
use crate::simd::{MulAdd, Separate};

/// `Q(t)`'s coefficients, constant term first.
const Q: [f32; 10] = [
    -1.265_441_5,
    0.998_492_9,
    0.387_896_8,
    0.028_371_451,
    0.020_152_915,
    -0.116_705_2,
    -0.651_349_05,
    1.122_477,
    -0.666_095_55,
    0.142_200_22,
];

/// Past this `u`, `erfc(u) < 1e-36`: taken as 0 (the GELU is then exactly `x` or `-0`; below
/// `x = -12.7` its true value is under 1e-35).
const ERFC_ZERO_FROM: f32 = 9.0;

/// `2 / sqrt(pi)`.
const TWO_OVER_SQRT_PI: f32 = std::f32::consts::FRAC_2_SQRT_PI;

/// `erf(x)` to about 3e-7 relative (one value; the scalar fused multiply-add it uses is exact
/// on every target, a library call where the CPU lacks FMA).
pub fn erf(x: f32) -> f32 {
    erf_one::<crate::simd::Fused>(x)
}

/// `erfc(u)` for `u >= 0` given `u^2 = sq_hi + sq_lo` exactly; 0 past [`ERFC_ZERO_FROM`].
#[inline(always)]
fn erfc_nonnegative<M: MulAdd>(u: f32, sq_hi: f32, sq_lo: f32) -> f32 {
    let past = u > ERFC_ZERO_FROM;
    let u = if past { ERFC_ZERO_FROM } else { u };
    let t = 1.0 / M::mul_add(0.5, u, 1.0);
    let mut q = Q[9];
    for &c in Q[..9].iter().rev() {
        q = M::mul_add(q, t, c);
    }
    // exp(-sq_hi + (q - sq_lo)): `-sq_hi` is exact and large, the rest small.
    let value = t * exp_split::<M>(-sq_hi, q - sq_lo);
    if past {
        0.0
    } else {
        value
    }
}

/// `e^(a + b)` for `a + b` in about `[-90, 1]`, with `a` exact and large and `b` small: the
/// range reduction subtracts `n ln 2` from `a` first, which is exact, so `a`'s size costs no
/// accuracy. Relative error about 1e-7.
#[inline(always)]
fn exp_split<M: MulAdd>(a: f32, b: f32) -> f32 {
    // Adding 1.5 * 2^23 rounds to an integer held in the low mantissa bits.
    const ROUND: f32 = 12_582_912.0;
    // ln 2 in two parts, the first with 15 significant bits so `n * LN2_HI` is exact.
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    let w = a + b;
    let w = if w < -87.0 { -87.0 } else { w };
    let shifted = M::mul_add(w, std::f32::consts::LOG2_E, ROUND);
    let n = shifted - ROUND;
    let n_int = (shifted.to_bits() as i32).wrapping_sub(ROUND.to_bits() as i32);
    let r = (M::mul_add(-n, LN2_HI, a) + b) - n * LN2_LO;
    // Taylor series of e^r to r^7: |r| <= 0.35 leaves under 1e-8.
    const C: [f32; 8] = [1.0, 1.0, 0.5, 1.0 / 6.0, 1.0 / 24.0, 1.0 / 120.0, 1.0 / 720.0, 1.0 / 5040.0];
    let mut p = C[7];
    for &c in C[..7].iter().rev() {
        p = M::mul_add(p, r, c);
    }
    // 2^n from its exponent bits; n >= -126 after the clamp, a normal number.
    p * f32::from_bits((n_int.wrapping_add(127) as u32) << 23)
}

/// `x^2` as an exact sum `hi + lo` (with FMA; [`Separate`] gives `lo = 0`).
#[inline(always)]
fn square_split<M: MulAdd>(x: f32) -> (f32, f32) {
    let hi = x * x;
    (hi, M::mul_add(x, x, -hi))
}

#[inline(always)]
fn erf_one<M: MulAdd>(x: f32) -> f32 {
    let a = x.abs();
    if a < 0.5 {
        // Taylor series: 2/sqrt(pi) * sum (-1)^n x^(2n+1) / (n! (2n+1)), seven terms.
        const S: [f32; 7] =
            [1.0, -1.0 / 3.0, 1.0 / 10.0, -1.0 / 42.0, 1.0 / 216.0, -1.0 / 1320.0, 1.0 / 9360.0];
        let x2 = x * x;
        let mut s = S[6];
        for &c in S[..6].iter().rev() {
            s = M::mul_add(s, x2, c);
        }
        return TWO_OVER_SQRT_PI * x * s;
    }
    let (hi, lo) = square_split::<M>(a);
    let e = 1.0 - erfc_nonnegative::<M>(a, hi, lo);
    if x < 0.0 {
        -e
    } else {
        e
    }
}

/// `x * Phi(x)`, written without branches so that a loop of it vectorises.
#[inline(always)]
fn gelu_one<M: MulAdd>(x: f32) -> f32 {
    // u^2 = x^2 / 2: halving is exact, so the split of x^2 carries over.
    let (hi, lo) = square_split::<M>(x);
    let u = x.abs() * std::f32::consts::FRAC_1_SQRT_2;
    let half_erfc = 0.5 * erfc_nonnegative::<M>(u, 0.5 * hi, 0.5 * lo);
    let phi = if x < 0.0 { half_erfc } else { 1.0 - half_erfc };
    x * phi
}

/// `values[i] = gelu(values[i])`, the exact (erf) GELU.
pub fn gelu_erf(values: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    match crate::simd::level() {
        // SAFETY: the CPU has the features each build enables (checked by `level`).
        crate::simd::Level::Avx512 => return unsafe { gelu_avx512(values) },
        crate::simd::Level::Avx2 => return unsafe { gelu_avx2(values) },
        crate::simd::Level::None => {}
    }
    gelu_in_place::<Separate>(values);
}

/// `gelu(x + bias)` for `x` holding rows as long as `bias` (a layer's output before its bias),
/// as a new `[rows, bias.len()]` buffer, rows split over rayon.
pub fn add_bias_gelu_erf(x: &[f32], bias: &[f32]) -> Vec<f32> {
    let width = bias.len();
    assert!(width > 0 && x.len().is_multiple_of(width), "{} values in rows of {width}", x.len());
    // Enough per task (about 10 us of work) to be worth handing to another thread.
    let min_rows = (1usize << 15).div_ceil(width);
    par_rows(x.len() / width, width, min_rows, 0f32, |i, dst| {
        let src = &x[i * width..(i + 1) * width];
        #[cfg(target_arch = "x86_64")]
        match crate::simd::level() {
            // SAFETY: the CPU has the features each build enables (checked by `level`).
            crate::simd::Level::Avx512 => return unsafe { bias_gelu_avx512(src, bias, dst) },
            crate::simd::Level::Avx2 => return unsafe { bias_gelu_avx2(src, bias, dst) },
            crate::simd::Level::None => {}
        }
        bias_gelu::<Separate>(src, bias, dst);
    })
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn gelu_avx512(values: &mut [f32]) {
    gelu_in_place::<crate::simd::Fused>(values);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn gelu_avx2(values: &mut [f32]) {
    gelu_in_place::<crate::simd::Fused>(values);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn bias_gelu_avx512(src: &[f32], bias: &[f32], dst: &mut [f32]) {
    bias_gelu::<crate::simd::Fused>(src, bias, dst);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn bias_gelu_avx2(src: &[f32], bias: &[f32], dst: &mut [f32]) {
    bias_gelu::<crate::simd::Fused>(src, bias, dst);
}

#[inline(always)]
fn gelu_in_place<M: MulAdd>(values: &mut [f32]) {
    for v in values.iter_mut() {
        *v = gelu_one::<M>(*v);
    }
}

#[inline(always)]
fn bias_gelu<M: MulAdd>(src: &[f32], bias: &[f32], dst: &mut [f32]) {
    for ((d, &x), &b) in dst.iter_mut().zip(src).zip(bias) {
        *d = gelu_one::<M>(x + b);
    }
}

#[cfg(test)]
#[path = "gelu_tests.rs"]
mod tests;

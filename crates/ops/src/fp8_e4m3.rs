//! The e4m3 FP8 codes Pagoda stores (FP8 weights and the FP8 KV cache): one sign bit, four
//! exponent bits (bias 7), three mantissa bits; largest finite magnitude 448, no infinities.
//!
//! Pagoda's encoder never makes a subnormal code: a value below e4m3's smallest normal (2^-6)
//! rounds to zero or to ±2^-6, whichever is nearer. Every nonzero code is then a normal number,
//! so the kernels turn codes into wider floats by moving bits (times a power of two they fold
//! into a scale), never meeting a subnormal: here [`widen_into`], on CUDA the helpers of
//! kernels/fp8.cuh.

use float8::F8E4M3;

/// e4m3's largest finite magnitude.
pub const FP8_E4M3_MAX: f32 = 448.0;

/// e4m3's smallest normal magnitude.
pub(crate) const MIN_NORMAL: f32 = 1.0 / 64.0;

/// The code nearest `v` (ties to even), subnormals excluded; magnitudes past 448 (and
/// infinities) saturate to ±448. Bit arithmetic on the f32 rather than `F8E4M3::from_f32`
/// (which goes through f64 for every format): a model's billions of weights are quantized at
/// load, and every new K/V row of a step is encoded. The tests check it against the crate.
pub(crate) fn encode(v: f32) -> u8 {
    let bits = v.to_bits();
    let sign = ((bits >> 24) & 0x80) as u8;
    let magnitude = f32::from_bits(bits & 0x7FFF_FFFF);
    if magnitude < MIN_NORMAL {
        // 0x08: exponent 1, mantissa 0, the smallest normal.
        return if magnitude > MIN_NORMAL / 2.0 { sign | 0x08 } else { sign };
    }
    // e4m3's exponent field is the f32 exponent rebased from 127 to 7; the 23 mantissa bits
    // round to 3, to nearest with ties to even, a carry moving up the exponent.
    let m = bits & 0x7F_FFFF;
    let exponent = ((bits >> 23) & 0xFF) - 120;
    let mantissa = (m + 0x7_FFFF + ((m >> 20) & 1)) >> 20;
    let field = (exponent << 3) + mantissa;
    // 0x7E is 448; 0x7F would be NaN.
    sign | field.min(0x7E) as u8
}

/// The value of an e4m3 code.
pub fn fp8_e4m3_value(code: u8) -> f32 {
    F8E4M3::from_bits(code).to_f32()
}

/// Whether `code` is one [`encode`] never makes: a subnormal or a NaN.
pub(crate) fn is_subnormal_or_nan(code: u8) -> bool {
    (code & 0x78 == 0 && code & 0x07 != 0) || code & 0x7F == 0x7F
}

/// 2^120: an e4m3 code's bits moved under an f32's exponent hold its value times 2^-120.
const WIDEN_FACTOR: f32 = f32::from_bits((127 + 120) << 23);

/// Codes into their values. The sign moves to bit 31 and the exponent-and-mantissa bits under
/// the f32 exponent, which is the value times 2^-120 (the biases differ by 120), exact also for
/// a subnormal code; one exact multiply undoes the factor. Loops of shifts, masks and
/// multiplies that vectorise, where a table lookup per code would not.
#[inline(always)]
pub(crate) fn widen_into(src: &[F8E4M3], dst: &mut [f32]) {
    for (d, s) in dst.iter_mut().zip(src) {
        let c = u32::from(s.to_bits());
        *d = f32::from_bits(((c & 0x80) << 24) | ((c & 0x7F) << 20)) * WIDEN_FACTOR;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_decode_as_e4m3_and_none_is_subnormal() {
        use rand::rngs::StdRng;
        use rand::{Rng, SeedableRng};
        assert_eq!(fp8_e4m3_value(0x7E), 448.0);
        assert_eq!(fp8_e4m3_value(0x08), MIN_NORMAL);
        assert_eq!(fp8_e4m3_value(0xB8), -1.0);
        assert_eq!(encode(448.0), 0x7E);
        assert_eq!(encode(-1.0), 0xB8);
        // Past the largest finite value: saturated, the sign kept.
        assert_eq!(encode(1e6), 0x7E);
        assert_eq!(encode(f32::NEG_INFINITY), 0xFE);
        assert_eq!(encode(464.1), 0x7E);
        // Between subnormal steps: to zero or the smallest normal, the sign kept.
        assert_eq!(encode(MIN_NORMAL * 0.4), 0);
        assert_eq!(encode(-MIN_NORMAL * 0.6), 0x88);
        assert_eq!(encode(MIN_NORMAL * 0.9), 0x08);
        // Against the crate's own rounding, over e4m3's normal range and at the ties.
        let mut rng = StdRng::seed_from_u64(7);
        let ties = (0..=255u8).filter_map(|c| {
            let (a, b) = (fp8_e4m3_value(c), fp8_e4m3_value(c.wrapping_add(1)));
            (a.is_finite() && b.is_finite() && a >= MIN_NORMAL && b <= 448.0 && b > a)
                .then_some((a + b) / 2.0)
        });
        let randoms = (0..200_000).map(|_| rng.random_range(MIN_NORMAL..448.0f32));
        for v in ties.chain(randoms).chain([MIN_NORMAL, 448.0, 447.9, 0.0234375]) {
            for v in [v, -v] {
                assert_eq!(encode(v), F8E4M3::from_f32(v).to_bits(), "{v}");
            }
        }
        for code in 0..=255u8 {
            let v = fp8_e4m3_value(code);
            if v.is_finite() && v != 0.0 && v.abs() >= MIN_NORMAL {
                assert_eq!(encode(v), code, "{code:#x}");
            }
            assert_eq!(is_subnormal_or_nan(code), !(v.is_finite() && (v == 0.0 || v.abs() >= MIN_NORMAL)));
        }
    }

    #[test]
    fn widening_gives_every_finite_code_its_value() {
        let codes: Vec<F8E4M3> = (0..=255u8).map(F8E4M3::from_bits).collect();
        let mut values = vec![0f32; 256];
        widen_into(&codes, &mut values);
        for (code, got) in codes.iter().zip(&values) {
            let want = code.to_f32();
            if want.is_finite() {
                assert_eq!(got.to_bits(), want.to_bits(), "{:#04x}", code.to_bits());
            }
        }
    }
}

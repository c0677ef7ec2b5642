//! FP8 weights: a `[rows, cols]` matrix as one e4m3 code per element and one f32 scale per row
//! (per output channel), `w[n][k] = scale[n] * e4m3(code[n][k])`. Quantized from dense rows
//! (a bf16 or f32 checkpoint) at load: each row's scale maps its largest magnitude to e4m3's
//! largest finite value, 448, and every element rounds to the nearest code (the `float8`
//! crate's conversion).
//!
//! No code is subnormal: a scaled value below e4m3's smallest normal (2^-6) rounds to zero or
//! to ±2^-6, whichever is nearer (an error of at most `scale * 2^-7`, below a 50,000th of the
//! row's largest element). The CUDA kernels then turn codes into 16-bit floats with shifts
//! alone, never meeting a subnormal (kernels/fp8_matmul.cu).

use float8::F8E4M3;
use rayon::prelude::*;

/// e4m3's largest finite magnitude.
pub const FP8_E4M3_MAX: f32 = 448.0;

/// e4m3's smallest normal magnitude.
const MIN_NORMAL: f32 = 1.0 / 64.0;

/// A matrix of e4m3 codes with a scale per row.
#[derive(Debug, Clone, PartialEq)]
pub struct Fp8Weight {
    rows: usize,
    cols: usize,
    /// Row-major `[rows, cols]` e4m3 bit patterns.
    codes: Vec<u8>,
    /// One per row.
    scales: Vec<f32>,
}

/// The code nearest `v` (`|v| <= 448`, ties to even), subnormals excluded. Bit arithmetic on
/// the f32 rather than `F8E4M3::from_f32` (which goes through f64 for every format): a model's
/// billions of weights are quantized at load. The tests check it against the crate.
fn encode(v: f32) -> u8 {
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

impl Fp8Weight {
    /// Quantizes row-major `values` of a `[rows, cols]` matrix. A row of zeros gets scale 0
    /// (and zero codes); values must be finite.
    pub fn quantize(rows: usize, cols: usize, values: &[f32]) -> Result<Self, String> {
        if values.len() != rows * cols {
            return Err(format!("{} values for a {rows} x {cols} matrix", values.len()));
        }
        if let Some(bad) = values.iter().find(|v| !v.is_finite()) {
            return Err(format!("a weight that is not finite ({bad}) cannot be quantized to fp8"));
        }
        let mut codes = vec![0u8; rows * cols];
        let width = cols.max(1);
        let scales = values
            .par_chunks_exact(width)
            .zip(codes.par_chunks_exact_mut(width))
            .map(|(row, out)| {
                let amax = row.iter().fold(0f32, |a, v| a.max(v.abs()));
                if amax == 0.0 {
                    return 0.0;
                }
                let scale = amax / FP8_E4M3_MAX;
                for (c, &v) in out.iter_mut().zip(row) {
                    // Clamped: amax / scale may round a hair past 448.
                    *c = encode((v / scale).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX));
                }
                scale
            })
            .collect();
        Ok(Self { rows, cols, codes, scales })
    }

    /// A matrix from its arrays (a weight read back from a device, tests). Subnormal and NaN
    /// codes are refused: [`Fp8Weight::quantize`] makes neither, and the kernels rely on it.
    pub fn from_arrays(rows: usize, cols: usize, codes: Vec<u8>, scales: Vec<f32>) -> Result<Self, String> {
        if codes.len() != rows * cols || scales.len() != rows {
            return Err(format!(
                "{} codes and {} scales for a {rows} x {cols} matrix",
                codes.len(),
                scales.len()
            ));
        }
        if let Some(bad) = codes.iter().find(|&&c| (c & 0x78 == 0 && c & 0x07 != 0) || c & 0x7F == 0x7F) {
            return Err(format!("code {bad:#04x} is subnormal or NaN"));
        }
        if let Some(bad) = scales.iter().find(|s| !s.is_finite()) {
            return Err(format!("a scale that is not finite: {bad}"));
        }
        Ok(Self { rows, cols, codes, scales })
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    pub fn codes(&self) -> &[u8] {
        &self.codes
    }

    pub fn scales(&self) -> &[f32] {
        &self.scales
    }

    /// Bytes of codes and scales.
    pub fn size_in_bytes(&self) -> usize {
        self.codes.len() + 4 * self.scales.len()
    }

    /// Row `n`'s values into `out` (`cols` long): `scale * value(code)`, rounded once to f32.
    pub fn dequantize_row(&self, n: usize, out: &mut [f32]) {
        let scale = self.scales[n];
        let codes = &self.codes[n * self.cols..(n + 1) * self.cols];
        for (o, &c) in out.iter_mut().zip(codes) {
            *o = scale * fp8_e4m3_value(c);
        }
    }

    /// The whole matrix, row-major.
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.rows * self.cols];
        for (n, row) in out.chunks_exact_mut(self.cols.max(1)).enumerate().take(self.rows) {
            self.dequantize_row(n, row);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

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
        }
    }

    #[test]
    fn rows_quantize_within_e4m3_precision_of_their_largest_value() {
        let mut rng = StdRng::seed_from_u64(8);
        let (rows, cols) = (7, 96);
        let mut values: Vec<f32> = (0..rows * cols).map(|_| rng.random_range(-2.0f32..2.0)).collect();
        values[3 * cols..4 * cols].iter_mut().for_each(|v| *v = 0.0);
        values[5 * cols + 7] = 300.0;
        let w = Fp8Weight::quantize(rows, cols, &values).unwrap();
        assert_eq!(w.size_in_bytes(), rows * cols + 4 * rows);
        let back = w.dequantize();
        for n in 0..rows {
            let row = &values[n * cols..(n + 1) * cols];
            let amax = row.iter().fold(0f32, |a, v| a.max(v.abs()));
            assert!((w.scales()[n] - amax / 448.0).abs() <= f32::EPSILON * amax);
            for (k, (&v, &b)) in row.iter().zip(&back[n * cols..(n + 1) * cols]).enumerate() {
                // Three mantissa bits: half a step is 1/16 of the value; below the normals a
                // fixed step of the scale.
                let bound = (v.abs() / 16.0).max(w.scales()[n] / 64.0) * 1.0001;
                assert!((v - b).abs() <= bound, "row {n} col {k}: {v} -> {b}");
            }
            // The row's largest element is exact up to the scale's rounding.
            let largest = row.iter().zip(&back[n * cols..]).max_by(|a, b| a.0.abs().total_cmp(&b.0.abs()));
            let (v, b) = largest.unwrap();
            assert!((v - b).abs() <= 1e-6 * v.abs().max(1e-30), "row {n}: {v} -> {b}");
        }
        assert!(back[3 * cols..4 * cols].iter().all(|&v| v == 0.0));
        assert!(Fp8Weight::quantize(1, 2, &[1.0, f32::NAN]).is_err());
        assert!(Fp8Weight::quantize(2, 2, &[1.0; 3]).is_err());
        let again = Fp8Weight::from_arrays(rows, cols, w.codes().to_vec(), w.scales().to_vec()).unwrap();
        assert_eq!(again, w);
        assert!(Fp8Weight::from_arrays(rows, cols, vec![0; 3], vec![0.0; rows]).is_err());
        for bad in [0x01, 0x87, 0x7F, 0xFF] {
            let mut codes = w.codes().to_vec();
            codes[5] = bad;
            assert!(Fp8Weight::from_arrays(rows, cols, codes, w.scales().to_vec()).is_err(), "{bad:#x}");
        }
    }
}

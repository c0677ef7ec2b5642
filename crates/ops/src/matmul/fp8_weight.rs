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

use rayon::prelude::*;

use crate::fp8_e4m3::{encode as encode_e4m3, fp8_e4m3_value, is_subnormal_or_nan, FP8_E4M3_MAX};

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
                    *c = encode_e4m3((v / scale).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX));
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
        if let Some(bad) = codes.iter().find(|&&c| is_subnormal_or_nan(c)) {
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

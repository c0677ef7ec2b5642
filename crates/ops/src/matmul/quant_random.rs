//! Random GGUF blocks of a given format and shape: the weights of dummy quantized models and of
//! kernel timings, where only the format and the shape matter. Codes and packed sub-block
//! scales are random bytes; each block's f16 scale (and minimum) is fixed so that the values
//! stay within about plus or minus `magnitude`, which keeps activations finite through many
//! layers.

use candle_core::Result;
use half::f16;
use rayon::prelude::*;

use crate::check::invalid;
use crate::{QuantFormat, QuantizedWeight};

/// splitmix64: a fast, seedable stream of bytes; no statistical quality is needed here.
struct Bytes(u64);

impl Bytes {
    fn fill(&mut self, out: &mut [u8]) {
        for chunk in out.chunks_mut(8) {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            chunk.copy_from_slice(&z.to_le_bytes()[..chunk.len()]);
        }
    }
}

/// Each f16 field of one GGUF block of `format` (byte offset, value) for values within about
/// `magnitude`: the scale over the largest code (times the largest sub-block scale for
/// K-quants), and a minimum of half the range below zero.
fn block_fields(format: QuantFormat, magnitude: f32) -> Vec<(usize, f32)> {
    match format {
        QuantFormat::Q4_0 => vec![(0, magnitude / 8.0)],
        QuantFormat::Q4_1 => vec![(0, magnitude / 15.0), (2, -magnitude / 2.0)],
        QuantFormat::Q5_0 => vec![(0, magnitude / 16.0)],
        QuantFormat::Q8_0 => vec![(0, magnitude / 128.0)],
        QuantFormat::Q4K => vec![(0, magnitude / (63.0 * 15.0)), (2, magnitude / (2.0 * 63.0))],
        QuantFormat::Q5K => vec![(0, magnitude / (63.0 * 31.0)), (2, magnitude / (2.0 * 63.0))],
        QuantFormat::Q6K => vec![(208, magnitude / (128.0 * 32.0))],
    }
}

impl QuantizedWeight {
    /// A `[rows, cols]` matrix of `format` with random codes, values within about
    /// `magnitude`; the same `seed` gives the same matrix. Rows are made in parallel.
    pub fn random(format: QuantFormat, rows: usize, cols: usize, magnitude: f32, seed: u64) -> Result<Self> {
        let elems = format.gguf_block_elems();
        if !cols.is_multiple_of(elems) || rows == 0 {
            return Err(invalid(
                "quantized_weight",
                format!("{format:?}: random [{rows}, {cols}] needs rows and whole {elems}-element blocks"),
            ));
        }
        let fields: Vec<(usize, [u8; 2])> = block_fields(format, magnitude)
            .into_iter()
            .map(|(at, v)| (at, f16::from_f32(v).to_le_bytes()))
            .collect();
        let block_bytes = format.gguf_block_bytes();
        let chunk_rows = rows.div_ceil(4 * rayon::current_num_threads()).max(1);
        let parts = (0..rows.div_ceil(chunk_rows))
            .into_par_iter()
            .map(|chunk| {
                let first = chunk * chunk_rows;
                let n = chunk_rows.min(rows - first);
                let mut bytes = vec![0u8; n * cols / elems * block_bytes];
                Bytes(seed ^ (first as u64).wrapping_mul(0xD1B5_4A32_D192_ED03)).fill(&mut bytes);
                for block in bytes.chunks_exact_mut(block_bytes) {
                    for (at, v) in &fields {
                        block[*at..*at + 2].copy_from_slice(v);
                    }
                }
                QuantizedWeight::from_gguf(format, n, cols, &bytes)
            })
            .collect::<Result<Vec<_>>>()?;
        match parts.len() {
            1 => Ok(parts.into_iter().next().expect("one part")),
            _ => QuantizedWeight::concat_rows(&parts.iter().collect::<Vec<_>>()),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::{QuantFormat, QuantizedWeight};

    #[test]
    fn random_weights_are_seeded_and_stay_within_their_magnitude() {
        for format in QuantFormat::ALL {
            let cols = 2 * format.gguf_block_elems();
            let a = QuantizedWeight::random(format, 37, cols, 0.05, 7).unwrap();
            assert_eq!((a.rows(), a.cols(), a.format()), (37, cols, format));
            assert_eq!(a, QuantizedWeight::random(format, 37, cols, 0.05, 7).unwrap());
            assert_ne!(a, QuantizedWeight::random(format, 37, cols, 0.05, 8).unwrap());
            let values = a.dequantize();
            let largest = values.iter().fold(0f32, |m, v| m.max(v.abs()));
            assert!(largest > 0.01 && largest <= 0.06, "{format:?}: {largest}");
            let distinct: std::collections::HashSet<u32> = values.iter().map(|v| v.to_bits()).collect();
            assert!(distinct.len() >= 16, "{format:?}: {} distinct values", distinct.len());
        }
        assert!(QuantizedWeight::random(crate::QuantFormat::Q4K, 3, 96, 0.05, 1).is_err());
    }
}

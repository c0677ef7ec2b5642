//! Block-quantized weight matrices kept in memory for [`crate::quant_matmul`].
//!
//! GGUF stores Q4_1 and Q8_0 weights as 32-element blocks with an f16 scale (and, for Q4_1, an
//! f16 minimum) inside each block. [`QuantizedWeight`] splits those into separate arrays: the
//! codes row-major, and the scales and minimums as f32. The kernels then read codes with plain
//! vector loads and a scale with one broadcast, with no f16 conversion in the inner loop. The
//! values are exactly the GGUF's: `w = d * q + m` (Q4_1, `q` in 0..16) or `w = d * q` (Q8_0,
//! `q` in -128..128).

use candle_core::Result;
use half::f16;

use crate::check::invalid;

const OP: &str = "quantized_weight";

/// Elements per block in every supported format.
pub const QUANT_BLOCK: usize = 32;

/// The GGUF block formats the quantized matmul reads directly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuantFormat {
    /// 4-bit codes with a scale and a minimum per block: `w = d * q + m`.
    Q4_1,
    /// 8-bit signed codes with a scale per block: `w = d * q`.
    Q8_0,
}

impl QuantFormat {
    /// Bytes of one block in a GGUF file.
    pub fn gguf_block_bytes(self) -> usize {
        match self {
            QuantFormat::Q4_1 => 4 + QUANT_BLOCK / 2,
            QuantFormat::Q8_0 => 2 + QUANT_BLOCK,
        }
    }

    /// Bytes of codes per block in memory.
    pub(crate) fn code_bytes(self) -> usize {
        match self {
            QuantFormat::Q4_1 => QUANT_BLOCK / 2,
            QuantFormat::Q8_0 => QUANT_BLOCK,
        }
    }
}

/// A `[rows, cols]` matrix of quantized blocks (`cols` a multiple of 32).
#[derive(Debug, Clone, PartialEq)]
pub struct QuantizedWeight {
    format: QuantFormat,
    rows: usize,
    cols: usize,
    /// Q4_1: 16 bytes per block, byte `j` holding element `j` in its low nibble and element
    /// `j + 16` in its high nibble (GGUF's order). Q8_0: 32 `i8` per block.
    codes: Vec<u8>,
    /// `d` of each block, `[rows, cols / 32]`.
    scales: Vec<f32>,
    /// `m` of each Q4_1 block, `[rows, cols / 32]`; empty for Q8_0.
    mins: Vec<f32>,
}

impl QuantizedWeight {
    /// Reads a matrix from the bytes of a GGUF tensor of `format` with GGUF shape
    /// `[cols, rows]` (innermost first), i.e. `rows` rows of `cols` elements.
    pub fn from_gguf(format: QuantFormat, rows: usize, cols: usize, bytes: &[u8]) -> Result<Self> {
        if !cols.is_multiple_of(QUANT_BLOCK) {
            return Err(invalid(OP, format!("{cols} columns is not a multiple of {QUANT_BLOCK}")));
        }
        let blocks = rows * cols / QUANT_BLOCK;
        let block_bytes = format.gguf_block_bytes();
        if bytes.len() != blocks * block_bytes {
            return Err(invalid(
                OP,
                format!(
                    "{format:?} [{rows}, {cols}] needs {} bytes, got {}",
                    blocks * block_bytes,
                    bytes.len()
                ),
            ));
        }
        let mut codes = Vec::with_capacity(blocks * format.code_bytes());
        let mut scales = Vec::with_capacity(blocks);
        let mut mins = Vec::with_capacity(if format == QuantFormat::Q4_1 { blocks } else { 0 });
        let half_at = |b: &[u8], i: usize| f16::from_le_bytes([b[i], b[i + 1]]).to_f32();
        for block in bytes.chunks_exact(block_bytes) {
            scales.push(half_at(block, 0));
            match format {
                QuantFormat::Q4_1 => {
                    mins.push(half_at(block, 2));
                    codes.extend_from_slice(&block[4..]);
                }
                QuantFormat::Q8_0 => codes.extend_from_slice(&block[2..]),
            }
        }
        Ok(Self { format, rows, cols, codes, scales, mins })
    }

    /// Stacks matrices of one format and width on top of each other (e.g. Q, K and V into one
    /// projection), so one matmul computes all of them.
    pub fn concat_rows(parts: &[&QuantizedWeight]) -> Result<Self> {
        let first = parts.first().ok_or_else(|| invalid(OP, "nothing to concatenate"))?;
        if let Some(p) = parts.iter().find(|p| p.format != first.format || p.cols != first.cols) {
            return Err(invalid(
                OP,
                format!(
                    "cannot stack {:?} [_, {}] onto {:?} [_, {}]",
                    p.format, p.cols, first.format, first.cols
                ),
            ));
        }
        Ok(Self {
            format: first.format,
            rows: parts.iter().map(|p| p.rows).sum(),
            cols: first.cols,
            codes: parts.iter().flat_map(|p| p.codes.iter().copied()).collect(),
            scales: parts.iter().flat_map(|p| p.scales.iter().copied()).collect(),
            mins: parts.iter().flat_map(|p| p.mins.iter().copied()).collect(),
        })
    }

    pub fn format(&self) -> QuantFormat {
        self.format
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    pub(crate) fn blocks_per_row(&self) -> usize {
        self.cols / QUANT_BLOCK
    }

    pub(crate) fn codes(&self) -> &[u8] {
        &self.codes
    }

    pub(crate) fn scales(&self) -> &[f32] {
        &self.scales
    }

    pub(crate) fn mins(&self) -> &[f32] {
        &self.mins
    }

    /// Bytes held in memory.
    pub fn size_in_bytes(&self) -> usize {
        self.codes.len() + 4 * (self.scales.len() + self.mins.len())
    }

    /// Row `row` as f32 values, exactly as the GGUF defines them.
    pub fn dequantize_row(&self, row: usize, out: &mut [f32]) {
        let bpr = self.blocks_per_row();
        let cb = self.format.code_bytes();
        for (b, dst) in out[..self.cols].chunks_exact_mut(QUANT_BLOCK).enumerate() {
            let block = row * bpr + b;
            let codes = &self.codes[block * cb..(block + 1) * cb];
            let d = self.scales[block];
            match self.format {
                QuantFormat::Q4_1 => {
                    let m = self.mins[block];
                    for (j, &byte) in codes.iter().enumerate() {
                        dst[j] = d * f32::from(byte & 0x0F) + m;
                        dst[j + QUANT_BLOCK / 2] = d * f32::from(byte >> 4) + m;
                    }
                }
                QuantFormat::Q8_0 => {
                    for (o, &c) in dst.iter_mut().zip(codes) {
                        *o = d * f32::from(c as i8);
                    }
                }
            }
        }
    }

    /// The whole matrix as row-major f32.
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.rows * self.cols];
        if self.cols > 0 {
            for (r, row) in out.chunks_exact_mut(self.cols).enumerate() {
                self.dequantize_row(r, row);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One GGUF Q4_1 block from its parts.
    pub(crate) fn q4_1_block(d: f32, m: f32, q: &[u8; 32]) -> Vec<u8> {
        let mut b = f16::from_f32(d).to_le_bytes().to_vec();
        b.extend(f16::from_f32(m).to_le_bytes());
        b.extend((0..16).map(|j| q[j] | (q[j + 16] << 4)));
        b
    }

    #[test]
    fn q4_1_values_follow_the_gguf_definition() {
        let q: [u8; 32] = std::array::from_fn(|i| (i % 16) as u8);
        let bytes = q4_1_block(0.5, -2.0, &q);
        let w = QuantizedWeight::from_gguf(QuantFormat::Q4_1, 1, 32, &bytes).unwrap();
        let want: Vec<f32> = q.iter().map(|&q| 0.5 * q as f32 - 2.0).collect();
        assert_eq!(w.dequantize(), want);
    }

    #[test]
    fn q8_0_values_follow_the_gguf_definition() {
        let mut bytes = f16::from_f32(0.25).to_le_bytes().to_vec();
        bytes.extend((0..32).map(|i| (i as i8 - 16) as u8));
        let w = QuantizedWeight::from_gguf(QuantFormat::Q8_0, 1, 32, &bytes).unwrap();
        let want: Vec<f32> = (0..32).map(|i| 0.25 * (i as f32 - 16.0)).collect();
        assert_eq!(w.dequantize(), want);
    }

    #[test]
    fn bad_sizes_are_errors() {
        assert!(QuantizedWeight::from_gguf(QuantFormat::Q8_0, 1, 30, &[0; 32]).is_err());
        assert!(QuantizedWeight::from_gguf(QuantFormat::Q8_0, 2, 32, &[0; 34]).is_err());
    }

    #[test]
    fn concat_rows_stacks_and_checks_widths() {
        let a =
            QuantizedWeight::from_gguf(QuantFormat::Q4_1, 1, 32, &q4_1_block(1.0, 0.0, &[1; 32])).unwrap();
        let b =
            QuantizedWeight::from_gguf(QuantFormat::Q4_1, 1, 32, &q4_1_block(2.0, 1.0, &[3; 32])).unwrap();
        let ab = QuantizedWeight::concat_rows(&[&a, &b]).unwrap();
        assert_eq!(ab.rows(), 2);
        assert_eq!(ab.dequantize(), [a.dequantize(), b.dequantize()].concat());
        let wide = QuantizedWeight::from_gguf(QuantFormat::Q4_1, 1, 64, &[0; 40]).unwrap();
        assert!(QuantizedWeight::concat_rows(&[&a, &wide]).is_err());
    }
}

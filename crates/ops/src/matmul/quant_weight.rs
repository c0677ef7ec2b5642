//! Block-quantized weight matrices kept in memory for [`crate::matmul::quant_matmul`].
//!
//! GGUF stores weights as blocks of 32 elements (Q4_0, Q4_1, Q5_0, Q8_0) or super-blocks of 256
//! (Q4_K, Q5_K, Q6_K) with f16 scales and, for K-quants, 6- or 8-bit sub-block scales inside
//! each block. [`QuantizedWeight`] splits every format into 32-element blocks held in up to four
//! arrays, so that the kernels read codes with plain vector loads and scales with a broadcast,
//! with no f16 conversion or bit unpacking of scales in the inner loop:
//!
//! - `codes`: Q8_0 keeps its 32 signed bytes; every other format keeps 16 bytes of 4-bit codes,
//!   byte `j` holding element `j` in its low nibble and element `j + 16` in its high nibble
//!   (Q4_0/Q4_1/Q5_0's own order; K-quant nibbles are reordered into it).
//! - `high`: the bits above the nibble as 32-bit planes, bit `j` for element `j`: one plane
//!   (bit 4) for Q5_0 and Q5_K, two (bits 4 and 5) for Q6_K.
//! - `scales`: the effective f32 scale of each block (`d`, or a K-quant's `d * sc`), two per
//!   block for Q6_K, whose sub-blocks are 16 elements.
//! - `mins`: the f32 offset of each block for Q4_1 (`m`) and Q4_K/Q5_K (`-dmin * m`).
//!
//! Every product above is exact in f32 (an f16 times an integer of at most 8 bits), so the
//! values are exactly the GGUF's (and candle's dequantization, bit for bit): `w = s * c` or,
//! with a minimum, `w = s * c + m`, where the code `c` is the unsigned code less the format's
//! offset (8 for Q4_0, 16 for Q5_0, 32 for Q6_K). In bits per weight, codes plus scales: Q4_0
//! 5, Q4_1 6, Q5_0 6, Q8_0 9, Q4_K 6, Q5_K 7, Q6_K 8 (files: 4.5, 5, 5.5, 8.5, 4.5, 5.5, 6.56).

use candle_core::Result;
use half::f16;

use crate::check::invalid;

const OP: &str = "quantized_weight";

/// Elements per block in memory (and per GGUF block of Q4_0, Q4_1, Q5_0 and Q8_0).
pub const QUANT_BLOCK: usize = 32;

/// Elements per GGUF super-block of the K-quants.
pub const K_BLOCK: usize = 256;

/// The GGUF block formats the quantized matmul reads directly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuantFormat {
    /// 4-bit codes with a scale per block of 32: `w = d * (q - 8)`.
    Q4_0,
    /// 4-bit codes with a scale and a minimum per block of 32: `w = d * q + m`.
    Q4_1,
    /// 5-bit codes with a scale per block of 32: `w = d * (q - 16)`.
    Q5_0,
    /// 8-bit signed codes with a scale per block of 32: `w = d * q`.
    Q8_0,
    /// Super-blocks of 256 with 4-bit codes and a 6-bit scale and minimum per 32 elements:
    /// `w = d * sc * q - dmin * m`.
    Q4K,
    /// Q4K with 5-bit codes.
    Q5K,
    /// Super-blocks of 256 with 6-bit codes and a signed 8-bit scale per 16 elements:
    /// `w = d * sc * (q - 32)`.
    Q6K,
}

impl QuantFormat {
    /// Every format, in declaration order.
    pub const ALL: [QuantFormat; 7] = [
        QuantFormat::Q4_0,
        QuantFormat::Q4_1,
        QuantFormat::Q5_0,
        QuantFormat::Q8_0,
        QuantFormat::Q4K,
        QuantFormat::Q5K,
        QuantFormat::Q6K,
    ];

    /// Elements of one block in a GGUF file: the matrix width must be a multiple of it.
    pub fn gguf_block_elems(self) -> usize {
        match self {
            QuantFormat::Q4K | QuantFormat::Q5K | QuantFormat::Q6K => K_BLOCK,
            _ => QUANT_BLOCK,
        }
    }

    /// Bytes of one block in a GGUF file.
    pub fn gguf_block_bytes(self) -> usize {
        match self {
            QuantFormat::Q4_0 => 2 + QUANT_BLOCK / 2,
            QuantFormat::Q4_1 => 4 + QUANT_BLOCK / 2,
            QuantFormat::Q5_0 => 2 + 4 + QUANT_BLOCK / 2,
            QuantFormat::Q8_0 => 2 + QUANT_BLOCK,
            QuantFormat::Q4K => 4 + 12 + K_BLOCK / 2,
            QuantFormat::Q5K => 4 + 12 + K_BLOCK / 8 + K_BLOCK / 2,
            QuantFormat::Q6K => K_BLOCK / 2 + K_BLOCK / 4 + K_BLOCK / 16 + 2,
        }
    }

    /// Bytes of codes per 32-element block in memory.
    pub(crate) fn code_bytes(self) -> usize {
        match self {
            QuantFormat::Q8_0 => QUANT_BLOCK,
            _ => QUANT_BLOCK / 2,
        }
    }

    /// 32-bit planes of high code bits per block in memory.
    pub(crate) fn high_planes(self) -> usize {
        match self {
            QuantFormat::Q5_0 | QuantFormat::Q5K => 1,
            QuantFormat::Q6K => 2,
            _ => 0,
        }
    }

    /// f32 scales per block in memory (Q6_K: one per 16 elements).
    pub(crate) fn scales_per_block(self) -> usize {
        match self {
            QuantFormat::Q6K => 2,
            _ => 1,
        }
    }

    /// Whether each block has an f32 minimum added to its scaled codes.
    pub(crate) fn has_mins(self) -> bool {
        matches!(self, QuantFormat::Q4_1 | QuantFormat::Q4K | QuantFormat::Q5K)
    }

    /// What is subtracted from the unsigned code of a nibble-based format.
    pub(crate) fn code_offset(self) -> u8 {
        match self {
            QuantFormat::Q4_0 => 8,
            QuantFormat::Q5_0 => 16,
            QuantFormat::Q6K => 32,
            _ => 0,
        }
    }

    /// Bytes in memory per 32-element block.
    pub fn block_bytes(self) -> usize {
        self.code_bytes() + 4 * (self.high_planes() + self.scales_per_block() + usize::from(self.has_mins()))
    }
}

/// A `[rows, cols]` matrix of quantized blocks (`cols` a multiple of the format's GGUF block).
#[derive(Debug, Clone, PartialEq)]
pub struct QuantizedWeight {
    format: QuantFormat,
    rows: usize,
    cols: usize,
    /// Q8_0: 32 `i8` per block. Others: 16 bytes per block, byte `j` holding element `j` in its
    /// low nibble and element `j + 16` in its high nibble.
    codes: Vec<u8>,
    /// [`QuantFormat::high_planes`] words per block: bit `j` of plane `p` is bit `4 + p` of
    /// element `j`'s code.
    high: Vec<u32>,
    /// [`QuantFormat::scales_per_block`] effective scales per block, `[rows, cols / 32, _]`.
    scales: Vec<f32>,
    /// The minimum of each block (formats with [`QuantFormat::has_mins`]), `[rows, cols / 32]`.
    mins: Vec<f32>,
}

/// The arrays of a [`QuantizedWeight`] being filled block by block.
#[derive(Default)]
struct Parts {
    codes: Vec<u8>,
    high: Vec<u32>,
    scales: Vec<f32>,
    mins: Vec<f32>,
}

impl Parts {
    /// Appends the nibbles and high-bit planes of 32 unsigned codes of `bits` bits.
    fn push_codes(&mut self, q: &[u8; QUANT_BLOCK], bits: u32) {
        let half = QUANT_BLOCK / 2;
        self.codes.extend((0..half).map(|j| (q[j] & 0x0F) | (q[j + half] << 4)));
        for bit in 4..bits {
            self.high.push(q.iter().enumerate().fold(0, |acc, (j, &c)| acc | (u32::from(c >> bit) & 1) << j));
        }
    }
}

fn half_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// Sub-block `j`'s 6-bit scale and minimum from a Q4_K/Q5_K block's 12 packed bytes: for
/// `j < 4` the low 6 bits of bytes `j` and `j + 4`; otherwise a nibble of byte `j + 4` with
/// the top two bits of byte `j - 4` (scale) or `j` (minimum) above it.
fn k_scale_min(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        ((s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4), (s[j + 4] >> 4) | ((s[j] >> 6) << 4))
    }
}

/// Appends one GGUF block of `format` to `parts`.
fn push_gguf_block(parts: &mut Parts, format: QuantFormat, block: &[u8]) {
    match format {
        QuantFormat::Q4_0 | QuantFormat::Q8_0 => {
            parts.scales.push(half_at(block, 0));
            parts.codes.extend_from_slice(&block[2..]);
        }
        QuantFormat::Q4_1 => {
            parts.scales.push(half_at(block, 0));
            parts.mins.push(half_at(block, 2));
            parts.codes.extend_from_slice(&block[4..]);
        }
        QuantFormat::Q5_0 => {
            parts.scales.push(half_at(block, 0));
            // The file's `qh` is already the plane: bit `j` is bit 4 of element `j`.
            parts.high.push(u32::from_le_bytes([block[2], block[3], block[4], block[5]]));
            parts.codes.extend_from_slice(&block[6..]);
        }
        QuantFormat::Q4K | QuantFormat::Q5K => {
            let (d, dmin, packed) = (half_at(block, 0), half_at(block, 2), &block[4..16]);
            let five = format == QuantFormat::Q5K;
            let (qh, qs) = if five { (&block[16..48], &block[48..]) } else { (&[][..], &block[16..]) };
            for j in 0..K_BLOCK / QUANT_BLOCK {
                let (sc, m) = k_scale_min(j, packed);
                parts.scales.push(d * f32::from(sc));
                parts.mins.push(-(dmin * f32::from(m)));
                // Sub-blocks 2i and 2i + 1 are the low and high nibbles of bytes 32i..32i+32;
                // Q5_K's bit 4 of element `l` of sub-block `j` is bit `j` of `qh[l]`.
                let q: [u8; QUANT_BLOCK] = std::array::from_fn(|l| {
                    let low = (qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 0x0F;
                    if five {
                        low | (((qh[l] >> j) & 1) << 4)
                    } else {
                        low
                    }
                });
                parts.push_codes(&q, if five { 5 } else { 4 });
            }
        }
        QuantFormat::Q6K => {
            let (ql, qh, sc) = (&block[..128], &block[128..192], &block[192..208]);
            let d = half_at(block, 208);
            for k in 0..K_BLOCK / QUANT_BLOCK {
                // Each half of the super-block is 128 elements in four runs of 32: low nibbles
                // of ql[0..32], of ql[32..64], high nibbles of the same, with bit pairs 0-1,
                // 2-3, 4-5, 6-7 of qh[0..32] above them.
                let (n, t) = (k / 4, k % 4);
                let q: [u8; QUANT_BLOCK] = std::array::from_fn(|l| {
                    let low = (ql[64 * n + 32 * (t % 2) + l] >> (4 * (t / 2))) & 0x0F;
                    low | (((qh[32 * n + l] >> (2 * t)) & 3) << 4)
                });
                parts.push_codes(&q, 6);
                parts.scales.push(d * f32::from(sc[2 * k] as i8));
                parts.scales.push(d * f32::from(sc[2 * k + 1] as i8));
            }
        }
    }
}

impl QuantizedWeight {
    /// Reads a matrix from the bytes of a GGUF tensor of `format` with GGUF shape
    /// `[cols, rows]` (innermost first), i.e. `rows` rows of `cols` elements.
    pub fn from_gguf(format: QuantFormat, rows: usize, cols: usize, bytes: &[u8]) -> Result<Self> {
        let elems = format.gguf_block_elems();
        if !cols.is_multiple_of(elems) {
            return Err(invalid(
                OP,
                format!("{format:?}: {cols} columns is not a multiple of its {elems}-element blocks"),
            ));
        }
        let blocks = rows * cols / QUANT_BLOCK;
        let block_bytes = format.gguf_block_bytes();
        let need = rows * cols / elems * block_bytes;
        if bytes.len() != need {
            return Err(invalid(
                OP,
                format!("{format:?} [{rows}, {cols}] needs {need} bytes, got {}", bytes.len()),
            ));
        }
        let mut parts = Parts {
            codes: Vec::with_capacity(blocks * format.code_bytes()),
            high: Vec::with_capacity(blocks * format.high_planes()),
            scales: Vec::with_capacity(blocks * format.scales_per_block()),
            mins: Vec::with_capacity(if format.has_mins() { blocks } else { 0 }),
        };
        for block in bytes.chunks_exact(block_bytes) {
            push_gguf_block(&mut parts, format, block);
        }
        let Parts { codes, high, scales, mins } = parts;
        Ok(Self { format, rows, cols, codes, high, scales, mins })
    }

    /// A matrix from its arrays as [`QuantizedWeight`] lays them out (what
    /// `DeviceQuantWeight` uploads), checking their lengths.
    pub(crate) fn from_arrays(
        format: QuantFormat,
        rows: usize,
        cols: usize,
        codes: Vec<u8>,
        high: Vec<u32>,
        scales: Vec<f32>,
        mins: Vec<f32>,
    ) -> Result<Self> {
        let blocks = rows * cols / QUANT_BLOCK;
        let lengths = [
            (codes.len(), blocks * format.code_bytes()),
            (high.len(), blocks * format.high_planes()),
            (scales.len(), blocks * format.scales_per_block()),
            (mins.len(), if format.has_mins() { blocks } else { 0 }),
        ];
        if !cols.is_multiple_of(QUANT_BLOCK) || lengths.iter().any(|(got, want)| got != want) {
            return Err(invalid(
                OP,
                format!("{format:?} [{rows}, {cols}]: arrays of {lengths:?} (got, wanted)"),
            ));
        }
        Ok(Self { format, rows, cols, codes, high, scales, mins })
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
            high: parts.iter().flat_map(|p| p.high.iter().copied()).collect(),
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

    pub(crate) fn high(&self) -> &[u32] {
        &self.high
    }

    pub(crate) fn scales(&self) -> &[f32] {
        &self.scales
    }

    pub(crate) fn mins(&self) -> &[f32] {
        &self.mins
    }

    /// Bytes held in memory.
    pub fn size_in_bytes(&self) -> usize {
        self.codes.len() + 4 * (self.high.len() + self.scales.len() + self.mins.len())
    }

    /// The signed codes of block `block` (counted over the whole matrix), offset removed.
    pub(crate) fn block_codes(&self, block: usize) -> [i8; QUANT_BLOCK] {
        if self.format == QuantFormat::Q8_0 {
            let c = &self.codes[block * QUANT_BLOCK..(block + 1) * QUANT_BLOCK];
            return std::array::from_fn(|j| c[j] as i8);
        }
        let half = QUANT_BLOCK / 2;
        let nib = &self.codes[block * half..(block + 1) * half];
        let planes = self.format.high_planes();
        let high = &self.high[block * planes..(block + 1) * planes];
        let offset = self.format.code_offset();
        std::array::from_fn(|j| {
            let mut q = (nib[j % half] >> (4 * (j / half))) & 0x0F;
            for (p, &h) in high.iter().enumerate() {
                q |= (((h >> j) & 1) as u8) << (4 + p);
            }
            q.wrapping_sub(offset) as i8
        })
    }

    /// The scales of elements 0..16 and 16..32 of block `block` (equal but for Q6_K).
    #[inline]
    pub(crate) fn block_scales(&self, block: usize) -> (f32, f32) {
        if self.format.scales_per_block() == 2 {
            (self.scales[2 * block], self.scales[2 * block + 1])
        } else {
            (self.scales[block], self.scales[block])
        }
    }

    /// The minimum of block `block` (formats with [`QuantFormat::has_mins`]).
    #[inline]
    pub(crate) fn block_min(&self, block: usize) -> f32 {
        self.mins[block]
    }

    /// Row `row` as f32 values, exactly as the GGUF defines them.
    pub fn dequantize_row(&self, row: usize, out: &mut [f32]) {
        let bpr = self.blocks_per_row();
        let half = QUANT_BLOCK / 2;
        for (b, dst) in out[..self.cols].chunks_exact_mut(QUANT_BLOCK).enumerate() {
            let block = row * bpr + b;
            let codes = self.block_codes(block);
            let (s0, s1) = self.block_scales(block);
            let scaled = |j: usize| {
                let s = if j < half { s0 } else { s1 };
                s * f32::from(codes[j])
            };
            if self.format.has_mins() {
                let m = self.mins[block];
                for (j, o) in dst.iter_mut().enumerate() {
                    *o = scaled(j) + m;
                }
            } else {
                for (j, o) in dst.iter_mut().enumerate() {
                    *o = scaled(j);
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
#[path = "quant_weight_tests.rs"]
pub(crate) mod tests;

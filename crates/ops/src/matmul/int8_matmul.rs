//! The int8 form of a block-quantized weight for the many-token steps: the weight's own integer
//! codes times activations rounded to 8 bits per block of 32 (llama.cpp's Q8 activations),
//! summed in int32 per block and scaled into f32 once per block.
//!
//! Why: on CPUs with AVX512-VNNI, `vpdpbusd` does 64 byte multiply-adds per instruction where
//! `vdpbf16ps` does 32 bfloat16 ones, and measured on a 2-core AVX-512 VM it also issues faster
//! (1.95 against 1.24 per ns per core), so at 32 rows and more a step's matmuls run about twice
//! as fast as the bfloat16 panels. The weights stay exact (their codes, scales and minimums are
//! the GGUF's); only the activations lose precision, as in llama.cpp. Opt-in
//! (`--cpu-gemm-dtype int8`): the default keeps bfloat16 or exact f32 activations.
//!
//! Layout ([`Int8Weight`]), per panel of [`PANEL`] output columns and per 32-element block:
//! - codes: 8 quads of 4 consecutive inputs, each quad as 32 columns x 4 bytes, so one 64-byte
//!   load feeds `vpdpbusd` for 16 columns. The instruction multiplies unsigned by signed bytes,
//!   so the codes are stored as `c + 128` and the activations as signed bytes; each int32 sum
//!   starts from the correction `-128 * sum(q)` (per row and sub-block, from the sums of `q`
//!   kept when the activations are rounded), which keeps the panels at 1.125 bytes per weight
//!   (Q8_0: 1.06 in the file) instead of carrying a correction per column;
//! - 4-bit formats (Q4_0, Q4_1, Q4_K) store `c + offset` (8 for Q4_0, else 0) as nibbles: quad
//!   `p` in the low and quad `p + 4` in the high half of the same byte, in the byte layout's
//!   order, so a block takes 512 bytes per panel and the kernel masks or shifts a nibble out
//!   after the load. At one token a step reads every weight once, so the 0.75 bytes per weight
//!   of codes, scales and minimums (those of the GGUF blocks in memory) instead of 1.25 are
//!   what a decode step saves;
//! - per sub-block (one, or two of 16 elements for Q6_K) and column: the f32 scale;
//! - formats with minimums (Q4_1, Q4_K, Q5_K): the f32 minimum per block and column, multiplied
//!   by the block's activation sum.
//!
//! The result is, up to f32 rounding, `sum_k w[n][k] * x~[r][k]` with `w` exact and `x~` the
//! activations rounded to `d * q`, `d = max|x| / 127` per block of 32 and `q` an integer in
//! -127..=127. The portable kernel here is the tests' reference and the fallback.

use rayon::prelude::*;

use crate::matmul::cpu_matmul::CpuWeight;
use crate::matmul::panel_matmul::{for_each_tile, PANEL};
use crate::matmul::quant_weight::{QuantFormat, QuantizedWeight, QUANT_BLOCK};

/// Quads of 4 inputs per block.
const QUADS: usize = QUANT_BLOCK / 4;

/// Activation rows per register tile of the x86 kernel: 2 x 6 f32 and 2 x 6 int32 accumulators
/// plus weights and scales fill AVX-512's 32 registers.
pub(crate) const INT8_TILE_ROWS: usize = 6;

/// A quantized weight in int8 panels (see the module docs). `cols` is a multiple of 32.
#[derive(Debug, Clone)]
pub struct Int8Weight {
    rows: usize,
    cols: usize,
    /// Scales per block: 1, or 2 for Q6_K's 16-element sub-blocks.
    subs: usize,
    has_mins: bool,
    /// Two codes per byte (4-bit formats).
    nibbles: bool,
    /// What the stored codes add to the signed ones: 128 for bytes, the format's offset for
    /// nibbles.
    offset: i32,
    /// `[panel][block][quad][PANEL][4]`: `c + 128`; for nibbles `[panel][block][quad % 4][PANEL][4]`
    /// with quads 4..8 in the high nibbles.
    codes: Vec<u8>,
    /// `[panel][block][sub][PANEL]`.
    scales: Vec<f32>,
    /// `[panel][block][PANEL]`, empty without minimums.
    mins: Vec<f32>,
}

/// One panel's slices of an [`Int8Weight`].
pub(crate) struct Int8Panel<'a> {
    pub blocks: usize,
    pub subs: usize,
    /// Two codes per byte.
    pub nibbles: bool,
    /// What the stored codes add to the signed ones.
    pub offset: i32,
    pub codes: &'a [u8],
    pub scales: &'a [f32],
    /// Empty without minimums.
    pub mins: &'a [f32],
}

/// Activation rows rounded to 8 bits per block of 32.
pub(crate) struct Int8Activations {
    pub cols: usize,
    /// Sub-blocks per block of the weight (1, or 2 for Q6_K).
    pub subs: usize,
    /// `[rows][cols]`: `q`.
    pub codes: Vec<i8>,
    /// `[rows][blocks]`: the scale `d` of each block.
    pub scales: Vec<f32>,
    /// `[rows][blocks][subs]`: `sum(q over the sub-block)`; an int32 sum starts from
    /// `-offset` times it.
    pub code_sums: Vec<i32>,
    /// `[rows][blocks]`: `d * sum(q)`, the block's rounded sum (for minimums).
    pub sums: Vec<f32>,
}

/// Computes one tile: rows `rows` of `acts` against `panel`, into the first `width` columns of
/// each out row. Implementations may assume `rows.len()` in `1..=INT8_TILE_ROWS` and `width` in
/// `1..=PANEL`.
pub(crate) type Int8TileKernel = fn(
    acts: &Int8Activations,
    rows: std::ops::Range<usize>,
    panel: &Int8Panel<'_>,
    out_rows: &mut [&mut [f32]],
    width: usize,
);

impl<'a> Int8Panel<'a> {
    /// The stored code (`c + offset`) of block `b`'s input `k` (0..32) for column `j`.
    #[inline]
    pub(crate) fn code(&self, b: usize, k: usize, j: usize) -> i32 {
        let (quad, t) = (k / 4, k % 4);
        if self.nibbles {
            let byte = self.codes[((b * QUADS / 2 + quad % 4) * PANEL + j) * 4 + t];
            i32::from((byte >> (4 * (quad / 4))) & 0x0F)
        } else {
            i32::from(self.codes[((b * QUADS + quad) * PANEL + j) * 4 + t])
        }
    }
}

/// Whether a format's codes fit 4 bits (then panels keep two per byte).
fn nibble_format(format: QuantFormat) -> bool {
    matches!(format, QuantFormat::Q4_0 | QuantFormat::Q4_1 | QuantFormat::Q4K)
}

impl Int8Weight {
    /// The int8 panels of `w` (any format: every code fits a signed byte). In parallel.
    pub fn from_quantized(w: &QuantizedWeight) -> Self {
        let (rows, cols) = (w.rows(), w.cols());
        let blocks = cols / QUANT_BLOCK;
        let subs = w.format().scales_per_block();
        let has_mins = w.format().has_mins();
        let nibbles = nibble_format(w.format());
        let offset = if nibbles { i32::from(w.format().code_offset()) } else { 128 };
        let panels = rows.div_ceil(PANEL);
        let code_len = block_code_bytes(nibbles) * blocks;
        let sub_len = blocks * subs * PANEL;
        let pad = if nibbles { (offset | offset << 4) as u8 } else { 128 };
        let mut codes = vec![pad; panels * code_len];
        let mut scales = vec![0f32; panels * sub_len];
        let mut mins = vec![0f32; if has_mins { panels * blocks * PANEL } else { 0 }];
        if panels > 0 && blocks > 0 {
            let min_len = if has_mins { blocks * PANEL } else { 0 };
            let mut mins_chunks: Vec<&mut [f32]> = if has_mins {
                mins.chunks_mut(min_len).collect()
            } else {
                (0..panels).map(|_| &mut [][..]).collect()
            };
            codes
                .par_chunks_mut(code_len)
                .zip(scales.par_chunks_mut(sub_len))
                .zip(mins_chunks.par_iter_mut())
                .enumerate()
                .for_each(|(p, ((codes, scales), mins))| {
                    for j in 0..PANEL.min(rows - p * PANEL) {
                        let row = p * PANEL + j;
                        for b in 0..blocks {
                            let block = row * blocks + b;
                            let c = w.block_codes(block);
                            for (k, &v) in c.iter().enumerate() {
                                let stored = (i32::from(v) + offset) as u8;
                                let (quad, t) = (k / 4, k % 4);
                                if nibbles {
                                    let at = ((b * QUADS / 2 + quad % 4) * PANEL + j) * 4 + t;
                                    let keep = if quad < 4 { 0xF0 } else { 0x0F };
                                    codes[at] = (codes[at] & keep) | (stored << (4 * (quad / 4)));
                                } else {
                                    codes[((b * QUADS + quad) * PANEL + j) * 4 + t] = stored;
                                }
                            }
                            let (s0, s1) = w.block_scales(block);
                            for s in 0..subs {
                                scales[(b * subs + s) * PANEL + j] = if s == 0 { s0 } else { s1 };
                            }
                            if has_mins {
                                mins[b * PANEL + j] = w.block_min(block);
                            }
                        }
                    }
                });
        }
        Self { rows, cols, subs, has_mins, nibbles, offset, codes, scales, mins }
    }

    /// Bytes held in memory.
    pub fn size_in_bytes(&self) -> usize {
        self.codes.len() + 4 * (self.scales.len() + self.mins.len())
    }

    /// Scales per block: 1, or 2 for Q6_K's sub-blocks.
    pub(crate) fn subs(&self) -> usize {
        self.subs
    }

    pub(crate) fn panel(&self, p: usize) -> Int8Panel<'_> {
        let blocks = self.cols / QUANT_BLOCK;
        let code_len = block_code_bytes(self.nibbles) * blocks;
        let sub_len = blocks * self.subs * PANEL;
        let min_len = if self.has_mins { blocks * PANEL } else { 0 };
        Int8Panel {
            blocks,
            subs: self.subs,
            nibbles: self.nibbles,
            offset: self.offset,
            codes: &self.codes[p * code_len..(p + 1) * code_len],
            scales: &self.scales[p * sub_len..(p + 1) * sub_len],
            mins: &self.mins[p * min_len..(p + 1) * min_len],
        }
    }

    /// `[x_rows.len(), self.rows]` row-major with `kernel`.
    pub(crate) fn matmul_with(&self, x_rows: &[&[f32]], kernel: Int8TileKernel) -> Vec<f32> {
        if x_rows.is_empty() || self.rows == 0 || self.cols == 0 {
            return vec![0f32; x_rows.len() * self.rows];
        }
        let acts = quantize_activations(x_rows, self.cols, self.subs);
        for_each_tile(x_rows.len(), self.rows, INT8_TILE_ROWS, |pi, rows, out_rows, width| {
            kernel(&acts, rows, &self.panel(pi), out_rows, width)
        })
    }
}

/// Code bytes of one block in one panel.
pub(crate) fn block_code_bytes(nibbles: bool) -> usize {
    QUANT_BLOCK * PANEL / if nibbles { 2 } else { 1 }
}

impl CpuWeight for Int8Weight {
    const OP: &'static str = "int8_matmul";

    fn rows(&self) -> usize {
        self.rows
    }

    fn cols(&self) -> usize {
        self.cols
    }

    fn matmul(&self, x_rows: &[&[f32]]) -> Vec<f32> {
        self.matmul_with(x_rows, kernel())
    }
}

/// Activation values below which rounding runs on the calling thread: a few rows take
/// microseconds, less than waking another worker (which, per matmul of a few-token step, had
/// made 4 rows cost three times 1 row).
const PARALLEL_ROUNDING_MIN: usize = 1 << 16;

/// Rounds each row to 8 bits per block of 32: `d = max|x| / 127`, `q = round(x / d)` (ties to
/// even, which vectorises), with the sums of `q` over each of `subs` sub-blocks per block.
pub(crate) fn quantize_activations(x_rows: &[&[f32]], cols: usize, subs: usize) -> Int8Activations {
    assert!(subs == 1 || subs == 2, "one or two sub-blocks");
    let blocks = cols / QUANT_BLOCK;
    let m = x_rows.len();
    let mut codes = vec![0i8; m * cols];
    let mut scales = vec![0f32; m * blocks];
    let mut code_sums = vec![0i32; m * blocks * subs];
    let mut sums = vec![0f32; m * blocks];
    if blocks > 0 && m * cols >= PARALLEL_ROUNDING_MIN {
        codes
            .par_chunks_mut(cols)
            .zip(scales.par_chunks_mut(blocks))
            .zip(code_sums.par_chunks_mut(blocks * subs))
            .zip(sums.par_chunks_mut(blocks))
            .zip(x_rows.par_iter())
            .for_each(|((((codes, scales), code_sums), sums), x)| {
                round_row(x, codes, scales, code_sums, sums, subs)
            });
    } else if blocks > 0 {
        for (r, x) in x_rows.iter().enumerate() {
            round_row(
                x,
                &mut codes[r * cols..(r + 1) * cols],
                &mut scales[r * blocks..(r + 1) * blocks],
                &mut code_sums[r * blocks * subs..(r + 1) * blocks * subs],
                &mut sums[r * blocks..(r + 1) * blocks],
                subs,
            );
        }
    }
    Int8Activations { cols, subs, codes, scales, code_sums, sums }
}

/// One row of [`quantize_activations`].
fn round_row(
    x: &[f32],
    codes: &mut [i8],
    scales: &mut [f32],
    code_sums: &mut [i32],
    sums: &mut [f32],
    subs: usize,
) {
    let quantize_block = quantize_block();
    for (b, scale) in scales.iter_mut().enumerate() {
        let span = b * QUANT_BLOCK..(b + 1) * QUANT_BLOCK;
        let (d, [low, high]) = quantize_block(&x[span.clone()], &mut codes[span]);
        *scale = d;
        if subs == 1 {
            code_sums[b] = low + high;
        } else {
            code_sums[2 * b] = low;
            code_sums[2 * b + 1] = high;
        }
        sums[b] = d * (low + high) as f32;
    }
}

/// Rounds one block of 32 into `codes`; returns its scale `d` and the sums of `q` over elements
/// 0..16 and 16..32.
pub(crate) type QuantizeBlock = fn(&[f32], &mut [i8]) -> (f32, [i32; 2]);

/// The fastest block rounding this CPU runs. The x86 builds give the portable one's bytes (the
/// same f32 operations, rounding to nearest even).
fn quantize_block() -> QuantizeBlock {
    #[cfg(target_arch = "x86_64")]
    if let Some(quantize) = crate::matmul::int8_matmul_x86::quantize_block()
        .or_else(crate::matmul::int8_matmul_avx2::quantize_block)
    {
        return quantize;
    }
    quantize_block_portable
}

pub(crate) fn quantize_block_portable(x: &[f32], codes: &mut [i8]) -> (f32, [i32; 2]) {
    let amax = x.iter().fold(0f32, |a, &v| a.max(v.abs()));
    let d = amax / 127.0;
    let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
    let mut sums = [0i32; 2];
    for (k, (c, &v)) in codes.iter_mut().zip(x).enumerate() {
        let q = (v * inv).round_ties_even().clamp(-127.0, 127.0) as i32;
        sums[k / (QUANT_BLOCK / 2)] += q;
        *c = q as i8;
    }
    (d, sums)
}

/// The fastest int8 kernel this CPU runs: AVX512-VNNI, else AVX-VNNI, else AVX2. All give the
/// same bits (exact int32 sums, the same f32 updates in the same order).
pub(crate) fn kernel() -> Int8TileKernel {
    native_kernel().unwrap_or(portable_kernel)
}

/// The int8 kernel of this CPU's vector instructions, if it has any the kernels use.
pub(crate) fn native_kernel() -> Option<Int8TileKernel> {
    #[cfg(target_arch = "x86_64")]
    {
        use crate::matmul::{int8_matmul_avx2 as avx2, int8_matmul_x86 as x86};
        x86::kernel().or_else(avx2::avx_vnni_kernel).or_else(avx2::avx2_kernel)
    }
    #[cfg(not(target_arch = "x86_64"))]
    None
}

/// Plain Rust, in the x86 kernel's order: an int32 sum per sub-block, then one f32 update.
pub(crate) fn portable_kernel(
    acts: &Int8Activations,
    rows: std::ops::Range<usize>,
    panel: &Int8Panel<'_>,
    out_rows: &mut [&mut [f32]],
    width: usize,
) {
    let blocks = panel.blocks;
    assert_eq!(acts.subs, panel.subs, "activations rounded for this weight's sub-blocks");
    let per_sub = QUADS / panel.subs;
    for (out, r) in out_rows.iter_mut().zip(rows) {
        let a = &acts.codes[r * acts.cols..(r + 1) * acts.cols];
        for (j, o) in out[..width].iter_mut().enumerate() {
            let mut acc = 0f32;
            for b in 0..blocks {
                let d = acts.scales[r * blocks + b];
                for s in 0..panel.subs {
                    let idx = (b * panel.subs + s) * PANEL + j;
                    let mut sum = -panel.offset * acts.code_sums[(r * blocks + b) * panel.subs + s];
                    for k in s * per_sub * 4..(s + 1) * per_sub * 4 {
                        sum += i32::from(a[b * QUANT_BLOCK + k]) * panel.code(b, k, j);
                    }
                    acc += sum as f32 * (panel.scales[idx] * d);
                }
                if !panel.mins.is_empty() {
                    acc += panel.mins[b * PANEL + j] * acts.sums[r * blocks + b];
                }
            }
            *o = acc;
        }
    }
}

#[cfg(test)]
#[path = "int8_matmul_tests.rs"]
pub(crate) mod tests;

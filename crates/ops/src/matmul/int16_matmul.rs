//! 16-bit activations over the int8 panels: the weight's own integer codes ([`Int8Weight`],
//! unchanged) times activations rounded to 16 bits per block of 32, summed exactly in int32
//! per block and scaled into f32 once per block.
//!
//! Why: bfloat16 activations keep 8 significant bits per element and 8-bit ones (llama.cpp's,
//! [`crate::matmul::int8_matmul`]) 7 bits of the block's largest; on the default 135M model the latter
//! already change greedy answers. Here each block's rounding step is `max|x| / 32639`, about
//! 2^-15 of the block's largest value, while the multiply still runs on AVX512-VNNI's
//! `vpdpbusd`: a 16-bit code `q` is split into two signed bytes, `q = 256 * high + low`, and
//! the block's int32 sum is `256 * sum(c * high) + sum(c * low)`, two byte passes over the
//! same panel. That is twice the int8 kernel's multiply-adds, as many instructions per weight
//! as `vdpbf16ps` (on an Intel Xeon VM `vpdpbusd` issues about 1.6x as fast:
//! benches/reports/2026-11-26-large-step-kernel-timing-amd.md; on an AMD one int16 and bfloat16
//! panels tie at 32 tokens: benches/reports/2026-11-25-int16-small-steps-amd.md). It pays most
//! for the small steps: with 4-bit codes kept two per byte, a one-token step reads 0.75 bytes per
//! weight, as the blocks do, and beats their exact f32 kernel from one token on.
//!
//! Codes are rounded to at most 32639 = 127 * 256 + 127 in magnitude so that both bytes of
//! the split stay in -128..=127: `low = ((q + 128) mod 256) - 128`, `high = (q - low) / 256`.
//! The panels store `c + offset` (128, or a 4-bit format's offset; see
//! [`crate::matmul::int8_matmul`]), so each block's sum starts from `-offset * sum(q)`. No int32 sum
//! overflows: `|sum((c + 128) * high)| <= 32 * 255 * 128`, which shifted by 8 bits plus the
//! correction and the low pass stays under 2^29.
//!
//! The result is, up to f32 rounding, `sum_k w[n][k] * x~[r][k]` with `w` exact and `x~` the
//! activations rounded to `d * q`, `d = max|x| / 32639` per block of 32. Each row's sum runs in
//! one order whatever the number of rows beside it. The portable kernel here is the tests'
//! reference and the fallback.

use rayon::prelude::*;

use crate::matmul::cpu_matmul::CpuWeight;
use crate::matmul::int8_matmul::{Int8Panel, Int8Weight};
use crate::matmul::panel_matmul::{for_each_tile, PANEL};
use crate::matmul::quant_weight::QUANT_BLOCK;

/// The largest code magnitude: both bytes of its split fit a signed byte.
pub(crate) const INT16_MAX_CODE: i32 = 127 * 256 + 127;

/// Activation rows per register tile of the x86 kernel (as the int8 one: 2 x 6 f32 and
/// 2 x 6 int32 accumulators plus weights and scales fill AVX-512's 32 registers).
pub(crate) const INT16_TILE_ROWS: usize = 6;

/// Activation rows rounded to 16 bits per block of 32, each code split into two bytes.
pub(crate) struct Int16Activations {
    pub cols: usize,
    /// Sub-blocks per block of the weight (1, or 2 for Q6_K).
    pub subs: usize,
    /// `[rows][cols]`: `high` of each code `q = 256 * high + low`.
    pub high: Vec<i8>,
    /// `[rows][cols]`: `low`.
    pub low: Vec<i8>,
    /// `[rows][cols]`: `q` whole, for the kernels that multiply 16-bit values.
    pub codes: Vec<i16>,
    /// `[rows][blocks]`: the scale `d` of each block.
    pub scales: Vec<f32>,
    /// `[rows][blocks][subs]`: `sum(q over the sub-block)`; an int32 sum starts from `-offset`
    /// times it.
    pub code_sums: Vec<i32>,
    /// `[rows][blocks]`: `d * sum(q)`, the block's rounded sum (for minimums).
    pub sums: Vec<f32>,
}

/// Computes one tile: rows `rows` of `acts` against `panel`, into the first `width` columns of
/// each out row. Implementations may assume `rows.len()` in `1..=INT16_TILE_ROWS` and `width`
/// in `1..=PANEL`.
pub(crate) type Int16TileKernel = fn(
    acts: &Int16Activations,
    rows: std::ops::Range<usize>,
    panel: &Int8Panel<'_>,
    out_rows: &mut [&mut [f32]],
    width: usize,
);

/// Rounds one block of 32 into its two byte planes; returns its scale `d` and the sums of `q`
/// over elements 0..16 and 16..32.
pub(crate) type QuantizeBlock16 = fn(&[f32], &mut [i8], &mut [i8]) -> (f32, [i32; 2]);

impl Int8Weight {
    /// `[x_rows.len(), self.rows()]` row-major with 16-bit activations, with `kernel`.
    pub(crate) fn matmul_int16_with(&self, x_rows: &[&[f32]], kernel: Int16TileKernel) -> Vec<f32> {
        if x_rows.is_empty() || self.rows() == 0 || self.cols() == 0 {
            return vec![0f32; x_rows.len() * self.rows()];
        }
        let acts = quantize_activations16(x_rows, self.cols(), self.subs());
        for_each_tile(x_rows.len(), self.rows(), INT16_TILE_ROWS, |pi, rows, out_rows, width| {
            kernel(&acts, rows, &self.panel(pi), out_rows, width)
        })
    }

    /// The same with the fastest kernel this CPU runs.
    pub(crate) fn matmul_int16(&self, x_rows: &[&[f32]]) -> Vec<f32> {
        self.matmul_int16_with(x_rows, kernel())
    }
}

/// Activation values below which rounding runs on the calling thread (as in the int8 path:
/// waking a worker costs more than a few rows' rounding).
const PARALLEL_ROUNDING_MIN: usize = 1 << 16;

/// Rounds each row to 16 bits per block of 32: `d = max|x| / 32639`, `q = round(x / d)` (ties
/// to even), split into bytes, with the sums of `q` over each of `subs` sub-blocks per block.
pub(crate) fn quantize_activations16(x_rows: &[&[f32]], cols: usize, subs: usize) -> Int16Activations {
    assert!(subs == 1 || subs == 2, "one or two sub-blocks");
    let blocks = cols / QUANT_BLOCK;
    let m = x_rows.len();
    let mut acts = Int16Activations {
        cols,
        subs,
        high: vec![0i8; m * cols],
        low: vec![0i8; m * cols],
        codes: vec![0i16; m * cols],
        scales: vec![0f32; m * blocks],
        code_sums: vec![0i32; m * blocks * subs],
        sums: vec![0f32; m * blocks],
    };
    if blocks == 0 {
        return acts;
    }
    let Int16Activations { high, low, codes, scales, code_sums, sums, .. } = &mut acts;
    if m * cols >= PARALLEL_ROUNDING_MIN {
        high.par_chunks_mut(cols)
            .zip(low.par_chunks_mut(cols))
            .zip(codes.par_chunks_mut(cols))
            .zip(scales.par_chunks_mut(blocks))
            .zip(code_sums.par_chunks_mut(blocks * subs))
            .zip(sums.par_chunks_mut(blocks))
            .zip(x_rows.par_iter())
            .for_each(|((((((high, low), codes), scales), code_sums), sums), x)| {
                round_row(x, [high, low], codes, scales, code_sums, sums, subs)
            });
    } else {
        for (r, x) in x_rows.iter().enumerate() {
            round_row(
                x,
                [&mut high[r * cols..(r + 1) * cols], &mut low[r * cols..(r + 1) * cols]],
                &mut codes[r * cols..(r + 1) * cols],
                &mut scales[r * blocks..(r + 1) * blocks],
                &mut code_sums[r * blocks * subs..(r + 1) * blocks * subs],
                &mut sums[r * blocks..(r + 1) * blocks],
                subs,
            );
        }
    }
    acts
}

/// One row of [`quantize_activations16`].
fn round_row(
    x: &[f32],
    [high, low]: [&mut [i8]; 2],
    codes: &mut [i16],
    scales: &mut [f32],
    code_sums: &mut [i32],
    sums: &mut [f32],
    subs: usize,
) {
    let quantize_block = quantize_block16();
    for (b, scale) in scales.iter_mut().enumerate() {
        let span = b * QUANT_BLOCK..(b + 1) * QUANT_BLOCK;
        let (d, [first, second]) =
            quantize_block(&x[span.clone()], &mut high[span.clone()], &mut low[span.clone()]);
        *scale = d;
        let bytes = high[span.clone()].iter().zip(&low[span.clone()]);
        for (q, (&h, &l)) in codes[span].iter_mut().zip(bytes) {
            *q = 256 * i16::from(h) + i16::from(l);
        }
        if subs == 1 {
            code_sums[b] = first + second;
        } else {
            code_sums[2 * b] = first;
            code_sums[2 * b + 1] = second;
        }
        sums[b] = d * (first + second) as f32;
    }
}

/// The fastest block rounding this CPU runs (every build gives the portable one's bytes).
fn quantize_block16() -> QuantizeBlock16 {
    #[cfg(target_arch = "x86_64")]
    if let Some(quantize) = crate::matmul::int16_matmul_x86::quantize_block()
        .or_else(crate::matmul::int16_matmul_avx2::quantize_block)
    {
        return quantize;
    }
    quantize_block16_portable
}

pub(crate) fn quantize_block16_portable(x: &[f32], high: &mut [i8], low: &mut [i8]) -> (f32, [i32; 2]) {
    let amax = x.iter().fold(0f32, |a, &v| a.max(v.abs()));
    let d = amax / INT16_MAX_CODE as f32;
    let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
    let limit = INT16_MAX_CODE as f32;
    let mut sums = [0i32; 2];
    for (k, &v) in x.iter().enumerate() {
        let q = (v * inv).round_ties_even().clamp(-limit, limit) as i32;
        sums[k / (QUANT_BLOCK / 2)] += q;
        let (h, l) = split(q);
        high[k] = h;
        low[k] = l;
    }
    (d, sums)
}

/// `q = 256 * high + low` with both in -128..=127 (`|q| <= INT16_MAX_CODE`).
pub(crate) fn split(q: i32) -> (i8, i8) {
    let low = ((q + 128) & 255) - 128;
    (((q - low) >> 8) as i8, low as i8)
}

/// The fastest 16-bit-activation kernel this CPU runs: AVX512-VNNI, else AVX-VNNI, else AVX2.
/// All give the same bits (exact int32 sums, the same f32 updates in the same order).
pub(crate) fn kernel() -> Int16TileKernel {
    #[cfg(target_arch = "x86_64")]
    {
        use crate::matmul::{int16_matmul_avx2 as avx2, int16_matmul_x86 as x86};
        if let Some(k) = x86::kernel().or_else(avx2::avx_vnni_kernel).or_else(avx2::avx2_kernel) {
            return k;
        }
    }
    portable_kernel
}

/// Plain Rust, in the x86 kernel's order: an exact int32 sum per sub-block, then one f32
/// update (`sum * (scale * d) + acc`, fused as the x86 kernel's).
pub(crate) fn portable_kernel(
    acts: &Int16Activations,
    rows: std::ops::Range<usize>,
    panel: &Int8Panel<'_>,
    out_rows: &mut [&mut [f32]],
    width: usize,
) {
    let blocks = panel.blocks;
    assert_eq!(acts.subs, panel.subs, "activations rounded for this weight's sub-blocks");
    let per_sub = QUANT_BLOCK / panel.subs;
    for (out, r) in out_rows.iter_mut().zip(rows) {
        let high = &acts.high[r * acts.cols..(r + 1) * acts.cols];
        let low = &acts.low[r * acts.cols..(r + 1) * acts.cols];
        for (j, o) in out[..width].iter_mut().enumerate() {
            let mut acc = 0f32;
            for b in 0..blocks {
                let d = acts.scales[r * blocks + b];
                for s in 0..panel.subs {
                    let idx = (b * panel.subs + s) * PANEL + j;
                    let mut sum = -panel.offset * acts.code_sums[(r * blocks + b) * panel.subs + s];
                    for kb in s * per_sub..(s + 1) * per_sub {
                        let k = b * QUANT_BLOCK + kb;
                        sum += panel.code(b, kb, j) * (256 * i32::from(high[k]) + i32::from(low[k]));
                    }
                    acc = (sum as f32).mul_add(panel.scales[idx] * d, acc);
                }
                if !panel.mins.is_empty() {
                    acc = panel.mins[b * PANEL + j].mul_add(acts.sums[r * blocks + b], acc);
                }
            }
            *o = acc;
        }
    }
}

#[cfg(test)]
#[path = "int16_matmul_tests.rs"]
mod tests;

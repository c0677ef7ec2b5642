//! The CPU kernels of a BERT-style encoder step besides its matmuls, on plain f32 row-major
//! buffers: the LayerNorm of a residual sum ([`add_layer_norm`]) and bidirectional attention of
//! each sequence over its own tokens ([`encoder_attention`]).
//!
//! Each is one pass (one rayon region) where candle's ops take several, each with its own
//! parallel loop and wake-ups: an encoder step over one short input is a few milliseconds, so
//! the per-op overheads are a large part of it. Layer biases are folded in as the values are
//! read, so the matmul outputs are used as they come. Sums run in f32 in fixed lane order (the
//! same bits for a row whatever the batch), and the loops pick the widest build the CPU runs
//! (AVX-512, AVX2 with FMA) at run time.

use rayon::prelude::*;

use crate::matmul::cpu_matmul::OutPtr;
use crate::par_rows::par_rows;
use crate::simd::{exp_nonpositive, max_lanes, sum_lanes, MulAdd, Separate};

/// Rows of the residual LayerNorm: `v = y + bias + residual`, then
/// `(v - mean(v)) / sqrt(var(v) + eps) * gamma + beta` per row; `y` and `residual` are
/// `[rows, width]`, the others `[width]`. Returns the new `[rows, width]` buffer.
pub fn add_layer_norm(
    y: &[f32],
    bias: &[f32],
    residual: &[f32],
    gamma: &[f32],
    beta: &[f32],
    eps: f32,
) -> Vec<f32> {
    let width = gamma.len();
    assert!(width > 0 && y.len().is_multiple_of(width) && residual.len() == y.len(), "rows of {width}");
    assert!(bias.len() == width && beta.len() == width, "bias, gamma and beta of {width}");
    let params = NormParams { bias, gamma, beta, eps };
    let min_rows = (1usize << 15).div_ceil(width);
    par_rows(y.len() / width, width, min_rows, 0f32, |i, out| {
        let rows = i * width..(i + 1) * width;
        norm_row(&y[rows.clone()], &residual[rows], &params, out);
    })
}

struct NormParams<'a> {
    bias: &'a [f32],
    gamma: &'a [f32],
    beta: &'a [f32],
    eps: f32,
}

fn norm_row(y: &[f32], residual: &[f32], p: &NormParams<'_>, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    match crate::simd::level() {
        // SAFETY: the CPU has the features each build enables (checked by `level`).
        crate::simd::Level::Avx512 => return unsafe { norm_row_avx512(y, residual, p, out) },
        crate::simd::Level::Avx2 => return unsafe { norm_row_avx2(y, residual, p, out) },
        crate::simd::Level::None => {}
    }
    norm_row_portable::<Separate>(y, residual, p, out);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn norm_row_avx512(y: &[f32], residual: &[f32], p: &NormParams<'_>, out: &mut [f32]) {
    norm_row_portable::<crate::simd::Fused>(y, residual, p, out);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn norm_row_avx2(y: &[f32], residual: &[f32], p: &NormParams<'_>, out: &mut [f32]) {
    norm_row_portable::<crate::simd::Fused>(y, residual, p, out);
}

#[inline(always)]
fn norm_row_portable<M: MulAdd>(y: &[f32], residual: &[f32], p: &NormParams<'_>, out: &mut [f32]) {
    for (((o, &y), &b), &r) in out.iter_mut().zip(y).zip(p.bias).zip(residual) {
        *o = y + b + r;
    }
    let n = out.len() as f32;
    let mean = sum_lanes(out) / n;
    for o in out.iter_mut() {
        *o -= mean;
    }
    // The centred values' squares, summed in lanes (two passes: no cancellation).
    let mut acc = [0f32; 16];
    let chunks = out.chunks_exact(16);
    let tail: f32 = chunks.remainder().iter().map(|v| v * v).sum();
    for c in chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a = M::mul_add(v, v, *a);
        }
    }
    let variance = (acc.iter().sum::<f32>() + tail) / n;
    let inv_std = 1.0 / (variance + p.eps).sqrt();
    for ((o, &g), &b) in out.iter_mut().zip(p.gamma).zip(p.beta) {
        *o = M::mul_add(*o * inv_std, g, b);
    }
}

/// The shape of [`encoder_attention`]'s input.
#[derive(Debug, Clone, Copy)]
pub struct EncoderAttentionShape {
    pub heads: usize,
    pub head_dim: usize,
    /// Scores are `scale * q . k` (usually `1 / sqrt(head_dim)`).
    pub scale: f32,
}

/// Bidirectional softmax attention: `qkv` is `[tokens, 3 * heads * head_dim]` (each token's
/// query, key and value, heads side by side in each), `qkv_bias` the `3 * heads * head_dim`
/// biases added to every row, and `bounds[s]..bounds[s + 1]` the tokens of sequence `s`, which
/// attend to each other only. Returns `[tokens, heads * head_dim]`. Work is split over rayon by
/// (sequence, head).
pub fn encoder_attention(
    qkv: &[f32],
    qkv_bias: &[f32],
    bounds: &[usize],
    shape: EncoderAttentionShape,
) -> Vec<f32> {
    let hidden = shape.heads * shape.head_dim;
    let tokens = bounds.last().copied().unwrap_or(0);
    assert_eq!(qkv.len(), tokens * 3 * hidden, "qkv is [tokens, 3 * {hidden}]");
    assert_eq!(qkv_bias.len(), 3 * hidden, "one bias per column of qkv");
    assert!(bounds.first().is_none_or(|&b| b == 0) && bounds.windows(2).all(|w| w[0] <= w[1]));
    let mut out: Vec<f32> = vec![0f32; tokens * hidden];
    let ptr = OutPtr(out.as_mut_ptr());
    let tasks: Vec<(usize, usize)> =
        (0..bounds.len().saturating_sub(1)).flat_map(|s| (0..shape.heads).map(move |h| (s, h))).collect();
    tasks.into_par_iter().for_each(|(s, head)| {
        let p = ptr;
        let task = HeadTask { qkv, qkv_bias, start: bounds[s], len: bounds[s + 1] - bounds[s], head, shape };
        // SAFETY: this task writes columns `head * head_dim..(head + 1) * head_dim` of the rows
        // of sequence `s` only, which no other task touches, inside `out`'s allocation, which
        // outlives the loop.
        let write = |row: usize, values: &[f32]| unsafe {
            let dst = p.0.add((task.start + row) * hidden + head * shape.head_dim);
            std::ptr::copy_nonoverlapping(values.as_ptr(), dst, shape.head_dim);
        };
        head_attention(&task, write);
    });
    out
}

/// One head of one sequence.
struct HeadTask<'a> {
    qkv: &'a [f32],
    qkv_bias: &'a [f32],
    start: usize,
    len: usize,
    head: usize,
    shape: EncoderAttentionShape,
}

fn head_attention(task: &HeadTask<'_>, write: impl FnMut(usize, &[f32])) {
    #[cfg(target_arch = "x86_64")]
    match crate::simd::level() {
        // SAFETY: the CPU has the features each build enables (checked by `level`).
        crate::simd::Level::Avx512 => return unsafe { head_attention_avx512(task, write) },
        crate::simd::Level::Avx2 => return unsafe { head_attention_avx2(task, write) },
        crate::simd::Level::None => {}
    }
    head_attention_portable::<Separate>(task, false, write);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn head_attention_avx512(task: &HeadTask<'_>, write: impl FnMut(usize, &[f32])) {
    head_attention_portable::<crate::simd::Fused>(task, true, write);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn head_attention_avx2(task: &HeadTask<'_>, write: impl FnMut(usize, &[f32])) {
    head_attention_portable::<crate::simd::Fused>(task, false, write);
}

/// Query rows [`head_attention_portable`] works on together: each key or value loaded feeds
/// this many independent multiply-add chains.
const QUERY_ROWS: usize = 4;

/// Keys are scored in blocks of this many (the keys are zero-padded to a multiple); a
/// 32-key block keeps `QUERY_ROWS x 32` sums in registers.
const KEY_BLOCK: usize = 16;

/// Packs the head's keys transposed (`[head_dim, len]` padded to whole key blocks, so scores
/// are multiply-adds along contiguous keys) and its values (`[len, head_dim]`), biases added;
/// then, [`QUERY_ROWS`] queries at a time, their scores, softmax and weighted sums of values.
#[inline(always)]
fn head_attention_portable<M: MulAdd>(task: &HeadTask<'_>, wide: bool, mut write: impl FnMut(usize, &[f32])) {
    let EncoderAttentionShape { heads, head_dim: dim, scale } = task.shape;
    let (len, width) = (task.len, 3 * heads * dim);
    if len == 0 {
        return;
    }
    let padded = len.div_ceil(KEY_BLOCK) * KEY_BLOCK;
    let (q_col, k_col, v_col) = (task.head * dim, (heads + task.head) * dim, (2 * heads + task.head) * dim);
    let row = |j: usize, col: usize| &task.qkv[(task.start + j) * width + col..][..dim];
    let bias = |col: usize| &task.qkv_bias[col..col + dim];
    let mut keys_t = vec![0f32; dim * padded];
    let mut values = vec![0f32; len * dim];
    for j in 0..len {
        for (d, (&k, &b)) in row(j, k_col).iter().zip(bias(k_col)).enumerate() {
            keys_t[d * padded + j] = k + b;
        }
        for ((v, &x), &b) in values[j * dim..(j + 1) * dim].iter_mut().zip(row(j, v_col)).zip(bias(v_col)) {
            *v = x + b;
        }
    }
    let mut q = vec![0f32; QUERY_ROWS * dim];
    let mut scores = vec![0f32; QUERY_ROWS * padded];
    let mut context = vec![0f32; QUERY_ROWS * dim];
    for i0 in (0..len).step_by(QUERY_ROWS) {
        // A short last group repeats its last query; those rows are not written.
        for (r, q) in q.chunks_exact_mut(dim).enumerate() {
            for ((q, &x), &b) in q.iter_mut().zip(row((i0 + r).min(len - 1), q_col)).zip(bias(q_col)) {
                *q = (x + b) * scale;
            }
        }
        let mut j0 = 0;
        while j0 < padded {
            if j0 + 2 * KEY_BLOCK <= padded {
                score_block::<M, { 2 * KEY_BLOCK }>(&q, &keys_t, padded, j0, &mut scores);
                j0 += 2 * KEY_BLOCK;
            } else {
                score_block::<M, KEY_BLOCK>(&q, &keys_t, padded, j0, &mut scores);
                j0 += KEY_BLOCK;
            }
        }
        let mut inv_sums = [0f32; QUERY_ROWS];
        for (s, inv_sum) in scores.chunks_exact_mut(padded).zip(&mut inv_sums) {
            let s = &mut s[..len];
            let max = max_lanes(s);
            for v in s.iter_mut() {
                *v -= max;
            }
            exp_nonpositive(s);
            *inv_sum = 1.0 / sum_lanes(s);
        }
        weigh_values::<M>(wide, &scores, padded, len, &values, &mut context);
        for (r, (c, inv_sum)) in context.chunks_exact_mut(dim).zip(inv_sums).enumerate().take(len - i0) {
            for c in c.iter_mut() {
                *c *= inv_sum;
            }
            write(i0 + r, c);
        }
    }
}

/// `scores[r][j0..j0 + N] = q[r] . keys[j0..j0 + N]` for each of the [`QUERY_ROWS`] queries.
#[inline(always)]
fn score_block<M: MulAdd, const N: usize>(
    q: &[f32],
    keys_t: &[f32],
    padded: usize,
    j0: usize,
    scores: &mut [f32],
) {
    let dim = q.len() / QUERY_ROWS;
    let mut acc = [[0f32; N]; QUERY_ROWS];
    for d in 0..dim {
        let k: &[f32; N] = keys_t[d * padded + j0..][..N].try_into().expect("N keys");
        for (r, acc) in acc.iter_mut().enumerate() {
            let qd = q[r * dim + d];
            for (a, &kv) in acc.iter_mut().zip(k) {
                *a = M::mul_add(qd, kv, *a);
            }
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        scores[r * padded + j0..][..N].copy_from_slice(acc);
    }
}

/// `context[r] = sum_j scores[r][j] values[j]` for each of the [`QUERY_ROWS`] rows, the sums
/// in memory (the loop over the head vectorises; see [`weigh_values_avx512`] for the fast one).
#[inline(always)]
fn weigh_values_in_memory<M: MulAdd>(
    scores: &[f32],
    padded: usize,
    len: usize,
    values: &[f32],
    context: &mut [f32],
) {
    let dim = context.len() / QUERY_ROWS;
    context.fill(0.0);
    for (r, c) in context.chunks_exact_mut(dim).enumerate() {
        for (&p, v) in scores[r * padded..][..len].iter().zip(values.chunks_exact(dim)) {
            for (c, &x) in c.iter_mut().zip(v) {
                *c = M::mul_add(p, x, *c);
            }
        }
    }
}

/// `context[r] = sum_j scores[r][j] values[j]`: with 512-bit registers for a head size of 16
/// to 64 (`wide`, only in code built for AVX-512), else [`weigh_values_in_memory`].
#[inline(always)]
fn weigh_values<M: MulAdd>(
    wide: bool,
    scores: &[f32],
    padded: usize,
    len: usize,
    values: &[f32],
    context: &mut [f32],
) {
    let dim = context.len() / QUERY_ROWS;
    assert!(scores.len() >= QUERY_ROWS * padded && padded >= len && values.len() >= len * dim);
    #[cfg(target_arch = "x86_64")]
    if wide && dim.is_multiple_of(16) {
        // SAFETY: `wide` is only set in code built for AVX-512F on a CPU that has it, and the
        // bounds the kernel reads and writes within are asserted above.
        unsafe {
            match dim / 16 {
                1 => return weigh_values_avx512::<1>(scores, padded, len, values, context),
                2 => return weigh_values_avx512::<2>(scores, padded, len, values, context),
                3 => return weigh_values_avx512::<3>(scores, padded, len, values, context),
                4 => return weigh_values_avx512::<4>(scores, padded, len, values, context),
                _ => {}
            }
        }
    }
    let _ = wide;
    weigh_values_in_memory::<M>(scores, padded, len, values, context);
}

/// [`weigh_values`] with `QUERY_ROWS x V` 512-bit sums in registers (head size `16 V`): LLVM
/// turned the portable form of this loop into scalar code. Caller guarantees the bounds
/// asserted in [`weigh_values`] and AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn weigh_values_avx512<const V: usize>(
    scores: &[f32],
    padded: usize,
    len: usize,
    values: &[f32],
    context: &mut [f32],
) {
    use std::arch::x86_64::*;
    // SAFETY: the caller guarantees AVX-512F and the bounds (see above).
    unsafe {
        let dim = 16 * V;
        let mut acc = [[_mm512_setzero_ps(); V]; QUERY_ROWS];
        for j in 0..len {
            let row = values.as_ptr().add(j * dim);
            let mut v = [_mm512_setzero_ps(); V];
            for (c, v) in v.iter_mut().enumerate() {
                *v = _mm512_loadu_ps(row.add(16 * c));
            }
            for (r, acc) in acc.iter_mut().enumerate() {
                let p = _mm512_set1_ps(*scores.get_unchecked(r * padded + j));
                for (a, &v) in acc.iter_mut().zip(&v) {
                    *a = _mm512_fmadd_ps(p, v, *a);
                }
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            for (c, &a) in acc.iter().enumerate() {
                _mm512_storeu_ps(context.as_mut_ptr().add(r * dim + 16 * c), a);
            }
        }
    }
}

#[cfg(test)]
#[path = "encoder_cpu_tests.rs"]
mod tests;

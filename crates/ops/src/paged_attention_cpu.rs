//! CPU kernel of varlen paged attention: flash-attention-style online softmax in f32, reading
//! K/V through the block tables.
//!
//! Work is split into items of (sequence, range of kv heads, tile of query tokens, range of key
//! splits; see [`crate::attention_plan`]). An item
//! handles all `group = num_q_heads / num_kv_heads` query heads of its kv heads for every token
//! in its tile, so each K/V row it reads is converted once and used by `tile_tokens * group`
//! query rows. Items take all kv heads of a sequence when there are enough items to keep the
//! threads busy (decode batches): a position's K/V for all heads is then one contiguous read.
//! With few sequences the kv heads are split, then the token tiles made smaller (a speculative
//! step's 9 positions at one stream on two threads: 6 items of 5 or 4 tokens and one kv head,
//! not 3 of 9; see [`crate::attention_plan`]).
//! Keys are visited in chunks of `KEY_CHUNK` positions on a fixed grid (independent of the block
//! size, so tiny blocks cost no extra rescaling, and of the tile, so a query's sums do not
//! depend on what else is in the step); within a chunk it computes the scores (each kv head's keys
//! transposed once, then scored against all the tile's rows: `attention_scores`), folds them into
//! the running max/sum of each row and accumulates `P V`, a token's query heads of one kv head at
//! a time (`attention_group`: each V row is loaded once for the group). Each key split
//! starts a fresh softmax and is folded into the item's rows in key order; items run in
//! parallel with rayon, and the items of one tile are folded in key order, normalized and
//! scattered into the result afterwards ([`crate::attention_merge`]).

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, Result};
use rayon::prelude::*;

use crate::attention_merge::{gather, RowStates};
use crate::attention_plan::{plan, Item, KEY_SPLIT};
use crate::attention_scores::HalfRows;
use crate::check::invalid;
use crate::dtype::Float;
use crate::metadata::HostAttentionMetadata;
use crate::simd::{exp_nonpositive, max_lanes, prefetch_l2, scale, sum_lanes, MulAdd, Separate};
#[cfg(target_arch = "x86_64")]
use crate::simd::{Fused, Wide};

/// Key positions per chunk: scores for a chunk stay in L1 alongside the query tile.
const KEY_CHUNK: usize = 64;
const OP: &str = "paged_attention";
/// Target query rows (tokens x heads of a group) per work item.
const ROWS_PER_TILE: usize = 32;

/// One layer's paged K and V caches, `[num_blocks, block_size, kv_heads, head_dim]` each.
pub(crate) struct CacheView<'a, T> {
    pub k: &'a [T],
    pub v: &'a [T],
    pub block_size: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

/// One cache tensor's storage and the element range its contiguous layout covers.
pub(crate) struct CacheSlices<'a> {
    pub storage: &'a CpuStorage,
    pub start: usize,
    pub end: usize,
}

impl CacheSlices<'_> {
    fn slice<T: Float>(&self, what: &str) -> Result<&[T]> {
        self.storage
            .as_slice::<T>()?
            .get(self.start..self.end)
            .ok_or_else(|| invalid(OP, format!("{what} view exceeds its storage")))
    }
}

/// A cache tensor's `[num_blocks, block_size, kv_heads, head_dim]`, less the block count.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CacheShape {
    pub block_size: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

/// [`paged_attention`] over the storages of a K and a V cache of element type `T`.
pub(crate) fn paged_attention_over<T: Float>(
    queries: &Queries<'_>,
    k: CacheSlices<'_>,
    v: CacheSlices<'_>,
    shape: CacheShape,
    meta: &HostAttentionMetadata,
) -> Result<Vec<f32>> {
    if k.storage.dtype() != v.storage.dtype() {
        return Err(candle_core::Error::DTypeMismatchBinaryOp {
            lhs: k.storage.dtype(),
            rhs: v.storage.dtype(),
            op: OP,
        });
    }
    let CacheShape { block_size, kv_heads, head_dim } = shape;
    let view = CacheView {
        k: k.slice::<T>("k_cache")?,
        v: v.slice::<T>("v_cache")?,
        block_size,
        kv_heads,
        head_dim,
    };
    Ok(paged_attention(queries, &view, meta))
}

/// The queries, `[num_tokens, q_heads, head_dim]` contiguous f32, and how to read them.
pub(crate) struct Queries<'a> {
    pub q: &'a [f32],
    pub q_heads: usize,
    pub softmax_scale: f32,
    /// Sliding window: a query at position `p` sees keys `p + 1 - window ..= p` only.
    pub window: Option<usize>,
    /// Scores become `cap * tanh(score / cap)` before the softmax.
    pub logit_softcap: Option<f32>,
    /// Each output row is multiplied by this (an FP8 cache's V scale; 1 for a float cache).
    pub v_scale: f32,
}

/// Per-thread buffers, reused across items.
struct Scratch {
    q: Vec<f32>,
    scores: Vec<f32>,
    /// The current key split's softmax state of each row, and its unnormalized output.
    max: Vec<f32>,
    sum: Vec<f32>,
    split_out: Vec<f32>,
    /// Element offset of each key position of the current chunk in the cache.
    offsets: Vec<usize>,
    /// The current chunk's K (then V) rows of one kv head converted to f32, for caches that
    /// store f16 or bf16.
    kv: Vec<f32>,
    /// One kv head's keys of the current chunk, transposed: `kt[d * KEY_CHUNK + j]`.
    kt: Vec<f32>,
}

/// Runs attention for the whole batch; returns `[num_tokens, q_heads, head_dim]` f32.
///
/// The caller has validated shapes and metadata (`validate` and `validate_for_cache`), so the
/// indexing below stays in bounds.
pub(crate) fn paged_attention<T: Float>(
    queries: &Queries<'_>,
    cache: &CacheView<'_, T>,
    meta: &HostAttentionMetadata,
) -> Vec<f32> {
    let hd = cache.head_dim;
    let group = queries.q_heads / cache.kv_heads;
    let tile_tokens = (ROWS_PER_TILE / group).max(1);
    let items = plan(meta, cache.kv_heads, tile_tokens, queries.window);
    let max_heads = items.iter().map(|it| (it.kv1 - it.kv0) * group).max().unwrap_or(0);
    let rows_cap = tile_tokens * max_heads;
    let results: Vec<(Item, RowStates)> = items
        .into_par_iter()
        .map_init(
            || Scratch {
                q: vec![0.0; rows_cap * hd],
                scores: vec![0.0; rows_cap * KEY_CHUNK],
                max: vec![0.0; rows_cap],
                sum: vec![0.0; rows_cap],
                split_out: vec![0.0; rows_cap * hd],
                offsets: vec![0; 2 * KEY_CHUNK],
                kv: vec![0.0; KEY_CHUNK * max_heads / group * hd],
                kt: vec![0.0; hd * KEY_CHUNK],
            },
            |scratch, item| {
                let mut state = RowStates::empty((item.t1 - item.t0) * (item.kv1 - item.kv0) * group, hd);
                attend(queries, cache, meta, item, scratch, &mut state);
                (item, state)
            },
        )
        .collect();

    let mut output = vec![0f32; queries.q.len()];
    let start = |seq: usize| meta.query_range(seq).start;
    gather(results, &mut output, queries.q_heads, group, hd, queries.v_scale, start);
    output
}

/// One work item, dispatched to a build with AVX2 and FMA when the CPU has them (the default
/// x86-64 target only has SSE2, and these loops are where the time goes).
fn attend<T: Float>(
    queries: &Queries<'_>,
    cache: &CacheView<'_, T>,
    meta: &HostAttentionMetadata,
    item: Item,
    scratch: &mut Scratch,
    state: &mut RowStates,
) {
    #[cfg(target_arch = "x86_64")]
    {
        use crate::simd::{level, Level};
        if level() == Level::Avx512 {
            // SAFETY: the CPU supports AVX-512F, AVX2 and FMA (AVX-512F implies AVX2).
            unsafe { attend_avx512(queries, cache, meta, item, scratch, state) };
            return;
        }
        if level() == Level::Avx2 {
            // SAFETY: the CPU supports AVX2 and FMA (what `level` checks), which is all
            // `attend_avx2` requires beyond the baseline target.
            unsafe { attend_avx2(queries, cache, meta, item, scratch, state) };
            return;
        }
    }
    attend_impl::<T, Separate>(queries, cache, meta, item, scratch, state);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn attend_avx2<T: Float>(
    queries: &Queries<'_>,
    cache: &CacheView<'_, T>,
    meta: &HostAttentionMetadata,
    item: Item,
    scratch: &mut Scratch,
    state: &mut RowStates,
) {
    attend_impl::<T, Fused>(queries, cache, meta, item, scratch, state);
}

/// The same loops with 512-bit vectors available (value accumulation and conversions use them).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn attend_avx512<T: Float>(
    queries: &Queries<'_>,
    cache: &CacheView<'_, T>,
    meta: &HostAttentionMetadata,
    item: Item,
    scratch: &mut Scratch,
    state: &mut RowStates,
) {
    attend_impl::<T, Wide>(queries, cache, meta, item, scratch, state);
}

#[inline(always)]
fn attend_impl<T: Float, M: MulAdd>(
    queries: &Queries<'_>,
    cache: &CacheView<'_, T>,
    meta: &HostAttentionMetadata,
    item: Item,
    scratch: &mut Scratch,
    state: &mut RowStates,
) {
    let hd = cache.head_dim;
    let group = queries.q_heads / cache.kv_heads;
    let kv_count = item.kv1 - item.kv0;
    // Query rows are (token, q head of the item): row = token * heads + head.
    let heads = kv_count * group;
    let tokens = item.t1 - item.t0;
    let rows = tokens * heads;
    let q_range = meta.query_range(item.seq);
    let context = meta.context_lens[item.seq] as usize;
    // Position of the tile's first token; token `ti` of the tile sees keys
    // `window_start(ti)..=first + ti`.
    let first = context - q_range.len() + item.t0;
    let num_keys = first + tokens;
    let window_start = |ti: usize| match queries.window {
        Some(w) => (first + ti + 1).saturating_sub(w),
        None => 0,
    };
    let table = meta.block_table(item.seq);
    let row_stride = cache.kv_heads * hd;

    // Gather the tile's query rows (contiguous per token), pre-scaled.
    let q = &mut scratch.q[..rows * hd];
    for ti in 0..tokens {
        let token = q_range.start + item.t0 + ti;
        let src = (token * queries.q_heads + item.kv0 * group) * hd;
        let dst = &mut q[ti * heads * hd..(ti + 1) * heads * hd];
        for (d, s) in dst.iter_mut().zip(&queries.q[src..src + heads * hd]) {
            *d = s * queries.softmax_scale;
        }
    }
    let max = &mut scratch.max[..rows];
    let sum = &mut scratch.sum[..rows];
    let out = &mut scratch.split_out[..rows * hd];
    let scores = &mut scratch.scores[..rows * KEY_CHUNK];
    let kv_buf = &mut scratch.kv[..];
    let kt = &mut scratch.kt[..];
    let offsets = &mut scratch.offsets[..];

    // Keys before the first token's window are seen by no token of the tile. Chunks sit on a
    // fixed grid of key positions, so the chunks a query is folded over (and its bits) depend on
    // its own position only, not on which tile or step it shares (`--batch-invariant`).
    // Key splits sit on a grid of their own (a multiple of the chunk): each is softmaxed from
    // scratch and folded into `state` in key order, as `gather` folds the splits of other items.
    let first_visible = window_start(0);
    let item_keys =
        (first_visible / KEY_CHUNK * KEY_CHUNK).max(item.s0 * KEY_SPLIT)..num_keys.min(item.s1 * KEY_SPLIT);
    for split in item.s0..item.s1 {
        let keys = item_keys.start.max(split * KEY_SPLIT)..item_keys.end.min((split + 1) * KEY_SPLIT);
        if keys.is_empty() {
            continue;
        }
        max.fill(f32::NEG_INFINITY);
        sum.fill(0.0);
        out.fill(0.0);
        for c0 in keys.clone().step_by(KEY_CHUNK) {
            let n = KEY_CHUNK.min(keys.end - c0);
            for (j, off) in offsets[..n].iter_mut().enumerate() {
                // Positions before every window of the tile are never scored, and their blocks may
                // be released: point them at the first position some query sees.
                let p = (c0 + j).max(first_visible);
                let slot = table[p / cache.block_size] as usize * cache.block_size + p % cache.block_size;
                *off = slot * row_stride + item.kv0 * hd;
            }
            // Block tables scatter a sequence's rows over the cache, beyond what the hardware
            // prefetcher follows: `chunk_rows` requests the next chunk's K/V rows while it reads
            // this chunk's, one row per row read, into level 2 (into level 1 they would evict this
            // chunk's V rows: 13% slower over 30 layers of 32 x 256 f16 rows). Requested in one
            // burst at the chunk's start instead, they stalled the loads behind them: 10-13%
            // slower on the same bench.
            let next = c0 + KEY_CHUNK..(c0 + 2 * KEY_CHUNK).min(item_keys.end);
            let ahead_len = next.len();
            for (p, off) in next.zip(&mut offsets[KEY_CHUNK..]) {
                let slot = table[p / cache.block_size] as usize * cache.block_size + p % cache.block_size;
                *off = slot * row_stride + item.kv0 * hd;
            }
            let (offsets, ahead) = offsets.split_at(KEY_CHUNK);
            let ahead = &ahead[..ahead_len];
            // Keys `lo..hi` of this chunk are visible to tile token `ti`: the chunk's part of its
            // window, empty when `lo >= hi`.
            let visible = |ti: usize| {
                let hi = (first + ti + 1).saturating_sub(c0).min(n);
                (window_start(ti).saturating_sub(c0).min(hi), hi)
            };

            // Scores S = Q K^T for visible (row, key) pairs, one kv head at a time; a token's rows
            // of one kv head are adjacent, so they are scored as one group. A row's scores for key
            // `j` of the chunk sit at `r * KEY_CHUNK + j`. Each kv head's keys are transposed once
            // for all the tile's rows (keys in lanes, where the build calls for it;
            // see `attention_scores`) or read row-major. A position's K (and V) rows of the item's
            // kv heads are adjacent in the cache: they are read and widened as one row, a
            // sequential stream, then split by head; or, for keys in lanes from a 16-bit cache,
            // widened as they are transposed (the next chunk's rows prefetched with head 0's).
            let in_lanes = M::keys_in_lanes();
            let halves = T::as_halves(cache.k).filter(|_| in_lanes && M::transposes_halves(hd));
            let key_rows = match halves {
                Some(_) => None,
                None => Some(chunk_rows::<T, M>(cache.k, &offsets[..n], ahead, 0, kv_count * hd, kv_buf)),
            };
            for kv in 0..kv_count {
                if let Some(k) = halves {
                    let ahead = if kv == 0 { ahead } else { &[] };
                    let rows =
                        HalfRows { offsets: &offsets[..n], at: kv * hd, ahead, ahead_width: kv_count * hd };
                    M::transpose_halves(k, &rows, hd, kt, KEY_CHUNK);
                } else if let (true, Some(rows)) = (in_lanes, &key_rows) {
                    M::transpose_keys(&rows[..n], kv * hd, hd, kt, KEY_CHUNK);
                }
                let row_major = match (&key_rows, in_lanes) {
                    (Some(rows), false) => Some(head_rows(&rows[..n], kv * hd, hd)),
                    _ => None,
                };
                for ti in 0..tokens {
                    let (lo, hi) = visible(ti);
                    if lo >= hi {
                        continue;
                    }
                    let r0 = ti * heads + kv * group;
                    let group_q = &q[r0 * hd..(r0 + group) * hd];
                    match &row_major {
                        Some(keys) => {
                            let group_scores = &mut scores[r0 * KEY_CHUNK + lo..(r0 + group) * KEY_CHUNK];
                            M::group_scores(group_q, hd, &keys[lo..hi], group_scores, KEY_CHUNK);
                        }
                        None => {
                            let group_scores = &mut scores[r0 * KEY_CHUNK..(r0 + group) * KEY_CHUNK];
                            M::chunk_scores(group_q, hd, kt, KEY_CHUNK, lo..hi, group_scores, KEY_CHUNK);
                        }
                    }
                }
            }

            // Online softmax: fold this chunk into each row's running max and sum, rescaling the
            // row's accumulated output when the max grows.
            for r in 0..rows {
                let (lo, hi) = visible(r / heads);
                if lo >= hi {
                    continue;
                }
                let s = &mut scores[r * KEY_CHUNK + lo..r * KEY_CHUNK + hi];
                if let Some(cap) = queries.logit_softcap {
                    for x in s.iter_mut() {
                        *x = cap * (*x / cap).tanh();
                    }
                }
                let chunk_max = max_lanes(s);
                let new_max = max[r].max(chunk_max);
                if new_max > max[r] {
                    let correction = (max[r] - new_max).exp();
                    sum[r] *= correction;
                    scale(&mut out[r * hd..(r + 1) * hd], correction);
                    max[r] = new_max;
                }
                for x in s.iter_mut() {
                    *x -= new_max;
                }
                exp_nonpositive(s);
                sum[r] += sum_lanes(s);
            }

            // Accumulate P V, one kv head and one token's group of rows at a time.
            let all_values = chunk_rows::<T, M>(cache.v, &offsets[..n], ahead, 0, kv_count * hd, kv_buf);
            for kv in 0..kv_count {
                let values = head_rows(&all_values[..n], kv * hd, hd);
                for ti in 0..tokens {
                    let (lo, hi) = visible(ti);
                    if lo >= hi {
                        continue;
                    }
                    let r0 = ti * heads + kv * group;
                    let p = &scores[r0 * KEY_CHUNK + lo..(r0 + group) * KEY_CHUNK];
                    M::group_accumulate(
                        &mut out[r0 * hd..(r0 + group) * hd],
                        hd,
                        p,
                        KEY_CHUNK,
                        &values[lo..hi],
                    );
                }
            }
        }
        state.fold(max, sum, out);
    }
}

/// Columns `at..at + width` of each of `rows`.
#[inline(always)]
fn head_rows<'a>(rows: &[&'a [f32]], at: usize, width: usize) -> [&'a [f32]; KEY_CHUNK] {
    let mut out: [&[f32]; KEY_CHUNK] = [&[]; KEY_CHUNK];
    for (o, row) in out.iter_mut().zip(rows) {
        *o = &row[at..at + width];
    }
    out
}

/// The `head_dim`-wide rows at `offsets[j] + head_offset` of one cache (K or V) as f32: slices
/// of the cache itself when it stores f32 (no copy), else converted into `buf`. Row `j` of
/// `ahead` (the next chunk's offsets) is prefetched with row `j` of this one.
#[inline(always)]
fn chunk_rows<'a, T: Float, M: MulAdd>(
    src: &'a [T],
    offsets: &[usize],
    ahead: &[usize],
    head_offset: usize,
    head_dim: usize,
    buf: &'a mut [f32],
) -> [&'a [f32]; KEY_CHUNK] {
    let mut rows: [&[f32]; KEY_CHUNK] = [&[]; KEY_CHUNK];
    let prefetch = |j: usize| {
        if let Some(off) = ahead.get(j) {
            let at = off + head_offset;
            prefetch_l2(&src[at..at + head_dim]);
        }
    };
    match T::as_f32(src) {
        Some(src) => {
            for (j, (row, off)) in rows.iter_mut().zip(offsets).enumerate() {
                prefetch(j);
                let at = off + head_offset;
                *row = &src[at..at + head_dim];
            }
        }
        None => {
            for (j, ((row, off), dst)) in
                rows.iter_mut().zip(offsets).zip(buf.chunks_exact_mut(head_dim)).enumerate()
            {
                prefetch(j);
                let at = off + head_offset;
                T::to_f32_slice_in::<M>(&src[at..at + head_dim], dst);
                *row = dst;
            }
        }
    }
    rows
}

#[cfg(test)]
#[path = "paged_attention_cpu_tests.rs"]
mod tests;

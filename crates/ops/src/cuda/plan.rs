//! Host-side planning of one `paged_attention` call on CUDA: which kernel handles which query
//! rows, and how a key range is split when there is too little work to fill the GPU.
//!
//! The plan depends only on the host metadata and the head counts, so it is made once per
//! step and shared by every layer (see `cuda::attention`). Pure Rust, tested without a GPU.
//!
//! - Sequences with more than [`SIMT_MAX_ROWS`] rows (query tokens x q heads of a kv head's
//!   group) go to the tensor-core kernel in f16/bf16, in items of up to [`MMA_ROWS`] rows.
//! - Everything else (decodes, short chunks, every f32 item) goes to the CUDA-core kernel in
//!   items of up to 4 or 8 rows.
//! - When all items times kv heads make fewer than half of [`BLOCKS_PER_SM`] blocks per SM,
//!   the CUDA-core items' key ranges are split (flash-decoding) into up to
//!   `BLOCKS_PER_SM * SMs / blocks` pieces of at least [`SPLIT_MIN_KEYS`] keys; the combine
//!   kernel merges the pieces.
//! - Batch-invariant calls ([`PlanParams::batch_invariant`]) plan every query token as a decode
//!   of its own: CUDA-core items of one token, split by the token's key count alone
//!   ([`invariant_splits`]). A row's item, and so its bits, are then those of the same token
//!   decoded alone.
//! - Replay plans ([`plan_replay`], for metadata a CUDA graph replays) depend on the number of
//!   sequences alone: one-token decodes on the CUDA-core kernel, split for the longest context
//!   the metadata can hold, each item marked [`ITEM_RANGE_AT_RUN_TIME`] so that the kernel
//!   takes its position and key range from the sequence's context length when it runs.

/// Rows (tokens x heads) of the CUDA-core kernel's small and large variants.
pub(crate) const SIMT_SMALL_ROWS: usize = 4;
pub(crate) const SIMT_MAX_ROWS: usize = 8;
/// Rows of one tensor-core item.
pub(crate) const MMA_ROWS: usize = 64;
/// Splitting aims at this many blocks per SM.
pub(crate) const BLOCKS_PER_SM: usize = 4;
/// Fewest keys a split may have. On an H200 (benches/reports/2026-11-26-split-kv-decode-h200.md),
/// 128 against 256 took batch-1 decode attention at 1k and 4k keys from 29.5 and 30.5 us
/// to 22 and 24 us and changed nothing at larger batches; 64 made batch 16 x 4k and 64 x 1k
/// about 15 % slower.
pub(crate) const SPLIT_MIN_KEYS: usize = 128;
/// Split boundaries are multiples of this many keys (a multiple of every kernel's key tile).
pub(crate) const SPLIT_GRANULE: usize = 64;
/// Most pieces of one batch-invariant item. Every token of a prefill chunk is split by its own
/// key count there, so the partial rows grow with tokens x pieces: 16 pieces keep a 2048-token
/// chunk of Llama-3.1-8B's heads at 0.5 GB of f32 scratch however long the context, and still
/// give a one-token decode of 8 kv heads 128 blocks.
pub(crate) const INVARIANT_MAX_SPLITS: usize = 16;

/// One unit of attention work; the layout of `WorkItem` in kernels/attention.cuh.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct WorkItem {
    pub seq: u32,
    pub tok0: u32,
    pub ntok: u32,
    pub pos0: u32,
    pub head_lo: u32,
    pub head_cnt: u32,
    pub kv_lo: u32,
    pub kv_hi: u32,
    pub split: u32,
    pub num_splits: u32,
    pub scratch_base: u32,
    /// [`ITEM_RANGE_AT_RUN_TIME`] or 0.
    pub flags: u32,
}

/// u32 words per [`WorkItem`].
pub(crate) const WORK_ITEM_WORDS: usize = 12;

/// `WorkItem::flags` bit of a one-token decode item whose `pos0`, `kv_lo` and `kv_hi` the
/// kernel computes from the sequence's context length (kernels/attention.cuh,
/// `resolve_range_at_run_time`): split `s` of `S` covers keys `[s * piece, (s + 1) * piece)`
/// of the context, `piece` being the context over `S` rounded up to [`SPLIT_GRANULE`] and at
/// least [`SPLIT_MIN_KEYS`].
pub(crate) const ITEM_RANGE_AT_RUN_TIME: u32 = 1;

impl WorkItem {
    pub fn rows(&self) -> usize {
        (self.ntok * self.head_cnt) as usize
    }

    /// The item as the u32 words the kernels read.
    pub fn words(&self) -> [u32; WORK_ITEM_WORDS] {
        [
            self.seq,
            self.tok0,
            self.ntok,
            self.pos0,
            self.head_lo,
            self.head_cnt,
            self.kv_lo,
            self.kv_hi,
            self.split,
            self.num_splits,
            self.scratch_base,
            self.flags,
        ]
    }
}

/// What the plan depends on besides the metadata.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct PlanParams {
    pub num_q_heads: usize,
    pub num_kv_heads: usize,
    /// f16/bf16: long query chunks use the tensor-core kernel.
    pub tensor_cores: bool,
    pub num_sms: usize,
    /// Every token planned as a decode of its own ([`plan_attention`]).
    pub batch_invariant: bool,
}

/// The work of one call, by kernel.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct AttentionPlan {
    /// CUDA-core items of at most [`SIMT_SMALL_ROWS`] rows.
    pub simt_small: Vec<WorkItem>,
    /// CUDA-core items of at most [`SIMT_MAX_ROWS`] rows.
    pub simt: Vec<WorkItem>,
    /// Tensor-core items of at most [`MMA_ROWS`] rows.
    pub mma: Vec<WorkItem>,
    /// Split 0 of every split group, for the combine kernel.
    pub combine: Vec<WorkItem>,
    /// Rows of partial results (f32 `[rows, head_dim]` plus one lse each) the splits write.
    pub partial_rows: usize,
}

/// The query rows of one sequence, before splitting.
struct SeqRows {
    seq: u32,
    tok0: u32,
    q_len: u32,
    pos0: u32,
}

/// Cuts a sequence's rows into items of at most `capacity` rows: whole groups of heads with
/// as many tokens as fit, or (groups larger than `capacity`) one token and a slice of heads.
fn cut(s: &SeqRows, group: u32, capacity: u32, out: &mut Vec<WorkItem>) {
    let (head_chunk, tokens_per_item) =
        if group <= capacity { (group, capacity / group) } else { (capacity, 1) };
    let mut head_lo = 0;
    while head_lo < group {
        let head_cnt = head_chunk.min(group - head_lo);
        let mut t = 0;
        while t < s.q_len {
            let ntok = tokens_per_item.min(s.q_len - t);
            out.push(WorkItem {
                seq: s.seq,
                tok0: s.tok0 + t,
                ntok,
                pos0: s.pos0 + t,
                head_lo,
                head_cnt,
                kv_lo: 0,
                kv_hi: s.pos0 + t + ntok,
                split: 0,
                num_splits: 1,
                ..Default::default()
            });
            t += ntok;
        }
        head_lo += head_cnt;
    }
}

/// How many pieces to split a CUDA-core item's `kv_len` keys into, given the number of
/// blocks the unsplit call would launch.
pub(crate) fn num_splits(kv_len: usize, unsplit_blocks: usize, num_sms: usize) -> usize {
    let target = BLOCKS_PER_SM * num_sms.max(1);
    if unsplit_blocks == 0 || unsplit_blocks >= target {
        return 1;
    }
    // Only whole multiples: a call that is nearly full gains less from splitting than the
    // combine costs.
    let wanted = target / unsplit_blocks;
    let most = (kv_len / SPLIT_MIN_KEYS).max(1);
    let splits = wanted.min(most);
    if splits <= 1 {
        return 1;
    }
    // Round the piece up to the granule; that may need fewer pieces.
    let piece = kv_len.div_ceil(splits).next_multiple_of(SPLIT_GRANULE);
    kv_len.div_ceil(piece)
}

/// The pieces of a batch-invariant item of `kv_len` keys: a function of `kv_len` alone, at
/// least [`SPLIT_MIN_KEYS`] keys each and at most [`INVARIANT_MAX_SPLITS`] of them.
pub(crate) fn invariant_splits(kv_len: usize) -> usize {
    let splits = (kv_len / SPLIT_MIN_KEYS).min(INVARIANT_MAX_SPLITS);
    if splits <= 1 {
        return 1;
    }
    let piece = kv_len.div_ceil(splits).next_multiple_of(SPLIT_GRANULE);
    kv_len.div_ceil(piece)
}

/// Splits `item` (unsplit) into `splits` pieces of its key range, appending them to `out`
/// and the group's first piece to `combine`; returns the partial rows the group uses.
fn split(
    item: WorkItem,
    splits: usize,
    scratch_base: usize,
    kv_heads: usize,
    out: &mut Vec<WorkItem>,
    combine: &mut Vec<WorkItem>,
) -> usize {
    let kv_len = (item.kv_hi - item.kv_lo) as usize;
    let piece = kv_len.div_ceil(splits).next_multiple_of(SPLIT_GRANULE);
    for s in 0..splits {
        let lo = item.kv_lo as usize + s * piece;
        let hi = (lo + piece).min(item.kv_hi as usize);
        let part = WorkItem {
            kv_lo: lo as u32,
            kv_hi: hi as u32,
            split: s as u32,
            num_splits: splits as u32,
            scratch_base: scratch_base as u32,
            ..item
        };
        if s == 0 {
            combine.push(part);
        }
        out.push(part);
    }
    splits * kv_heads * item.rows()
}

/// Plans one call over a validated batch: `cu_seqlens_q` (`num_seqs + 1` starts) and
/// `context_lens` as in [`crate::HostAttentionMetadata`].
pub(crate) fn plan_attention(cu_seqlens_q: &[u32], context_lens: &[u32], p: &PlanParams) -> AttentionPlan {
    let group = (p.num_q_heads / p.num_kv_heads.max(1)).max(1) as u32;
    let mut plan = AttentionPlan::default();
    let mut small = Vec::new();
    let mut large = Vec::new();
    for (seq, &ctx) in context_lens.iter().enumerate() {
        let (start, end) = (cu_seqlens_q[seq], cu_seqlens_q[seq + 1]);
        let q_len = end - start;
        if q_len == 0 {
            continue;
        }
        let rows = SeqRows { seq: seq as u32, tok0: start, q_len, pos0: ctx - q_len };
        let row_count = (q_len * group) as usize;
        if p.batch_invariant {
            // One token per item, on the variant its head group takes in a decode.
            let (capacity, out) = match group as usize <= SIMT_SMALL_ROWS {
                true => (SIMT_SMALL_ROWS, &mut small),
                false => (SIMT_MAX_ROWS, &mut large),
            };
            for t in 0..q_len {
                let token = SeqRows { seq: rows.seq, tok0: start + t, q_len: 1, pos0: rows.pos0 + t };
                cut(&token, group, capacity as u32, out);
            }
        } else if p.tensor_cores && row_count > SIMT_MAX_ROWS {
            cut(&rows, group, MMA_ROWS as u32, &mut plan.mma);
        } else if row_count <= SIMT_SMALL_ROWS {
            cut(&rows, group, SIMT_SMALL_ROWS as u32, &mut small);
        } else {
            cut(&rows, group, SIMT_MAX_ROWS as u32, &mut large);
        }
    }

    let unsplit_blocks = (small.len() + large.len() + plan.mma.len()) * p.num_kv_heads;
    let mut partial_rows = 0;
    for (items, out) in [(small, &mut plan.simt_small), (large, &mut plan.simt)] {
        for item in items {
            let kv_len = (item.kv_hi - item.kv_lo) as usize;
            let splits = match p.batch_invariant {
                true => invariant_splits(kv_len),
                false => num_splits(kv_len, unsplit_blocks, p.num_sms),
            };
            if splits > 1 {
                partial_rows += split(item, splits, partial_rows, p.num_kv_heads, out, &mut plan.combine);
            } else {
                out.push(item);
            }
        }
    }
    plan.partial_rows = partial_rows;

    // Longest key ranges first, so the last wave is made of short items.
    for items in [&mut plan.simt_small, &mut plan.simt] {
        items.sort_by_key(|it| std::cmp::Reverse(it.kv_hi - it.kv_lo));
    }
    plan.mma.sort_by_key(|it| std::cmp::Reverse(it.kv_hi));
    plan
}

/// The plan of `num_seqs` one-token decodes (sequence `i` is query token `i`) whose context
/// lengths are only known when the kernels run, at most `max_context` each: what a CUDA graph
/// captures once and replays at every step of that batch size. Every item reads its key range
/// at run time ([`ITEM_RANGE_AT_RUN_TIME`]); the splits are those a decode of `max_context`
/// keys would get, so a short context leaves the last pieces empty (they exit at once and the
/// combine kernel skips them).
pub(crate) fn plan_replay(num_seqs: usize, max_context: usize, p: &PlanParams) -> AttentionPlan {
    let group = (p.num_q_heads / p.num_kv_heads.max(1)).max(1) as u32;
    let capacity = if group as usize <= SIMT_SMALL_ROWS { SIMT_SMALL_ROWS } else { SIMT_MAX_ROWS };
    let mut items = Vec::new();
    for seq in 0..num_seqs as u32 {
        // pos0 and the key range are placeholders of the longest context; the kernel replaces them.
        let rows = SeqRows { seq, tok0: seq, q_len: 1, pos0: max_context.max(1) as u32 - 1 };
        cut(&rows, group, capacity as u32, &mut items);
    }
    let unsplit_blocks = items.len() * p.num_kv_heads;
    let splits = num_splits(max_context, unsplit_blocks, p.num_sms);
    let mut plan = AttentionPlan::default();
    let out = if capacity == SIMT_SMALL_ROWS { &mut plan.simt_small } else { &mut plan.simt };
    let mut partial_rows = 0;
    for item in items {
        if splits > 1 {
            partial_rows += split(item, splits, partial_rows, p.num_kv_heads, out, &mut plan.combine);
        } else {
            out.push(item);
        }
    }
    plan.partial_rows = partial_rows;
    for it in plan.simt_small.iter_mut().chain(&mut plan.simt).chain(&mut plan.combine) {
        it.flags = ITEM_RANGE_AT_RUN_TIME;
    }
    plan
}

/// The key range `[lo, hi)` and position that split `split` of `num_splits` of a one-token
/// item gets at run time for a context of `context_len` keys: the host's mirror of the
/// kernel's `resolve_range_at_run_time`, for tests.
#[cfg(test)]
pub(crate) fn range_at_run_time(context_len: u32, split: u32, num_splits: u32) -> (u32, u32) {
    let piece =
        context_len.div_ceil(num_splits).next_multiple_of(SPLIT_GRANULE as u32).max(SPLIT_MIN_KEYS as u32);
    let lo = (split * piece).min(context_len);
    (lo, (lo + piece).min(context_len))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn params(q: usize, kv: usize, tensor_cores: bool) -> PlanParams {
        PlanParams { num_q_heads: q, num_kv_heads: kv, tensor_cores, num_sms: 132, batch_invariant: false }
    }

    /// Checks that the plan covers every (token, q head of a group) row exactly once per key
    /// position it may see, with consistent positions, capacities and scratch.
    fn check_plan(cu: &[u32], ctx: &[u32], p: &PlanParams, plan: &AttentionPlan) {
        let group = (p.num_q_heads / p.num_kv_heads) as u32;
        // (token, head in group) -> key positions covered, summed over the items.
        let mut covered: HashMap<(u32, u32), Vec<(u32, u32)>> = HashMap::new();
        let lists = [(&plan.simt_small, SIMT_SMALL_ROWS), (&plan.simt, SIMT_MAX_ROWS), (&plan.mma, MMA_ROWS)];
        let mut scratch: Vec<(usize, usize)> = Vec::new();
        for (items, capacity) in lists {
            for it in items {
                assert!(it.rows() >= 1 && it.rows() <= capacity, "{it:?} exceeds {capacity} rows");
                assert!(it.head_lo + it.head_cnt <= group);
                let seq = it.seq as usize;
                let (start, end) = (cu[seq], cu[seq + 1]);
                assert!(it.tok0 >= start && it.tok0 + it.ntok <= end);
                assert_eq!(it.pos0, ctx[seq] - (end - start) + (it.tok0 - start), "{it:?}");
                assert!(it.kv_lo < it.kv_hi && it.kv_hi <= it.pos0 + it.ntok);
                assert!(it.split < it.num_splits);
                if it.num_splits > 1 {
                    assert!(!std::ptr::eq(items, &plan.mma), "tensor-core items are never split");
                    let lo = it.scratch_base as usize + it.split as usize * p.num_kv_heads * it.rows();
                    scratch.push((lo, lo + p.num_kv_heads * it.rows()));
                }
                for t in it.tok0..it.tok0 + it.ntok {
                    for h in it.head_lo..it.head_lo + it.head_cnt {
                        covered.entry((t, h)).or_default().push((it.kv_lo, it.kv_hi));
                    }
                }
            }
        }
        for (seq, &c) in ctx.iter().enumerate() {
            let (start, end) = (cu[seq], cu[seq + 1]);
            for t in start..end {
                let last_pos = c - (end - t);
                for h in 0..group {
                    let mut ranges =
                        covered.remove(&(t, h)).unwrap_or_else(|| panic!("token {t} head {h} not covered"));
                    ranges.sort();
                    // The ranges tile [0, kv_hi) of the item, which reaches at least this row.
                    assert_eq!(ranges[0].0, 0);
                    for w in ranges.windows(2) {
                        assert_eq!(w[0].1, w[1].0, "gap or overlap in {ranges:?}");
                    }
                    assert!(ranges.last().unwrap().1 > last_pos);
                }
            }
        }
        assert!(covered.is_empty(), "rows outside the batch: {covered:?}");
        scratch.sort();
        for w in scratch.windows(2) {
            assert!(w[0].1 <= w[1].0, "partial rows overlap: {scratch:?}");
        }
        assert!(scratch.last().is_none_or(|s| s.1 <= plan.partial_rows));
        let groups: usize = plan.combine.iter().map(|c| c.num_splits as usize).sum();
        let split_items = plan.simt_small.iter().chain(&plan.simt).filter(|i| i.num_splits > 1).count();
        assert_eq!(groups, split_items);
        assert!(plan.combine.iter().all(|c| c.split == 0 && c.num_splits > 1));
    }

    #[test]
    fn decode_batch_fills_the_gpu_without_splits() {
        let n = 64;
        let cu: Vec<u32> = (0..=n).collect();
        let ctx = vec![4096; n as usize];
        let p = params(32, 8, true);
        let plan = plan_attention(&cu, &ctx, &p);
        check_plan(&cu, &ctx, &p, &plan);
        assert_eq!(plan.simt_small.len(), 64);
        assert!(plan.simt.is_empty() && plan.mma.is_empty() && plan.combine.is_empty());
        assert_eq!(plan.simt_small[0].rows(), 4);
    }

    #[test]
    fn single_long_decode_is_split() {
        let (cu, ctx) = (vec![0, 1], vec![16 * 1024]);
        let p = params(32, 8, true);
        let plan = plan_attention(&cu, &ctx, &p);
        check_plan(&cu, &ctx, &p, &plan);
        // 8 blocks unsplit, 528 wanted: about 66 splits, pieces rounded up to whole granules.
        assert_eq!(plan.combine.len(), 1);
        let splits = plan.combine[0].num_splits as usize;
        assert!((60..=66).contains(&splits), "{splits}");
        assert_eq!(plan.simt_small.len(), splits);
        assert_eq!(plan.partial_rows, splits * 8 * 4);
        assert!(plan.simt_small.iter().all(|i| (i.kv_lo as usize).is_multiple_of(SPLIT_GRANULE)));
    }

    #[test]
    fn short_contexts_are_not_split() {
        // Fewer than two pieces of SPLIT_MIN_KEYS keys: one block walks them all.
        let (cu, ctx) = (vec![0, 1], vec![200]);
        let plan = plan_attention(&cu, &ctx, &params(32, 8, true));
        assert!(plan.combine.is_empty());
        assert_eq!(num_splits(2 * SPLIT_MIN_KEYS - 1, 8, 132), 1);
        assert_eq!(num_splits(2 * SPLIT_MIN_KEYS, 8, 132), 2);
        assert_eq!(num_splits(100_000, 10_000, 132), 1);
    }

    #[test]
    fn prefill_uses_tensor_cores_only_in_half_precision() {
        let (cu, ctx) = (vec![0, 100], vec![150]);
        let half = params(32, 8, true);
        let plan = plan_attention(&cu, &ctx, &half);
        check_plan(&cu, &ctx, &half, &plan);
        // 16 tokens x 4 heads per item.
        assert_eq!(plan.mma.len(), 7);
        assert!(plan.mma.iter().all(|i| i.head_cnt == 4 && i.ntok <= 16));
        assert_eq!(plan.mma[0].kv_hi, 150, "longest first");

        let f32 = params(32, 8, false);
        let plan = plan_attention(&cu, &ctx, &f32);
        check_plan(&cu, &ctx, &f32, &plan);
        assert!(plan.mma.is_empty());
        assert_eq!(plan.simt.len(), 50);
    }

    #[test]
    fn odd_groups_and_mqa_are_tiled() {
        // SmolLM2: 9 q heads over 3 kv heads (groups of 3); MQA with 48 heads; and a group
        // wider than a tensor-core item.
        for (q, kv) in [(9, 3), (48, 1), (80, 1), (12, 12)] {
            for tc in [false, true] {
                let cu = vec![0, 1, 6, 6, 40];
                let ctx = vec![10, 5, 7, 300];
                let p = params(q, kv, tc);
                let plan = plan_attention(&cu, &ctx, &p);
                check_plan(&cu, &ctx, &p, &plan);
            }
        }
    }

    #[test]
    fn mixed_batch_plans_every_row() {
        let cu = vec![0, 1, 2, 130, 131, 131, 140];
        let ctx = vec![1, 900, 128, 20_000, 3, 9];
        for (q, kv) in [(32, 8), (8, 8), (14, 2)] {
            for sms in [1, 132] {
                let p = PlanParams { num_sms: sms, ..params(q, kv, true) };
                check_plan(&cu, &ctx, &p, &plan_attention(&cu, &ctx, &p));
            }
        }
    }

    #[test]
    fn invariant_splits_depend_on_the_key_count_alone() {
        assert_eq!(invariant_splits(1), 1);
        assert_eq!(invariant_splits(2 * SPLIT_MIN_KEYS - 1), 1);
        assert_eq!(invariant_splits(2 * SPLIT_MIN_KEYS), 2);
        assert_eq!(invariant_splits(100_000), INVARIANT_MAX_SPLITS);
        // Every piece `split` cuts holds keys: none starts past the end.
        for kv in [256, 1000, 2049, 5000, 65_537, 100_000] {
            let s = invariant_splits(kv);
            let piece = kv.div_ceil(s).next_multiple_of(SPLIT_GRANULE);
            assert!((s - 1) * piece < kv && s * piece >= kv, "{kv} keys: {s} x {piece}");
        }
    }

    /// Batch-invariant plans give each token the items (kernel variant, heads, key pieces) it
    /// gets decoded alone, whatever the batch around it; only where its rows go differs.
    #[test]
    fn batch_invariant_rows_get_their_one_token_decode_items() {
        let cu = vec![0, 1, 10, 138, 139, 139, 148];
        let ctx = vec![1, 900, 128, 20_000, 3, 9];
        let key = |list: usize, it: &WorkItem| {
            (list, it.pos0, it.head_lo, it.head_cnt, it.kv_lo, it.kv_hi, it.split, it.num_splits)
        };
        let items = |plan: &AttentionPlan| -> Vec<(usize, WorkItem)> {
            let lists = [&plan.simt_small, &plan.simt, &plan.mma];
            lists.iter().enumerate().flat_map(|(l, items)| items.iter().map(move |it| (l, *it))).collect()
        };
        for (q, kv) in [(9, 3), (32, 8), (8, 1), (80, 1)] {
            let p = PlanParams { batch_invariant: true, ..params(q, kv, true) };
            let plan = plan_attention(&cu, &ctx, &p);
            check_plan(&cu, &ctx, &p, &plan);
            assert!(plan.mma.is_empty());
            assert!(plan.combine.iter().all(|c| c.num_splits as usize <= INVARIANT_MAX_SPLITS));
            assert!(
                plan.combine.iter().any(|c| c.num_splits as usize == INVARIANT_MAX_SPLITS),
                "20k keys: 16"
            );
            for (seq, &c) in ctx.iter().enumerate() {
                for t in cu[seq]..cu[seq + 1] {
                    let pos = c - (cu[seq + 1] - t);
                    let mut in_batch: Vec<_> = items(&plan)
                        .iter()
                        .filter(|(_, it)| it.tok0 == t)
                        .map(|(l, it)| key(*l, it))
                        .collect();
                    assert!(items(&plan).iter().filter(|(_, it)| it.tok0 == t).all(|(_, it)| it.ntok == 1));
                    let alone = plan_attention(&[0, 1], &[pos + 1], &p);
                    let mut want: Vec<_> = items(&alone).iter().map(|(l, it)| key(*l, it)).collect();
                    in_batch.sort();
                    want.sort();
                    assert_eq!(in_batch, want, "q {q} kv {kv}: token {t} at {pos}");
                }
            }
        }
    }

    #[test]
    fn work_item_matches_the_kernel_layout() {
        assert_eq!(std::mem::size_of::<WorkItem>(), WORK_ITEM_WORDS * 4);
        let it = WorkItem {
            seq: 1,
            tok0: 2,
            ntok: 3,
            pos0: 4,
            head_lo: 5,
            head_cnt: 6,
            kv_lo: 7,
            kv_hi: 8,
            split: 9,
            num_splits: 10,
            scratch_base: 11,
            flags: 12,
        };
        assert_eq!(it.words(), [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]);
    }

    /// A replay plan covers every head of every sequence once, and the ranges its pieces take
    /// at run time tile each context exactly, whatever its length up to the plan's limit.
    #[test]
    fn replay_plans_tile_every_context_at_run_time() {
        for (num_seqs, q, kv) in [(1, 32, 8), (3, 32, 8), (8, 14, 2), (64, 32, 8), (2, 16, 1)] {
            let p = params(q, kv, true);
            let max_context = 8192;
            let plan = plan_replay(num_seqs, max_context, &p);
            assert!(plan.mma.is_empty());
            let items: Vec<&WorkItem> = plan.simt_small.iter().chain(&plan.simt).collect();
            assert!(items
                .iter()
                .chain(&plan.combine.iter().collect::<Vec<_>>())
                .all(|it| it.flags == ITEM_RANGE_AT_RUN_TIME));
            let group = (q / kv) as u32;
            for ctx in [1u32, 5, 127, 128, 129, 1000, 4096, 8192] {
                let mut covered: HashMap<(u32, u32), Vec<(u32, u32)>> = HashMap::new();
                for it in &items {
                    assert_eq!((it.ntok, it.tok0), (1, it.seq));
                    let (lo, hi) = range_at_run_time(ctx, it.split, it.num_splits);
                    for h in it.head_lo..it.head_lo + it.head_cnt {
                        covered.entry((it.seq, h)).or_default().push((lo, hi));
                    }
                }
                assert_eq!(covered.len(), num_seqs * group as usize);
                for ranges in covered.values_mut() {
                    ranges.retain(|r| r.0 < r.1);
                    ranges.sort();
                    assert_eq!(ranges[0].0, 0, "{ranges:?}");
                    assert_eq!(ranges.last().unwrap().1, ctx, "{ranges:?}");
                    assert!(ranges.windows(2).all(|w| w[0].1 == w[1].0), "{ranges:?}");
                }
            }
            let split_items = items.iter().filter(|i| i.num_splits > 1).count();
            assert_eq!(plan.combine.iter().map(|c| c.num_splits as usize).sum::<usize>(), split_items);
        }
        // One sequence of a long context is split to fill the GPU; 64 are not split.
        assert!(plan_replay(1, 8192, &params(32, 8, true)).combine.len() == 1);
        assert!(plan_replay(64, 8192, &params(32, 8, true)).combine.is_empty());
    }
}

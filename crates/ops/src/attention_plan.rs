//! How the CPU attention splits a batch into work items for the thread pool (see
//! [`crate::paged_attention_cpu`]): an item is one sequence's tile of query tokens over a range of
//! its kv heads and a range of its key splits. With many sequences an item takes all kv heads
//! and all keys of a sequence's tile; with few, the keys are split first (a long context's
//! decode reads its whole rows in parallel, each thread a stretch of positions), then the kv
//! heads, then the token tiles made smaller, until every thread has several items.
//!
//! Keys are split on a fixed grid of [`KEY_SPLIT`] positions, and every query folds its splits
//! in key order whether they came from one item or several (see
//! [`crate::attention_merge`]), so no split changes a bit.

use crate::metadata::HostAttentionMetadata;

/// Items per thread below which items are made smaller (kv heads split, then token tiles) for
/// more parallelism.
pub(crate) const MIN_ITEMS_PER_THREAD: usize = 4;

/// Items per thread that splitting token tiles aims at. Lower than [`MIN_ITEMS_PER_THREAD`]:
/// every tile of a sequence reads and widens all its keys again, so a speculative step's 9
/// positions ran faster in 6 items (tiles of 5 and 4 tokens) than in 9 (`bench_attention`,
/// 55 against 61 us per layer at 300 keys on two threads).
const MIN_TILE_ITEMS_PER_THREAD: usize = 2;

/// Key positions per split: each query's keys are softmaxed split by split (positions
/// `s * KEY_SPLIT..(s + 1) * KEY_SPLIT`) and the splits folded in order. A multiple of the
/// kernel's key chunk; small enough that a two-thread box parallelises a few hundred keys.
pub(crate) const KEY_SPLIT: usize = 128;

/// One unit of work: a sequence's tokens `t0..t1` over its kv heads `kv0..kv1` and key splits
/// `s0..s1`. Either `s0` is the first split the tile sees (the item folds `s0..s1` itself) or
/// the item holds one split alone, so folding items in key order folds splits in key order.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Item {
    pub seq: usize,
    /// Kv heads `kv0..kv1`; the item's q heads are `kv0 * group..kv1 * group`.
    pub kv0: usize,
    pub kv1: usize,
    /// Tile of query tokens, as indices within the sequence's queries.
    pub t0: usize,
    pub t1: usize,
    /// Key splits `s0..s1` (positions `s0 * KEY_SPLIT..min(s1 * KEY_SPLIT, keys)`).
    pub s0: usize,
    pub s1: usize,
}

/// Key splits `first..end` that the query tokens `t0..t1` of sequence `seq` see: from the
/// split of the first token's window start to the one holding the last token's position.
pub(crate) fn tile_splits(
    meta: &HostAttentionMetadata,
    seq: usize,
    t0: usize,
    t1: usize,
    window: Option<usize>,
) -> std::ops::Range<usize> {
    let context = meta.context_lens[seq] as usize;
    let first = context - meta.query_range(seq).len() + t0;
    let first_visible = window.map_or(0, |w| (first + 1).saturating_sub(w));
    first_visible / KEY_SPLIT..(first + (t1 - t0)).div_ceil(KEY_SPLIT)
}

/// Splits the batch into items: all kv heads and keys per item unless that leaves too few
/// items for the thread pool; then every key split becomes its own item, then the kv heads are
/// split in as few parts as needed, then the tiles of query tokens made smaller (tiles of at
/// most `max_tile_tokens`). Longest items first, so a big one does not start last and leave the
/// other threads idle. No split changes a bit: a query's sums depend on its own position only.
pub(crate) fn plan(
    meta: &HostAttentionMetadata,
    kv_heads: usize,
    max_tile_tokens: usize,
    window: Option<usize>,
) -> Vec<Item> {
    // (Tile size, whether splits are items) -> the tiles' starts and ends, and the unit count.
    let tiles_of = |t: usize| -> Vec<(usize, usize, usize)> {
        let mut tiles = Vec::new();
        for seq in 0..meta.num_seqs() {
            let q_len = meta.query_range(seq).len();
            // As many tiles as `t` needs, of even sizes (9 tokens in 3 tiles: 3, 3, 3).
            let tile = q_len.div_ceil(q_len.div_ceil(t).max(1)).max(1);
            tiles.extend((0..q_len).step_by(tile).map(|t0| (seq, t0, (t0 + tile).min(q_len))));
        }
        tiles
    };
    let units = |tiles: &[(usize, usize, usize)], split: bool| -> usize {
        match split {
            false => tiles.len(),
            true => tiles.iter().map(|&(seq, t0, t1)| tile_splits(meta, seq, t0, t1, window).len()).sum(),
        }
    };
    let threads = rayon::current_num_threads();
    let wanted = MIN_ITEMS_PER_THREAD * threads;
    let whole_tiles = tiles_of(max_tile_tokens);
    let split = units(&whole_tiles, false) < wanted;
    let base = units(&whole_tiles, split);
    let parts = (1..=kv_heads).find(|p| base * p >= wanted).unwrap_or(kv_heads);
    // Still too few items (a few sequences of several tokens, as a speculative step verifies):
    // smaller tiles of tokens, down to one token per item.
    let wanted_tiles = MIN_TILE_ITEMS_PER_THREAD * threads;
    let tile_tokens = (1..=max_tile_tokens)
        .rev()
        .find(|&t| units(&tiles_of(t), split) * parts >= wanted_tiles)
        .unwrap_or(1);
    let heads_per_part = kv_heads.div_ceil(parts);
    let mut items = Vec::new();
    for (seq, t0, t1) in tiles_of(tile_tokens) {
        let splits = tile_splits(meta, seq, t0, t1, window);
        for kv0 in (0..kv_heads).step_by(heads_per_part) {
            let kv1 = (kv0 + heads_per_part).min(kv_heads);
            let item = |s0, s1| Item { seq, kv0, kv1, t0, t1, s0, s1 };
            match split {
                false => items.push(item(splits.start, splits.end)),
                true => items.extend(splits.clone().map(|s| item(s, s + 1))),
            }
        }
    }
    items.sort_by_key(|it| {
        let keys = (meta.context_lens[it.seq] as usize).min(it.s1 * KEY_SPLIT) - it.s0 * KEY_SPLIT;
        std::cmp::Reverse(keys * (it.t1 - it.t0) * (it.kv1 - it.kv0))
    });
    items
}

/// Metadata of sequences with these query lengths and contexts (no cache behind them): what the
/// plan and the kernels' tests feed in.
#[cfg(test)]
pub(crate) fn test_meta(q_lens: &[u32], contexts: &[u32]) -> HostAttentionMetadata {
    let mut cu = vec![0];
    for q in q_lens {
        cu.push(cu.last().unwrap() + q);
    }
    HostAttentionMetadata {
        slot_mapping: vec![0; *cu.last().unwrap() as usize],
        cu_seqlens_q: cu,
        context_lens: contexts.to_vec(),
        block_tables: vec![],
        max_blocks_per_seq: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use test_meta as meta;

    /// Every (sequence, kv head, query token) is covered by items of one tile whose key splits
    /// run from the tile's first split to its last without gap or overlap, every item after
    /// the first holding one split.
    fn assert_partition(
        m: &HostAttentionMetadata,
        kv_heads: usize,
        tile: usize,
        window: Option<usize>,
    ) -> Vec<Item> {
        let items = plan(m, kv_heads, tile, window);
        for seq in 0..m.num_seqs() {
            for kv in 0..kv_heads {
                for t in 0..m.query_range(seq).len() {
                    let mut mine: Vec<&Item> = items
                        .iter()
                        .filter(|i| i.seq == seq && (i.kv0..i.kv1).contains(&kv) && (i.t0..i.t1).contains(&t))
                        .collect();
                    assert!(!mine.is_empty(), "seq {seq} kv {kv} token {t}");
                    mine.sort_by_key(|i| i.s0);
                    let splits = tile_splits(m, seq, mine[0].t0, mine[0].t1, window);
                    assert_eq!(mine[0].s0, splits.start, "seq {seq} kv {kv} token {t}");
                    assert_eq!(mine.last().unwrap().s1, splits.end, "seq {seq} kv {kv} token {t}");
                    for pair in mine.windows(2) {
                        assert_eq!(
                            (pair[0].t0, pair[0].t1, pair[0].kv0),
                            (pair[1].t0, pair[1].t1, pair[1].kv0)
                        );
                        assert_eq!(pair[0].s1, pair[1].s0, "seq {seq} kv {kv} token {t}");
                        assert_eq!(pair[1].s1, pair[1].s0 + 1, "a later item holds one split");
                    }
                }
            }
        }
        assert!(items.iter().all(|i| i.t1 - i.t0 <= tile && i.t1 > i.t0 && i.s1 > i.s0));
        items
    }

    #[test]
    fn plan_partitions_the_batch() {
        let pool = |n| rayon::ThreadPoolBuilder::new().num_threads(n).build().unwrap();
        // Many decodes on one thread: whole sequences per item.
        let decodes = meta(&[1; 12], &[100; 12]);
        let items = pool(1).install(|| assert_partition(&decodes, 3, 10, None));
        assert!(items.iter().all(|i| (i.kv0, i.kv1, i.s0, i.s1) == (0, 3, 0, 1)));
        // One short decode on many threads: one key split, kv heads split one per item.
        let one = meta(&[1], &[100]);
        let items = pool(8).install(|| assert_partition(&one, 3, 10, None));
        assert_eq!(items.len(), 3);
        // One long decode on two threads: its key splits in parallel, all kv heads each (whole
        // cache rows read by one thread).
        let long = meta(&[1], &[2000]);
        let items = pool(2).install(|| assert_partition(&long, 3, 10, None));
        assert_eq!(items.len(), 2000usize.div_ceil(KEY_SPLIT));
        assert!(items.iter().all(|i| (i.kv0, i.kv1, i.s1 - i.s0) == (0, 3, 1)));
        // Inside a sliding window only the splits the window reaches.
        let items = pool(2).install(|| assert_partition(&long, 3, 10, Some(300)));
        assert_eq!(items.iter().map(|i| i.s0).min(), Some(1700 / KEY_SPLIT));
        // A speculative step's verification (one sequence, 9 tokens) on two threads: its two
        // key splits and three kv heads give both threads three items.
        let verify = meta(&[9], &[224]);
        let items = pool(2).install(|| assert_partition(&verify, 3, 10, None));
        assert_eq!(items.len(), 2 * 3);
        assert!(items.iter().all(|i| i.kv1 - i.kv0 == 1 && i.t1 - i.t0 == 9));
        // Short enough for one split: the tokens tiled in two instead.
        let verify = meta(&[9], &[100]);
        let items = pool(2).install(|| assert_partition(&verify, 3, 10, None));
        assert_eq!(items.len(), 3 * 2);
        assert!(items.iter().all(|i| i.kv1 - i.kv0 == 1 && [4, 5].contains(&(i.t1 - i.t0))));
        // Mixed, with q_len 0, tiles that do not divide the chunk, and windows.
        let mixed = meta(&[0, 25, 1, 7, 300], &[5, 40, 9, 7, 900]);
        for threads in [1, 2, 16] {
            for window in [None, Some(50), Some(400)] {
                pool(threads).install(|| assert_partition(&mixed, 4, 8, window));
            }
        }
        let items = pool(1).install(|| plan(&mixed, 4, 8, None));
        // Longest work first.
        assert_eq!((items[0].seq, items[0].t1 - items[0].t0), (4, 8));
    }
}

//! How the CPU attention splits a batch into work items for the thread pool (see
//! [`crate::paged_attention_cpu`]): an item is one sequence's tile of query tokens over a range of
//! its kv heads. With many sequences an item takes all kv heads of a sequence; with few, the kv
//! heads are split, then the token tiles made smaller, until every thread has several items.

use crate::metadata::HostAttentionMetadata;

/// Items per thread below which items are made smaller (kv heads split, then token tiles) for
/// more parallelism.
pub(crate) const MIN_ITEMS_PER_THREAD: usize = 4;

/// Items per thread that splitting token tiles aims at. Lower than [`MIN_ITEMS_PER_THREAD`]:
/// every tile of a sequence reads and widens all its keys again, so a speculative step's 9
/// positions ran faster in 6 items (tiles of 5 and 4 tokens) than in 9 (`bench_attention`,
/// 55 against 61 us per layer at 300 keys on two threads).
const MIN_TILE_ITEMS_PER_THREAD: usize = 2;

/// One unit of work: a sequence's tokens `t0..t1` over its kv heads `kv0..kv1`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Item {
    pub seq: usize,
    /// Kv heads `kv0..kv1`; the item's q heads are `kv0 * group..kv1 * group`.
    pub kv0: usize,
    pub kv1: usize,
    /// Tile of query tokens, as indices within the sequence's queries.
    pub t0: usize,
    pub t1: usize,
}

/// Splits the batch into items: all kv heads per item unless that leaves too few items for the
/// thread pool, then the kv heads are split in as few parts as needed, then the tiles of query
/// tokens made smaller (tiles of at most `max_tile_tokens`). Longest items first, so a big one
/// does not start last and leave the other threads idle. The split changes no bits: a query's
/// sums depend on its own position only.
pub(crate) fn plan(meta: &HostAttentionMetadata, kv_heads: usize, max_tile_tokens: usize) -> Vec<Item> {
    let tiles_of =
        |t: usize| -> usize { (0..meta.num_seqs()).map(|s| meta.query_range(s).len().div_ceil(t)).sum() };
    let wanted = MIN_ITEMS_PER_THREAD * rayon::current_num_threads();
    let tiles = tiles_of(max_tile_tokens);
    let parts = (1..=kv_heads).find(|p| tiles * p >= wanted).unwrap_or(kv_heads);
    // Still too few items (a few sequences of several tokens, as a speculative step verifies):
    // smaller tiles of tokens, down to one token per item.
    let wanted_tiles = MIN_TILE_ITEMS_PER_THREAD * rayon::current_num_threads();
    let tile_tokens = (1..=max_tile_tokens).rev().find(|&t| tiles_of(t) * parts >= wanted_tiles).unwrap_or(1);
    let tiles = tiles_of(tile_tokens);
    let heads_per_part = kv_heads.div_ceil(parts);
    let mut items = Vec::with_capacity(tiles * parts);
    for seq in 0..meta.num_seqs() {
        let q_len = meta.query_range(seq).len();
        // As many tiles as `tile_tokens` needs, of even sizes (9 tokens in 3 tiles: 3, 3, 3).
        let tile = q_len.div_ceil(q_len.div_ceil(tile_tokens).max(1)).max(1);
        for kv0 in (0..kv_heads).step_by(heads_per_part) {
            let kv1 = (kv0 + heads_per_part).min(kv_heads);
            for t0 in (0..q_len).step_by(tile) {
                items.push(Item { seq, kv0, kv1, t0, t1: (t0 + tile).min(q_len) });
            }
        }
    }
    items.sort_by_key(|it| {
        let keys = meta.context_lens[it.seq] as usize;
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

    /// Every (sequence, kv head, query token) is covered by exactly one item.
    fn assert_partition(m: &HostAttentionMetadata, kv_heads: usize, tile: usize) -> Vec<Item> {
        let items = plan(m, kv_heads, tile);
        for seq in 0..m.num_seqs() {
            for kv in 0..kv_heads {
                for t in 0..m.query_range(seq).len() {
                    let n = items
                        .iter()
                        .filter(|i| i.seq == seq && (i.kv0..i.kv1).contains(&kv) && (i.t0..i.t1).contains(&t))
                        .count();
                    assert_eq!(n, 1, "seq {seq} kv {kv} token {t}");
                }
            }
        }
        assert!(items.iter().all(|i| i.t1 - i.t0 <= tile && i.t1 > i.t0));
        items
    }

    #[test]
    fn plan_partitions_the_batch() {
        let pool = |n| rayon::ThreadPoolBuilder::new().num_threads(n).build().unwrap();
        // Many decodes on one thread: whole sequences per item.
        let decodes = meta(&[1; 12], &[100; 12]);
        let items = pool(1).install(|| assert_partition(&decodes, 3, 10));
        assert!(items.iter().all(|i| (i.kv0, i.kv1) == (0, 3)));
        // One decode on many threads: kv heads split one per item.
        let one = meta(&[1], &[100]);
        let items = pool(8).install(|| assert_partition(&one, 3, 10));
        assert_eq!(items.len(), 3);
        // A speculative step's verification (one sequence, 9 tokens) on two threads: kv heads
        // split and the tokens tiled in two, so both threads get three items.
        let verify = meta(&[9], &[224]);
        let items = pool(2).install(|| assert_partition(&verify, 3, 10));
        assert_eq!(items.len(), 6);
        assert!(items.iter().all(|i| i.kv1 - i.kv0 == 1 && [4, 5].contains(&(i.t1 - i.t0))));
        // Mixed, with q_len 0 and tiles that do not divide the chunk.
        let mixed = meta(&[0, 25, 1, 7], &[5, 40, 9, 7]);
        for threads in [1, 2, 16] {
            pool(threads).install(|| assert_partition(&mixed, 4, 8));
        }
        let items = pool(1).install(|| plan(&mixed, 4, 8));
        // Longest work first.
        assert_eq!((items[0].seq, items[0].t1 - items[0].t0), (1, 7));
    }
}

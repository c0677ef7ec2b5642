//! Block manager unit tests: single-group behaviour (as before KV groups) and windowed groups.

use super::*;
use crate::kv_groups::{KvGroups, NULL_BLOCK};

fn seq(id: u64, tokens: Vec<u32>) -> Sequence {
    Sequence::new(id, id, 0, tokens, 0)
}

/// Admits `s` computing as much of it as possible (all but the last token from the cache).
fn admit_all(bm: &mut BlockManager, s: &mut Sequence, copies: &mut Vec<(BlockId, BlockId)>) {
    let cap = s.len() - 1;
    let plan = bm.plan_admission(s, cap);
    let q = s.len() - plan.num_cached_tokens;
    bm.admit(s, plan, q, copies).unwrap();
    s.num_computed_tokens = s.len();
    bm.commit_computed(s);
}

#[test]
fn allocates_blocks_as_tokens_grow() {
    let mut bm = BlockManager::new(8, 4, true);
    let mut s = seq(1, (0..6).collect());
    let mut copies = Vec::new();
    admit_all(&mut bm, &mut s, &mut copies);
    assert_eq!(s.block_tables[0].len(), 2);
    assert!(copies.is_empty());
    // Two more decode tokens fit in block 2; the third needs block 3.
    for t in 6..9 {
        s.token_ids.push(t);
        bm.allocate(&mut s, 1, &mut copies).unwrap();
        s.num_computed_tokens += 1;
        bm.commit_computed(&mut s);
    }
    assert_eq!(s.block_tables[0].len(), 3);
    assert_eq!(bm.num_used_blocks(), 3);
    bm.free(&mut s);
    assert_eq!(bm.num_free_blocks(), 8);
    bm.audit(std::iter::empty::<&[Vec<BlockId>]>()).unwrap();
}

#[test]
fn prefix_hit_reuses_full_blocks_and_counts_tokens() {
    let mut bm = BlockManager::new(16, 4, true);
    let mut copies = Vec::new();
    let mut a = seq(1, (0..10).collect());
    admit_all(&mut bm, &mut a, &mut copies);
    let mut b = seq(2, (0..8).chain(100..105).collect());
    let cap = b.len() - 1;
    let plan = bm.plan_admission(&mut b, cap);
    assert_eq!(plan.num_cached_tokens, 8);
    bm.admit(&mut b, plan, 5, &mut copies).unwrap();
    assert_eq!(b.block_tables[0][..2], a.block_tables[0][..2]);
    assert_ne!(b.block_tables[0][2], a.block_tables[0][2]);
    assert!(copies.is_empty());
    assert_eq!(bm.prefix_cache_queries(), 10 + 13);
    assert_eq!(bm.prefix_cache_hits(), 8);
    bm.audit([a.block_tables.as_slice(), b.block_tables.as_slice()]).unwrap();
}

#[test]
fn each_lora_adapter_caches_its_own_blocks() {
    let mut bm = BlockManager::new(32, 4, true);
    let mut copies = Vec::new();
    let with = |id, lora| {
        let mut s = seq(id, (0..10).collect());
        s.lora = lora;
        s
    };
    let mut base = with(1, None);
    admit_all(&mut bm, &mut base, &mut copies);
    let mut adapter = with(2, Some(7));
    admit_all(&mut bm, &mut adapter, &mut copies);
    // The same tokens under another adapter (or none) are a miss; under the same, a hit.
    assert_eq!(bm.prefix_cache_hits(), 0);
    let mut again = with(3, Some(7));
    let cap = again.len() - 1;
    assert_eq!(bm.plan_admission(&mut again, cap).num_cached_tokens, 8);
    let mut other = with(4, Some(8));
    assert_eq!(bm.plan_admission(&mut other, cap).num_cached_tokens, 0);
    let mut plain = with(5, None);
    assert_eq!(bm.plan_admission(&mut plain, cap).num_cached_tokens, 8);
    assert_ne!(base.block_tables[0][0], adapter.block_tables[0][0]);
}

#[test]
fn different_prefix_same_block_tokens_is_a_miss() {
    let mut bm = BlockManager::new(16, 2, true);
    let mut copies = Vec::new();
    let mut a = seq(1, vec![1, 2, 3, 4, 9]);
    admit_all(&mut bm, &mut a, &mut copies);
    // Second block equal, first block different: the chain must not match it.
    let mut b = seq(2, vec![7, 7, 3, 4, 9]);
    let plan = bm.plan_admission(&mut b, 4);
    assert_eq!(plan.num_cached_tokens, 0);
}

#[test]
fn freed_blocks_are_revived_from_the_cache() {
    let mut bm = BlockManager::new(4, 4, true);
    let mut copies = Vec::new();
    let mut a = seq(1, (0..9).collect());
    admit_all(&mut bm, &mut a, &mut copies);
    let table = a.block_tables[0].clone();
    bm.free(&mut a);
    assert_eq!(bm.num_free_blocks(), 4);
    let mut b = seq(2, (0..9).collect());
    let plan = bm.plan_admission(&mut b, 8);
    assert_eq!(plan.num_cached_tokens, 8);
    assert_eq!(bm.admission_blocks_needed(&plan, 1), 3);
    bm.admit(&mut b, plan, 1, &mut copies).unwrap();
    assert_eq!(b.block_tables[0][..2], table[..2]);
    bm.audit([b.block_tables.as_slice()]).unwrap();
}

#[test]
fn fully_cached_prompt_copies_its_last_block_to_recompute_one_token() {
    let mut bm = BlockManager::new(8, 4, true);
    let mut copies = Vec::new();
    let mut a = seq(1, (0..8).collect());
    admit_all(&mut bm, &mut a, &mut copies);
    let mut b = seq(2, (0..8).collect());
    let plan = bm.plan_admission(&mut b, 7);
    assert_eq!(plan.num_cached_tokens, 7);
    assert_eq!(bm.admission_blocks_needed(&plan, 1), 1);
    bm.admit(&mut b, plan, 1, &mut copies).unwrap();
    assert_eq!(b.block_tables[0][0], a.block_tables[0][0]);
    assert_eq!(copies, vec![(a.block_tables[0][1], b.block_tables[0][1])]);
    // After computing, the copy is not registered twice; the original stays canonical.
    b.num_computed_tokens = 8;
    bm.commit_computed(&mut b);
    assert!(!bm.pool().is_cached(b.block_tables[0][1]));
    assert!(b.cache_refs[0][1].is_some());
    bm.audit([a.block_tables.as_slice(), b.block_tables.as_slice()]).unwrap();
}

#[test]
fn shared_partial_block_is_copied_on_write() {
    let mut bm = BlockManager::new(8, 4, false);
    let mut copies = Vec::new();
    let mut parent = seq(1, (0..6).collect());
    let plan = bm.plan_admission(&mut parent, 5);
    bm.admit(&mut parent, plan, 5, &mut copies).unwrap();
    parent.num_computed_tokens = 5;
    let mut child = parent.fork(2, 1, 0);
    bm.share(&child.block_tables);
    // The child writes position 5 into the shared partial block 1: copy first.
    assert_eq!(bm.blocks_needed(&child, 1), 1);
    bm.allocate(&mut child, 1, &mut copies).unwrap();
    assert_eq!(copies, vec![(parent.block_tables[0][1], child.block_tables[0][1])]);
    assert_eq!(child.block_tables[0][0], parent.block_tables[0][0]);
    // The parent is now the only holder: it writes in place.
    assert_eq!(bm.blocks_needed(&parent, 1), 0);
    bm.allocate(&mut parent, 1, &mut copies).unwrap();
    assert_eq!(copies.len(), 1);
    bm.audit([parent.block_tables.as_slice(), child.block_tables.as_slice()]).unwrap();
    bm.free(&mut parent);
    bm.free(&mut child);
    assert_eq!(bm.num_free_blocks(), 8);
}

#[test]
fn out_of_blocks_is_all_or_nothing() {
    let mut bm = BlockManager::new(2, 4, true);
    let mut copies = Vec::new();
    let mut s = seq(1, (0..12).collect());
    let plan = bm.plan_admission(&mut s, 11);
    assert_eq!(bm.admission_max_tokens(&plan, 12), 8);
    let err = bm.admit(&mut s, plan, 12, &mut copies).unwrap_err();
    assert_eq!(err, OutOfBlocks { needed: 3, free: 2 });
    assert!(s.block_tables.is_empty());
    assert_eq!(bm.num_free_blocks(), 2);
    bm.audit(std::iter::empty::<&[Vec<BlockId>]>()).unwrap();
}

#[test]
fn disabled_cache_never_hits() {
    let mut bm = BlockManager::new(8, 2, false);
    let mut copies = Vec::new();
    let mut a = seq(1, vec![1, 2, 3, 4, 5]);
    admit_all(&mut bm, &mut a, &mut copies);
    let mut b = seq(2, vec![1, 2, 3, 4, 5]);
    assert_eq!(bm.plan_admission(&mut b, 4).num_cached_tokens, 0);
    assert_eq!(bm.prefix_cache_queries(), 0);
}

/// A full group and two windowed groups of `window` tokens.
fn hybrid(num_blocks: usize, block_size: usize, window: usize) -> BlockManager {
    let groups = KvGroups::new(vec![None, Some(window), Some(window)]).unwrap();
    BlockManager::with_groups(num_blocks, block_size, groups, true)
}

/// Computes one more token of `s` (a decode).
fn decode(bm: &mut BlockManager, s: &mut Sequence, token: u32, copies: &mut Vec<(BlockId, BlockId)>) {
    s.token_ids.push(token);
    bm.allocate(s, 1, copies).unwrap();
    s.num_computed_tokens += 1;
    bm.commit_computed(s);
}

fn held(table: &[BlockId]) -> usize {
    table.iter().filter(|&&b| b != NULL_BLOCK).count()
}

#[test]
fn windowed_groups_release_blocks_as_the_sequence_grows() {
    // Window 6, blocks of 4: the next query at 12 reads keys 7..=11, blocks 1 and 2.
    let mut bm = hybrid(64, 4, 6);
    let mut copies = Vec::new();
    let mut s = seq(1, (0..12).collect());
    admit_all(&mut bm, &mut s, &mut copies);
    assert_eq!(s.block_tables[0].len(), 3);
    assert_eq!(held(&s.block_tables[0]), 3);
    for g in 1..3 {
        assert_eq!(s.block_tables[g][0], NULL_BLOCK, "group {g}");
        assert_eq!(held(&s.block_tables[g]), 2);
    }
    assert_eq!(bm.num_used_blocks(), 3 + 2 * 2);
    bm.audit_sequence(&s).unwrap();
    // Every group's blocks are distinct pages.
    let mut all: Vec<_> = s.block_tables.iter().flatten().filter(|&&b| b != NULL_BLOCK).collect();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), 7);
    // Released blocks stay cached (evictable) under their hash.
    assert_eq!(bm.pool().num_cached(), 9);
    bm.free(&mut s);
    assert_eq!(bm.num_free_blocks(), 64);
    bm.audit(std::iter::empty::<&[Vec<BlockId>]>()).unwrap();
}

#[test]
fn usage_stays_bounded_in_a_long_decode() {
    let (bs, window) = (4, 8);
    let mut bm = hybrid(400, bs, window);
    let mut copies = Vec::new();
    let mut s = seq(1, (0..5).collect());
    admit_all(&mut bm, &mut s, &mut copies);
    for t in 0..500u32 {
        decode(&mut bm, &mut s, t % 7, &mut copies);
        bm.audit_sequence(&s).unwrap();
        for g in 1..3 {
            // The window plus the block being filled, at most.
            assert!(held(&s.block_tables[g]) <= window / bs + 1, "group {g} holds too much");
        }
        let full = s.num_computed_tokens.div_ceil(bs);
        assert!(bm.num_used_blocks() <= full + 2 * (window / bs + 1));
        bm.audit([s.block_tables.as_slice()]).unwrap();
    }
    assert_eq!(s.num_computed_tokens, 505);
    // A single table would hold 3 * 127 blocks.
    assert!(bm.num_used_blocks() <= 127 + 6, "{}", bm.num_used_blocks());
    assert!(copies.is_empty());
}

#[test]
fn prefix_hits_give_every_group_its_window() {
    let mut bm = hybrid(64, 4, 6);
    let mut copies = Vec::new();
    let mut a = seq(1, (0..20).collect());
    admit_all(&mut bm, &mut a, &mut copies);
    bm.free(&mut a);
    // The same first 16 tokens (4 blocks) from the cache, the last 4 computed.
    let mut b = seq(2, (0..16).chain(100..104).collect());
    let plan = bm.plan_admission(&mut b, 19);
    assert_eq!(plan.num_cached_tokens, 16);
    // Group 0: 4 revived + 1 new; windowed groups: blocks 2, 3 revived + 1 new each.
    assert_eq!(bm.admission_blocks_needed(&plan, 4), 4 + 1 + 2 * (2 + 1));
    bm.admit(&mut b, plan, 4, &mut copies).unwrap();
    for g in 1..3 {
        assert_eq!(&b.block_tables[g][..2], &[NULL_BLOCK, NULL_BLOCK]);
        assert_eq!(held(&b.block_tables[g]), 3);
    }
    assert!(copies.is_empty());
    bm.audit_sequence(&b).unwrap();
    b.num_computed_tokens = 20;
    bm.commit_computed(&mut b);
    bm.audit_sequence(&b).unwrap();
    bm.audit([b.block_tables.as_slice()]).unwrap();
}

#[test]
fn a_hit_stops_where_a_windowed_group_lost_its_blocks() {
    // 13 blocks: after `a` is freed, `filler` evicts the least recently freed cached blocks,
    // the windowed groups' early ones, which `b`'s window does not need, then more.
    let mut bm = hybrid(13, 4, 6);
    let mut copies = Vec::new();
    let mut a = seq(1, (0..16).collect());
    admit_all(&mut bm, &mut a, &mut copies);
    let a_tables = a.block_tables.clone();
    bm.free(&mut a);
    let mut b = seq(2, (0..16).collect());
    let plan = bm.plan_admission(&mut b, 15);
    assert_eq!(plan.num_cached_tokens, 15);
    // Evict every cached block of group 1 by taking all free blocks but group 0's and group 2's.
    let mut taken = Vec::new();
    while bm.num_free_blocks() > 0 {
        taken.push(bm.pool.allocate().unwrap());
        if a_tables[1].iter().filter(|&&x| x != NULL_BLOCK).all(|&x| taken.contains(&x)) {
            break;
        }
    }
    let plan = bm.plan_admission(&mut b, 15);
    assert_eq!(plan.num_cached_tokens, 0, "group 1 lost its window: no hit");
    for x in taken {
        bm.pool.release(x);
    }
    bm.audit(std::iter::empty::<&[Vec<BlockId>]>()).unwrap();
}

#[test]
fn forked_samples_share_then_copy_in_every_group() {
    let mut bm = hybrid(64, 4, 6);
    let mut copies = Vec::new();
    let mut parent = seq(1, (0..14).collect());
    let plan = bm.plan_admission(&mut parent, 13);
    bm.admit(&mut parent, plan, 13, &mut copies).unwrap();
    parent.num_computed_tokens = 13;
    bm.commit_computed(&mut parent);
    let mut child = parent.fork(2, 1, 0);
    bm.share(&child.block_tables);
    bm.audit([parent.block_tables.as_slice(), child.block_tables.as_slice()]).unwrap();
    // Position 13 lands in the shared partial block 3 of every group.
    assert_eq!(bm.blocks_needed(&child, 1), 3);
    bm.allocate(&mut child, 1, &mut copies).unwrap();
    assert_eq!(copies.len(), 3);
    for (g, &(src, dst)) in copies.iter().enumerate() {
        assert_eq!((src, dst), (parent.block_tables[g][3], child.block_tables[g][3]));
    }
    assert_eq!(bm.blocks_needed(&parent, 1), 0);
    for s in [&mut parent, &mut child] {
        s.num_computed_tokens = 14;
        bm.commit_computed(s);
        bm.audit_sequence(s).unwrap();
    }
    bm.audit([parent.block_tables.as_slice(), child.block_tables.as_slice()]).unwrap();
    // Preemption (or the end) frees every group.
    bm.free(&mut parent);
    bm.free(&mut child);
    assert_eq!(bm.num_free_blocks(), 64);
    bm.audit(std::iter::empty::<&[Vec<BlockId>]>()).unwrap();
}

#[test]
fn chunks_fit_the_free_blocks_of_every_group() {
    let mut bm = hybrid(10, 4, 6);
    let mut copies = Vec::new();
    let mut s = seq(1, (0..40).collect());
    let plan = bm.plan_admission(&mut s, 39);
    // 3 groups grow together: 10 free blocks hold 3 blocks (12 tokens) per group.
    assert_eq!(bm.admission_max_tokens(&plan, 40), 12);
    bm.admit(&mut s, plan, 12, &mut copies).unwrap();
    s.num_computed_tokens = 12;
    bm.commit_computed(&mut s);
    // The windowed groups released block 0: 3 free, one more block per group.
    assert_eq!(bm.num_free_blocks(), 3);
    assert_eq!(bm.max_tokens_fitting(&s, 28), 4);
    assert_eq!(bm.blocks_needed(&s, 4), 3);
}

#[test]
fn cache_events_report_stores_evictions_and_flushes_in_order() {
    let mut bm = BlockManager::new(8, 4, true);
    bm.record_events();
    let mut copies = Vec::new();
    let mut resident = std::collections::HashSet::new();
    let apply = |events: Vec<CacheEvent>, resident: &mut std::collections::HashSet<CachedBlockRef>| {
        for e in &events {
            match e {
                CacheEvent::Stored { block, .. } => assert!(resident.insert(*block), "stored twice: {e:?}"),
                CacheEvent::Removed { block } => assert!(resident.remove(block), "removed unknown: {e:?}"),
                CacheEvent::Cleared => resident.clear(),
                CacheEvent::TierStored { .. } | CacheEvent::TierRemoved { .. } => panic!("no tiers: {e:?}"),
            }
        }
        events
    };
    let mut a = seq(1, (0..10).collect());
    admit_all(&mut bm, &mut a, &mut copies);
    let events = apply(bm.take_events(), &mut resident);
    let [CacheEvent::Stored { block: a0, parent: None, token_ids: t0, lora: None, group: 0, .. }, CacheEvent::Stored { parent: Some(p), token_ids: t1, .. }] =
        events.as_slice()
    else {
        panic!("{events:?}")
    };
    assert_eq!((&t0[..], &t1[..], p), (&[0, 1, 2, 3][..], &[4, 5, 6, 7][..], a0));
    // A hit stores nothing new; its own third block does.
    let mut b = seq(2, (0..8).chain(100..105).collect());
    admit_all(&mut bm, &mut b, &mut copies);
    let events = apply(bm.take_events(), &mut resident);
    assert!(
        matches!(events.as_slice(), [CacheEvent::Stored { token_ids, .. }] if token_ids[..] == [100, 101, 102, 103][..]),
        "{events:?}"
    );
    assert_eq!(resident.len(), bm.pool().num_cached());
    bm.free(&mut a);
    bm.free(&mut b);
    // New content needs every block: the cached ones are evicted, each reported.
    let mut c = seq(3, (200..232).collect());
    admit_all(&mut bm, &mut c, &mut copies);
    let events = apply(bm.take_events(), &mut resident);
    assert_eq!(events.iter().filter(|e| matches!(e, CacheEvent::Removed { .. })).count(), 3, "{events:?}");
    assert_eq!(resident.len(), bm.pool().num_cached());
    bm.free(&mut c);
    bm.flush_prefix_cache();
    let events = apply(bm.take_events(), &mut resident);
    assert_eq!(events, vec![CacheEvent::Cleared]);
    assert_eq!(bm.pool().num_cached(), 0);
}

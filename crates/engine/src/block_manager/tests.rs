//! Block manager unit tests: single-group behaviour (as before KV groups) and windowed groups.

use super::*;

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

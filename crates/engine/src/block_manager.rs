//! Per-sequence KV block bookkeeping on top of [`BlockPool`]: prefix-cache lookup at admission,
//! growing a sequence's block table for the tokens of a step, copy-on-write of a shared or cached
//! block before it is written, registering blocks in the cache once they are full, sharing blocks
//! between the samples of one request, and releasing them. Never touches tensors: a copy is only
//! recorded as `(src, dst)` for the executor.

use crate::block_pool::{BlockId, BlockPool, CachedBlockRef};
use crate::rng::{combine, mix64};
use crate::sequence::Sequence;

/// Not enough free blocks for what was asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("out of KV blocks: {needed} needed, {free} free")]
pub struct OutOfBlocks {
    pub needed: usize,
    pub free: usize,
}

/// What the prefix cache offers a sequence about to be admitted (nothing is taken yet).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AdmissionPlan {
    /// Leading tokens whose KV comes from the cache.
    pub num_cached_tokens: usize,
    /// Cached blocks covering those tokens, in order.
    blocks: Vec<CachedBlockRef>,
    /// How many of `blocks` are unreferenced (admitting takes them off the free list).
    from_free: usize,
    /// Tokens the sequence had when looked up (the query size for the hit-rate counters).
    queried_tokens: usize,
}

impl AdmissionPlan {
    /// Whether the first token to compute lands in a cached block, which must be copied first.
    fn cow(&self, block_size: usize) -> bool {
        !self.num_cached_tokens.is_multiple_of(block_size)
    }
}

#[derive(Debug)]
pub struct BlockManager {
    pool: BlockPool,
    block_size: usize,
    prefix_caching: bool,
    /// Prompt tokens looked up in the prefix cache at admission.
    queries: u64,
    /// Of those, tokens whose KV was reused.
    hits: u64,
}

/// Chained hash of one full block: its parent's hash and its token ids.
fn block_hash(parent: Option<u64>, tokens: &[u32]) -> u64 {
    let seed = parent.map_or(0x5EED_B10C_u64, |p| combine(p, 1));
    mix64(tokens.iter().fold(seed, |h, &t| mix64(h ^ u64::from(t))))
}

impl BlockManager {
    pub fn new(num_blocks: usize, block_size: usize, prefix_caching: bool) -> Self {
        Self {
            pool: BlockPool::new(num_blocks),
            block_size: block_size.max(1),
            prefix_caching,
            queries: 0,
            hits: 0,
        }
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn num_total_blocks(&self) -> usize {
        self.pool.num_blocks()
    }

    pub fn num_free_blocks(&self) -> usize {
        self.pool.num_free()
    }

    pub fn num_used_blocks(&self) -> usize {
        self.pool.num_used()
    }

    /// Fraction of blocks referenced by some sequence.
    pub fn usage(&self) -> f64 {
        self.pool.num_used() as f64 / self.pool.num_blocks().max(1) as f64
    }

    pub fn prefix_caching_enabled(&self) -> bool {
        self.prefix_caching
    }

    /// Tokens looked up in the prefix cache so far.
    pub fn prefix_cache_queries(&self) -> u64 {
        self.queries
    }

    /// Tokens served from the prefix cache so far.
    pub fn prefix_cache_hits(&self) -> u64 {
        self.hits
    }

    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    /// Extends the sequence's block hashes to cover its first `num_blocks` full blocks.
    fn extend_hashes(&self, seq: &mut Sequence, num_blocks: usize) {
        let bs = self.block_size;
        while seq.block_hashes.len() < num_blocks {
            let j = seq.block_hashes.len();
            let parent = j.checked_sub(1).map(|p| seq.block_hashes[p]);
            let hash = block_hash(parent, &seq.token_ids[j * bs..(j + 1) * bs]);
            seq.block_hashes.push(hash);
        }
    }

    /// Looks up the longest cached prefix of a sequence that holds no blocks, taking at most
    /// `max_cached_tokens` of its tokens from the cache (callers keep at least one token to
    /// compute, so there are logits to sample from).
    pub fn plan_admission(&mut self, seq: &mut Sequence, max_cached_tokens: usize) -> AdmissionPlan {
        debug_assert!(seq.block_table.is_empty());
        let mut plan = AdmissionPlan { queried_tokens: seq.len(), ..Default::default() };
        if !self.prefix_caching {
            return plan;
        }
        let bs = self.block_size;
        let full = seq.len() / bs;
        self.extend_hashes(seq, full);
        let mut parent = None;
        for j in 0..full {
            if plan.blocks.len() * bs >= max_cached_tokens {
                break;
            }
            let tokens = &seq.token_ids[j * bs..(j + 1) * bs];
            match self.pool.lookup(seq.block_hashes[j], parent, tokens) {
                Some(r) => {
                    plan.blocks.push(r);
                    parent = Some(r);
                }
                None => break,
            }
        }
        plan.num_cached_tokens = (plan.blocks.len() * bs).min(max_cached_tokens);
        plan.from_free = plan.blocks.iter().filter(|r| self.pool.ref_count(r.id) == 0).count();
        plan
    }

    /// Blocks that admitting with `plan` and then computing `q` tokens takes from the free list.
    pub fn admission_blocks_needed(&self, plan: &AdmissionPlan, q: usize) -> usize {
        if q == 0 {
            return plan.from_free;
        }
        let total = (plan.num_cached_tokens + q).div_ceil(self.block_size);
        plan.from_free + total.saturating_sub(plan.blocks.len()) + usize::from(plan.cow(self.block_size))
    }

    /// Largest `q <= want` that admitting with `plan` can compute with the free blocks.
    pub fn admission_max_tokens(&self, plan: &AdmissionPlan, want: usize) -> usize {
        let spare =
            self.pool.num_free().saturating_sub(plan.from_free + usize::from(plan.cow(self.block_size)));
        let fits = (plan.blocks.len() + spare) * self.block_size;
        want.min(fits.saturating_sub(plan.num_cached_tokens))
    }

    /// Admits a sequence: takes the cached blocks of `plan`, then allocates for `q` tokens.
    pub fn admit(
        &mut self,
        seq: &mut Sequence,
        plan: AdmissionPlan,
        q: usize,
        copies: &mut Vec<(BlockId, BlockId)>,
    ) -> Result<(), OutOfBlocks> {
        let needed = self.admission_blocks_needed(&plan, q);
        if needed > self.pool.num_free() {
            return Err(OutOfBlocks { needed, free: self.pool.num_free() });
        }
        let bs = self.block_size;
        for r in &plan.blocks {
            self.pool.incref(r.id);
        }
        seq.block_table.extend(plan.blocks.iter().map(|r| r.id));
        // Only blocks that are full of computed tokens count as known cache content.
        let full_computed = plan.num_cached_tokens / bs;
        seq.cache_refs.extend(plan.blocks[..full_computed].iter().map(|&r| Some(r)));
        seq.num_computed_tokens = plan.num_cached_tokens;
        if self.prefix_caching {
            self.queries += plan.queried_tokens as u64;
            self.hits += plan.num_cached_tokens as u64;
        }
        self.allocate(seq, q, copies)
    }

    /// Whether writing the sequence's next token would modify a block others can see.
    fn needs_cow(&self, seq: &Sequence) -> bool {
        let idx = seq.num_computed_tokens / self.block_size;
        seq.block_table.get(idx).is_some_and(|&b| self.pool.ref_count(b) > 1 || self.pool.is_cached(b))
    }

    /// Free blocks a running sequence needs to compute `q` more tokens.
    pub fn blocks_needed(&self, seq: &Sequence, q: usize) -> usize {
        if q == 0 {
            return 0;
        }
        let total = (seq.num_computed_tokens + q).div_ceil(self.block_size);
        total.saturating_sub(seq.block_table.len()) + usize::from(self.needs_cow(seq))
    }

    /// Largest `q <= want` a running sequence can compute with the free blocks.
    pub fn max_tokens_fitting(&self, seq: &Sequence, want: usize) -> usize {
        let cow = usize::from(self.needs_cow(seq));
        let Some(spare) = self.pool.num_free().checked_sub(cow) else { return 0 };
        let fits = (seq.block_table.len() + spare) * self.block_size;
        want.min(fits.saturating_sub(seq.num_computed_tokens))
    }

    /// Makes the block table cover the next `q` tokens: copies a shared or cached block that the
    /// first of them lands in (recording `(src, dst)` in `copies`), then appends fresh blocks.
    /// All or nothing.
    pub fn allocate(
        &mut self,
        seq: &mut Sequence,
        q: usize,
        copies: &mut Vec<(BlockId, BlockId)>,
    ) -> Result<(), OutOfBlocks> {
        if q == 0 {
            return Ok(());
        }
        let needed = self.blocks_needed(seq, q);
        let free = self.pool.num_free();
        if needed > free {
            return Err(OutOfBlocks { needed, free });
        }
        let idx = seq.num_computed_tokens / self.block_size;
        if self.needs_cow(seq) {
            let old = seq.block_table[idx];
            let new = self.pool.allocate().ok_or(OutOfBlocks { needed, free })?;
            copies.push((old, new));
            self.pool.release(old);
            seq.block_table[idx] = new;
        }
        let total = (seq.num_computed_tokens + q).div_ceil(self.block_size);
        while seq.block_table.len() < total {
            let b = self.pool.allocate().ok_or(OutOfBlocks { needed, free })?;
            seq.block_table.push(b);
        }
        Ok(())
    }

    /// Offers the blocks that became full of computed tokens to the prefix cache.
    pub fn commit_computed(&mut self, seq: &mut Sequence) {
        if !self.prefix_caching {
            return;
        }
        let bs = self.block_size;
        let full = (seq.num_computed_tokens / bs).min(seq.block_table.len());
        if seq.cache_refs.len() >= full {
            return;
        }
        self.extend_hashes(seq, full);
        for j in seq.cache_refs.len()..full {
            let parent = match j.checked_sub(1) {
                None => None,
                Some(p) => match seq.cache_refs[p] {
                    Some(r) => Some(r),
                    // The parent could not be cached, so nothing after it can be found either.
                    None => {
                        seq.cache_refs.push(None);
                        continue;
                    }
                },
            };
            let tokens = &seq.token_ids[j * bs..(j + 1) * bs];
            let r = self.pool.register(seq.block_table[j], seq.block_hashes[j], parent, tokens);
            seq.cache_refs.push(r);
        }
    }

    /// Adds a reference to every block of `table` (a new sample sharing a parent's blocks).
    pub fn share(&mut self, table: &[BlockId]) {
        for &b in table {
            self.pool.incref(b);
        }
    }

    /// Releases all of the sequence's blocks (last block first, so the tail of a prefix is
    /// evicted before its head) and resets it to "nothing computed".
    pub fn free(&mut self, seq: &mut Sequence) {
        for &b in seq.block_table.iter().rev() {
            self.pool.release(b);
        }
        seq.block_table.clear();
        seq.cache_refs.clear();
        seq.num_computed_tokens = 0;
    }

    /// Full check for tests: the pool is consistent and every block's reference count equals
    /// the number of block tables holding it.
    pub fn audit<'a>(&self, tables: impl IntoIterator<Item = &'a [BlockId]>) -> Result<(), String> {
        self.pool.audit()?;
        let mut counts = vec![0u32; self.pool.num_blocks()];
        for table in tables {
            for &b in table {
                *counts.get_mut(b as usize).ok_or_else(|| format!("block {b} out of range"))? += 1;
            }
        }
        for (b, &c) in counts.iter().enumerate() {
            let rc = self.pool.ref_count(b as BlockId);
            if rc != c {
                return Err(format!("block {b}: ref count {rc}, held by {c} tables"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
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
        assert_eq!(s.block_table.len(), 2);
        assert!(copies.is_empty());
        // Two more decode tokens fit in block 2; the third needs block 3.
        for t in 6..9 {
            s.token_ids.push(t);
            bm.allocate(&mut s, 1, &mut copies).unwrap();
            s.num_computed_tokens += 1;
            bm.commit_computed(&mut s);
        }
        assert_eq!(s.block_table.len(), 3);
        assert_eq!(bm.num_used_blocks(), 3);
        bm.free(&mut s);
        assert_eq!(bm.num_free_blocks(), 8);
        bm.audit([]).unwrap();
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
        assert_eq!(b.block_table[..2], a.block_table[..2]);
        assert_ne!(b.block_table[2], a.block_table[2]);
        assert!(copies.is_empty());
        assert_eq!(bm.prefix_cache_queries(), 10 + 13);
        assert_eq!(bm.prefix_cache_hits(), 8);
        bm.audit([a.block_table.as_slice(), b.block_table.as_slice()]).unwrap();
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
        let table = a.block_table.clone();
        bm.free(&mut a);
        assert_eq!(bm.num_free_blocks(), 4);
        let mut b = seq(2, (0..9).collect());
        let plan = bm.plan_admission(&mut b, 8);
        assert_eq!(plan.num_cached_tokens, 8);
        assert_eq!(bm.admission_blocks_needed(&plan, 1), 3);
        bm.admit(&mut b, plan, 1, &mut copies).unwrap();
        assert_eq!(b.block_table[..2], table[..2]);
        bm.audit([b.block_table.as_slice()]).unwrap();
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
        assert_eq!(b.block_table[0], a.block_table[0]);
        assert_eq!(copies, vec![(a.block_table[1], b.block_table[1])]);
        // After computing, the copy is not registered twice; the original stays canonical.
        b.num_computed_tokens = 8;
        bm.commit_computed(&mut b);
        assert!(!bm.pool().is_cached(b.block_table[1]));
        assert!(b.cache_refs[1].is_some());
        bm.audit([a.block_table.as_slice(), b.block_table.as_slice()]).unwrap();
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
        bm.share(&child.block_table);
        // The child writes position 5 into the shared partial block 1: copy first.
        assert_eq!(bm.blocks_needed(&child, 1), 1);
        bm.allocate(&mut child, 1, &mut copies).unwrap();
        assert_eq!(copies, vec![(parent.block_table[1], child.block_table[1])]);
        assert_eq!(child.block_table[0], parent.block_table[0]);
        // The parent is now the only holder: it writes in place.
        assert_eq!(bm.blocks_needed(&parent, 1), 0);
        bm.allocate(&mut parent, 1, &mut copies).unwrap();
        assert_eq!(copies.len(), 1);
        bm.audit([parent.block_table.as_slice(), child.block_table.as_slice()]).unwrap();
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
        assert!(s.block_table.is_empty());
        assert_eq!(bm.num_free_blocks(), 2);
        bm.audit([]).unwrap();
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
}

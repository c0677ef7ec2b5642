//! Admission of a waiting sequence: the prefix-cache lookup ([`BlockManager::plan_admission`]),
//! what admitting with its plan costs in free blocks, and taking the plan's blocks.
//!
//! A hit must give every group the blocks its first query needs: all blocks up to the cached
//! length in a full group, only those inside the window in a windowed group (its earlier blocks
//! may be long evicted). The cached length is the longest one at which every group has them.

use super::{group_hash, BlockManager, OutOfBlocks};
use crate::block_pool::{BlockId, CachedBlockRef};
use crate::kv_groups::NULL_BLOCK;
use crate::sequence::Sequence;

/// What the prefix cache offers a sequence about to be admitted (nothing is taken yet).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AdmissionPlan {
    /// Leading tokens whose KV comes from the cache.
    pub num_cached_tokens: usize,
    /// Per group, the cache registration of each block covering those tokens (`None` where a
    /// windowed group's block was not found; it is not needed then).
    refs: Vec<Vec<Option<CachedBlockRef>>>,
    /// Per group, the first block the sequence takes (0 in a full group).
    first_held: Vec<usize>,
    /// How many of the taken blocks are unreferenced (admitting takes them off the free list).
    from_free: usize,
    /// Tokens the sequence had when looked up (the query size for the hit-rate counters).
    queried_tokens: usize,
}

impl AdmissionPlan {
    /// Blocks covering the cached tokens (the same in every group).
    fn num_blocks(&self) -> usize {
        self.refs.first().map_or(0, Vec::len)
    }

    /// Whether the first token to compute lands in a cached block, which must be copied first
    /// (in every group).
    fn cow(&self, block_size: usize) -> bool {
        !self.num_cached_tokens.is_multiple_of(block_size)
    }

    /// The blocks the sequence takes from the cache.
    fn held(&self) -> impl Iterator<Item = CachedBlockRef> + '_ {
        self.refs
            .iter()
            .zip(&self.first_held)
            .flat_map(|(refs, &first)| refs[first..].iter().flatten().copied())
    }
}

impl BlockManager {
    /// Looks up the longest cached prefix of a sequence that holds no blocks, taking at most
    /// `max_cached_tokens` of its tokens from the cache (callers keep at least one token to
    /// compute, so there are logits to sample from).
    pub fn plan_admission(&mut self, seq: &mut Sequence, max_cached_tokens: usize) -> AdmissionPlan {
        debug_assert!(seq.block_tables.is_empty());
        let groups = self.num_groups();
        let mut plan = AdmissionPlan {
            queried_tokens: seq.len(),
            refs: vec![Vec::new(); groups],
            first_held: vec![0; groups],
            ..Default::default()
        };
        if !self.prefix_caching {
            return plan;
        }
        if max_cached_tokens == 0 {
            // Nothing could be taken from the cache: no lookup, and none counted.
            plan.queried_tokens = 0;
            return plan;
        }
        let bs = self.block_size;
        let full = seq.len() / bs;
        self.extend_hashes(seq, full);
        let tokens = |j: usize| &seq.token_ids[j * bs..(j + 1) * bs];
        // Group 0's chain decides how far anything can hit.
        let mut chain: Vec<CachedBlockRef> = Vec::new();
        for j in 0..full {
            if chain.len() * bs >= max_cached_tokens {
                break;
            }
            match self.pool.lookup(seq.block_hashes[j], chain.last().copied(), tokens(j)) {
                Some(r) => chain.push(r),
                None => break,
            }
        }
        plan.refs[0] = chain.iter().copied().map(Some).collect();
        for g in 1..groups {
            plan.refs[g] = chain
                .iter()
                .enumerate()
                .map(|(j, &parent)| {
                    self.pool.lookup(group_hash(seq.block_hashes[j], g), Some(parent), tokens(j))
                })
                .collect();
        }
        // The longest prefix at which every group holds what the first query to compute reads.
        let mut k = chain.len();
        let cached = loop {
            let c = (k * bs).min(max_cached_tokens);
            let hi = c.div_ceil(bs);
            let covered = (0..groups).all(|g| {
                let lo = self.groups.first_needed_block(g, c, bs).min(hi);
                plan.refs[g][lo..hi].iter().all(Option::is_some)
            });
            if covered || k == 0 {
                break c;
            }
            k -= 1;
        };
        let hi = cached.div_ceil(bs);
        for g in 0..groups {
            plan.refs[g].truncate(hi);
            plan.first_held[g] = self.groups.first_needed_block(g, cached, bs).min(hi);
        }
        plan.num_cached_tokens = cached;
        plan.from_free = plan.held().filter(|r| self.pool.ref_count(r.id) == 0).count();
        plan
    }

    /// Blocks that admitting with `plan` and then computing `q` tokens takes from the free list.
    pub fn admission_blocks_needed(&self, plan: &AdmissionPlan, q: usize) -> usize {
        if q == 0 {
            return plan.from_free;
        }
        let total = (plan.num_cached_tokens + q).div_ceil(self.block_size);
        let per_group = total.saturating_sub(plan.num_blocks()) + usize::from(plan.cow(self.block_size));
        plan.from_free + self.num_groups() * per_group
    }

    /// Largest `q <= want` that admitting with `plan` can compute with the free blocks.
    pub fn admission_max_tokens(&self, plan: &AdmissionPlan, want: usize) -> usize {
        let groups = self.num_groups();
        let cow = groups * usize::from(plan.cow(self.block_size));
        let spare = self.pool.num_free().saturating_sub(plan.from_free + cow);
        let fits = (plan.num_blocks() + spare / groups) * self.block_size;
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
        for r in plan.held() {
            self.pool.incref(r.id);
        }
        // Only blocks that are full of computed tokens count as known cache content.
        let full_computed = plan.num_cached_tokens / bs;
        seq.block_tables.clear();
        seq.cache_refs.clear();
        seq.table_changes.reset();
        for (refs, &first) in plan.refs.iter().zip(&plan.first_held) {
            let table = refs.iter().enumerate().map(|(j, r)| match r {
                Some(r) if j >= first => r.id,
                _ => NULL_BLOCK,
            });
            seq.block_tables.push(table.collect());
            seq.cache_refs.push(refs[..full_computed].to_vec());
        }
        seq.num_computed_tokens = plan.num_cached_tokens;
        if self.prefix_caching {
            self.queries += plan.queried_tokens as u64;
            self.hits += plan.num_cached_tokens as u64;
        }
        self.allocate(seq, q, copies)
    }
}

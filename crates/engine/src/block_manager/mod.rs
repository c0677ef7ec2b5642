//! Per-sequence KV block bookkeeping on top of [`BlockPool`]: growing a sequence's block tables
//! (one per KV group, see [`crate::kv_groups`]) for the tokens of a step, copy-on-write of a
//! shared or cached block before it is written, registering blocks in the prefix cache once they
//! are full, releasing a windowed group's blocks that no future query can see, sharing blocks
//! between the samples of one request, and releasing them. Admission (the prefix-cache lookup) is
//! in `admission.rs`. Never touches tensors: a copy is only recorded as `(src, dst)` for the
//! executor, and each change to a table is recorded on the sequence, so that a step sends the
//! executor only what changed ([`crate::block_tables`]).
//!
//! All groups draw pages from the one pool, and all of a sequence's tables have the same length;
//! a windowed group's entries before its window are [`NULL_BLOCK`]. Prefix caching keys group 0's
//! blocks by the chained hash as with a single table; group `g > 0` registers its block `j` under
//! the same hash salted with `g`, with group 0's block `j` as its parent, so that its hits are as
//! exact as group 0's chain while surviving the eviction of its own earlier blocks.

mod admission;
mod offload;
mod transfer;

pub use admission::AdmissionPlan;
pub use offload::{NewCachedBlock, TierLoadBlock, TierLoadPlan};
pub use transfer::ImportPlan;

use crate::block_pool::{BlockId, BlockPool, CachedBlockRef};
use crate::cache_events::CacheEvent;
use crate::executor::SeqId;
use crate::kv_groups::{KvGroups, NULL_BLOCK};
use crate::multimodal::ImageHash;
use crate::rng::{combine, mix64};
use crate::sequence::Sequence;

/// Not enough free blocks for what was asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("out of KV blocks: {needed} needed, {free} free")]
pub struct OutOfBlocks {
    pub needed: usize,
    pub free: usize,
}

#[derive(Debug)]
pub struct BlockManager {
    pool: BlockPool,
    block_size: usize,
    groups: KvGroups,
    prefix_caching: bool,
    /// Prompt tokens looked up in the prefix cache at admission.
    queries: u64,
    /// Of those, tokens whose KV was reused.
    hits: u64,
    /// Sequences freed whose tables the executor holds ([`Self::take_released`]).
    released: Vec<SeqId>,
    /// Blocks that entered the cache, for the offload tiers (`offload.rs`); `None`: not logged.
    new_blocks: Option<Vec<NewCachedBlock>>,
}

/// Chained hash of one full block: its parent's hash, its token ids and the hashes of the
/// images with a placeholder in it (vLLM's `extra_keys`), so that blocks of equal tokens but
/// different images never match.
fn block_hash(parent: Option<u64>, tokens: &[u32], images: impl Iterator<Item = ImageHash>) -> u64 {
    let seed = parent.map_or(0x5EED_B10C_u64, |p| combine(p, 1));
    let h = mix64(tokens.iter().fold(seed, |h, &t| mix64(h ^ u64::from(t))));
    images.fold(h, |h, ImageHash(image)| combine(combine(h, image as u64), (image >> 64) as u64))
}

/// The chain root of LoRA adapter `id`'s blocks.
fn adapter_root(id: crate::executor::LoraId) -> u64 {
    combine(0x4C0_4A00_0000, u64::from(id))
}

/// The cache key of group `group`'s copy of a block with chained hash `hash` (group 0's is the
/// hash itself, as with a single table).
fn group_hash(hash: u64, group: usize) -> u64 {
    if group == 0 {
        hash
    } else {
        combine(hash, 0x6B0_0000 + group as u64)
    }
}

impl BlockManager {
    /// One full-attention group.
    pub fn new(num_blocks: usize, block_size: usize, prefix_caching: bool) -> Self {
        Self::with_groups(num_blocks, block_size, KvGroups::single(), prefix_caching)
    }

    pub fn with_groups(num_blocks: usize, block_size: usize, groups: KvGroups, prefix_caching: bool) -> Self {
        Self {
            pool: BlockPool::new(num_blocks),
            block_size: block_size.max(1),
            groups,
            prefix_caching,
            queries: 0,
            hits: 0,
            released: Vec::new(),
            new_blocks: None,
        }
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn groups(&self) -> &KvGroups {
        &self.groups
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

    /// Empties the prefix cache of unreferenced blocks; returns how many blocks it held.
    pub fn flush_prefix_cache(&mut self) -> usize {
        self.pool.clear_cache()
    }

    fn num_groups(&self) -> usize {
        self.groups.len()
    }

    /// Extends the sequence's block hashes to cover its first `num_blocks` full blocks.
    fn extend_hashes(&self, seq: &mut Sequence, num_blocks: usize) {
        let bs = self.block_size;
        while seq.block_hashes.len() < num_blocks {
            let j = seq.block_hashes.len();
            // An adapter's chain starts from the adapter: its KV differs from the base model's.
            let parent = j.checked_sub(1).map(|p| seq.block_hashes[p]).or(seq.lora.map(adapter_root));
            let positions = j * bs..(j + 1) * bs;
            let hash = block_hash(parent, &seq.token_ids[positions.clone()], seq.image_hashes_in(positions));
            seq.block_hashes.push(hash);
        }
    }

    /// Group `group`'s cache parent of block `j`: group 0 chains its own blocks (`Ok(None)` for
    /// the first), other groups hang off group 0's block `j`. `Err` when that parent could not
    /// be cached, so the block cannot be found either.
    fn cache_parent(
        refs0: &[Option<CachedBlockRef>],
        group: usize,
        j: usize,
    ) -> Result<Option<CachedBlockRef>, ()> {
        match (group, j) {
            (0, 0) => Ok(None),
            (0, _) => refs0[j - 1].map(Some).ok_or(()),
            _ => refs0.get(j).copied().flatten().map(Some).ok_or(()),
        }
    }

    /// Whether writing the sequence's next token would modify group `group`'s block that others
    /// can see.
    fn needs_cow(&self, seq: &Sequence, group: usize) -> bool {
        let idx = seq.num_computed_tokens / self.block_size;
        seq.block_tables
            .get(group)
            .and_then(|t| t.get(idx))
            .is_some_and(|&b| b != NULL_BLOCK && (self.pool.ref_count(b) > 1 || self.pool.is_cached(b)))
    }

    fn num_cow(&self, seq: &Sequence) -> usize {
        (0..self.num_groups()).filter(|&g| self.needs_cow(seq, g)).count()
    }

    /// Free blocks a running sequence needs to compute `q` more tokens.
    pub fn blocks_needed(&self, seq: &Sequence, q: usize) -> usize {
        if q == 0 {
            return 0;
        }
        let total = (seq.num_computed_tokens + q).div_ceil(self.block_size);
        self.num_groups() * total.saturating_sub(seq.num_table_blocks()) + self.num_cow(seq)
    }

    /// Largest `q <= want` a running sequence can compute with the free blocks.
    pub fn max_tokens_fitting(&self, seq: &Sequence, want: usize) -> usize {
        let Some(spare) = self.pool.num_free().checked_sub(self.num_cow(seq)) else { return 0 };
        // Every group grows by the same number of blocks.
        let fits = (seq.num_table_blocks() + spare / self.num_groups()) * self.block_size;
        want.min(fits.saturating_sub(seq.num_computed_tokens))
    }

    /// Makes the block tables cover the next `q` tokens: copies a shared or cached block that the
    /// first of them lands in (recording `(src, dst)` in `copies`), then appends fresh blocks to
    /// every group's table. All or nothing.
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
        seq.block_tables.resize_with(self.num_groups(), Vec::new);
        let idx = seq.num_computed_tokens / self.block_size;
        let total = (seq.num_computed_tokens + q).div_ceil(self.block_size);
        for g in 0..self.num_groups() {
            if self.needs_cow(seq, g) {
                let old = seq.block_tables[g][idx];
                let new = self.pool.allocate().ok_or(OutOfBlocks { needed, free })?;
                copies.push((old, new));
                self.pool.release(old);
                seq.block_tables[g][idx] = new;
                seq.table_changes.changed_from(idx);
            }
            while seq.block_tables[g].len() < total {
                let b = self.pool.allocate().ok_or(OutOfBlocks { needed, free })?;
                seq.block_tables[g].push(b);
            }
        }
        Ok(())
    }

    /// After a step: offers the blocks that became full of computed tokens to the prefix cache,
    /// then releases the windowed groups' blocks that no future query can see (they stay in the
    /// cache, evictable, under their hash).
    pub fn commit_computed(&mut self, seq: &mut Sequence) {
        if self.prefix_caching {
            self.register_full_blocks(seq);
        }
        self.release_outside_windows(seq);
    }

    fn register_full_blocks(&mut self, seq: &mut Sequence) {
        let bs = self.block_size;
        let groups = self.num_groups();
        let full = (seq.num_computed_tokens / bs).min(seq.num_table_blocks());
        seq.cache_refs.resize_with(groups, Vec::new);
        let offered = seq.cache_refs[0].len();
        if offered >= full {
            return;
        }
        self.extend_hashes(seq, full);
        for j in offered..full {
            for g in 0..groups {
                let block = seq.block_tables[g][j];
                let r = match Self::cache_parent(&seq.cache_refs[0], g, j) {
                    Ok(parent) if block != NULL_BLOCK => {
                        let tokens = &seq.token_ids[j * bs..(j + 1) * bs];
                        self.pool.register(block, group_hash(seq.block_hashes[j], g), parent, tokens)
                    }
                    _ => None,
                };
                if let Some(stored) = r.filter(|r| r.id == block) {
                    self.stored(seq, g, j, stored);
                    if g == 0 {
                        self.log_new_block(seq, j, stored);
                    }
                }
                seq.cache_refs[g].push(r);
            }
        }
    }

    /// Records that block `j` of group `g` of `seq` entered the cache, chained to the group's
    /// block before it (a block after one that could not be cached is not reported: its
    /// chain is broken for any consumer).
    fn stored(&mut self, seq: &Sequence, g: usize, j: usize, block: CachedBlockRef) {
        let parent = match j.checked_sub(1) {
            None => None,
            Some(p) => match seq.cache_refs[g].get(p).copied().flatten() {
                Some(parent) => Some(parent),
                None => return,
            },
        };
        let bs = self.block_size;
        self.pool.push_event(CacheEvent::Stored {
            block,
            parent,
            token_ids: seq.token_ids[j * bs..(j + 1) * bs].into(),
            lora: seq.lora,
            group: g,
            images: seq.image_hashes_in(j * bs..(j + 1) * bs).collect(),
        });
    }

    /// Starts recording cache events for [`Self::take_events`].
    pub fn record_events(&mut self) {
        self.pool.record_events();
    }

    /// The cache events since the last call.
    pub fn take_events(&mut self) -> Vec<CacheEvent> {
        self.pool.take_events()
    }

    /// Releases, in each windowed group, the blocks wholly before the window of the next query
    /// (at `num_computed_tokens`); their entries become [`NULL_BLOCK`].
    fn release_outside_windows(&mut self, seq: &mut Sequence) {
        let bs = self.block_size;
        for g in 0..seq.block_tables.len() {
            if self.groups.window(g).is_none() {
                continue;
            }
            let table = &mut seq.block_tables[g];
            let end = self.groups.first_needed_block(g, seq.num_computed_tokens, bs).min(table.len());
            // Released entries form a prefix: walk back from `end` to the last one released.
            let start = table[..end].iter().rposition(|&b| b == NULL_BLOCK).map_or(0, |i| i + 1);
            for b in &mut table[start..end] {
                self.pool.release(*b);
                *b = NULL_BLOCK;
            }
            seq.table_changes.released(g, end);
        }
    }

    /// Releases the blocks past those holding the computed tokens (allocated for proposed
    /// tokens that verification rejected). They were never full of computed tokens, so never
    /// offered to the prefix cache, and no other sequence holds them.
    pub fn release_tail(&mut self, seq: &mut Sequence) {
        let keep = seq.num_computed_tokens.div_ceil(self.block_size);
        seq.table_changes.changed_from(keep);
        for table in &mut seq.block_tables {
            for b in table.drain(keep.min(table.len())..).rev() {
                if b != NULL_BLOCK {
                    self.pool.release(b);
                }
            }
        }
    }

    /// Adds a reference to every block of `tables` (a new sample sharing a parent's blocks).
    pub fn share(&mut self, tables: &[Vec<BlockId>]) {
        for &b in tables.iter().flatten().filter(|&&b| b != NULL_BLOCK) {
            self.pool.incref(b);
        }
    }

    /// Releases all of the sequence's blocks (last block first, so the tail of a prefix is
    /// evicted before its head) and resets it to "nothing computed". A sequence whose tables
    /// the executor holds goes on the list for it to forget ([`take_released`](Self::take_released)).
    pub fn free(&mut self, seq: &mut Sequence) {
        if seq.table_changes.was_sent() {
            self.released.push(seq.id);
        }
        seq.table_changes.reset();
        for table in &seq.block_tables {
            for &b in table.iter().rev().filter(|&&b| b != NULL_BLOCK) {
                self.pool.release(b);
            }
        }
        seq.block_tables.clear();
        seq.cache_refs.clear();
        seq.num_computed_tokens = 0;
    }

    /// The sequences freed since the last call whose tables the executor holds: the next batch
    /// tells it to forget them.
    pub fn take_released(&mut self) -> Vec<SeqId> {
        std::mem::take(&mut self.released)
    }

    /// Full check for tests: the pool is consistent and every block's reference count equals
    /// the number of block-table entries holding it.
    pub fn audit<'a>(&self, tables: impl IntoIterator<Item = &'a [Vec<BlockId>]>) -> Result<(), String> {
        self.pool.audit()?;
        let mut counts = vec![0u32; self.pool.num_blocks()];
        for seq_tables in tables {
            for &b in seq_tables.iter().flatten().filter(|&&b| b != NULL_BLOCK) {
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

    /// Check for tests of one sequence that holds blocks: one table per group, all of the same
    /// length covering its computed tokens, each windowed group holding exactly the blocks from
    /// its window on (earlier ones released), a full group holding every block.
    pub fn audit_sequence(&self, seq: &Sequence) -> Result<(), String> {
        let bs = self.block_size;
        if seq.block_tables.len() != self.num_groups() {
            return Err(format!("{} block tables for {} groups", seq.block_tables.len(), self.num_groups()));
        }
        let len = seq.num_table_blocks();
        if len < seq.num_computed_tokens.div_ceil(bs) {
            return Err(format!("{len} blocks cannot hold {} computed tokens", seq.num_computed_tokens));
        }
        for (g, table) in seq.block_tables.iter().enumerate() {
            if table.len() != len {
                return Err(format!("group {g} has {} entries, group 0 {len}", table.len()));
            }
            let first = self.groups.first_needed_block(g, seq.num_computed_tokens, bs).min(len);
            if let Some(j) = table[..first].iter().position(|&b| b != NULL_BLOCK) {
                return Err(format!("group {g} still holds block {j}, before its window"));
            }
            if let Some(j) = table[first..].iter().position(|&b| b == NULL_BLOCK) {
                return Err(format!("group {g} lacks block {}, inside its window", first + j));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod image_tests;
#[cfg(test)]
mod tests;

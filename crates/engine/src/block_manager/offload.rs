//! Blocks for the prefix cache's offload tiers ([`crate::kv_tier`]): the log of blocks that
//! entered the cache (their pages are copied to the tiers after the step that filled them), and
//! loading a waiting sequence's prefix back from a tier into free blocks, registered as cached
//! before admission looks it up. Only models with one KV group take part, as with transfers.

use super::{adapter_root, BlockManager};
use crate::block_pool::{BlockId, CachedBlockRef};
use crate::cache_events::CacheEvent;
use crate::sequence::Sequence;

/// A full block that entered the prefix cache: what a tier keys and checks it by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewCachedBlock {
    pub block: CachedBlockRef,
    pub hash: u64,
    /// The chained hash before it (the adapter's root for an adapter's first block).
    pub parent: Option<u64>,
    pub tokens: Box<[u32]>,
}

/// One block a tier load brings back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TierLoadBlock {
    pub hash: u64,
    pub parent: Option<u64>,
    pub tokens: Box<[u32]>,
    /// The images with a placeholder in it (for its `Stored` event).
    pub images: Box<[crate::multimodal::ImageHash]>,
}

/// The blocks a tier load fills: taken by [`BlockManager::plan_tier_load`], given back by
/// [`BlockManager::finish_tier_load`].
#[derive(Debug)]
pub struct TierLoadPlan {
    /// The leading blocks the pool holds (referenced while the load runs).
    hits: Vec<CachedBlockRef>,
    /// The blocks after them to load, in order, as many as there are `writes`.
    pub blocks: Vec<TierLoadBlock>,
    /// Freshly allocated blocks for `blocks`: the executor writes their pages.
    pub writes: Vec<BlockId>,
    lora: Option<crate::LoraId>,
}

impl BlockManager {
    /// Starts logging the blocks that enter the cache, for [`Self::take_new_blocks`].
    pub fn record_new_blocks(&mut self) {
        self.new_blocks.get_or_insert_with(Vec::new);
    }

    /// The blocks that entered the cache since the last call and still hold that content (none
    /// unless recorded). A cached block is never written, so its pages are the ones computed
    /// until the block is reused, which changes its registration.
    pub fn take_new_blocks(&mut self) -> Vec<NewCachedBlock> {
        let mut blocks = self.new_blocks.as_mut().map(std::mem::take).unwrap_or_default();
        blocks.retain(|b| self.pool.registration(b.block.id) == Some(b.block));
        blocks
    }

    /// Records `event` when cache events are recorded (an offload tier's store or removal).
    pub fn push_event(&mut self, event: CacheEvent) {
        self.pool.push_event(event);
    }

    /// Logs block `j` of `seq` (group 0, block `id`) as newly cached.
    pub(super) fn log_new_block(&mut self, seq: &Sequence, j: usize, block: CachedBlockRef) {
        if let Some(log) = &mut self.new_blocks {
            let bs = self.block_size;
            log.push(NewCachedBlock {
                block,
                hash: seq.block_hashes[j],
                parent: parent_hash(seq, j),
                tokens: seq.token_ids[j * bs..(j + 1) * bs].into(),
            });
        }
    }

    /// Plans loading the blocks of a waiting `seq` (holding no blocks) that follow what the pool
    /// holds of it and that `tier_has(hash, parent, tokens)` says a tier holds, up to
    /// `max_cached_tokens` tokens (what admission may take from the cache). `None` when there is
    /// nothing to load, or when the free blocks could not hold the whole sequence (it would not
    /// be admitted soon, and what is loaded now would be evicted before it is).
    pub fn plan_tier_load(
        &mut self,
        seq: &mut Sequence,
        max_cached_tokens: usize,
        mut tier_has: impl FnMut(u64, Option<u64>, &[u32]) -> bool,
    ) -> Option<TierLoadPlan> {
        if !self.supports_transfer() || !seq.block_tables.is_empty() {
            return None;
        }
        let bs = self.block_size;
        let full = (seq.len() / bs).min(max_cached_tokens / bs);
        self.extend_hashes(seq, full);
        let tokens = |j: usize| &seq.token_ids[j * bs..(j + 1) * bs];
        let mut hits: Vec<CachedBlockRef> = Vec::new();
        while hits.len() < full {
            let j = hits.len();
            match self.pool.lookup(seq.block_hashes[j], hits.last().copied(), tokens(j)) {
                Some(r) => hits.push(r),
                None => break,
            }
        }
        let mut blocks = Vec::new();
        for j in hits.len()..full {
            let (hash, parent) = (seq.block_hashes[j], parent_hash(seq, j));
            if !tier_has(hash, parent, tokens(j)) {
                break;
            }
            let images = seq.image_hashes_in(j * bs..(j + 1) * bs).collect();
            blocks.push(TierLoadBlock { hash, parent, tokens: tokens(j).into(), images });
        }
        let unpinned_hits = hits.iter().filter(|r| self.pool.ref_count(r.id) == 0).count();
        let needed = seq.len().div_ceil(bs) - hits.len() + unpinned_hits;
        if blocks.is_empty() || needed > self.pool.num_free() {
            return None;
        }
        // Pin the hits first: allocating evicts least recently freed blocks, which they may be.
        for r in &hits {
            self.pool.incref(r.id);
        }
        let mut writes = Vec::with_capacity(blocks.len());
        for _ in 0..blocks.len() {
            match self.pool.allocate() {
                Some(id) => writes.push(id),
                None => break,
            }
        }
        blocks.truncate(writes.len());
        Some(TierLoadPlan { hits, blocks, writes, lora: seq.lora })
    }

    /// Ends a tier load whose first `written` blocks the executor wrote: registers those in the
    /// cache (publishing `Stored` events), then releases every block of the plan, which stay
    /// cached and evictable until admission takes them. Returns how many blocks were registered.
    pub fn finish_tier_load(&mut self, plan: TierLoadPlan, written: usize) -> usize {
        let mut parent = plan.hits.last().copied();
        let mut registered = 0;
        for (block, &id) in plan.blocks.iter().zip(&plan.writes).take(written) {
            match self.pool.register(id, block.hash, parent, &block.tokens) {
                Some(stored) if stored.id == id => {
                    self.pool.push_event(CacheEvent::Stored {
                        block: stored,
                        parent,
                        token_ids: block.tokens.clone(),
                        lora: plan.lora,
                        group: 0,
                        images: block.images.clone(),
                    });
                    parent = Some(stored);
                    registered += 1;
                }
                // A collision (or equal content registered meanwhile): the chain stops here.
                _ => break,
            }
        }
        for &id in plan.writes.iter().rev() {
            self.pool.release(id);
        }
        for r in plan.hits.iter().rev() {
            self.pool.release(r.id);
        }
        registered
    }
}

/// The chained hash before block `j` of `seq` (its hashes extended past `j`).
fn parent_hash(seq: &Sequence, j: usize) -> Option<u64> {
    j.checked_sub(1).map(|p| seq.block_hashes[p]).or(seq.lora.map(adapter_root))
}

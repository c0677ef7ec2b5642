//! Blocks for prefill/decode disaggregation ([`crate::kv_transfer`]): pinning a finished
//! sequence's computed prompt blocks for a transfer, and importing received pages into the
//! prefix cache. Only models with one KV group take part (a windowed group's early blocks are
//! gone by the time a prompt finishes, so there would be nothing whole to send).

use super::{block_hash, BlockManager};
use crate::block_pool::{BlockId, CachedBlockRef};
use crate::cache_events::CacheEvent;
use crate::executor::LoraId;
use crate::sequence::Sequence;

/// The blocks an import fills: taken (referenced) by [`BlockManager::plan_import`], given back
/// by [`BlockManager::finish_import`].
#[derive(Debug)]
pub struct ImportPlan {
    token_ids: Vec<u32>,
    lora: Option<LoraId>,
    /// Chained hash of each block to import.
    hashes: Vec<u64>,
    /// Leading blocks already in the cache (referenced while the import runs).
    hits: Vec<CachedBlockRef>,
    /// Freshly allocated blocks for the blocks after the hits, in order: the executor writes
    /// their pages, then they are registered.
    pub writes: Vec<BlockId>,
}

impl ImportPlan {
    /// Index of the first block that is written (the leading ones were cached already).
    pub fn first_written_block(&self) -> usize {
        self.hits.len()
    }
}

impl BlockManager {
    /// Whether this cache can hold and import transferred prefixes.
    pub fn supports_transfer(&self) -> bool {
        self.prefix_caching && self.num_groups() == 1
    }

    /// Pins the leading full blocks of `seq` that the prefix cache knows (the computed prompt's
    /// whole blocks), before the sequence is freed; returns them with the tokens they hold.
    pub fn hold_prefix(&mut self, seq: &Sequence) -> (Vec<BlockId>, Vec<u32>) {
        if !self.supports_transfer() || seq.block_tables.is_empty() {
            return (Vec::new(), Vec::new());
        }
        let cached = seq.cache_refs.first().map_or(0, |refs| refs.iter().take_while(|r| r.is_some()).count());
        let full = cached.min(seq.block_tables[0].len()).min(seq.prompt_len / self.block_size);
        let blocks = seq.block_tables[0][..full].to_vec();
        for &b in &blocks {
            self.pool.incref(b);
        }
        (blocks, seq.token_ids[..full * self.block_size].to_vec())
    }

    /// Releases blocks pinned by [`Self::hold_prefix`], last first (the tail of a prefix is
    /// evicted before its head).
    pub fn release_held(&mut self, blocks: &[BlockId]) {
        for &b in blocks.iter().rev() {
            self.pool.release(b);
        }
    }

    /// Plans importing the pages of `token_ids` (whole blocks) for adapter `lora`: the leading
    /// blocks the cache already holds are kept, and free blocks are taken for the rest (as many
    /// as are free). Nothing is visible to lookups until [`Self::finish_import`].
    pub fn plan_import(&mut self, token_ids: &[u32], lora: Option<LoraId>) -> ImportPlan {
        let bs = self.block_size;
        let n = if self.supports_transfer() { token_ids.len() / bs } else { 0 };
        let mut hashes = Vec::with_capacity(n);
        for j in 0..n {
            let parent = j.checked_sub(1).map(|p| hashes[p]).or(lora.map(super::adapter_root));
            // Imported pages carry no images (a prompt with images is not transferred).
            hashes.push(block_hash(parent, &token_ids[j * bs..(j + 1) * bs], std::iter::empty()));
        }
        let mut hits: Vec<CachedBlockRef> = Vec::new();
        for j in 0..n {
            match self.pool.lookup(hashes[j], hits.last().copied(), &token_ids[j * bs..(j + 1) * bs]) {
                Some(r) => hits.push(r),
                None => break,
            }
        }
        // Pin the hits first: allocating evicts least recently freed blocks, which they may be.
        for r in &hits {
            self.pool.incref(r.id);
        }
        let mut writes = Vec::new();
        for _ in hits.len()..n {
            match self.pool.allocate() {
                Some(id) => writes.push(id),
                None => break,
            }
        }
        ImportPlan { token_ids: token_ids[..n * bs].to_vec(), lora, hashes, hits, writes }
    }

    /// Ends an import: when the executor `written` the planned pages, registers them in the
    /// prefix cache (publishing `Stored` events); then releases every block of the plan, which
    /// stay cached and evictable. Returns how many leading tokens the cache now holds.
    pub fn finish_import(&mut self, plan: ImportPlan, written: bool) -> usize {
        let bs = self.block_size;
        let mut parent = plan.hits.last().copied();
        let mut covered = plan.hits.len();
        if written {
            for (k, &id) in plan.writes.iter().enumerate() {
                let j = plan.hits.len() + k;
                let tokens = &plan.token_ids[j * bs..(j + 1) * bs];
                match self.pool.register(id, plan.hashes[j], parent, tokens) {
                    Some(stored) if stored.id == id => {
                        self.pool.push_event(CacheEvent::Stored {
                            block: stored,
                            parent,
                            token_ids: tokens.into(),
                            lora: plan.lora,
                            group: 0,
                            // Requests with images are not transferred.
                            images: Box::default(),
                        });
                        parent = Some(stored);
                        covered += 1;
                    }
                    // A collision (or equal content registered meanwhile): the chain stops here.
                    _ => break,
                }
            }
        }
        for &id in plan.writes.iter().rev() {
            self.pool.release(id);
        }
        for r in plan.hits.iter().rev() {
            self.pool.release(r.id);
        }
        covered * bs
    }
}

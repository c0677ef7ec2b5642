//! Physical KV blocks: reference counts, the LRU free list, and the prefix-cache index that maps
//! a full block's chained content hash to the block holding it.
//!
//! A block whose last reference goes away keeps its cached content and joins the free list; it
//! can be revived by a later prefix-cache hit until [`BlockPool::allocate`] hands it out again,
//! which evicts it from the index. Uncached free blocks sit at the front of the list so they are
//! reused before anything revivable.
//!
//! Hits are exact, not probabilistic: an entry matches only when its token ids are equal and its
//! parent is the very cache registration (block id *and* generation) matched for the previous
//! block, so neither a hash collision nor a stale entry whose parent was evicted can ever match.

use std::collections::HashMap;

use crate::cache_events::CacheEvent;

/// Index of a physical KV block.
pub type BlockId = u32;

const NIL: u32 = u32::MAX;

/// Identity of one cache registration of a block: the generation changes whenever the block's
/// cached content is evicted, so references to older content stop matching.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CachedBlockRef {
    pub id: BlockId,
    pub generation: u32,
}

#[derive(Debug)]
struct CacheEntry {
    hash: u64,
    parent: Option<CachedBlockRef>,
    tokens: Box<[u32]>,
}

#[derive(Debug)]
struct BlockMeta {
    ref_count: u32,
    generation: u32,
    in_free_list: bool,
    prev: u32,
    next: u32,
    cached: Option<CacheEntry>,
}

#[derive(Debug)]
pub struct BlockPool {
    blocks: Vec<BlockMeta>,
    /// Least recently freed end: `allocate` takes from here.
    head: u32,
    tail: u32,
    num_free: usize,
    /// Blocks with a reference, counted separately from the free list so that
    /// `num_free + num_used == num_blocks` is a real cross-check.
    num_used: usize,
    index: HashMap<u64, BlockId>,
    /// Evictions and flushes since [`Self::take_events`], when recorded.
    events: Option<Vec<CacheEvent>>,
}

impl BlockPool {
    /// `num_blocks` must fit in a `u32` below `u32::MAX` (the config validates it).
    pub fn new(num_blocks: usize) -> Self {
        let n = num_blocks.min(NIL as usize);
        let blocks = (0..n)
            .map(|i| BlockMeta {
                ref_count: 0,
                generation: 0,
                in_free_list: true,
                prev: if i == 0 { NIL } else { i as u32 - 1 },
                next: if i + 1 == n { NIL } else { i as u32 + 1 },
                cached: None,
            })
            .collect();
        Self {
            blocks,
            head: if n == 0 { NIL } else { 0 },
            tail: if n == 0 { NIL } else { n as u32 - 1 },
            num_free: n,
            num_used: 0,
            index: HashMap::new(),
            events: None,
        }
    }

    /// Starts recording evictions and flushes for [`Self::take_events`].
    pub fn record_events(&mut self) {
        self.events.get_or_insert_with(Vec::new);
    }

    /// Records `event` when events are recorded.
    pub fn push_event(&mut self, event: CacheEvent) {
        if let Some(events) = &mut self.events {
            events.push(event);
        }
    }

    /// The events recorded since the last call.
    pub fn take_events(&mut self) -> Vec<CacheEvent> {
        self.events.as_mut().map(std::mem::take).unwrap_or_default()
    }

    pub fn num_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Blocks nobody references (cached or not).
    pub fn num_free(&self) -> usize {
        self.num_free
    }

    /// Blocks with at least one reference.
    pub fn num_used(&self) -> usize {
        self.num_used
    }

    pub fn ref_count(&self, id: BlockId) -> u32 {
        self.blocks.get(id as usize).map_or(0, |b| b.ref_count)
    }

    /// Whether the block is registered in the prefix cache (its content must not change).
    pub fn is_cached(&self, id: BlockId) -> bool {
        self.blocks.get(id as usize).is_some_and(|b| b.cached.is_some())
    }

    /// The block's current cache registration, if it holds cached content.
    pub fn registration(&self, id: BlockId) -> Option<CachedBlockRef> {
        let block = self.blocks.get(id as usize)?;
        block.cached.as_ref().map(|_| CachedBlockRef { id, generation: block.generation })
    }

    /// Takes the least recently freed block, evicting its cached content; `None` when all blocks
    /// are referenced.
    pub fn allocate(&mut self) -> Option<BlockId> {
        let id = self.head;
        if id == NIL {
            return None;
        }
        self.unlink(id);
        self.num_used += 1;
        let block = &mut self.blocks[id as usize];
        block.ref_count = 1;
        if let Some(entry) = block.cached.take() {
            let evicted = CachedBlockRef { id, generation: block.generation };
            block.generation = block.generation.wrapping_add(1);
            if self.index.get(&entry.hash) == Some(&id) {
                self.index.remove(&entry.hash);
            }
            self.push_event(CacheEvent::Removed { block: evicted });
        }
        Some(id)
    }

    /// Adds a reference; a free block (a prefix-cache hit) is revived off the free list.
    pub fn incref(&mut self, id: BlockId) {
        if self.blocks[id as usize].in_free_list {
            self.unlink(id);
            self.num_used += 1;
        }
        self.blocks[id as usize].ref_count += 1;
    }

    /// Drops a reference; at zero the block becomes free, keeping any cached content.
    pub fn release(&mut self, id: BlockId) {
        let block = &mut self.blocks[id as usize];
        debug_assert!(block.ref_count > 0, "release of free block {id}");
        block.ref_count = block.ref_count.saturating_sub(1);
        if block.ref_count == 0 && !block.in_free_list {
            self.num_used -= 1;
            if block.cached.is_some() {
                self.push_back(id);
            } else {
                self.push_front(id);
            }
        }
    }

    /// The cached block holding `tokens` after `parent`, if any.
    pub fn lookup(
        &self,
        hash: u64,
        parent: Option<CachedBlockRef>,
        tokens: &[u32],
    ) -> Option<CachedBlockRef> {
        let &id = self.index.get(&hash)?;
        let block = &self.blocks[id as usize];
        let entry = block.cached.as_ref()?;
        (entry.parent == parent && *entry.tokens == *tokens)
            .then_some(CachedBlockRef { id, generation: block.generation })
    }

    /// Offers block `id`, now full with `tokens` after `parent`, to the cache. Returns the
    /// canonical registration of that content: this block, or an equal block registered earlier
    /// (then this one stays uncached). `None` on a hash collision with different content.
    pub fn register(
        &mut self,
        id: BlockId,
        hash: u64,
        parent: Option<CachedBlockRef>,
        tokens: &[u32],
    ) -> Option<CachedBlockRef> {
        if self.index.contains_key(&hash) {
            return self.lookup(hash, parent, tokens);
        }
        let block = &mut self.blocks[id as usize];
        if block.cached.is_some() {
            // Already registered under another hash: the content of a cached block never changes.
            return None;
        }
        block.cached = Some(CacheEntry { hash, parent, tokens: tokens.into() });
        self.index.insert(hash, id);
        Some(CachedBlockRef { id, generation: block.generation })
    }

    /// Number of prefix-cache entries (cached blocks, used or free).
    pub fn num_cached(&self) -> usize {
        self.index.len()
    }

    /// Forgets the content of every cached block that nobody references, as a prefix-cache flush
    /// does; returns how many entries were dropped. Referenced blocks keep theirs: a running
    /// sequence's blocks are still its KV, and the caller flushes only when idle.
    pub fn clear_cache(&mut self) -> usize {
        let mut dropped = 0;
        for id in 0..self.blocks.len() {
            let block = &mut self.blocks[id];
            if block.ref_count != 0 {
                continue;
            }
            if let Some(entry) = block.cached.take() {
                block.generation = block.generation.wrapping_add(1);
                if self.index.get(&entry.hash) == Some(&(id as BlockId)) {
                    self.index.remove(&entry.hash);
                }
                dropped += 1;
            }
        }
        self.push_event(CacheEvent::Cleared);
        dropped
    }

    /// Full consistency check (O(blocks)), for tests: the free list holds exactly the
    /// unreferenced blocks, in a well-formed chain.
    pub fn audit(&self) -> Result<(), String> {
        let mut seen = 0usize;
        let mut prev = NIL;
        let mut cur = self.head;
        while cur != NIL {
            let b = self.blocks.get(cur as usize).ok_or_else(|| format!("free list points at {cur}"))?;
            if !b.in_free_list || b.ref_count != 0 || b.prev != prev {
                return Err(format!("free list entry {cur} is inconsistent: {b:?}"));
            }
            seen += 1;
            if seen > self.blocks.len() {
                return Err("free list has a cycle".into());
            }
            prev = cur;
            cur = b.next;
        }
        if prev != self.tail {
            return Err("free list tail is wrong".into());
        }
        let unreferenced = self.blocks.iter().filter(|b| b.ref_count == 0).count();
        if seen != self.num_free || unreferenced != self.num_free {
            return Err(format!(
                "num_free {} but {seen} listed and {unreferenced} unreferenced",
                self.num_free
            ));
        }
        if self.num_free + self.num_used != self.blocks.len() {
            return Err(format!(
                "{} free + {} used != {} blocks",
                self.num_free,
                self.num_used,
                self.blocks.len()
            ));
        }
        for (&hash, &id) in &self.index {
            match &self.blocks[id as usize].cached {
                Some(e) if e.hash == hash => {}
                _ => return Err(format!("index entry {hash:x} -> {id} has no matching content")),
            }
        }
        Ok(())
    }

    fn unlink(&mut self, id: BlockId) {
        let (prev, next) = {
            let b = &self.blocks[id as usize];
            (b.prev, b.next)
        };
        if prev == NIL {
            self.head = next;
        } else {
            self.blocks[prev as usize].next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.blocks[next as usize].prev = prev;
        }
        let b = &mut self.blocks[id as usize];
        b.prev = NIL;
        b.next = NIL;
        b.in_free_list = false;
        self.num_free -= 1;
    }

    fn push_back(&mut self, id: BlockId) {
        let b = &mut self.blocks[id as usize];
        b.in_free_list = true;
        b.prev = self.tail;
        b.next = NIL;
        if self.tail == NIL {
            self.head = id;
        } else {
            self.blocks[self.tail as usize].next = id;
        }
        self.tail = id;
        self.num_free += 1;
    }

    fn push_front(&mut self, id: BlockId) {
        let b = &mut self.blocks[id as usize];
        b.in_free_list = true;
        b.prev = NIL;
        b.next = self.head;
        if self.head == NIL {
            self.tail = id;
        } else {
            self.blocks[self.head as usize].prev = id;
        }
        self.head = id;
        self.num_free += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocate_until_empty_then_release() {
        let mut pool = BlockPool::new(3);
        let ids: Vec<_> = (0..3).map(|_| pool.allocate().unwrap()).collect();
        assert_eq!(ids, vec![0, 1, 2]);
        assert_eq!(pool.allocate(), None);
        assert_eq!(pool.num_used(), 3);
        pool.release(1);
        assert_eq!(pool.num_free(), 1);
        assert_eq!(pool.allocate(), Some(1));
        pool.audit().unwrap();
    }

    #[test]
    fn shared_block_is_freed_by_its_last_reference() {
        let mut pool = BlockPool::new(2);
        let b = pool.allocate().unwrap();
        pool.incref(b);
        pool.release(b);
        assert_eq!(pool.ref_count(b), 1);
        assert_eq!(pool.num_free(), 1);
        pool.release(b);
        assert_eq!(pool.num_free(), 2);
        pool.audit().unwrap();
    }

    #[test]
    fn freed_cached_block_is_revived_until_reused() {
        let mut pool = BlockPool::new(2);
        let b = pool.allocate().unwrap();
        let r = pool.register(b, 77, None, &[1, 2]).unwrap();
        pool.release(b);
        assert_eq!(pool.lookup(77, None, &[1, 2]), Some(r));
        pool.incref(b);
        assert_eq!(pool.num_free(), 1);
        pool.release(b);
        // The uncached block goes first; the cached one is evicted only when nothing else is left.
        let other = pool.allocate().unwrap();
        assert_ne!(other, b);
        assert_eq!(pool.lookup(77, None, &[1, 2]), Some(r));
        assert_eq!(pool.allocate(), Some(b));
        assert_eq!(pool.lookup(77, None, &[1, 2]), None);
        assert_eq!(pool.num_cached(), 0);
        pool.audit().unwrap();
    }

    #[test]
    fn lru_order_among_cached_blocks() {
        let mut pool = BlockPool::new(3);
        let ids: Vec<_> = (0..3).map(|_| pool.allocate().unwrap()).collect();
        for (i, &id) in ids.iter().enumerate() {
            pool.register(id, i as u64, None, &[i as u32]).unwrap();
        }
        pool.release(ids[2]);
        pool.release(ids[0]);
        pool.release(ids[1]);
        assert_eq!(pool.allocate(), Some(ids[2]));
        assert_eq!(pool.allocate(), Some(ids[0]));
        assert_eq!(pool.allocate(), Some(ids[1]));
    }

    #[test]
    fn collisions_and_stale_parents_never_match() {
        let mut pool = BlockPool::new(4);
        let a = pool.allocate().unwrap();
        let ra = pool.register(a, 5, None, &[1, 2]).unwrap();
        // Same hash, different tokens: not a hit, and the second block is not registered.
        let b = pool.allocate().unwrap();
        assert_eq!(pool.lookup(5, None, &[9, 9]), None);
        assert_eq!(pool.register(b, 5, None, &[9, 9]), None);
        // Same content again: the canonical registration is the first block.
        assert_eq!(pool.register(b, 5, None, &[1, 2]), Some(ra));
        assert!(!pool.is_cached(b));
        // A child of `a` stops matching once `a` is evicted and re-registered with other content.
        let c = pool.allocate().unwrap();
        pool.register(c, 6, Some(ra), &[3, 4]).unwrap();
        assert!(pool.lookup(6, Some(ra), &[3, 4]).is_some());
        pool.release(a);
        pool.release(b);
        // Uncached free blocks (b, then the never-used one) go before the cached `a`.
        assert_eq!(pool.allocate(), Some(b));
        assert!(pool.allocate().is_some());
        assert_eq!(pool.allocate(), Some(a));
        let ra2 = pool.register(a, 7, None, &[1, 2]).unwrap();
        assert_ne!(ra, ra2);
        assert_eq!(pool.lookup(6, Some(ra2), &[3, 4]), None);
        pool.audit().unwrap();
    }

    #[test]
    fn clearing_the_cache_keeps_referenced_blocks() {
        let mut pool = BlockPool::new(3);
        let ids: Vec<_> = (0..3).map(|_| pool.allocate().unwrap()).collect();
        let refs: Vec<_> =
            ids.iter().map(|&id| pool.register(id, u64::from(id), None, &[id]).unwrap()).collect();
        pool.release(ids[0]);
        pool.release(ids[1]);
        assert_eq!(pool.clear_cache(), 2);
        assert_eq!(pool.lookup(0, None, &[0]), None);
        assert_eq!(pool.lookup(1, None, &[1]), None);
        // The block still in use keeps its content and its entry.
        assert_eq!(pool.lookup(2, None, &[2]), Some(refs[2]));
        assert_eq!(pool.num_cached(), 1);
        assert_eq!(pool.num_free(), 2);
        // The same content registers afresh, under a new generation.
        let b = pool.allocate().unwrap();
        assert_ne!(pool.register(b, 0, None, &[0]), Some(refs[0]));
        pool.audit().unwrap();
    }
}

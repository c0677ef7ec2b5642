//! The host-memory tier: blocks' pages in process memory, keyed by block hash, least recently
//! used first out once the byte bound is reached.

use std::collections::{BTreeMap, HashMap};

use super::TierBlock;

/// An LRU map from block hash to a block's pages, bounded in bytes of pages.
#[derive(Debug)]
pub struct HostStore {
    capacity: u64,
    bytes: u64,
    /// Hash -> (block, its last-use tick).
    entries: HashMap<u64, (TierBlock, u64)>,
    /// Last-use tick -> hash: the first entry is the least recently used.
    order: BTreeMap<u64, u64>,
    tick: u64,
}

impl HostStore {
    pub fn new(capacity: u64) -> Self {
        Self { capacity, bytes: 0, entries: HashMap::new(), order: BTreeMap::new(), tick: 0 }
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Bytes of pages held.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The block stored under `hash`, without touching its recency.
    pub fn peek(&self, hash: u64) -> Option<&TierBlock> {
        self.entries.get(&hash).map(|(b, _)| b)
    }

    /// The block under `hash`, now the most recently used.
    pub fn get(&mut self, hash: u64) -> Option<TierBlock> {
        let tick = self.next_tick();
        let (block, last) = self.entries.get_mut(&hash)?;
        self.order.remove(last);
        *last = tick;
        self.order.insert(tick, hash);
        Some(block.clone())
    }

    /// Stores `block` under `hash` as the most recently used, evicting least recently used
    /// blocks until it fits; returns the hashes evicted. A block larger than the whole store is
    /// not kept (and evicts nothing).
    pub fn put(&mut self, hash: u64, block: TierBlock) -> Vec<u64> {
        let size = block.pages.len() as u64;
        if size > self.capacity {
            return Vec::new();
        }
        if self.entries.contains_key(&hash) {
            // Same content (the hash chains every token before it): only its recency changes.
            self.get(hash);
            return Vec::new();
        }
        let mut evicted = Vec::new();
        while self.bytes + size > self.capacity {
            let Some((_, victim)) = self.order.pop_first() else { break };
            if let Some((old, _)) = self.entries.remove(&victim) {
                self.bytes -= old.pages.len() as u64;
            }
            evicted.push(victim);
        }
        let tick = self.next_tick();
        self.bytes += size;
        self.order.insert(tick, hash);
        self.entries.insert(hash, (block, tick));
        evicted
    }

    /// Forgets the block under `hash`, if held.
    pub fn remove(&mut self, hash: u64) {
        if let Some((old, tick)) = self.entries.remove(&hash) {
            self.order.remove(&tick);
            self.bytes -= old.pages.len() as u64;
        }
    }

    fn next_tick(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(tokens: &[u32], bytes: usize) -> TierBlock {
        TierBlock { parent: None, tokens: tokens.into(), pages: vec![tokens[0] as u8; bytes].into() }
    }

    #[test]
    fn least_recently_used_goes_first_within_the_byte_bound() {
        let mut store = HostStore::new(300);
        assert!(store.put(1, block(&[1], 100)).is_empty());
        assert!(store.put(2, block(&[2], 100)).is_empty());
        assert!(store.put(3, block(&[3], 100)).is_empty());
        assert_eq!(store.bytes(), 300);
        // Touch 1: 2 is now the least recently used.
        assert_eq!(store.get(1).unwrap().pages[0], 1);
        assert_eq!(store.put(4, block(&[4], 150)), vec![2, 3]);
        assert_eq!(store.bytes(), 250);
        assert!(store.peek(2).is_none() && store.peek(3).is_none());
        assert!(store.peek(1).is_some() && store.peek(4).is_some());
        // Larger than the whole store: refused, nothing evicted.
        assert!(store.put(5, block(&[5], 301)).is_empty());
        assert_eq!(store.len(), 2);
        store.remove(1);
        assert_eq!((store.len(), store.bytes()), (1, 150));
    }

    #[test]
    fn storing_a_held_hash_again_only_refreshes_it() {
        let mut store = HostStore::new(200);
        store.put(1, block(&[1], 100));
        store.put(2, block(&[2], 100));
        store.put(1, block(&[1], 100));
        assert_eq!(store.bytes(), 200);
        assert_eq!(store.put(3, block(&[3], 100)), vec![2]);
    }
}

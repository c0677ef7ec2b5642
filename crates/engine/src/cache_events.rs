//! What happens to the prefix cache, for publishers of KV events (vLLM's `BlockStored`,
//! `BlockRemoved`, `AllBlocksCleared`): a block's content entering the cache, leaving it on
//! eviction, and the whole cache flushed. Blocks are named by their cache registration, so a
//! publisher can give each its own hash (vLLM's, say) and chain a child to its parent's.
//! Recorded only when asked for ([`crate::EngineConfig::kv_cache_events`]).

use crate::block_pool::CachedBlockRef;
use crate::executor::LoraId;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheEvent {
    /// A full block's content is now cached (the first time this content is).
    Stored {
        block: CachedBlockRef,
        /// The cached block before it in the same KV group; `None` for a sequence's first block.
        parent: Option<CachedBlockRef>,
        token_ids: Box<[u32]>,
        /// The adapter whose KV it holds (its blocks are cached apart from the base model's).
        lora: Option<LoraId>,
        /// Its KV group (0: full attention; others: sliding windows).
        group: usize,
    },
    /// A block's cached content was evicted (its block reused for other tokens).
    Removed { block: CachedBlockRef },
    /// Every unreferenced cached block was dropped at once (a flush).
    Cleared,
}

//! What happens to the prefix cache, for publishers of KV events (vLLM's `BlockStored`,
//! `BlockRemoved`, `AllBlocksCleared`): a block's content entering the cache, leaving it on
//! eviction, and the whole cache flushed. Blocks are named by their cache registration, so a
//! publisher can give each its own hash (vLLM's, say) and chain a child to its parent's.
//! Recorded only when asked for ([`crate::EngineConfig::kv_cache_events`]).

use crate::block_pool::CachedBlockRef;
use crate::executor::LoraId;
use crate::kv_tier::TierMedium;
use crate::multimodal::ImageHash;

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
        /// The images with a placeholder in it, in prompt order (their hashes enter the
        /// block's hash as vLLM's multimodal `extra_keys`).
        images: Box<[ImageHash]>,
    },
    /// A block's cached content was evicted (its block reused for other tokens).
    Removed { block: CachedBlockRef },
    /// Every unreferenced cached block was dropped at once (a flush).
    Cleared,
    /// A cached block's pages were copied to an offload tier ([`crate::kv_tier`]) under `hash`
    /// (the engine's block hash, which names it there from now on).
    TierStored { block: CachedBlockRef, hash: u64, medium: TierMedium },
    /// An offload tier dropped the block it held under `hash` (least recently used, or refused).
    TierRemoved { hash: u64, medium: TierMedium },
}

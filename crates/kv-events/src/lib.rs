//! `pagoda-kv-events`: vLLM-compatible KV-cache events for cache-aware routers and indexers
//! (vllm-router's `kv_aware` policy, llm-d's precise prefix-cache scorer).
//!
//! - [`block_hash`]: the block hashes vLLM computes with `--prefix-caching-hash-algo
//!   sha256_cbor` (its fixed seed, the 64-bit event form, the LoRA extra keys), so that a
//!   consumer hashing token ids itself finds the same keys.
//! - [`hashes`]: the engine's [`pagoda_engine::CacheEvent`]s named by those hashes, chained
//!   parent to child as the blocks were cached.

pub mod block_hash;
pub mod hashes;

pub use block_hash::{BlockDigest, BlockHasher, ExtraKeys};
pub use hashes::{EventHashes, HashedEvent};

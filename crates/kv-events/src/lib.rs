//! `pagoda-kv-events`: vLLM-compatible KV-cache events for cache-aware routers and indexers
//! (vllm-router's `kv_aware` policy, llm-d's precise prefix-cache scorer).
//!
//! - [`block_hash`]: the block hashes vLLM computes with `--prefix-caching-hash-algo
//!   sha256_cbor` (its fixed seed, the 64-bit event form, the LoRA extra keys), so that a
//!   consumer hashing token ids itself finds the same keys.
//! - [`hashes`]: the engine's [`pagoda_engine::CacheEvent`]s named by those hashes, chained
//!   parent to child as the blocks were cached.
//! - [`wire`]: vLLM's `KVEventBatch` in msgpack.
//! - [`publisher`]: libzmq's PUB socket and replay ROUTER socket (inbound frames capped), fed
//!   without ever making the engine wait.
//! - [`config`]: vLLM's `--kv-events-config` JSON.

pub mod block_hash;
pub mod config;
pub mod hashes;
pub mod publisher;
pub mod wire;

pub use block_hash::{BlockDigest, BlockHasher, ExtraKeys};
pub use config::KvEventsConfig;
pub use hashes::{EventHashes, HashedEvent};
pub use publisher::{AdapterNames, BoundEndpoints, KvEventPublisher, PublisherError, PublisherStats};

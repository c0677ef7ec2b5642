//! Offload tiers of the prefix cache (`--kv-offload host:SIZE`, `--kv-offload disk:PATH:SIZE`):
//! stores of KV pages keyed by block hash, behind the primary pool of the executor.
//!
//! A block's pages are copied to the tiers when the block enters the prefix cache (write-through,
//! as vLLM's offloading connector stores a request's blocks once they are computed), right after
//! the step that filled it: then its pages are whole and nothing can have reused its block yet,
//! so the copy needs no pinning and races no eviction, and the disk tier holds every warm prefix
//! without a flush at shutdown (a crash keeps what was written). On admission, a waiting
//! sequence's prefix that the pool misses and a tier holds is loaded back into free blocks and
//! registered, as a prefill/decode import is ([`crate::kv_transfer`]), so admission finds it as an
//! ordinary hit.
//!
//! Pages move only through the executor ([`crate::ModelExecutor::read_kv_pages`] and
//! [`crate::ModelExecutor::write_kv_pages`]), on the engine thread between steps; the block
//! manager and the scheduler never see them (`engine_io.rs` is the glue). The host tier is an LRU
//! map in memory (`host.rs`); the disk tier is one file per block under a directory named by the
//! model's identity and cache layout (`disk.rs`), written by a thread of its own.

mod disk;
mod engine_io;
mod host;

pub use disk::{DiskStore, DiskTierError};
pub(crate) use engine_io::{load_waiting, store_new_blocks};
pub use host::HostStore;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use crate::config::{ConfigError, EngineConfig};
use crate::kv_transfer::KvPageLayout;
use crate::scheduler::Scheduler;

/// A stable 64-bit hash of `text` (the same in every run and build, unlike std's hashers), for
/// identities that a disk tier compares across restarts.
pub fn text_hash(text: &str) -> u64 {
    text.as_bytes().chunks(8).fold(0x4B56_5449_4552_u64, |h, chunk| {
        let mut word = [0u8; 8];
        word[..chunk.len()].copy_from_slice(chunk);
        crate::rng::combine(h, u64::from_le_bytes(word))
    })
}

/// Which offload tiers an engine keeps, and what identifies its model for the disk tier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvOffloadConfig {
    /// Bytes of pages the host-memory tier holds at most; `None`: no host tier.
    pub host_bytes: Option<u64>,
    /// The disk tier's directory and byte bound; `None`: no disk tier.
    pub disk: Option<(PathBuf, u64)>,
    /// What must match for a disk tier's blocks to be loaded: the model (its path or name and a
    /// hash of its configuration) and the KV dtype. The page layout is added to it.
    pub model_identity: String,
}

/// Where a block's pages were found or stored, named as vLLM's KV events name a medium.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TierMedium {
    /// Host memory.
    Cpu,
    Disk,
}

impl TierMedium {
    /// vLLM's `medium` string.
    pub fn name(self) -> &'static str {
        match self {
            Self::Cpu => "CPU",
            Self::Disk => "DISK",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// One block as a tier keeps it: what identifies its content besides its hash (checked before
/// it is loaded: a hash alone could collide) and its pages, block-major as the executor reads
/// them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TierBlock {
    /// The chained hash of the block before it (or the adapter's chain root); `None` for a
    /// sequence's first block of the base model.
    pub parent: Option<u64>,
    pub tokens: Box<[u32]>,
    pub pages: Arc<[u8]>,
}

impl TierBlock {
    /// Whether this is the block holding `tokens` after `parent`.
    pub fn matches(&self, parent: Option<u64>, tokens: &[u32]) -> bool {
        self.parent == parent && *self.tokens == *tokens
    }
}

/// Why the tiers could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum KvTierError {
    #[error("--kv-offload needs a model whose KV pages can be read and written (prefix caching on, one KV group, an executor that exports pages)")]
    Unsupported,
    #[error(transparent)]
    Disk(#[from] DiskTierError),
}

/// Counters of one tier, for /metrics.
#[derive(Debug, Default)]
pub struct TierCounters {
    /// Blocks loaded back from this tier instead of recomputed.
    pub hit_blocks: AtomicU64,
    /// Blocks copied into this tier.
    pub stored_blocks: AtomicU64,
    /// Bytes of pages copied into this tier.
    pub stored_bytes: AtomicU64,
    /// Bytes of pages loaded back from this tier.
    pub loaded_bytes: AtomicU64,
    /// Bytes of pages held now.
    pub held_bytes: AtomicU64,
    /// Blocks refused: a file of another model or layout, truncated, or failing its checksum.
    pub refused_blocks: AtomicU64,
}

/// Every tier's counters, shared with whoever reports them.
#[derive(Debug, Default)]
pub struct KvTierStats {
    tiers: [TierCounters; 2],
}

impl KvTierStats {
    pub fn tier(&self, medium: TierMedium) -> &TierCounters {
        &self.tiers[medium.index()]
    }
}

/// The tiers `config` asks for, opened over the executor's page `layout`, with `scheduler`
/// logging the blocks that enter its cache for them; `None` without `kv_offload`.
pub(crate) fn open_for_engine(
    config: &EngineConfig,
    layout: Option<&KvPageLayout>,
    scheduler: &mut Scheduler,
) -> Result<Option<KvTiers>, ConfigError> {
    let Some(offload) = &config.kv_offload else { return Ok(None) };
    let refuse = |e: KvTierError| ConfigError::KvOffload(e.to_string());
    if !config.enable_prefix_caching || config.kv_groups.len() != 1 {
        return Err(refuse(KvTierError::Unsupported));
    }
    let tiers = KvTiers::open(offload, layout, Arc::default()).map_err(refuse)?;
    scheduler.record_new_cached_blocks();
    Ok(Some(tiers))
}

/// The host and disk tiers of one engine, host first.
#[derive(Debug)]
pub struct KvTiers {
    block_bytes: usize,
    host: Option<HostStore>,
    disk: Option<DiskStore>,
    stats: Arc<KvTierStats>,
    /// Blocks the host tier dropped since [`Self::take_removed`] (the disk tier keeps its own).
    host_removed: Vec<u64>,
}

impl KvTiers {
    /// Opens the tiers `config` asks for over pages of `layout` (reopening a disk tier's blocks
    /// of the same model and layout).
    pub fn open(
        config: &KvOffloadConfig,
        layout: Option<&KvPageLayout>,
        stats: Arc<KvTierStats>,
    ) -> Result<Self, KvTierError> {
        let layout = layout.ok_or(KvTierError::Unsupported)?;
        let disk = match &config.disk {
            Some((dir, bytes)) => {
                let store = DiskStore::open(dir, *bytes, &config.model_identity, layout)?;
                let counters = stats.tier(TierMedium::Disk);
                counters.refused_blocks.fetch_add(store.refused_at_open(), Relaxed);
                counters.held_bytes.store(store.bytes(), Relaxed);
                Some(store)
            }
            None => None,
        };
        Ok(Self {
            block_bytes: layout.block_bytes(),
            host: config.host_bytes.map(HostStore::new),
            disk,
            stats,
            host_removed: Vec::new(),
        })
    }

    pub fn stats(&self) -> &Arc<KvTierStats> {
        &self.stats
    }

    /// Blocks the disk tier holds (reopened or written since).
    pub fn num_disk_blocks(&self) -> usize {
        self.disk.as_ref().map_or(0, DiskStore::len)
    }

    /// Whether every tier holds the block `hash` (its pages need not be read again); refreshes
    /// its recency in host memory.
    pub fn holds_everywhere(&mut self, hash: u64) -> bool {
        let host = match &mut self.host {
            Some(host) => host.get(hash).is_some(),
            None => true,
        };
        host && self.disk.as_ref().is_none_or(|d| d.contains(hash))
    }

    /// Whether some tier holds the block `hash` with `tokens` after `parent` (no I/O).
    pub fn probe(&self, hash: u64, parent: Option<u64>, tokens: &[u32]) -> bool {
        self.host.as_ref().and_then(|h| h.peek(hash)).is_some_and(|b| b.matches(parent, tokens))
            || self.disk.as_ref().is_some_and(|d| d.probe(hash, parent, tokens))
    }

    /// The block `hash` with `tokens` after `parent`, from the first tier that holds it intact;
    /// a block found on disk is kept in host memory too.
    pub fn fetch(
        &mut self,
        hash: u64,
        parent: Option<u64>,
        tokens: &[u32],
    ) -> Option<(TierMedium, TierBlock)> {
        if let Some(block) =
            self.host.as_mut().and_then(|h| h.get(hash)).filter(|b| b.matches(parent, tokens))
        {
            self.count_load(TierMedium::Cpu, &block);
            return Some((TierMedium::Cpu, block));
        }
        let disk = self.disk.as_mut()?;
        let found = disk.fetch(hash, parent, tokens);
        self.stats.tier(TierMedium::Disk).refused_blocks.fetch_add(disk.take_refused(), Relaxed);
        self.stats.tier(TierMedium::Disk).held_bytes.store(disk.bytes(), Relaxed);
        let block = found?;
        self.count_load(TierMedium::Disk, &block);
        if let Some(host) = &mut self.host {
            self.host_removed.extend(host.put(hash, block.clone()));
            self.stats.tier(TierMedium::Cpu).held_bytes.store(host.bytes(), Relaxed);
        }
        Some((TierMedium::Disk, block))
    }

    /// Copies a block that entered the prefix cache into every tier that lacks it; returns the
    /// tiers it was stored in (for KV events).
    pub fn store(&mut self, hash: u64, block: TierBlock) -> Vec<TierMedium> {
        if block.pages.len() != self.block_bytes {
            return Vec::new();
        }
        let bytes = block.pages.len() as u64;
        let mut stored = Vec::new();
        if let Some(host) = &mut self.host {
            if host.peek(hash).is_none() {
                self.host_removed.extend(host.put(hash, block.clone()));
                if host.peek(hash).is_some() {
                    stored.push(TierMedium::Cpu);
                }
            } else {
                host.get(hash);
            }
            self.stats.tier(TierMedium::Cpu).held_bytes.store(host.bytes(), Relaxed);
        }
        if let Some(disk) = &mut self.disk {
            if disk.put(hash, block) {
                stored.push(TierMedium::Disk);
            }
            self.stats.tier(TierMedium::Disk).held_bytes.store(disk.bytes(), Relaxed);
        }
        for &medium in &stored {
            let counters = self.stats.tier(medium);
            counters.stored_blocks.fetch_add(1, Relaxed);
            counters.stored_bytes.fetch_add(bytes, Relaxed);
        }
        stored
    }

    /// The blocks each tier dropped since the last call (for KV events), by their hashes.
    pub fn take_removed(&mut self) -> Vec<(TierMedium, u64)> {
        let mut removed: Vec<_> = self.host_removed.drain(..).map(|h| (TierMedium::Cpu, h)).collect();
        if let Some(disk) = &mut self.disk {
            removed.extend(disk.take_removed().into_iter().map(|h| (TierMedium::Disk, h)));
        }
        removed
    }

    /// Waits until the disk tier has written everything handed to it (tests, shutdown).
    pub fn sync(&mut self) {
        if let Some(disk) = &mut self.disk {
            disk.sync();
        }
    }

    fn count_load(&self, medium: TierMedium, block: &TierBlock) {
        let counters = self.stats.tier(medium);
        counters.hit_blocks.fetch_add(1, Relaxed);
        counters.loaded_bytes.fetch_add(block.pages.len() as u64, Relaxed);
    }
}

#[cfg(test)]
mod tests;

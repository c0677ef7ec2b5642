//! The engine's cache events named by vLLM's block hashes: each stored block's digest is its
//! parent's chained with its tokens (and its adapter), remembered until the block is evicted,
//! so that a removal names what was stored. A block's consecutive stores along one chain
//! become one `BlockStored`, as vLLM reports a request's new blocks of a step.

use std::collections::HashMap;

use pagoda_engine::block_pool::CachedBlockRef;
use pagoda_engine::kv_tier::TierMedium;
use pagoda_engine::{CacheEvent, LoraId};

use crate::block_hash::{event_hash, BlockDigest, BlockHasher, ExtraKeys};

/// One vLLM event, hashes in their 64-bit form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HashedEvent {
    Stored {
        block_hashes: Vec<u64>,
        /// The block before the first of `block_hashes`; `None` at the start of a sequence.
        parent_block_hash: Option<u64>,
        token_ids: Vec<u32>,
        block_size: usize,
        /// The adapter's id (vLLM's `lora_int_id`) and name.
        lora_id: Option<LoraId>,
        lora_name: Option<String>,
        group_idx: usize,
        /// Where the blocks are: `GPU` (the primary pool, whatever its device, as vLLM names
        /// it), or an offload tier's `CPU` or `DISK`.
        medium: &'static str,
    },
    Removed {
        block_hashes: Vec<u64>,
        group_idx: usize,
        medium: &'static str,
    },
    Cleared,
}

/// A cached block's digest, and what its children chain on.
#[derive(Debug, Clone)]
struct Known {
    digest: BlockDigest,
    group: usize,
}

/// Turns cache events into hashed events, remembering the cached blocks' digests.
#[derive(Debug)]
pub struct EventHashes {
    hasher: BlockHasher,
    block_size: usize,
    blocks: HashMap<CachedBlockRef, Known>,
    /// Blocks an offload tier holds, by medium and the engine's block hash: their digests, for
    /// the removal that names them once their primary block is long gone.
    tier_blocks: HashMap<(TierMedium, u64), u64>,
}

impl EventHashes {
    pub fn new(hasher: BlockHasher, block_size: usize) -> Self {
        Self { hasher, block_size, blocks: HashMap::new(), tier_blocks: HashMap::new() }
    }

    /// Cached blocks known now (stored and not yet removed).
    pub fn num_resident(&self) -> usize {
        self.blocks.len()
    }

    /// The hashed events of `events`. `adapter` gives a LoRA adapter's name and path. A store
    /// whose parent is unknown (its chain broken) is dropped, and so is a removal of a block
    /// never reported.
    pub fn hash(
        &mut self,
        events: Vec<CacheEvent>,
        adapter: &dyn Fn(LoraId) -> Option<(String, String)>,
    ) -> Vec<HashedEvent> {
        let mut out: Vec<HashedEvent> = Vec::new();
        // The digest of the last block `out`'s last store covers, to extend it.
        let mut tail: Option<(CachedBlockRef, BlockDigest)> = None;
        for event in events {
            match event {
                CacheEvent::Stored { block, parent, token_ids, lora, group, images } => {
                    let parent_digest = match parent {
                        None => None,
                        Some(p) => match self.blocks.get(&p) {
                            Some(known) => Some(known.digest),
                            None => continue,
                        },
                    };
                    let names = lora.and_then(adapter);
                    let images = images.iter().map(|i| format!("{:032x}", i.0)).collect();
                    let extra = ExtraKeys { lora: names.clone(), images };
                    let digest = self.hasher.hash(parent_digest.as_ref(), &token_ids, &extra);
                    self.blocks.insert(block, Known { digest, group });
                    let extends = matches!((&tail, parent), (Some((t, _)), Some(p)) if *t == p);
                    match out.last_mut() {
                        Some(HashedEvent::Stored {
                            block_hashes,
                            token_ids: tokens,
                            lora_id,
                            group_idx,
                            ..
                        }) if extends && *lora_id == lora && *group_idx == group => {
                            block_hashes.push(event_hash(&digest));
                            tokens.extend_from_slice(&token_ids);
                        }
                        _ => out.push(HashedEvent::Stored {
                            block_hashes: vec![event_hash(&digest)],
                            parent_block_hash: parent_digest.as_ref().map(event_hash),
                            token_ids: token_ids.into_vec(),
                            block_size: self.block_size,
                            lora_id: lora,
                            lora_name: names.map(|(name, _)| name),
                            group_idx: group,
                            medium: "GPU",
                        }),
                    }
                    tail = Some((block, digest));
                }
                CacheEvent::Removed { block } => {
                    tail = None;
                    if let Some(known) = self.blocks.remove(&block) {
                        out.push(HashedEvent::Removed {
                            block_hashes: vec![event_hash(&known.digest)],
                            group_idx: known.group,
                            medium: "GPU",
                        });
                    }
                }
                CacheEvent::Cleared => {
                    tail = None;
                    self.blocks.clear();
                    out.push(HashedEvent::Cleared);
                }
                // As vLLM's offloading connector reports its stores: the blocks' hashes, no
                // parent or tokens (a consumer knows them from the block's GPU store).
                CacheEvent::TierStored { block, hash, medium } => {
                    tail = None;
                    if let Some(known) = self.blocks.get(&block) {
                        let digest = event_hash(&known.digest);
                        self.tier_blocks.insert((medium, hash), digest);
                        out.push(HashedEvent::Stored {
                            block_hashes: vec![digest],
                            parent_block_hash: None,
                            token_ids: Vec::new(),
                            block_size: self.block_size,
                            lora_id: None,
                            lora_name: None,
                            group_idx: known.group,
                            medium: medium.name(),
                        });
                    }
                }
                CacheEvent::TierRemoved { hash, medium } => {
                    tail = None;
                    if let Some(digest) = self.tier_blocks.remove(&(medium, hash)) {
                        out.push(HashedEvent::Removed {
                            block_hashes: vec![digest],
                            group_idx: 0,
                            medium: medium.name(),
                        });
                    }
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block_hash::DEFAULT_SEED;

    fn block(id: u32) -> CachedBlockRef {
        CachedBlockRef { id, generation: 0 }
    }

    fn stored(
        id: u32,
        parent: Option<u32>,
        tokens: std::ops::Range<u32>,
        lora: Option<LoraId>,
    ) -> CacheEvent {
        CacheEvent::Stored {
            block: block(id),
            parent: parent.map(block),
            token_ids: tokens.collect(),
            lora,
            group: 0,
            images: Box::default(),
        }
    }

    fn no_adapter(_: LoraId) -> Option<(String, String)> {
        None
    }

    #[test]
    fn a_chain_of_stores_is_one_event_with_vllms_hashes() {
        let hasher = BlockHasher::new(DEFAULT_SEED);
        let mut hashes = EventHashes::new(hasher.clone(), 16);
        let events =
            hashes.hash(vec![stored(7, None, 1..17, None), stored(3, Some(7), 17..33, None)], &no_adapter);
        let want: Vec<u64> = hasher
            .chain(&(1..33).collect::<Vec<_>>(), 16, &ExtraKeys::default())
            .iter()
            .map(event_hash)
            .collect();
        assert_eq!(want, [8866452693264111234, 807986237951177663]);
        assert_eq!(
            events,
            vec![HashedEvent::Stored {
                block_hashes: want.clone(),
                parent_block_hash: None,
                token_ids: (1..33).collect(),
                block_size: 16,
                lora_id: None,
                lora_name: None,
                group_idx: 0,
                medium: "GPU",
            }]
        );
        // A later child names its parent; removals name what was stored.
        let later = hashes.hash(
            vec![stored(9, Some(3), 33..49, None), CacheEvent::Removed { block: block(7) }],
            &no_adapter,
        );
        assert!(matches!(&later[0], HashedEvent::Stored { parent_block_hash: Some(p), .. } if *p == want[1]));
        assert_eq!(
            later[1],
            HashedEvent::Removed { block_hashes: vec![want[0]], group_idx: 0, medium: "GPU" }
        );
        assert_eq!(hashes.num_resident(), 2);
        // Unknown blocks are dropped, not guessed.
        assert!(hashes
            .hash(
                vec![stored(11, Some(99), 1..17, None), CacheEvent::Removed { block: block(98) }],
                &no_adapter
            )
            .is_empty());
        assert_eq!(hashes.hash(vec![CacheEvent::Cleared], &no_adapter), vec![HashedEvent::Cleared]);
        assert_eq!(hashes.num_resident(), 0);
    }

    #[test]
    fn offload_tiers_report_their_medium_by_the_gpu_blocks_hash() {
        let hasher = BlockHasher::new(DEFAULT_SEED);
        let mut hashes = EventHashes::new(hasher, 16);
        let gpu = hashes.hash(vec![stored(7, None, 1..17, None)], &no_adapter);
        let [HashedEvent::Stored { block_hashes, .. }] = gpu.as_slice() else { panic!("{gpu:?}") };
        let digest = block_hashes[0];
        let cpu = TierMedium::Cpu;
        let events = hashes.hash(
            vec![
                CacheEvent::TierStored { block: block(7), hash: 42, medium: cpu },
                CacheEvent::Removed { block: block(7) },
                // Unknown to any tier: dropped.
                CacheEvent::TierRemoved { hash: 43, medium: cpu },
                CacheEvent::TierRemoved { hash: 42, medium: TierMedium::Disk },
                // The tier's copy outlives the GPU block.
                CacheEvent::TierRemoved { hash: 42, medium: cpu },
            ],
            &no_adapter,
        );
        assert_eq!(
            events,
            vec![
                HashedEvent::Stored {
                    block_hashes: vec![digest],
                    parent_block_hash: None,
                    token_ids: Vec::new(),
                    block_size: 16,
                    lora_id: None,
                    lora_name: None,
                    group_idx: 0,
                    medium: "CPU",
                },
                HashedEvent::Removed { block_hashes: vec![digest], group_idx: 0, medium: "GPU" },
                HashedEvent::Removed { block_hashes: vec![digest], group_idx: 0, medium: "CPU" },
            ]
        );
    }

    #[test]
    fn adapters_hash_with_their_name_and_path() {
        let hasher = BlockHasher::new(DEFAULT_SEED);
        let mut hashes = EventHashes::new(hasher, 16);
        let adapter = |id: LoraId| (id == 1).then(|| ("my-lora".to_owned(), "/adapters/my-lora".to_owned()));
        let events =
            hashes.hash(vec![stored(1, None, 1..17, Some(1)), stored(2, Some(1), 17..33, Some(1))], &adapter);
        let [HashedEvent::Stored { block_hashes, lora_name, lora_id, .. }] = events.as_slice() else {
            panic!("{events:?}")
        };
        assert_eq!(block_hashes, &[17545897215080021822, 16746835161408628684]);
        assert_eq!((lora_name.as_deref(), *lora_id), (Some("my-lora"), Some(1)));
    }

    #[test]
    fn blocks_of_other_images_with_equal_tokens_get_other_hashes() {
        let hasher = BlockHasher::new(DEFAULT_SEED);
        let with_image = |id: u32, image: u128| {
            let CacheEvent::Stored { block, parent, token_ids, lora, group, .. } =
                stored(id, None, 1..17, None)
            else {
                unreachable!()
            };
            let images = vec![pagoda_engine::ImageHash(image)].into_boxed_slice();
            CacheEvent::Stored { block, parent, token_ids, lora, group, images }
        };
        let first = |events: Vec<HashedEvent>| match events.as_slice() {
            [HashedEvent::Stored { block_hashes, .. }] => block_hashes[0],
            other => panic!("{other:?}"),
        };
        let mut hashes = EventHashes::new(hasher, 16);
        let plain = first(hashes.hash(vec![stored(1, None, 1..17, None)], &no_adapter));
        let a = first(hashes.hash(vec![with_image(2, 7)], &no_adapter));
        let b = first(hashes.hash(vec![with_image(3, 8)], &no_adapter));
        let a_again = first(hashes.hash(vec![with_image(4, 7)], &no_adapter));
        assert!(plain != a && a != b && plain != b);
        assert_eq!(a, a_again);
    }
}

//! The engine thread's glue between the block manager's tier bookkeeping and the executor's
//! pages: copying the blocks that entered the prefix cache to the tiers after a step, and loading
//! waiting sequences' prefixes back from the tiers before the next one is scheduled.

use super::{KvTiers, TierBlock};
use crate::cache_events::CacheEvent;
use crate::executor::ModelExecutor;
use crate::scheduler::Scheduler;

/// Waiting sequences, from the head of the queue, whose prefixes are looked up in the tiers
/// before each step: admission rarely takes more in one step, and each lookup walks a prompt.
const LOAD_LOOKAHEAD: usize = 8;

/// Copies the pages of the blocks that entered the prefix cache in the last step to the tiers
/// that lack them. A block every tier holds already is not read.
pub(crate) fn store_new_blocks<E: ModelExecutor>(
    tiers: &mut KvTiers,
    scheduler: &mut Scheduler,
    executor: &mut E,
) {
    let mut blocks = scheduler.take_new_cached_blocks();
    blocks.retain(|b| !tiers.holds_everywhere(b.hash));
    if blocks.is_empty() {
        return;
    }
    let ids: Vec<u32> = blocks.iter().map(|b| b.block.id).collect();
    let pages = match executor.read_kv_pages(&ids) {
        Ok(pages) if pages.len() == ids.len() * tiers.block_bytes => pages,
        Ok(pages) => {
            tracing::warn!(
                bytes = pages.len(),
                blocks = ids.len(),
                "KV offload: the executor read pages of the wrong size"
            );
            return;
        }
        Err(e) => {
            tracing::warn!("KV offload: could not read pages to store: {e}");
            return;
        }
    };
    for (block, pages) in blocks.into_iter().zip(pages.chunks_exact(tiers.block_bytes)) {
        let (hash, cached) = (block.hash, block.block);
        let tier_block = TierBlock { parent: block.parent, tokens: block.tokens, pages: pages.into() };
        for medium in tiers.store(hash, tier_block) {
            scheduler.push_cache_event(CacheEvent::TierStored { block: cached, hash, medium });
        }
    }
    report_removed(tiers, scheduler);
}

/// Reports the blocks the tiers dropped as cache events.
fn report_removed(tiers: &mut KvTiers, scheduler: &mut Scheduler) {
    for (medium, hash) in tiers.take_removed() {
        scheduler.push_cache_event(CacheEvent::TierRemoved { hash, medium });
    }
}

/// Loads into free blocks the prefixes of the next waiting sequences that the pool misses and a
/// tier holds, so that their admission finds them cached.
pub(crate) fn load_waiting<E: ModelExecutor>(
    tiers: &mut KvTiers,
    scheduler: &mut Scheduler,
    executor: &mut E,
) {
    for id in scheduler.waiting_heads(LOAD_LOOKAHEAD) {
        let Some(plan) =
            scheduler.plan_tier_load(id, |hash, parent, tokens| tiers.probe(hash, parent, tokens))
        else {
            continue;
        };
        let mut pages = Vec::with_capacity(plan.writes.len() * tiers.block_bytes);
        let mut found = 0;
        for block in &plan.blocks {
            // A disk block that fails its checks is dropped here: the load stops before it.
            let Some((_, loaded)) = tiers.fetch(block.hash, block.parent, &block.tokens) else { break };
            pages.extend_from_slice(&loaded.pages);
            found += 1;
        }
        let written = match found {
            0 => 0,
            n => match executor.write_kv_pages(&plan.writes[..n], &pages) {
                Ok(()) => n,
                Err(e) => {
                    tracing::warn!("KV offload: could not write loaded pages: {e}");
                    0
                }
            },
        };
        scheduler.finish_tier_load(plan, written);
    }
    report_removed(tiers, scheduler);
}

//! The scheduler's share of the prefix cache's offload tiers ([`crate::kv_tier`]): which waiting
//! sequences a tier load is planned for (the next ones admission looks at), with the same limit
//! on cached tokens admission applies, and the log of blocks that entered the cache.

use crate::block_manager::{NewCachedBlock, TierLoadPlan};
use crate::executor::SeqId;

use super::Scheduler;

impl Scheduler {
    /// The first `n` waiting sequences, in admission order.
    pub(crate) fn waiting_heads(&self, n: usize) -> Vec<SeqId> {
        self.waiting.iter().take(n).copied().collect()
    }

    /// Plans loading from the tiers the part of waiting sequence `id`'s prefix that the pool
    /// lacks and `tier_has` offers (see
    /// [`BlockManager::plan_tier_load`](crate::block_manager::BlockManager::plan_tier_load)).
    pub(crate) fn plan_tier_load(
        &mut self,
        id: SeqId,
        tier_has: impl FnMut(u64, Option<u64>, &[u32]) -> bool,
    ) -> Option<TierLoadPlan> {
        let e = self.seqs.get_mut(&id)?;
        // As admission: pooling and prompt logprobs take nothing from the cache, a parent about
        // to fork may take everything up to the fork point, others keep a token to compute.
        if e.shared.pool || e.shared.prompt_logprobs.is_some() {
            return None;
        }
        let target = e.target();
        let max_cached = if e.fork_into > 1 { target } else { target.saturating_sub(1) };
        self.blocks.plan_tier_load(&mut e.seq, max_cached, tier_has)
    }

    /// Ends a tier load whose first `written` blocks were written; returns how many entered
    /// the cache.
    pub(crate) fn finish_tier_load(&mut self, plan: TierLoadPlan, written: usize) -> usize {
        self.blocks.finish_tier_load(plan, written)
    }

    /// Starts logging the blocks that enter the prefix cache ([`Self::take_new_cached_blocks`]).
    pub(crate) fn record_new_cached_blocks(&mut self) {
        self.blocks.record_new_blocks();
    }

    /// Records an offload tier's cache event (when cache events are recorded).
    pub(crate) fn push_cache_event(&mut self, event: crate::CacheEvent) {
        self.blocks.push_event(event);
    }

    /// The blocks that entered the prefix cache since the last call.
    pub(crate) fn take_new_cached_blocks(&mut self) -> Vec<NewCachedBlock> {
        self.blocks.take_new_blocks()
    }
}

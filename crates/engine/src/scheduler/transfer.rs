//! The scheduler's public face of prefill/decode transfers ([`crate::kv_transfer`]): reading,
//! releasing and expiring the holds kept by [`TransferHolds`](super::holds::TransferHolds), and
//! importing received pages into the prefix cache. Each call hands the holds the block manager
//! they pin blocks in; the bookkeeping itself is in `holds.rs`.

use std::time::Instant;

use crate::block_manager::ImportPlan;
use crate::executor::LoraId;

use super::{HeldPrefix, Scheduler, TakeHeld};

impl Scheduler {
    /// Takes the hold under `key` for reading, if there is one.
    pub fn take_held(&mut self, key: &str) -> TakeHeld {
        self.holds.take(key, Instant::now())
    }

    /// Unpins a hold's blocks once read (they stay in the prefix cache, evictable).
    pub fn release_held(&mut self, held: HeldPrefix) {
        self.blocks.release_held(&held.blocks);
    }

    /// Releases the holds whose deadline has passed and forgets gone keys past theirs; returns
    /// how many holds expired.
    pub fn expire_holds(&mut self, now: Instant) -> usize {
        self.holds.expire(&mut self.blocks, now)
    }

    /// Gives up the hold that expires first, counted as expired; false when there is none.
    pub fn release_oldest_hold(&mut self) -> bool {
        self.holds.release_oldest(&mut self.blocks)
    }

    /// When the next hold expires or gone key is forgotten, if any.
    pub fn next_hold_deadline(&self) -> Option<Instant> {
        self.holds.next_deadline()
    }

    /// Blocks pinned by holds now.
    pub fn num_held_blocks(&self) -> usize {
        self.holds.num_blocks()
    }

    /// Holds released unread (expired, or given up for room) since start.
    pub fn num_expired_holds(&self) -> u64 {
        self.holds.num_expired()
    }

    /// Plans importing pages for `token_ids` under `lora` (see
    /// [`BlockManager::plan_import`](crate::block_manager::BlockManager::plan_import)).
    pub fn plan_import(&mut self, token_ids: &[u32], lora: Option<LoraId>) -> ImportPlan {
        self.blocks.plan_import(token_ids, lora)
    }

    /// Ends an import; returns the leading tokens now cached.
    pub fn finish_import(&mut self, plan: ImportPlan, written: bool) -> usize {
        self.blocks.finish_import(plan, written)
    }
}

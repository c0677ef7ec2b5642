//! The scheduler's side of prefill/decode transfers ([`crate::kv_transfer`]): the prompt blocks
//! a finished prefill holds under its transfer key until read or expired, and imports of
//! received pages into the prefix cache.

use std::time::Instant;

use crate::block_manager::ImportPlan;
use crate::executor::LoraId;
use crate::kv_transfer::{HeldBlocks, KvHold};
use crate::sequence::Sequence;

use super::Scheduler;

/// A hold taken off the scheduler for reading: its blocks stay pinned until
/// [`Scheduler::release_held`].
#[derive(Debug)]
pub struct HeldPrefix {
    pub blocks: Vec<u32>,
    pub token_ids: Vec<u32>,
}

impl Scheduler {
    /// Pins a finishing sequence's prompt blocks under the hold's key (a key held already is
    /// replaced: the newer prefill is the one a decode instance was told about).
    pub(super) fn hold_for_transfer(&mut self, hold: &KvHold, seq: &Sequence, now: Instant) {
        let (blocks, token_ids) = self.blocks.hold_prefix(seq);
        let held = HeldBlocks { table: vec![blocks], token_ids, deadline: now + hold.timeout };
        if let Some(old) = self.held.insert(hold.key.clone(), held) {
            self.blocks.release_held(&old.table[0]);
        }
    }

    /// Takes the hold under `key` for reading, if there is one.
    pub fn take_held(&mut self, key: &str) -> Option<HeldPrefix> {
        let mut held = self.held.remove(key)?;
        Some(HeldPrefix { blocks: held.table.pop().unwrap_or_default(), token_ids: held.token_ids })
    }

    /// Unpins a hold's blocks once read (they stay in the prefix cache, evictable).
    pub fn release_held(&mut self, held: HeldPrefix) {
        self.blocks.release_held(&held.blocks);
    }

    /// Releases the holds whose deadline has passed; returns how many.
    pub fn expire_holds(&mut self, now: Instant) -> usize {
        let expired: Vec<String> =
            self.held.iter().filter(|(_, h)| h.deadline <= now).map(|(k, _)| k.clone()).collect();
        for key in &expired {
            if let Some(held) = self.held.remove(key) {
                self.blocks.release_held(&held.table[0]);
            }
        }
        self.expired_holds += expired.len() as u64;
        expired.len()
    }

    /// When the next hold expires, if any is held.
    pub fn next_hold_deadline(&self) -> Option<Instant> {
        self.held.values().map(|h| h.deadline).min()
    }

    /// Blocks pinned by holds now.
    pub fn num_held_blocks(&self) -> usize {
        self.held.values().map(|h| h.table[0].len()).sum()
    }

    /// Holds released unread since start.
    pub fn num_expired_holds(&self) -> u64 {
        self.expired_holds
    }

    /// Whether this scheduler's cache can hold and import transferred prefixes.
    pub fn supports_transfer(&self) -> bool {
        self.blocks.supports_transfer()
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

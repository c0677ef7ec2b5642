//! The scheduler's side of prefill/decode transfers ([`crate::kv_transfer`]): the prompt blocks
//! a finished prefill holds under its transfer key until read or expired, the keys that will
//! never be held (so a reader stops waiting at once), and imports of received pages into the
//! prefix cache.
//!
//! Holds are best-effort: they never take more than half of the cache, and when admission finds
//! no free block the engine gives up the oldest hold before failing anything
//! ([`Scheduler::release_oldest_hold`]).

use std::time::Instant;

use crate::block_manager::ImportPlan;
use crate::executor::LoraId;
use crate::kv_transfer::{GoneKey, HeldBlocks, KvHold};
use crate::sequence::Sequence;

use super::Scheduler;

/// A hold taken off the scheduler for reading: its blocks stay pinned until
/// [`Scheduler::release_held`].
#[derive(Debug)]
pub struct HeldPrefix {
    pub blocks: Vec<u32>,
    pub token_ids: Vec<u32>,
}

/// What [`Scheduler::take_held`] found under a key.
#[derive(Debug)]
pub enum TakeHeld {
    Ready(HeldPrefix),
    Pending,
    Gone(&'static str),
}

impl Scheduler {
    /// Pins a finishing sequence's prompt blocks under the hold's key (a key held already is
    /// replaced: the newer prefill is the one a decode instance was told about). Older holds
    /// are given up first when holds would pass half of the cache.
    pub(super) fn hold_for_transfer(&mut self, hold: &KvHold, seq: &Sequence, now: Instant) {
        let (blocks, token_ids) = self.blocks.hold_prefix(seq);
        let cap = self.blocks.num_total_blocks() / 2;
        while self.num_held_blocks() + blocks.len() > cap && self.release_oldest_hold() {}
        if self.num_held_blocks() + blocks.len() > cap {
            self.blocks.release_held(&blocks);
            self.forget(
                &hold.key,
                "the prefill's blocks did not fit in the cache's share for holds",
                hold,
                now,
            );
            return;
        }
        let held = HeldBlocks {
            table: vec![blocks],
            token_ids,
            deadline: now + hold.timeout,
            timeout: hold.timeout,
        };
        self.gone.remove(&hold.key);
        if let Some(old) = self.held.insert(hold.key.clone(), held) {
            self.blocks.release_held(&old.table[0]);
        }
    }

    /// Records that nothing will be held under the request's key (its prefill failed or was
    /// aborted), so a decode instance waiting for it stops waiting.
    pub(super) fn hold_failed(&mut self, hold: &KvHold, now: Instant) {
        if !self.held.contains_key(&hold.key) {
            self.forget(&hold.key, "the prefill did not finish", hold, now);
        }
    }

    fn forget(&mut self, key: &str, reason: &'static str, hold: &KvHold, now: Instant) {
        self.gone.insert(key.to_owned(), GoneKey { reason, deadline: now + hold.timeout });
    }

    /// Takes the hold under `key` for reading, if there is one.
    pub fn take_held(&mut self, key: &str) -> TakeHeld {
        match self.held.remove(key) {
            Some(mut held) => {
                let deadline = Instant::now() + held.timeout;
                self.gone
                    .insert(key.to_owned(), GoneKey { reason: "the blocks were already read", deadline });
                TakeHeld::Ready(HeldPrefix {
                    blocks: held.table.pop().unwrap_or_default(),
                    token_ids: held.token_ids,
                })
            }
            None => match self.gone.get(key) {
                Some(gone) => TakeHeld::Gone(gone.reason),
                None => TakeHeld::Pending,
            },
        }
    }

    /// Unpins a hold's blocks once read (they stay in the prefix cache, evictable).
    pub fn release_held(&mut self, held: HeldPrefix) {
        self.blocks.release_held(&held.blocks);
    }

    /// Releases the holds whose deadline has passed and forgets gone keys past theirs; returns
    /// how many holds expired.
    pub fn expire_holds(&mut self, now: Instant) -> usize {
        self.gone.retain(|_, g| g.deadline > now);
        let expired: Vec<String> =
            self.held.iter().filter(|(_, h)| h.deadline <= now).map(|(k, _)| k.clone()).collect();
        for key in &expired {
            self.drop_hold(key, "the hold expired before anyone read it", now);
        }
        expired.len()
    }

    /// Gives up the hold that expires first, counted as expired; false when there is none.
    pub fn release_oldest_hold(&mut self) -> bool {
        let oldest = self.held.iter().min_by_key(|(_, h)| h.deadline).map(|(k, _)| k.clone());
        match oldest {
            Some(key) => {
                self.drop_hold(&key, "the hold was given up to make room", Instant::now());
                true
            }
            None => false,
        }
    }

    fn drop_hold(&mut self, key: &str, reason: &'static str, now: Instant) {
        if let Some(held) = self.held.remove(key) {
            self.blocks.release_held(&held.table[0]);
            self.gone.insert(key.to_owned(), GoneKey { reason, deadline: now + held.timeout });
            self.expired_holds += 1;
        }
    }

    /// When the next hold expires or gone key is forgotten, if any.
    pub fn next_hold_deadline(&self) -> Option<Instant> {
        let held = self.held.values().map(|h| h.deadline);
        held.chain(self.gone.values().map(|g| g.deadline)).min()
    }

    /// Blocks pinned by holds now.
    pub fn num_held_blocks(&self) -> usize {
        self.held.values().map(|h| h.table[0].len()).sum()
    }

    /// Holds released unread (expired, or given up for room) since start.
    pub fn num_expired_holds(&self) -> u64 {
        self.expired_holds
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

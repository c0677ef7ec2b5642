//! KV-transfer holds ([`crate::kv_transfer`]): the prompt blocks a finished prefill keeps pinned
//! under its transfer key until a decode instance reads them or the hold expires, and the keys
//! that will never be held (a failed prefill, a hold read or expired), remembered for a while so
//! that a reader stops waiting at once.
//!
//! Holds are best-effort: together they never take more than half of the cache, a new hold
//! gives up the oldest ones to stay under that, and admission gives up the oldest hold before
//! failing anything ([`TransferHolds::release_oldest`]). The component owns only the
//! bookkeeping; pinning and unpinning blocks is the block manager's, passed in by the caller.

use std::collections::HashMap;
use std::time::Instant;

use crate::block_manager::BlockManager;
use crate::kv_transfer::{GoneKey, HeldBlocks, KvHold};
use crate::sequence::Sequence;

/// A hold taken off the scheduler for reading: its blocks stay pinned until
/// [`Scheduler::release_held`](super::Scheduler::release_held).
#[derive(Debug)]
pub struct HeldPrefix {
    pub blocks: Vec<u32>,
    pub token_ids: Vec<u32>,
}

/// What [`Scheduler::take_held`](super::Scheduler::take_held) found under a key.
#[derive(Debug)]
pub enum TakeHeld {
    Ready(HeldPrefix),
    Pending,
    Gone(&'static str),
}

/// The holds of finished prefills and the keys that will not be held.
#[derive(Debug, Default)]
pub(crate) struct TransferHolds {
    /// Blocks pinned for prefill/decode transfers, by transfer key.
    held: HashMap<String, HeldBlocks>,
    /// Keys that will not be held (failed prefills, holds read or expired), until forgotten.
    gone: HashMap<String, GoneKey>,
    /// Holds released unread (expired, or given up for room), since start.
    expired: u64,
}

impl TransferHolds {
    /// Pins a finishing sequence's prompt blocks under the hold's key (a key held already is
    /// replaced: the newer prefill is the one a decode instance was told about). Older holds
    /// are given up first when holds would pass half of the cache.
    pub fn hold(&mut self, blocks: &mut BlockManager, hold: &KvHold, seq: &Sequence, now: Instant) {
        let (pinned, token_ids) = blocks.hold_prefix(seq);
        let cap = blocks.num_total_blocks() / 2;
        while self.num_blocks() + pinned.len() > cap && self.release_oldest(blocks) {}
        if self.num_blocks() + pinned.len() > cap {
            blocks.release_held(&pinned);
            self.forget(
                &hold.key,
                "the prefill's blocks did not fit in the cache's share for holds",
                hold,
                now,
            );
            return;
        }
        let held = HeldBlocks {
            table: vec![pinned],
            token_ids,
            deadline: now + hold.timeout,
            timeout: hold.timeout,
        };
        self.gone.remove(&hold.key);
        if let Some(old) = self.held.insert(hold.key.clone(), held) {
            blocks.release_held(&old.table[0]);
        }
    }

    /// Records that nothing will be held under the request's key (its prefill failed or was
    /// aborted), so a decode instance waiting for it stops waiting.
    pub fn failed(&mut self, hold: &KvHold, now: Instant) {
        if !self.held.contains_key(&hold.key) {
            self.forget(&hold.key, "the prefill did not finish", hold, now);
        }
    }

    fn forget(&mut self, key: &str, reason: &'static str, hold: &KvHold, now: Instant) {
        self.gone.insert(key.to_owned(), GoneKey { reason, deadline: now + hold.timeout });
    }

    /// Takes the hold under `key` for reading, if there is one; its blocks stay pinned.
    pub fn take(&mut self, key: &str, now: Instant) -> TakeHeld {
        match self.held.remove(key) {
            Some(mut held) => {
                let deadline = now + held.timeout;
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

    /// Releases the holds whose deadline has passed and forgets gone keys past theirs; returns
    /// how many holds expired.
    pub fn expire(&mut self, blocks: &mut BlockManager, now: Instant) -> usize {
        self.gone.retain(|_, g| g.deadline > now);
        let expired: Vec<String> =
            self.held.iter().filter(|(_, h)| h.deadline <= now).map(|(k, _)| k.clone()).collect();
        for key in &expired {
            self.drop_hold(blocks, key, "the hold expired before anyone read it", now);
        }
        expired.len()
    }

    /// Gives up the hold that expires first, counted as expired; false when there is none.
    pub fn release_oldest(&mut self, blocks: &mut BlockManager) -> bool {
        let oldest = self.held.iter().min_by_key(|(_, h)| h.deadline).map(|(k, _)| k.clone());
        match oldest {
            Some(key) => {
                self.drop_hold(blocks, &key, "the hold was given up to make room", Instant::now());
                true
            }
            None => false,
        }
    }

    fn drop_hold(&mut self, blocks: &mut BlockManager, key: &str, reason: &'static str, now: Instant) {
        if let Some(held) = self.held.remove(key) {
            blocks.release_held(&held.table[0]);
            self.gone.insert(key.to_owned(), GoneKey { reason, deadline: now + held.timeout });
            self.expired += 1;
        }
    }

    /// When the next hold expires or gone key is forgotten, if any.
    pub fn next_deadline(&self) -> Option<Instant> {
        let held = self.held.values().map(|h| h.deadline);
        held.chain(self.gone.values().map(|g| g.deadline)).min()
    }

    /// Blocks pinned by holds now.
    pub fn num_blocks(&self) -> usize {
        self.held.values().map(|h| h.table[0].len()).sum()
    }

    /// Holds released unread (expired, or given up for room) since start.
    pub fn num_expired(&self) -> u64 {
        self.expired
    }

    /// Every hold's blocks as a one-group block table, for the block manager's audit.
    pub fn tables(&self) -> impl Iterator<Item = &[Vec<u32>]> + '_ {
        self.held.values().map(|h| h.table.as_slice())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A sequence of `len` prompt tokens computed whole and offered to the prefix cache.
    fn computed(blocks: &mut BlockManager, id: u64, len: usize) -> Sequence {
        let mut s = Sequence::new(id, id, 0, (0..len as u32).map(|t| t + 100 * id as u32).collect(), 0);
        let plan = blocks.plan_admission(&mut s, len - 1);
        let q = len - plan.num_cached_tokens;
        blocks.admit(&mut s, plan, q, &mut Vec::new()).unwrap();
        s.num_computed_tokens = len;
        blocks.commit_computed(&mut s);
        s
    }

    fn kv_hold(key: &str, secs: u64) -> KvHold {
        KvHold { key: key.into(), timeout: Duration::from_secs(secs) }
    }

    #[test]
    fn a_hold_is_read_once_then_gone() {
        let mut blocks = BlockManager::new(16, 4, true);
        let mut holds = TransferHolds::default();
        let now = Instant::now();
        assert!(matches!(holds.take("a", now), TakeHeld::Pending));
        let mut s = computed(&mut blocks, 1, 9);
        holds.hold(&mut blocks, &kv_hold("a", 10), &s, now);
        blocks.free(&mut s);
        assert_eq!(holds.num_blocks(), 2, "the two full prompt blocks");
        let TakeHeld::Ready(prefix) = holds.take("a", now) else { panic!("not ready") };
        assert_eq!((prefix.blocks.len(), prefix.token_ids.len()), (2, 8));
        assert!(matches!(holds.take("a", now), TakeHeld::Gone("the blocks were already read")));
        assert_eq!((holds.num_blocks(), blocks.num_free_blocks()), (0, 14), "read blocks stay pinned");
        blocks.release_held(&prefix.blocks);
        assert_eq!(blocks.num_free_blocks(), 16);
        assert_eq!(holds.num_expired(), 0);
    }

    #[test]
    fn a_failed_prefill_is_gone_until_its_timeout_passes() {
        let mut blocks = BlockManager::new(16, 4, true);
        let mut holds = TransferHolds::default();
        let now = Instant::now();
        holds.failed(&kv_hold("k", 5), now);
        assert!(matches!(holds.take("k", now), TakeHeld::Gone("the prefill did not finish")));
        assert_eq!(holds.next_deadline(), Some(now + Duration::from_secs(5)));
        assert_eq!(holds.expire(&mut blocks, now + Duration::from_secs(5)), 0);
        assert!(matches!(holds.take("k", now), TakeHeld::Pending), "forgotten");
        assert_eq!(holds.next_deadline(), None);
    }

    #[test]
    fn an_unread_hold_expires_and_its_blocks_come_back() {
        let mut blocks = BlockManager::new(16, 4, true);
        let mut holds = TransferHolds::default();
        let now = Instant::now();
        let mut s = computed(&mut blocks, 1, 9);
        holds.hold(&mut blocks, &kv_hold("a", 1), &s, now);
        blocks.free(&mut s);
        // A later failure under a held key does not hide the hold.
        holds.failed(&kv_hold("a", 1), now);
        assert_eq!(holds.expire(&mut blocks, now), 0);
        assert_eq!(holds.expire(&mut blocks, now + Duration::from_secs(1)), 1);
        assert_eq!((holds.num_blocks(), holds.num_expired(), blocks.num_free_blocks()), (0, 1, 16));
        assert!(matches!(holds.take("a", now), TakeHeld::Gone("the hold expired before anyone read it")));
    }

    #[test]
    fn holds_stay_within_half_of_the_cache_giving_up_the_oldest() {
        let mut blocks = BlockManager::new(12, 4, true);
        let mut holds = TransferHolds::default();
        let now = Instant::now();
        for (id, key, secs) in [(1, "old", 1), (2, "new", 2)] {
            let mut s = computed(&mut blocks, id, 17);
            holds.hold(&mut blocks, &kv_hold(key, secs), &s, now);
            blocks.free(&mut s);
        }
        // Four blocks each against a cap of six: the older hold made room for the newer.
        assert_eq!((holds.num_blocks(), holds.num_expired()), (4, 1));
        assert!(matches!(holds.take("old", now), TakeHeld::Gone("the hold was given up to make room")));
        // Seven blocks cannot fit even alone: every hold is given up, then this one too.
        let mut s = computed(&mut blocks, 3, 29);
        holds.hold(&mut blocks, &kv_hold("big", 1), &s, now);
        blocks.free(&mut s);
        assert!(matches!(holds.take("big", now), TakeHeld::Gone(reason) if reason.contains("did not fit")));
        assert_eq!((holds.num_blocks(), holds.num_expired()), (0, 2));
        assert!(!holds.release_oldest(&mut blocks));
        assert_eq!(blocks.num_free_blocks(), 12);
    }
}

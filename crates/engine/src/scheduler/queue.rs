//! The scheduler's request queue: the waiting sequences and the policy that orders them.
//!
//! The policy is priority first (a lower value is more urgent), then first come first served
//! within one priority; a request that gives no priority has priority 0, so with none given
//! the queue is plain FCFS. A sequence preempted by recompute goes back ahead of every waiting
//! sequence of its own or a less urgent priority, so it resumes before newer work of its kind
//! without jumping more urgent work. Each entry carries its priority, so the queue decides
//! order on its own, without looking sequences up.

use std::collections::VecDeque;

use crate::executor::SeqId;

/// Waiting sequences in admission order.
#[derive(Debug, Default)]
pub(crate) struct RequestQueue {
    /// `(priority, sequence)`, sorted by priority (stable within one).
    entries: VecDeque<(i32, SeqId)>,
}

impl RequestQueue {
    /// Queues a newly arrived sequence behind every waiting one of the same or a more urgent
    /// priority.
    pub fn push_back(&mut self, id: SeqId, priority: i32) {
        let mut pos = self.entries.len();
        while pos > 0 && self.entries[pos - 1].0 > priority {
            pos -= 1;
        }
        self.entries.insert(pos, (priority, id));
    }

    /// Queues a preempted sequence ahead of every waiting one of the same or a less urgent
    /// priority.
    pub fn push_front(&mut self, id: SeqId, priority: i32) {
        let mut pos = 0;
        while pos < self.entries.len() && self.entries[pos].0 < priority {
            pos += 1;
        }
        self.entries.insert(pos, (priority, id));
    }

    /// Moves `ids` (queued sequences) ahead of every other waiting sequence of their priority,
    /// keeping their order among themselves.
    pub fn move_to_front(&mut self, ids: &[SeqId]) {
        let mut moved = Vec::with_capacity(ids.len());
        self.entries.retain(|entry| {
            let ours = ids.contains(&entry.1);
            if ours {
                moved.push(*entry);
            }
            !ours
        });
        for &(priority, id) in moved.iter().rev() {
            self.push_front(id, priority);
        }
    }

    /// Takes sequence `id` out of the queue, wherever it is (no-op when it is not queued).
    pub fn remove(&mut self, id: SeqId) {
        self.entries.retain(|&(_, w)| w != id);
    }

    /// The sequence at `index` in admission order.
    pub fn get(&self, index: usize) -> Option<SeqId> {
        self.entries.get(index).map(|&(_, id)| id)
    }

    /// Takes the sequence at `index` out of the queue, returning a ticket that puts it back
    /// there ([`Self::restore`]).
    pub fn remove_at(&mut self, index: usize) -> Option<QueueSlot> {
        self.entries.remove(index).map(|entry| QueueSlot { index, entry })
    }

    /// Puts a sequence taken by [`Self::remove_at`] back where it was (an admission undone).
    pub fn restore(&mut self, slot: QueueSlot) {
        self.entries.insert(slot.index, slot.entry);
    }

    /// The first sequence to admit.
    pub fn front(&self) -> Option<SeqId> {
        self.get(0)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The waiting sequences in admission order.
    pub fn iter(&self) -> impl Iterator<Item = &SeqId> + '_ {
        self.entries.iter().map(|(_, id)| id)
    }
}

/// A sequence taken off the queue at a known position, to be put back if its admission fails.
#[derive(Debug)]
pub(crate) struct QueueSlot {
    index: usize,
    entry: (i32, SeqId),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn order(q: &RequestQueue) -> Vec<SeqId> {
        q.iter().copied().collect()
    }

    #[test]
    fn equal_priorities_are_first_come_first_served() {
        let mut q = RequestQueue::default();
        for id in 0..4 {
            q.push_back(id, 0);
        }
        assert_eq!(order(&q), [0, 1, 2, 3]);
        assert_eq!(q.front(), Some(0));
    }

    #[test]
    fn a_more_urgent_arrival_goes_ahead_of_less_urgent_ones_only() {
        let mut q = RequestQueue::default();
        q.push_back(0, 0);
        q.push_back(1, 5);
        q.push_back(2, -1);
        q.push_back(3, 0);
        q.push_back(4, 5);
        assert_eq!(order(&q), [2, 0, 3, 1, 4]);
    }

    #[test]
    fn a_preempted_sequence_leads_its_priority_but_not_more_urgent_ones() {
        let mut q = RequestQueue::default();
        q.push_back(0, -1);
        q.push_back(1, 0);
        q.push_back(2, 3);
        q.push_front(7, 0);
        assert_eq!(order(&q), [0, 7, 1, 2]);
        q.push_front(8, -1);
        assert_eq!(order(&q), [8, 0, 7, 1, 2]);
        q.push_front(9, 4);
        assert_eq!(order(&q), [8, 0, 7, 1, 2, 9]);
    }

    #[test]
    fn moved_sequences_lead_their_priority_in_their_own_order() {
        let mut q = RequestQueue::default();
        for (id, p) in [(0, 0), (1, 0), (2, 1), (3, 0), (4, 1)] {
            q.push_back(id, p);
        }
        assert_eq!(order(&q), [0, 1, 3, 2, 4]);
        q.move_to_front(&[3, 1, 4]);
        assert_eq!(order(&q), [1, 3, 0, 4, 2]);
    }

    #[test]
    fn removal_and_restore_keep_the_order() {
        let mut q = RequestQueue::default();
        for id in 0..4 {
            q.push_back(id, 0);
        }
        q.remove(2);
        q.remove(9);
        assert_eq!(order(&q), [0, 1, 3]);
        let slot = q.remove_at(1).unwrap();
        assert_eq!(order(&q), [0, 3]);
        q.restore(slot);
        assert_eq!((order(&q), q.len(), q.get(1)), (vec![0, 1, 3], 3, Some(1)));
        assert!(q.remove_at(3).is_none());
        assert!(!q.is_empty());
    }
}

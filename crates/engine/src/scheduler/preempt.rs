//! Preemption by recompute and its order: when a running sequence finds no free block, the
//! least urgent (highest priority value), most recently admitted running sequence not yet in
//! this step's batch gives its blocks back and goes to the front of its priority in the queue;
//! never a more urgent sequence for a less urgent one, which goes itself instead.

use crate::executor::SeqId;
use crate::sequence::SeqStatus;

use super::Scheduler;

impl Scheduler {
    /// Frees blocks until running sequence `id` can compute at least one of `want` tokens, by
    /// preempting the least urgent, most recently admitted sequence not yet scheduled in this
    /// step — or `id` itself when there is none or that one is more urgent (then `None`). `cursor` (a position in
    /// `running`) is kept pointing at the same sequence while entries before it are removed.
    pub(super) fn make_room(&mut self, id: SeqId, want: usize, cursor: &mut usize) -> Option<usize> {
        loop {
            let e = self.seqs.get(&id)?;
            let q = self.blocks.max_tokens_fitting(&e.seq, want);
            if q > 0 {
                return Some(q);
            }
            match self.pick_victim(id) {
                // Never a more urgent sequence for a less urgent one: then `id` itself goes.
                Some(victim) if self.priority_of(victim) >= self.priority_of(id) => {
                    if self.preempt(victim).is_some_and(|pos| pos < *cursor) {
                        *cursor -= 1;
                    }
                }
                _ => {
                    // The next sequence moves into `id`'s position; the cursor stays.
                    self.preempt(id);
                    return None;
                }
            }
        }
    }

    /// The least urgent (highest priority value), most recently admitted running sequence other
    /// than `except` that is not in this step's batch yet.
    fn pick_victim(&self, except: SeqId) -> Option<SeqId> {
        let mut best: Option<(i32, SeqId)> = None;
        for &id in self.running.iter().rev() {
            let Some(e) = self.seqs.get(&id) else { continue };
            if id == except || e.last_scheduled == self.step {
                continue;
            }
            if best.is_none_or(|(p, _)| e.shared.priority > p) {
                best = Some((e.shared.priority, id));
            }
        }
        best.map(|(_, id)| id)
    }

    /// Preempts a running sequence by recompute: frees its blocks and requeues it at the front.
    /// Returns its former position in `running`.
    pub(super) fn preempt(&mut self, id: SeqId) -> Option<usize> {
        let pos = self.running.iter().position(|&r| r == id)?;
        self.running.remove(pos);
        let e = self.seqs.get_mut(&id)?;
        self.blocks.free(&mut e.seq);
        // The recompute samples the last token again: drafts after it would be guesses about
        // another token's future.
        e.proposals.clear();
        // A beam's candidates come again from its recompute, with its siblings'.
        if let Some(beam) = e.beam.as_mut() {
            beam.forget_candidates();
        }
        e.seq.status = SeqStatus::Waiting;
        self.running_slots -= e.slots();
        let request_id = e.seq.request_id;
        self.num_preemptions += 1;
        if let Some(state) = self.requests.get_mut(&request_id) {
            state.num_preemptions += 1;
        }
        self.waiting.push_front(id, e.shared.priority);
        Some(pos)
    }
}

//! Fan-out: the requests that run as several sequences, as the scheduler runs them.
//!
//! A request with `n > 1` starts as one sequence that computes the prompt up to its last
//! token, reserving the slots of all `n`; at that fork point it splits into `n` sequences
//! sharing those blocks ([`Scheduler::fork`]), each of which computes the last prompt token on
//! its own (copying the shared partial block on write) and samples with its own seed.
//!
//! A beam search ([`crate::request::BeamSearch`], its own state and decisions in `beam.rs`)
//! runs each beam as a sequence of the request. Once every live beam holds its candidates
//! (normally after one step, later when the budget split them), [`Scheduler::advance_beams`]
//! runs the round: a parent chosen once keeps its sequence, chosen again it forks (sharing its
//! blocks, the partial last one copied on write), not chosen it is dropped. When no beam is
//! left, or the beams reach `max_tokens`, the request's `n` best hypotheses go out as one event
//! each, carrying all their tokens and logprobs.
//!
//! The search's sequence slots stay `width` throughout: the first live beam holds the slots of
//! the beams the round did not fill. A round needs every beam, so a preempted beam's siblings
//! wait for it, holding their blocks. Queued beams are admitted only when the free blocks hold
//! all of their search's queued beams ([`Scheduler::search_admission_blocks`]). Before each
//! step ([`Scheduler::regroup_beams`]) the queued beams of a search that still runs move to the
//! front of the queue when they fit, and when they do not and every running beam waits for
//! them, the search goes back to the queue whole: otherwise those beams would hold the very
//! blocks their siblings need to come back.

use std::sync::Arc;
use std::time::Instant;

use crate::event::TokenEvent;
use crate::executor::SeqId;
use crate::request::RequestId;
use crate::rng::sample_seed;
use crate::sequence::SeqStatus;
use crate::speculative::MAX_SPECULATIVE_TOKENS;

use super::beam::{best_hypotheses, select_round, Beam, Continuation, RoundBeam};
use super::{Scheduler, SeqEntry, StepEvents};

impl Scheduler {
    /// Splits a parent whose prompt is computed up to its last token into the request's `n`
    /// samples, sharing its blocks. Returns the ids of the new sequences.
    pub(super) fn fork(&mut self, parent: SeqId) -> Vec<SeqId> {
        let Some(e) = self.seqs.get_mut(&parent) else { return Vec::new() };
        let n = std::mem::take(&mut e.fork_into);
        let shared = Arc::clone(&e.shared);
        let base = e.seq.clone();
        let constraint = e.constraint.clone();
        let mut children = Vec::with_capacity(n.saturating_sub(1));
        for index in 1..n {
            let id = self.new_seq_id();
            let seq = base.fork(id, index, sample_seed(shared.seed, index));
            self.blocks.share(&seq.block_tables);
            let last_scheduled = 0;
            self.seqs.insert(
                id,
                SeqEntry {
                    seq,
                    shared: Arc::clone(&shared),
                    fork_into: 0,
                    last_scheduled,
                    constraint: constraint.clone(),
                    draft_budget: MAX_SPECULATIVE_TOKENS,
                    proposals: Vec::new(),
                    beam: None,
                },
            );
            self.running.push(id);
            children.push(id);
        }
        if let Some(state) = self.requests.get_mut(&shared.id) {
            state.seq_ids.extend_from_slice(&children);
        }
        // The parent reserved `n` slots; now each of the `n` sequences holds one.
        children
    }

    /// For every search with both running and queued beams: the queued ones go first among
    /// the waiting sequences of their priority when they fit in the free blocks and sequence
    /// slots; when they do not and the running ones all hold their round's candidates, the
    /// running ones are preempted.
    pub(super) fn regroup_beams(&mut self) {
        let mut split: Vec<RequestId> = self
            .waiting
            .iter()
            .filter_map(|id| self.seqs.get(id))
            .filter(|e| e.beam.is_some())
            .map(|e| e.seq.request_id)
            .collect();
        split.sort_unstable();
        split.dedup();
        for request_id in split {
            let Some(state) = self.requests.get(&request_id) else { continue };
            let running: Vec<SeqId> = state
                .seq_ids
                .iter()
                .copied()
                .filter(|id| self.seqs.get(id).is_some_and(|e| e.seq.status == SeqStatus::Running))
                .collect();
            let pending = |id: &SeqId| self.seqs[id].beam.as_ref().is_some_and(Beam::is_ready);
            let queued = state
                .seq_ids
                .iter()
                .copied()
                .find(|id| self.seqs.get(id).is_some_and(|e| e.seq.status == SeqStatus::Waiting));
            let queued_slots: usize = state
                .seq_ids
                .iter()
                .filter_map(|id| self.seqs.get(id))
                .filter(|e| e.seq.status == SeqStatus::Waiting)
                .map(SeqEntry::slots)
                .sum();
            let fits = queued
                .and_then(|id| self.search_admission_blocks(id))
                .is_some_and(|need| need <= self.blocks.num_free_blocks())
                && self.running_slots + queued_slots <= self.config.max_num_seqs;
            if running.is_empty() {
                continue;
            }
            if fits {
                let ours: Vec<SeqId> = self
                    .waiting
                    .iter()
                    .copied()
                    .filter(|id| self.seqs.get(id).is_some_and(|e| e.seq.request_id == request_id))
                    .collect();
                self.waiting.move_to_front(&ours);
            } else if running.iter().all(pending) {
                for id in running {
                    self.preempt(id);
                }
            }
        }
    }

    /// For a queued beam: the blocks all queued beams of its search need to be admitted (no
    /// prefix-cache hits counted); `None` for other sequences.
    pub(super) fn search_admission_blocks(&self, id: SeqId) -> Option<usize> {
        let e = self.seqs.get(&id)?;
        e.beam.as_ref()?;
        let state = self.requests.get(&e.seq.request_id)?;
        let waiting = state.seq_ids.iter().filter_map(|id| self.seqs.get(id));
        let waiting = waiting.filter(|e| e.seq.status == SeqStatus::Waiting);
        Some(waiting.map(|e| self.blocks.blocks_needed(&e.seq, e.seq.len())).sum())
    }

    /// Whether a beam of `id`'s request runs (`id` being one of its beams).
    pub(super) fn search_is_running(&self, id: SeqId) -> bool {
        let Some(state) = self.seqs.get(&id).and_then(|e| self.requests.get(&e.seq.request_id)) else {
            return false;
        };
        state.seq_ids.iter().any(|s| self.seqs.get(s).is_some_and(|e| e.seq.status == SeqStatus::Running))
    }

    /// Runs the round of `request_id` when all its live beams hold candidates; returns whether
    /// sequences were dropped (the caller prunes `running`).
    pub(super) fn advance_beams(
        &mut self,
        request_id: RequestId,
        now: Instant,
        out: &mut StepEvents,
    ) -> bool {
        let Some(state) = self.requests.get(&request_id) else { return false };
        let shared = Arc::clone(&state.shared);
        let Some(search) = shared.beam else { return false };
        let live: Vec<SeqId> =
            state.seq_ids.iter().copied().filter(|id| self.seqs.contains_key(id)).collect();
        let ready = |id: &SeqId| {
            self.seqs.get(id).is_some_and(|e| {
                e.seq.status == SeqStatus::Running && e.beam.as_ref().is_some_and(Beam::is_ready)
            })
        };
        if live.is_empty() || !live.iter().all(ready) {
            return false;
        }
        let beams: Vec<RoundBeam<'_>> = live
            .iter()
            .filter_map(|id| self.seqs.get(id))
            .filter_map(|e| {
                let beam = e.beam.as_ref()?;
                Some(RoundBeam { beam, output: e.seq.output_token_ids(), len: e.seq.len() })
            })
            .collect();
        let (continuations, finished) = select_round(&search, &shared.stop, &beams);
        let state = self.requests.get_mut(&request_id).expect("checked above");
        state.hypotheses.extend(finished);
        // Every live beam is running; its slots come back below for the beams that go on.
        for id in &live {
            self.running_slots -= self.seqs[id].slots();
        }
        let next = self.continue_beams(request_id, &live, &continuations, search.width);
        let any_dropped = next.len() < live.len() || live.iter().any(|id| !next.contains(id));
        let at_length = next.first().and_then(|id| self.seqs.get(id)).is_some_and(|e| {
            e.seq.output_len() >= shared.max_tokens || e.seq.len() >= self.config.max_model_len
        });
        if next.is_empty() || at_length {
            self.finish_beams(request_id, &next, now, out);
            return true;
        }
        any_dropped
    }

    /// Makes the round's continuations the request's beams: appends each chosen token to its
    /// parent, forking a parent chosen more than once, and drops unchosen parents. Returns the
    /// beams, running, with `width` slots among them.
    fn continue_beams(
        &mut self,
        request_id: RequestId,
        live: &[SeqId],
        chosen: &[Continuation],
        width: usize,
    ) -> Vec<SeqId> {
        let mut beams: Vec<SeqId> = Vec::with_capacity(chosen.len());
        let mut taken = vec![false; live.len()];
        for c in chosen {
            let parent = live[c.parent];
            let id =
                if std::mem::replace(&mut taken[c.parent], true) { self.fork_beam(parent) } else { parent };
            beams.push(id);
        }
        // Appended only once every fork has copied its parent as it was.
        for (c, &id) in chosen.iter().zip(&beams) {
            let e = self.seqs.get_mut(&id).expect("a live beam");
            e.seq.token_ids.push(c.token.token_id);
            e.beam.as_mut().expect("a beam").extend(c);
        }
        for (&id, _) in live.iter().zip(&taken).filter(|(_, &t)| !t) {
            if let Some(mut e) = self.seqs.remove(&id) {
                self.blocks.free(&mut e.seq);
            }
        }
        // The request's sequences are its beams: dropped ones go, so lookups stay short.
        let seqs = &self.seqs;
        if let Some(state) = self.requests.get_mut(&request_id) {
            state.seq_ids.retain(|id| seqs.contains_key(id));
        }
        for (i, &id) in beams.iter().enumerate() {
            let e = self.seqs.get_mut(&id).expect("a live beam");
            let beam = e.beam.as_mut().expect("a beam");
            beam.start_round(if i == 0 { width - beams.len() } else { 0 });
            self.running_slots += e.slots();
        }
        beams
    }

    /// A running copy of beam `parent` sharing its blocks, before the round's token.
    fn fork_beam(&mut self, parent: SeqId) -> SeqId {
        let id = self.new_seq_id();
        let e = &self.seqs[&parent];
        let seq = e.seq.fork(id, 0, e.seq.seed);
        self.blocks.share(&seq.block_tables);
        let entry = SeqEntry {
            seq,
            shared: Arc::clone(&e.shared),
            fork_into: 0,
            last_scheduled: 0,
            constraint: None,
            draft_budget: MAX_SPECULATIVE_TOKENS,
            proposals: Vec::new(),
            beam: e.beam.clone(),
        };
        let request_id = entry.seq.request_id;
        self.seqs.insert(id, entry);
        self.running.push(id);
        if let Some(state) = self.requests.get_mut(&request_id) {
            state.seq_ids.push(id);
        }
        id
    }

    /// Ends the search: the live `beams` become hypotheses (cut at the length limit), and the
    /// request's `n` best hypotheses go out, the last event completing the request.
    fn finish_beams(&mut self, request_id: RequestId, beams: &[SeqId], now: Instant, out: &mut StepEvents) {
        let Some(search) = self.requests.get(&request_id).and_then(|s| s.shared.beam) else { return };
        let mut at_length = Vec::with_capacity(beams.len());
        for id in beams {
            let Some(mut e) = self.seqs.remove(id) else { continue };
            self.blocks.free(&mut e.seq);
            self.running_slots -= e.slots();
            let beam = e.beam.take().unwrap_or_default();
            at_length.push(beam.into_hypothesis(&search, e.seq.output_token_ids(), e.seq.len()));
        }
        let Some(mut state) = self.requests.remove(&request_id) else { return };
        let mut hypotheses = std::mem::take(&mut state.hypotheses);
        hypotheses.extend(at_length);
        let n = state.shared.n;
        state.timestamps.first_token.get_or_insert(now);
        for (index, h) in best_hypotheses(hypotheses, n).enumerate() {
            state.completion_tokens += h.token_ids.len();
            state.finish_reasons[index] = Some(h.reason.clone());
            let mut event = TokenEvent::finish(index, h.reason);
            event.token_ids = h.token_ids;
            event.logprobs = Some(h.logprobs);
            if index + 1 == n {
                Self::finalize(&mut state, now, &mut event, out);
            }
            out.events.push((request_id, event));
        }
    }
}

//! Beam search ([`crate::request::BeamSearch`]) as the scheduler runs it. Each beam is a
//! sequence of the request; a step that samples a beam records its top `2 * width` next
//! tokens instead of appending one ([`Scheduler::record_candidates`]). Once every live beam of
//! the request holds its candidates (normally after one step, later when the budget split
//! them), [`Scheduler::advance_beams`] picks the round's `width` best continuations: a parent
//! chosen once keeps its sequence, chosen again it forks (sharing its blocks, the partial last
//! one copied on write), not chosen it is dropped. Ending continuations become finished
//! hypotheses. When no beam is left, or the beams reach `max_tokens`, the request's `n` best
//! hypotheses go out as one event each, carrying all their tokens and logprobs.
//!
//! The request's sequence slots stay `width` throughout: the first live beam holds the slots
//! of the beams the round did not fill. A round needs every beam, so a preempted beam's
//! siblings wait for it, holding their blocks. Queued beams are admitted only when the free
//! blocks hold all of their search's queued beams ([`Scheduler::search_admission_blocks`]).
//! Before each step ([`Scheduler::regroup_beams`]) the queued beams of a search that still
//! runs move to the front of the queue when they fit, and when they do not and every running
//! beam waits for them, the search goes back to the queue whole: otherwise those beams would
//! hold the very blocks their siblings need to come back.

use std::sync::Arc;
use std::time::Instant;

use crate::event::{FinishReason, StopReason, TokenEvent};
use crate::executor::{SeqId, TokenLogprob, TopLogprobs};
use crate::request::RequestId;
use crate::sequence::SeqStatus;
use crate::speculative::MAX_SPECULATIVE_TOKENS;

use super::{Scheduler, SeqEntry, StepEvents};

/// One beam's search state.
#[derive(Debug, Clone, Default)]
pub(crate) struct Beam {
    /// Sum of the logprobs of the beam's output tokens.
    pub cum_logprob: f64,
    /// The logprob of each output token.
    pub logprobs: Vec<TopLogprobs>,
    /// The last step's most likely next tokens, until the round's selection.
    pub candidates: Option<Vec<TokenLogprob>>,
    /// Sequence slots held for beams the last round did not fill.
    pub reserve: usize,
}

/// A finished hypothesis of a beam search.
#[derive(Debug, Clone)]
pub(crate) struct Hypothesis {
    pub token_ids: Vec<u32>,
    pub logprobs: Vec<TopLogprobs>,
    pub score: f64,
    pub reason: FinishReason,
}

/// A continuation chosen in a round: beam `parent` (an index into the round's beams) followed
/// by `token`.
#[derive(Debug, Clone, Copy)]
struct Continuation {
    parent: usize,
    token: TokenLogprob,
    cum_logprob: f64,
}

impl Scheduler {
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
            let pending = |id: &SeqId| self.seqs[id].beam.as_ref().is_some_and(|b| b.candidates.is_some());
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
                self.waiting.retain(|id| !ours.contains(id));
                for &id in ours.iter().rev() {
                    self.enqueue_front(id);
                }
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

    /// Keeps a beam's step output (its top tokens) for the round's selection.
    pub(super) fn record_candidates(e: &mut SeqEntry, logprobs: Option<Vec<TopLogprobs>>) {
        let top = logprobs.and_then(|mut l| l.pop()).map(|l| l.top).unwrap_or_default();
        if let Some(beam) = e.beam.as_mut() {
            beam.candidates = Some(top);
        }
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
                e.seq.status == SeqStatus::Running && e.beam.as_ref().is_some_and(|b| b.candidates.is_some())
            })
        };
        if live.is_empty() || !live.iter().all(ready) {
            return false;
        }
        let stop = &shared.stop;
        let ends = |token: u32| {
            (!stop.ignore_eos && stop.eos_token_ids.contains(&token))
                .then_some(StopReason::Eos(token))
                .or_else(|| stop.stop_token_ids.contains(&token).then_some(StopReason::StopTokenId(token)))
        };
        let mut continuations = Vec::new();
        let mut finished = Vec::new();
        for (parent, id) in live.iter().enumerate() {
            let e = &self.seqs[id];
            let beam = e.beam.as_ref().expect("a beam");
            let output_len = e.seq.output_len() + 1;
            for &token in beam.candidates.as_deref().unwrap_or_default() {
                let cum_logprob = beam.cum_logprob + f64::from(token.logprob);
                match ends(token.token_id) {
                    // An ending token before `min_tokens` is not a continuation at all.
                    Some(_) if output_len <= stop.min_tokens => {}
                    Some(reason) => {
                        let (mut token_ids, mut logprobs) =
                            (e.seq.output_token_ids().to_vec(), beam.logprobs.clone());
                        token_ids.push(token.token_id);
                        logprobs.push(TopLogprobs { sampled: token, top: Vec::new() });
                        finished.push(Hypothesis {
                            token_ids,
                            logprobs,
                            score: search.score(cum_logprob, e.seq.len()),
                            reason: FinishReason::Stop(reason),
                        });
                    }
                    None => continuations.push(Continuation { parent, token, cum_logprob }),
                }
            }
        }
        // Equal lengths: the best scores are the best cumulative logprobs. Stable, so ties keep
        // beam order, then each beam's candidate order.
        continuations.sort_by(|a, b| b.cum_logprob.total_cmp(&a.cum_logprob));
        continuations.truncate(search.width);
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
            let beam = e.beam.as_mut().expect("a beam");
            beam.cum_logprob = c.cum_logprob;
            beam.logprobs.push(TopLogprobs { sampled: c.token, top: Vec::new() });
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
            beam.candidates = None;
            beam.reserve = if i == 0 { width - beams.len() } else { 0 };
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
            at_length.push(Hypothesis {
                token_ids: e.seq.output_token_ids().to_vec(),
                score: search.score(beam.cum_logprob, e.seq.len()),
                logprobs: beam.logprobs,
                reason: FinishReason::Length,
            });
        }
        let Some(mut state) = self.requests.remove(&request_id) else { return };
        let mut hypotheses = std::mem::take(&mut state.hypotheses);
        hypotheses.extend(at_length);
        hypotheses.sort_by(|a, b| b.score.total_cmp(&a.score));
        let n = state.shared.n;
        state.timestamps.first_token.get_or_insert(now);
        let mut best = hypotheses.into_iter();
        for index in 0..n {
            let h = best.next().unwrap_or(Hypothesis {
                token_ids: Vec::new(),
                logprobs: Vec::new(),
                score: f64::NEG_INFINITY,
                reason: FinishReason::Length,
            });
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

//! After a step: advance `num_computed_tokens`, offer newly full blocks to the prefix cache,
//! fork parents that reached their fork point, append sampled tokens (several when proposals
//! were accepted), check the token-level stop conditions after each (end-of-sequence, stop
//! token ids, `min_tokens`, length, a complete grammar; stop strings are the output stage's),
//! roll back rejected proposals, keep the executor's drafts for the next step, free finished
//! sequences and produce the step's [`TokenEvent`]s, which carry token ids and no text. A
//! pooling sequence ends with its step, its event carrying the pooled state; a beam's step
//! feeds its request's round of beam search (`fanout.rs`).

use std::time::Instant;

use crate::event::{FinishReason, StopReason, TokenEvent};
use crate::executor::{SeqId, StepOutput, TopLogprobs};
use crate::speculative::next_draft_budget;

use super::{Scheduler, SeqEntry, StepEvents, UpdateError};

impl Scheduler {
    /// Applies the executor's output for the batch of the last [`schedule`](Self::schedule).
    /// On a mismatch between batch and output nothing is changed; the caller should then
    /// [`fail_scheduled`](Self::fail_scheduled).
    pub fn update(&mut self, output: StepOutput, out: &mut StepEvents) -> Result<(), UpdateError> {
        self.check_output(&output)?;
        self.speculation.reset_stats();
        let now = Instant::now();
        let mut sampled = output.sampled.into_iter();
        let mut pooled = output.pooled.into_iter();
        let mut scored = output.prompt_logprobs.into_iter();
        let mut any_finished = false;
        let mut beam_requests = Vec::new();
        let scheduled = std::mem::take(&mut self.scheduled);
        for s in &scheduled {
            // Each output is taken in batch order, whether or not its sequence is still here.
            let token = if s.sample { sampled.next() } else { None };
            let pooled_state = if s.pool { pooled.next() } else { None };
            let scores = s.scored.and_then(|_| scored.next());
            let Some(e) = self.seqs.get_mut(&s.seq_id) else { continue };
            // Proposed tokens count as computed only once accepted.
            e.seq.num_computed_tokens += s.q - s.drafts.len();
            if let (Some((start, _)), Some(out)) = (s.scored, scores) {
                let state = self.requests.get_mut(&e.seq.request_id);
                if let Some(recorded) = state.and_then(|st| st.prompt_logprobs.as_mut()) {
                    // A recomputed prompt (after a preemption) scores what is recorded again.
                    let skip = recorded.len().saturating_sub(start);
                    if start <= recorded.len() {
                        recorded.extend(out.logprobs.into_iter().skip(skip));
                    }
                }
            }
            if s.pool {
                // Its KV is not offered to the prefix cache: an encoder writes none.
                let request_id = e.seq.request_id;
                if let Some(state) = self.requests.get_mut(&request_id) {
                    state.timestamps.first_token.get_or_insert(now);
                }
                let reason = FinishReason::Stop(StopReason::Pooled);
                let mut event = TokenEvent::finish(0, reason.clone());
                event.pooled = pooled_state.map(|p| p.values);
                self.finish_seq(s.seq_id, reason, now, &mut event, out);
                out.events.push((request_id, event));
                any_finished = true;
                continue;
            }
            let Some(token) = token else {
                self.blocks.commit_computed(&mut e.seq);
                if e.fork_into > 1 && e.seq.num_computed_tokens >= e.target() {
                    self.fork(s.seq_id);
                }
                continue;
            };
            if e.beam.is_some() {
                // The round's selection appends the beams' tokens.
                self.blocks.commit_computed(&mut e.seq);
                beam_requests.push(e.seq.request_id);
                if let Some(beam) = e.beam.as_mut() {
                    beam.record_candidates(token.logprobs);
                }
                continue;
            }
            let accepted = token.num_accepted();
            self.speculation.record(s.drafts.len(), accepted);
            if !s.drafts.is_empty() {
                e.draft_budget = next_draft_budget(s.drafts.len(), accepted);
            }
            // Drafts of what follows this step's tokens; a stop below drops them with the sequence.
            e.proposals = token.proposals;
            let request_id = e.seq.request_id;
            let mut logprobs = token.logprobs.map(Vec::into_iter);
            let mut finish = None;
            for &token_id in &token.token_ids {
                let lp = logprobs.as_mut().and_then(Iterator::next);
                let (mut event, reason) = Self::append_token(e, token_id, lp, self.config.max_model_len);
                if e.seq.output_len() == 1 {
                    if let Some(state) = self.requests.get_mut(&request_id) {
                        state.timestamps.first_token.get_or_insert(now);
                        // The prompt is scored whole by the request's first token.
                        event.prompt_logprobs = state.prompt_logprobs.take();
                    }
                }
                if let Some(reason) = reason {
                    // Tokens after a stop are dropped, accepted or not.
                    finish = Some((reason, event));
                    break;
                }
                out.events.push((request_id, event));
            }
            // The accepted proposals' KV is valid; the rejected ones' slots are overwritten by
            // later steps, and blocks that held nothing else go back to the pool.
            e.seq.num_computed_tokens = (e.seq.num_computed_tokens + accepted).min(e.seq.len());
            self.blocks.release_tail(&mut e.seq);
            self.blocks.commit_computed(&mut e.seq);
            if let Some((reason, mut event)) = finish {
                self.finish_seq(s.seq_id, reason, now, &mut event, out);
                out.events.push((request_id, event));
                any_finished = true;
            }
        }
        self.scheduled = scheduled;
        self.scheduled.clear();
        beam_requests.sort_unstable();
        beam_requests.dedup();
        for id in beam_requests {
            any_finished |= self.advance_beams(id, now, out);
        }
        if any_finished {
            let seqs = &self.seqs;
            self.running.retain(|id| seqs.contains_key(id));
        }
        Ok(())
    }

    /// The output must hold, for each sequence that sampled and in batch order, one to
    /// `drafts + 1` tokens of which all but the last are its proposals, one logprobs entry per
    /// token when any, and at most as many drafts for the next step as it was asked for.
    fn check_output(&self, output: &StepOutput) -> Result<(), UpdateError> {
        let scoring = self.scheduled.iter().filter_map(|s| s.scored.map(|(_, n)| (s.seq_id, n)));
        let got = output.prompt_logprobs.iter().map(|p| (p.seq_id, p.logprobs.len()));
        if !scoring.clone().eq(got.clone()) {
            return Err(UpdateError::PromptLogprobsMismatch {
                expected: scoring.collect(),
                got: got.collect(),
            });
        }
        let pooling = self.scheduled.iter().filter(|s| s.pool).map(|s| s.seq_id);
        if !pooling.clone().eq(output.pooled.iter().map(|p| p.seq_id)) {
            return Err(UpdateError::PooledMismatch {
                expected: pooling.collect(),
                got: output.pooled.iter().map(|p| p.seq_id).collect(),
            });
        }
        let expected = self.scheduled.iter().filter(|s| s.sample).count();
        if output.sampled.len() != expected {
            return Err(UpdateError::SampleCount { expected, got: output.sampled.len() });
        }
        let sampling = self.scheduled.iter().filter(|s| s.sample);
        for (index, (s, t)) in sampling.zip(&output.sampled).enumerate() {
            if s.seq_id != t.seq_id {
                return Err(UpdateError::SeqMismatch { index, expected: s.seq_id, got: t.seq_id });
            }
            let drafts = &s.drafts;
            let got = t.token_ids.len();
            let logprobs = t.logprobs.as_ref().map_or(got, Vec::len);
            if got == 0
                || got > drafts.len() + 1
                || t.token_ids[..got - 1] != drafts[..got - 1]
                || logprobs != got
            {
                return Err(UpdateError::BadVerification {
                    seq_id: s.seq_id,
                    drafts: s.drafts.len(),
                    got,
                    logprobs,
                });
            }
            if t.proposals.len() > s.to_draft {
                let (asked, got) = (s.to_draft, t.proposals.len());
                return Err(UpdateError::TooManyProposals { seq_id: s.seq_id, asked, got });
            }
        }
        Ok(())
    }

    /// Appends one sampled token and runs the token-level stop checks; returns the token's
    /// event and the finish reason if a stop condition hit.
    fn append_token(
        e: &mut SeqEntry,
        token: u32,
        logprobs: Option<TopLogprobs>,
        max_model_len: usize,
    ) -> (TokenEvent, Option<FinishReason>) {
        e.seq.token_ids.push(token);
        let output_len = e.seq.output_len();
        let grammar = Self::advance_constraint(e, token);
        let stop = &e.shared.stop;
        // The first `min_tokens` tokens can never stop the sample (eos / stop ids are also
        // banned from sampling until then, see `SampleRequest::banned_token_ids`).
        let may_stop = output_len > stop.min_tokens;
        let finish = match grammar {
            // A token outside the mask cannot be sampled; getting here is a bug, not the client's.
            Err(message) => Some(FinishReason::Error(message)),
            _ if may_stop && !stop.ignore_eos && stop.eos_token_ids.contains(&token) => {
                Some(FinishReason::Stop(StopReason::Eos(token)))
            }
            _ if may_stop && stop.stop_token_ids.contains(&token) => {
                Some(FinishReason::Stop(StopReason::StopTokenId(token)))
            }
            // A complete structure ends the sample, at the length limit too.
            Ok(true) => Some(FinishReason::Stop(StopReason::GrammarComplete)),
            Ok(false) if output_len >= e.shared.max_tokens || e.seq.len() >= max_model_len => {
                Some(FinishReason::Length)
            }
            Ok(false) => None,
        };
        let event = TokenEvent {
            index: e.seq.sample_index,
            token_ids: vec![token],
            text: String::new(),
            logprobs: logprobs.map(|l| vec![l]),
            pooled: None,
            prompt_logprobs: None,
            finished: finish.clone(),
            usage: None,
            timestamps: None,
        };
        (event, finish)
    }

    /// Feeds the token to the sequence's grammar, if it has one; `Ok(true)` when the grammar is
    /// complete. End-of-sequence ids are left to the stop checks (the mask allowed them only
    /// where the grammar may end).
    fn advance_constraint(e: &mut SeqEntry, token: u32) -> Result<bool, String> {
        let Some(constraint) = e.constraint.as_mut() else { return Ok(false) };
        if e.shared.stop.eos_token_ids.contains(&token) {
            return Ok(false);
        }
        constraint.0.accept_token(token).map_err(|err| format!("structured output: {err}"))?;
        Ok(constraint.0.is_finished())
    }

    /// Frees a finished sequence; on the request's last sample, completes the event with usage
    /// and timestamps and drops the request. The caller removes it from `running` (or `waiting`).
    pub(super) fn finish_seq(
        &mut self,
        id: SeqId,
        reason: FinishReason,
        now: Instant,
        event: &mut TokenEvent,
        out: &mut StepEvents,
    ) {
        let Some(mut e) = self.seqs.remove(&id) else { return };
        self.speculation.record_output(e.seq.output_token_ids());
        if let Some(hold) = &e.shared.kv_hold {
            if matches!(reason, FinishReason::Stop(_) | FinishReason::Length) {
                self.holds.hold(&mut self.blocks, hold, &e.seq, now);
            } else {
                self.holds.failed(hold, now);
            }
        }
        self.blocks.free(&mut e.seq);
        // A preempted sequence waits without a running slot.
        if e.seq.status == crate::sequence::SeqStatus::Running {
            self.running_slots -= e.slots();
        }
        e.seq.status = crate::sequence::SeqStatus::Finished;
        let request_id = e.seq.request_id;
        let Some(state) = self.requests.get_mut(&request_id) else { return };
        state.completion_tokens += e.seq.output_len();
        if let Some(slot) = state.finish_reasons.get_mut(e.seq.sample_index) {
            *slot = Some(reason);
        }
        state.num_unfinished = state.num_unfinished.saturating_sub(1);
        if state.num_unfinished == 0 {
            if let Some(mut state) = self.requests.remove(&request_id) {
                Self::finalize(&mut state, now, event, out);
            }
        }
    }
}

//! A request's life outside the step: its arrival (validated, its sequence queued) and every
//! way it ends other than by its own tokens — an abort, a stop string found by the output
//! stage, a failed step or a sequence the executor rejected, shutdown — and the usage and
//! metrics its last event carries.

use std::sync::Arc;
use std::time::Instant;

use crate::event::{FinishReason, RequestMetrics, RequestTimestamps, TokenEvent, Usage};
use crate::executor::SeqId;
use crate::request::{Request, RequestId};
use crate::rng::{combine, sample_seed};
use crate::sampling::SamplingParams;
use crate::sequence::{SeqStatus, Sequence};
use crate::speculative::MAX_SPECULATIVE_TOKENS;

use super::{beam, AddRequestError, RequestShared, RequestState, Scheduler, SeqEntry, StepEvents};

impl Scheduler {
    /// Validates and queues a request.
    pub fn add_request(&mut self, request: Request) -> Result<(), AddRequestError> {
        let max_tokens = request.validate(&self.config)?;
        if self.requests.contains_key(&request.id) {
            return Err(AddRequestError::DuplicateId(request.id));
        }
        let seed = request.params.seed.unwrap_or_else(|| {
            self.seed_state = combine(self.seed_state, request.id);
            self.seed_state
        });
        let stop = request.stop;
        let mut min_tokens_banned = Vec::new();
        if stop.min_tokens > 0 {
            if !stop.ignore_eos {
                min_tokens_banned.extend_from_slice(&stop.eos_token_ids);
            }
            min_tokens_banned.extend_from_slice(&stop.stop_token_ids);
        }
        // A beam offers its `2 * width` most likely next tokens, of the raw distribution.
        let params = match request.beam {
            Some(beam) => Arc::new(SamplingParams {
                logprobs: Some(2 * beam.width),
                ..SamplingParams::clone(&request.params)
            }),
            None => request.params,
        };
        let shared = Arc::new(RequestShared {
            id: request.id,
            params,
            max_tokens,
            prompt_len: request.prompt_token_ids.len(),
            n: request.n,
            priority: request.priority,
            group: request.group,
            seed,
            min_tokens_banned,
            stop,
            max_speculative_tokens: request.max_speculative_tokens,
            speculative_method: request.speculative_method,
            pool: request.pool,
            second_segment: request.second_segment,
            lora: request.lora,
            prompt_logprobs: request.prompt_logprobs,
            beam: request.beam,
            kv_hold: request.kv_hold,
        });
        self.speculation.prepare(request.speculative_method);
        let constraint = request.constraint;
        let seq_id = self.new_seq_id();
        let mut seq = Sequence::new(seq_id, request.id, 0, request.prompt_token_ids, sample_seed(seed, 0));
        seq.lora = request.lora;
        seq.images = (!request.images.is_empty()).then(|| std::sync::Arc::from(request.images));
        // A beam search starts from one beam, holding the slots of all of them.
        let fork_into = if shared.n > 1 && shared.beam.is_none() { shared.n } else { 0 };
        let beam = shared.beam.map(|b| beam::Beam::first(b.width));
        self.seqs.insert(
            seq_id,
            SeqEntry {
                seq,
                shared: shared.clone(),
                fork_into,
                last_scheduled: 0,
                constraint,
                draft_budget: MAX_SPECULATIVE_TOKENS,
                proposals: Vec::new(),
                beam,
            },
        );
        self.requests.insert(
            request.id,
            RequestState {
                seq_ids: vec![seq_id],
                finish_reasons: vec![None; shared.n],
                num_unfinished: shared.n,
                timestamps: RequestTimestamps::new(request.arrival),
                cached_prompt_tokens: None,
                completion_tokens: 0,
                num_preemptions: 0,
                prompt_logprobs: shared.prompt_logprobs.map(|_| Vec::new()),
                hypotheses: Vec::new(),
                shared,
            },
        );
        self.num_unstarted += request.n;
        self.waiting.push_back(seq_id, request.priority);
        Ok(())
    }

    /// Ends a request now: frees its blocks and finishes every unfinished sample with `reason`.
    /// Returns false for an unknown id.
    pub fn abort_request(&mut self, id: RequestId, reason: FinishReason, out: &mut StepEvents) -> bool {
        let Some(state) = self.requests.get(&id) else { return false };
        let seq_ids = state.seq_ids.clone();
        let mut removed_running = false;
        for sid in seq_ids {
            let Some(mut entry) = self.seqs.remove(&sid) else { continue };
            if let Some(state) = self.requests.get_mut(&id) {
                state.completion_tokens += entry.seq.output_len();
            }
            match entry.seq.status {
                SeqStatus::Running => {
                    self.running_slots -= entry.slots();
                    removed_running = true;
                }
                SeqStatus::Waiting => self.waiting.remove(sid),
                SeqStatus::Finished => {}
            }
            self.blocks.free(&mut entry.seq);
        }
        if removed_running {
            let seqs = &self.seqs;
            self.running.retain(|sid| seqs.contains_key(sid));
        }
        let now = Instant::now();
        let Some(mut state) = self.requests.remove(&id) else { return true };
        if let Some(hold) = &state.shared.kv_hold {
            self.holds.failed(hold, now);
        }
        if state.timestamps.first_scheduled.is_none() {
            self.num_unstarted -= state.shared.n;
        }
        let unfinished: Vec<usize> =
            (0..state.finish_reasons.len()).filter(|&i| state.finish_reasons[i].is_none()).collect();
        for (k, &i) in unfinished.iter().enumerate() {
            state.finish_reasons[i] = Some(reason.clone());
            let mut event = TokenEvent::finish(i, reason.clone());
            if k + 1 == unfinished.len() {
                Self::finalize(&mut state, now, &mut event, out);
            }
            out.events.push((id, event));
        }
        true
    }

    /// Ends sample `index` of request `id` with `reason` now (the output stage found a stop
    /// string in its text): frees its blocks and sends its last event, with the request's usage
    /// when it was the last sample. Returns false when the sample is unknown or already ended.
    pub fn finish_sample(
        &mut self,
        id: RequestId,
        index: usize,
        reason: FinishReason,
        out: &mut StepEvents,
    ) -> bool {
        let Some(state) = self.requests.get(&id) else { return false };
        let seqs = &self.seqs;
        let found = state
            .seq_ids
            .iter()
            .copied()
            .find(|s| seqs.get(s).is_some_and(|e| e.seq.sample_index == index && e.fork_into == 0));
        let Some(seq_id) = found else { return false };
        if self.seqs.get(&seq_id).is_some_and(|e| e.seq.status == SeqStatus::Waiting) {
            // Preempted: it holds no blocks and waits in the queue.
            self.waiting.remove(seq_id);
        }
        let mut event = TokenEvent::finish(index, reason.clone());
        self.finish_seq(seq_id, reason, Instant::now(), &mut event, out);
        out.events.push((id, event));
        let seqs = &self.seqs;
        self.running.retain(|s| seqs.contains_key(s));
        true
    }

    /// Fails every request with a sequence in the last scheduled batch (the step failed).
    pub fn fail_scheduled(&mut self, message: &str, out: &mut StepEvents) {
        let mut ids: Vec<RequestId> = self
            .scheduled
            .iter()
            .filter_map(|s| self.seqs.get(&s.seq_id).map(|e| e.seq.request_id))
            .collect();
        ids.sort_unstable();
        ids.dedup();
        self.scheduled.clear();
        for id in ids {
            self.abort_request(id, FinishReason::Error(message.to_string()), out);
        }
    }

    /// Fails the request of `seq_id`, one of the last batch's sequences that the executor could
    /// not run, with `FinishReason::Rejected(message)`, and takes all of that request's
    /// sequences out of the last batch (so that the rest of it can be run again). Returns false
    /// when `seq_id` was not in the last batch.
    pub fn reject_scheduled_seq(&mut self, seq_id: SeqId, message: &str, out: &mut StepEvents) -> bool {
        if !self.scheduled.iter().any(|s| s.seq_id == seq_id) {
            return false;
        }
        let Some(request_id) = self.seqs.get(&seq_id).map(|e| e.seq.request_id) else { return false };
        self.abort_request(request_id, FinishReason::Rejected(message.to_string()), out);
        let seqs = &self.seqs;
        self.scheduled.retain(|s| seqs.contains_key(&s.seq_id));
        true
    }

    /// Whether `seq_id` is part of the last scheduled batch (and still live).
    pub fn is_scheduled(&self, seq_id: SeqId) -> bool {
        self.scheduled.iter().any(|s| s.seq_id == seq_id)
    }

    /// Fails the first waiting request (it cannot be scheduled).
    pub fn fail_waiting_head(&mut self, message: &str, out: &mut StepEvents) {
        if let Some(id) = self.waiting.front().and_then(|s| self.seqs.get(&s)).map(|e| e.seq.request_id) {
            self.abort_request(id, FinishReason::Error(message.to_string()), out);
        }
    }

    /// Ends every request with `reason` (shutdown, or an engine that cannot continue).
    pub fn abort_all(&mut self, reason: FinishReason, out: &mut StepEvents) {
        let mut ids: Vec<RequestId> = self.requests.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            self.abort_request(id, reason.clone(), out);
        }
    }

    /// Fills in the request's usage and timestamps on its last event and records its metrics.
    pub(super) fn finalize(
        state: &mut RequestState,
        now: Instant,
        event: &mut TokenEvent,
        out: &mut StepEvents,
    ) {
        state.timestamps.finished = Some(now);
        let usage = Usage {
            prompt_tokens: state.shared.prompt_len,
            completion_tokens: state.completion_tokens,
            cached_prompt_tokens: state.cached_prompt_tokens.unwrap_or(0),
        };
        event.usage = Some(usage);
        event.timestamps = Some(state.timestamps);
        out.finished.push(RequestMetrics {
            request_id: state.shared.id,
            usage,
            timestamps: state.timestamps,
            finish_reasons: state
                .finish_reasons
                .iter()
                .map(|r| r.clone().unwrap_or(FinishReason::Abort))
                .collect(),
            num_preemptions: state.num_preemptions,
        });
    }
}

//! The continuous-batching scheduler: owns every live sequence, the waiting queue, the running
//! set and the block manager, and turns them into one [`ScheduledBatch`](crate::ScheduledBatch) per step
//! ([`schedule`](Scheduler::schedule), in `schedule.rs`) and the step's sampled tokens back into
//! [`TokenEvent`]s ([`update`](Scheduler::update), in `update.rs`). Never touches tensors, and
//! never text: its events carry token ids, and the output stage (`crate::output`, on the
//! caller's side of each stream) detokenizes them and finds stop strings, ending a sample
//! through [`finish_sample`](Scheduler::finish_sample).
//!
//! Prefill and decode are one thing: every step a scheduled sequence computes
//! `token_ids[num_computed..num_computed + q]`. A request with `n > 1` starts as one sequence
//! that computes the prompt up to its last token; it then forks into `n` sequences sharing those
//! blocks, and each computes the last prompt token (copying the shared partial block on write)
//! and samples on its own.

mod audit;
mod beam;
mod lora;
mod masks;
mod schedule;
mod state;
mod transfer;
mod update;

pub(crate) use state::{RequestShared, RequestState, Scheduled, SeqEntry};
pub use transfer::{HeldPrefix, TakeHeld};

use std::collections::hash_map::RandomState;
use std::collections::VecDeque;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::time::Instant;

use crate::block_manager::BlockManager;
use crate::config::{ConfigError, EngineConfig};
use crate::event::{FinishReason, RequestMetrics, RequestTimestamps, TokenEvent, Usage};
use crate::executor::SeqId;
use crate::id_map::IdMap;
use crate::request::{Request, RequestError, RequestId};
use crate::rng::{combine, sample_seed};
use crate::sampling::SamplingParams;
use crate::sequence::{SeqStatus, Sequence};
use crate::speculative::{Proposers, SpecDecodeStats, MAX_SPECULATIVE_TOKENS};

/// Why [`Scheduler::add_request`] refused a request.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AddRequestError {
    #[error(transparent)]
    Invalid(#[from] RequestError),
    #[error("request id {0} is already in flight")]
    DuplicateId(RequestId),
}

/// The executor's output did not match the batch it was given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UpdateError {
    #[error("the executor returned {got} sampled tokens for {expected} sequences that asked for one")]
    SampleCount { expected: usize, got: usize },
    #[error("sampled token {index} belongs to sequence {got}, expected sequence {expected}")]
    SeqMismatch { index: usize, expected: SeqId, got: SeqId },
    #[error(
        "sequence {seq_id}: the executor returned {got} tokens with {logprobs} logprobs for {drafts} \
         proposed tokens (1 to drafts + 1 tokens, all but the last the drafts' prefix)"
    )]
    BadVerification { seq_id: SeqId, drafts: usize, got: usize, logprobs: usize },
    #[error("sequence {seq_id}: the executor drafted {got} tokens for the next step, asked for {asked}")]
    TooManyProposals { seq_id: SeqId, asked: usize, got: usize },
    #[error("the executor pooled {got:?}, expected the pooling sequences {expected:?} in batch order")]
    PooledMismatch { expected: Vec<SeqId>, got: Vec<SeqId> },
    #[error("the executor scored prompt tokens of {got:?}, expected {expected:?} (sequence, count) in batch order")]
    PromptLogprobsMismatch { expected: Vec<(SeqId, usize)>, got: Vec<(SeqId, usize)> },
}

/// Events and finished-request metrics produced by one scheduler call. Reused across steps so
/// steady-state steps do not allocate the vectors.
#[derive(Debug, Default)]
pub struct StepEvents {
    pub events: Vec<(RequestId, TokenEvent)>,
    pub finished: Vec<RequestMetrics>,
}

impl StepEvents {
    pub fn clear(&mut self) {
        self.events.clear();
        self.finished.clear();
    }
}

/// What the last [`Scheduler::schedule`] did, for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScheduleStats {
    pub num_seqs: usize,
    /// Tokens computed for prompts (and for recomputing preempted output).
    pub num_prefill_tokens: usize,
    /// Tokens computed for sequences that are generating (one each).
    pub num_decode_tokens: usize,
    pub num_preemptions: usize,
    pub num_block_copies: usize,
    /// Prefix-cache lookups made by admissions this step, in tokens.
    pub prefix_cache_queries: u64,
    pub prefix_cache_hits: u64,
}

pub struct Scheduler {
    pub(crate) config: EngineConfig,
    pub(crate) blocks: BlockManager,
    pub(crate) seqs: IdMap<SeqId, SeqEntry>,
    pub(crate) requests: IdMap<RequestId, RequestState>,
    /// Ordered by priority, FIFO within one; preempted sequences go back to the front.
    pub(crate) waiting: VecDeque<SeqId>,
    /// In admission order.
    pub(crate) running: Vec<SeqId>,
    /// Sum of `slots()` over `running`.
    pub(crate) running_slots: usize,
    pub(crate) next_seq_id: SeqId,
    pub(crate) step: u64,
    pub(crate) scheduled: Vec<Scheduled>,
    /// Scratch list of running prefills, reused across steps.
    pub(crate) prefill_scratch: Vec<SeqId>,
    pub(crate) num_preemptions: u64,
    /// Samples (`n` each) of the requests none of whose sequences was ever scheduled.
    pub(crate) num_unstarted: usize,
    pub(crate) last_stats: ScheduleStats,
    /// Speculative decoding's proposers, when configured.
    pub(crate) proposers: Option<Proposers>,
    /// What verification accepted in the last `update`.
    pub(crate) last_spec_stats: SpecDecodeStats,
    /// Blocks pinned for prefill/decode transfers, by transfer key (`transfer.rs`).
    pub(crate) held: std::collections::HashMap<String, crate::kv_transfer::HeldBlocks>,
    /// Keys that will not be held (failed prefills, holds read or expired), until forgotten.
    pub(crate) gone: std::collections::HashMap<String, crate::kv_transfer::GoneKey>,
    /// Holds released unread (expired, or given up for room), since start.
    pub(crate) expired_holds: u64,
    /// Source of seeds for requests that bring none.
    seed_state: u64,
}

impl Scheduler {
    pub fn new(config: EngineConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        let mut blocks = BlockManager::with_groups(
            config.num_blocks,
            config.block_size,
            config.kv_groups.clone(),
            config.enable_prefix_caching,
        );
        if config.kv_cache_events {
            blocks.record_events();
        }
        let proposers = config.speculative.as_ref().map(Proposers::new);
        Ok(Self {
            config,
            blocks,
            seqs: IdMap::default(),
            requests: IdMap::default(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            running_slots: 0,
            next_seq_id: 0,
            step: 0,
            scheduled: Vec::new(),
            prefill_scratch: Vec::new(),
            num_preemptions: 0,
            num_unstarted: 0,
            last_stats: ScheduleStats::default(),
            proposers,
            last_spec_stats: SpecDecodeStats::default(),
            held: std::collections::HashMap::new(),
            gone: std::collections::HashMap::new(),
            expired_holds: 0,
            seed_state: RandomState::new().hash_one(0x5EED_u64),
        })
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

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
        if let (Some(proposers), Some(kind)) = (&mut self.proposers, request.speculative_method) {
            proposers.prepare(kind);
        }
        let constraint = request.constraint;
        let seq_id = self.new_seq_id();
        let mut seq = Sequence::new(seq_id, request.id, 0, request.prompt_token_ids, sample_seed(seed, 0));
        seq.lora = request.lora;
        // A beam search starts from one beam, holding the slots of all of them.
        let fork_into = if shared.n > 1 && shared.beam.is_none() { shared.n } else { 0 };
        let beam = shared.beam.map(|b| beam::Beam { reserve: b.width - 1, ..Default::default() });
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
        self.enqueue_back(seq_id);
        Ok(())
    }

    pub(crate) fn new_seq_id(&mut self) -> SeqId {
        let id = self.next_seq_id;
        self.next_seq_id += 1;
        id
    }

    fn priority_of(&self, id: SeqId) -> i32 {
        self.seqs.get(&id).map_or(0, |e| e.shared.priority)
    }

    /// Queues behind every waiting sequence of the same or a more urgent priority.
    fn enqueue_back(&mut self, id: SeqId) {
        let p = self.priority_of(id);
        let mut pos = self.waiting.len();
        while pos > 0 && self.priority_of(self.waiting[pos - 1]) > p {
            pos -= 1;
        }
        self.waiting.insert(pos, id);
    }

    /// Queues ahead of every waiting sequence of the same or a less urgent priority.
    pub(crate) fn enqueue_front(&mut self, id: SeqId) {
        let p = self.priority_of(id);
        let mut pos = 0;
        while pos < self.waiting.len() && self.priority_of(self.waiting[pos]) < p {
            pos += 1;
        }
        self.waiting.insert(pos, id);
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
                SeqStatus::Waiting => self.waiting.retain(|&w| w != sid),
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
            self.hold_failed(hold, now);
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
            self.waiting.retain(|&w| w != seq_id);
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
        if let Some(id) = self.waiting.front().and_then(|s| self.seqs.get(s)).map(|e| e.seq.request_id) {
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
    pub(crate) fn finalize(
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

    /// Whether any request is in flight.
    pub fn has_unfinished(&self) -> bool {
        !self.requests.is_empty()
    }

    pub fn num_requests(&self) -> usize {
        self.requests.len()
    }

    pub fn contains_request(&self, id: RequestId) -> bool {
        self.requests.contains_key(&id)
    }

    /// Ids of the requests in flight, in no particular order.
    pub fn request_ids(&self) -> impl Iterator<Item = RequestId> + '_ {
        self.requests.keys().copied()
    }

    pub fn num_running_seqs(&self) -> usize {
        self.running.len()
    }

    pub fn num_waiting_seqs(&self) -> usize {
        self.waiting.len()
    }

    /// Samples of the requests not yet scheduled even once (what `max_waiting_requests`
    /// bounds: a request with `n = 8` counts 8).
    pub fn num_unstarted_seqs(&self) -> usize {
        self.num_unstarted
    }

    pub fn num_preemptions(&self) -> u64 {
        self.num_preemptions
    }

    pub fn block_manager(&self) -> &BlockManager {
        &self.blocks
    }

    /// The prefix cache's changes since the last call (none unless `kv_cache_events`).
    pub fn take_cache_events(&mut self) -> Vec<crate::CacheEvent> {
        self.blocks.take_events()
    }

    /// Empties the prefix cache, or says how many requests are in flight: their blocks are
    /// still their KV, so a flush waits for an idle engine (as vLLM's and SGLang's do).
    pub fn flush_prefix_cache(&mut self) -> Result<usize, crate::handle::FlushBusy> {
        if self.has_unfinished() {
            return Err(crate::handle::FlushBusy {
                running: self.running.len(),
                waiting: self.waiting.len(),
            });
        }
        Ok(self.blocks.flush_prefix_cache())
    }

    /// A live sequence's block tables, one per KV group.
    pub fn block_tables(&self, seq_id: SeqId) -> Option<&[Vec<u32>]> {
        self.seqs.get(&seq_id).map(|e| e.seq.block_tables.as_slice())
    }

    pub fn last_schedule_stats(&self) -> &ScheduleStats {
        &self.last_stats
    }

    /// Proposals verified by the last [`update`](Self::update).
    pub fn last_spec_stats(&self) -> &SpecDecodeStats {
        &self.last_spec_stats
    }
}

#[cfg(test)]
mod tests;

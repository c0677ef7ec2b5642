//! The continuous-batching scheduler: owns every live sequence, the waiting queue, the running
//! set and the block manager, and turns them into one [`ScheduledBatch`](crate::ScheduledBatch) per step
//! ([`schedule`](Scheduler::schedule), in `schedule.rs`) and the step's sampled tokens back into
//! [`TokenEvent`]s ([`update`](Scheduler::update), in `update.rs`). Never touches tensors, and
//! never text: its events carry token ids, and the output stage (`crate::output`, on the
//! caller's side of each stream) detokenizes them and finds stop strings, ending a sample
//! through [`finish_sample`](Scheduler::finish_sample).
//!
//! Prefill and decode are one thing: every step a scheduled sequence computes
//! `token_ids[num_computed..num_computed + q]`.
//!
//! A request arrives and ends from outside the step in `lifecycle.rs`. The loop calls
//! components with one job each, through their methods:
//! - `queue.rs`: the request queue and its policy (priority, FCFS within one, preempted first);
//! - `admission.rs`: admission's pass-over rules (fair share between groups, `max_loras`);
//! - `preempt.rs`: preemption by recompute and the order of its victims;
//! - `batch.rs`: one scheduled sequence's batch entry (blocks, tokens, sampling, draft slots);
//! - `speculation.rs`: the model-free proposers (asked as the step is built), draft limits, the
//!   last verification;
//! - `fanout.rs` and `beam.rs`: `n > 1` forks and beam search (its state and round choices in
//!   `beam.rs`);
//! - `holds.rs` (with its public face in `transfer.rs`): KV-transfer holds;
//! - `masks.rs`: grammar constraints lent to the mask worker for a step; `lora.rs`: adapters in
//!   use; `audit.rs`: consistency checks; `state.rs`: what is kept per request and sequence.

mod admission;
mod audit;
mod batch;
mod beam;
mod fanout;
mod holds;
mod lifecycle;
mod lora;
mod masks;
mod offload;
mod preempt;
mod queue;
mod schedule;
mod speculation;
mod state;
mod transfer;
mod update;

pub use holds::{HeldPrefix, TakeHeld};
pub(crate) use state::{RequestShared, RequestState, Scheduled, SeqEntry};

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;

use crate::block_manager::BlockManager;
use crate::config::{ConfigError, EngineConfig};
use crate::event::{RequestMetrics, TokenEvent};
use crate::executor::SeqId;
use crate::id_map::IdMap;
use crate::request::{RequestError, RequestId};
use crate::speculative::SpecDecodeStats;

use holds::TransferHolds;
use queue::RequestQueue;
use speculation::Speculation;

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

/// The loop that builds each step (`schedule.rs`) and applies its output (`update.rs`) over
/// the live sequences, with its components: the request queue (`queue.rs`), the block manager,
/// speculation's proposers (`speculation.rs`) and the KV-transfer holds (`holds.rs`).
pub struct Scheduler {
    config: EngineConfig,
    blocks: BlockManager,
    seqs: IdMap<SeqId, SeqEntry>,
    requests: IdMap<RequestId, RequestState>,
    /// The waiting sequences and their order.
    waiting: RequestQueue,
    /// In admission order.
    running: Vec<SeqId>,
    /// Sum of `slots()` over `running`.
    running_slots: usize,
    next_seq_id: SeqId,
    step: u64,
    scheduled: Vec<Scheduled>,
    /// Scratch list of running prefills, reused across steps.
    prefill_scratch: Vec<SeqId>,
    num_preemptions: u64,
    /// Samples (`n` each) of the requests none of whose sequences was ever scheduled.
    num_unstarted: usize,
    last_stats: ScheduleStats,
    /// Speculative decoding's proposers and last verification.
    speculation: Speculation,
    /// Blocks pinned for prefill/decode transfers.
    holds: TransferHolds,
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
        let speculation = Speculation::new(&config);
        Ok(Self {
            config,
            blocks,
            seqs: IdMap::default(),
            requests: IdMap::default(),
            waiting: RequestQueue::default(),
            running: Vec::new(),
            running_slots: 0,
            next_seq_id: 0,
            step: 0,
            scheduled: Vec::new(),
            prefill_scratch: Vec::new(),
            num_preemptions: 0,
            num_unstarted: 0,
            last_stats: ScheduleStats::default(),
            speculation,
            holds: TransferHolds::default(),
            seed_state: RandomState::new().hash_one(0x5EED_u64),
        })
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    fn new_seq_id(&mut self) -> SeqId {
        let id = self.next_seq_id;
        self.next_seq_id += 1;
        id
    }

    fn priority_of(&self, id: SeqId) -> i32 {
        self.seqs.get(&id).map_or(0, |e| e.shared.priority)
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
        self.speculation.last_stats()
    }
}

#[cfg(test)]
mod tests;

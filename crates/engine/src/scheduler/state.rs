//! What the scheduler keeps per request and per sequence: the request's fixed settings shared by
//! its sequences ([`RequestShared`]), each live sequence with its scheduling state
//! ([`SeqEntry`]), the request's progress ([`RequestState`]), and what `update` needs of each
//! sequence the last step ran ([`Scheduled`]).

use std::sync::Arc;

use crate::constraint::SeqConstraint;
use crate::event::{FinishReason, RequestTimestamps};
use crate::executor::SeqId;
use crate::request::{BeamSearch, RequestId, StopConditions};
use crate::sampling::SamplingParams;
use crate::sequence::Sequence;
use crate::speculative::ProposerKind;

use super::beam;

/// What never changes for a request, shared by its sequences.
#[derive(Debug)]
pub(crate) struct RequestShared {
    pub id: RequestId,
    pub params: Arc<SamplingParams>,
    pub stop: StopConditions,
    pub max_tokens: usize,
    pub prompt_len: usize,
    pub n: usize,
    pub priority: i32,
    /// The admission group (the API call) the request belongs to.
    pub group: u64,
    pub seed: u64,
    /// Banned from sampling while `min_tokens` is not reached: eos (unless ignored) and stop ids.
    pub min_tokens_banned: Vec<u32>,
    /// The request's own cap on proposals per step ([`crate::request::Request::max_speculative_tokens`]).
    pub max_speculative_tokens: Option<usize>,
    /// The request's own proposer ([`crate::request::Request::speculative_method`]).
    pub speculative_method: Option<ProposerKind>,
    /// A pooling request ([`crate::request::Request::pool`]).
    pub pool: bool,
    /// Where a pooled pair's second text starts ([`crate::request::Request::second_segment`]).
    pub second_segment: Option<usize>,
    /// The request's LoRA adapter ([`crate::request::Request::lora`]).
    pub lora: Option<crate::executor::LoraId>,
    /// Alternatives per prompt token when the prompt's logprobs were asked for.
    pub prompt_logprobs: Option<usize>,
    /// A beam search ([`crate::request::Request::beam`]).
    pub beam: Option<BeamSearch>,
    /// Hold the prompt's blocks for a transfer when done ([`crate::request::Request::kv_hold`]).
    pub kv_hold: Option<crate::kv_transfer::KvHold>,
}

#[derive(Debug)]
pub(crate) struct SeqEntry {
    pub seq: Sequence,
    pub shared: Arc<RequestShared>,
    /// Samples this sequence forks into once all but the last prompt token are computed; 0 once
    /// forked (or for `n == 1`).
    pub fork_into: usize,
    /// Last step this sequence was scheduled in.
    pub last_scheduled: u64,
    /// Structured output: this sample's grammar state. Taken out by the engine while the mask
    /// worker has it (during `execute`), put back before `update`.
    pub constraint: Option<SeqConstraint>,
    /// Most tokens to propose next step (speculative decoding): halved down to what the last
    /// verification accepted plus one, doubled after a proposal held whole, so text that
    /// proposals do not predict stops paying for verified positions.
    pub draft_budget: usize,
    /// The executor's drafts of the tokens after the sequence's last one, from the last step
    /// that sampled it, for the next step to verify.
    pub proposals: Vec<u32>,
    /// A beam of a beam search: its score so far and its candidates of the round.
    pub beam: Option<beam::Beam>,
}

impl SeqEntry {
    /// Sequence slots it takes against `max_num_seqs`: an unforked parent reserves all samples,
    /// a beam those of the beams its request may still fork.
    pub fn slots(&self) -> usize {
        self.fork_into.max(1) + self.beam.as_ref().map_or(0, beam::Beam::reserve)
    }

    /// Tokens to have computed before the next thing happens (a sample, or the fork).
    pub fn target(&self) -> usize {
        if self.fork_into > 1 {
            self.seq.prompt_len - 1
        } else {
            self.seq.len()
        }
    }
}

#[derive(Debug)]
pub(crate) struct RequestState {
    pub shared: Arc<RequestShared>,
    /// Sequences created so far (finished ones included).
    pub seq_ids: Vec<SeqId>,
    /// By sample index.
    pub finish_reasons: Vec<Option<FinishReason>>,
    pub num_unfinished: usize,
    pub timestamps: RequestTimestamps,
    pub cached_prompt_tokens: Option<usize>,
    /// Output tokens of the sequences that have ended so far.
    pub completion_tokens: usize,
    pub num_preemptions: usize,
    /// The prompt's logprobs scored so far (entry `i` for prompt token `i + 1`), until the
    /// request's first token event carries them; `None` once sent, or when not asked for.
    pub prompt_logprobs: Option<Vec<crate::executor::TopLogprobs>>,
    /// A beam search's finished hypotheses so far.
    pub(crate) hypotheses: Vec<beam::Hypothesis>,
}

/// One scheduled sequence of the last step, as `update` needs it.
#[derive(Debug, Clone)]
pub(crate) struct Scheduled {
    pub seq_id: SeqId,
    /// Tokens computed, proposed ones included.
    pub q: usize,
    pub sample: bool,
    /// The proposed tokens at the end of the step's tokens (speculative decoding).
    pub drafts: Vec<u32>,
    /// Most tokens the executor may draft after the step ([`crate::ScheduledSeq::num_to_draft`]).
    pub to_draft: usize,
    /// A pooling sequence, whose pooled state the step returns.
    pub pool: bool,
    /// The first position and count of the prompt tokens the step scores.
    pub scored: Option<(usize, usize)>,
}

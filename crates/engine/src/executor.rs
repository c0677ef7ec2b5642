//! The boundary between the scheduler and the model: one [`ScheduledBatch`] in, one
//! [`StepOutput`] out per engine step.
//!
//! Prefill and decode are the same thing here: each scheduled sequence computes `q_len >= 1` new
//! tokens starting at position `start_pos` (its `num_computed_tokens`), attending to everything
//! before it through its block table. A decode is `q_len == 1`. The batch persists on the
//! executor's side: a sequence's block tables come as changes to what it held
//! ([`crate::block_tables`]).

use std::sync::Arc;

use crate::block_tables::BlockTableUpdate;
use crate::constraint::{DraftGrammar, MaskSlot};
use crate::sampling::SamplingParams;

/// Identifies one sequence (one of the `n` samples of a request) for the engine's lifetime.
pub type SeqId = u64;

/// A LoRA adapter as the executor knows it (the server names adapters; the executor holds
/// their weights under these ids).
pub type LoraId = u32;

/// A LoRA adapter read and checked off the engine thread, in the executor's own type, for
/// [`ModelExecutor::install_lora`]: the engine only moves it, so files are never read between
/// steps.
pub type PreparedLora = Box<dyn std::any::Any + Send>;

/// One sequence's share of a step.
#[derive(Debug, Clone)]
pub struct ScheduledSeq {
    pub seq_id: SeqId,
    /// The tokens to compute this step: `token_ids[start_pos..start_pos + q_len]` of the sequence.
    pub token_ids: Vec<u32>,
    /// Number of tokens already in the KV cache (`num_computed_tokens` before this step).
    pub start_pos: usize,
    /// How the sequence's block tables changed since the executor last ran it (all of them
    /// when it has not, see [`crate::block_tables`]). Brought up to date, they hold per KV group
    /// (see [`crate::kv_groups`]) the pages covering positions `0..start_pos + q_len` (and
    /// `num_to_draft` more), in order; entries a windowed group released are `NULL_BLOCK`.
    pub block_table_update: BlockTableUpdate,
    /// `Some` when this step completes the sequence's prompt (or is a decode), so a token must be
    /// sampled from the logits of its last position.
    pub sample: Option<SampleRequest>,
    /// Speculative decoding: the last `num_draft_tokens` of `token_ids` are proposed, not yet
    /// accepted. The executor samples at each of the last `num_draft_tokens + 1` positions and
    /// keeps drafts while they equal what it drew (see [`crate::speculative::verify`]). 0 unless
    /// `sample` is `Some`.
    pub num_draft_tokens: usize,
    /// Most tokens the executor drafts after the tokens it keeps this step, with
    /// [`ScheduledBatch::executor_draft`], and returns as [`SampledToken::proposals`] for the
    /// next step to verify: this many when every proposal of this step holds, else one past the
    /// accepted ones ([`num_to_draft_after`](Self::num_to_draft_after)). The block tables cover
    /// `context_len() + num_to_draft` positions, so the drafting passes have slots to write. 0
    /// unless `sample` is `Some`.
    pub num_to_draft: usize,
    /// A pooling sequence (embeddings): this step computes its whole input at once and the
    /// executor returns the pooled hidden state ([`StepOutput::pooled`]) instead of a token.
    /// `sample` is `None`; the KV it writes is not read again.
    pub pool: bool,
    /// A pooling sequence over a text pair (a cross-encoder's input): where the second text's
    /// tokens start in `token_ids`; they are segment B (BERT's token type 1), the rest segment A.
    pub second_segment: Option<usize>,
    /// The LoRA adapter the sequence runs with; `None`: the base model.
    pub lora: Option<LoraId>,
    /// The logprobs of the prompt tokens this step's positions predict (vLLM's
    /// `prompt_logprobs`), returned in [`StepOutput::prompt_logprobs`].
    pub prompt_logprobs: Option<PromptLogprobsRequest>,
}

/// Which prompt tokens a step scores: the step's position `start_pos + i` predicts `targets[i]`
/// (the prompt token after it), for the first `targets.len()` of its positions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromptLogprobsRequest {
    /// How many of the most likely tokens to give at each position besides the target.
    pub top: usize,
    pub targets: Vec<u32>,
}

impl ScheduledSeq {
    /// A chunk of `token_ids` at `start_pos` that asks for nothing else: no sample, no drafts,
    /// no pooling, the base model, no prompt logprobs.
    pub fn chunk(
        seq_id: SeqId,
        token_ids: Vec<u32>,
        start_pos: usize,
        block_table_update: BlockTableUpdate,
    ) -> Self {
        Self {
            seq_id,
            token_ids,
            start_pos,
            block_table_update,
            sample: None,
            num_draft_tokens: 0,
            num_to_draft: 0,
            pool: false,
            second_segment: None,
            lora: None,
            prompt_logprobs: None,
        }
    }

    pub fn q_len(&self) -> usize {
        self.token_ids.len()
    }

    /// Context length after this step: cached tokens plus the new ones.
    pub fn context_len(&self) -> usize {
        self.start_pos + self.token_ids.len()
    }

    /// The proposed tokens this step verifies.
    pub fn draft_tokens(&self) -> &[u32] {
        &self.token_ids[self.token_ids.len() - self.num_draft_tokens..]
    }

    /// How many tokens to draft after a verification that accepted `accepted` of this step's
    /// proposals: the scheduler's next limit, which falls to one past the accepted prefix after
    /// a rejection (see [`num_to_draft`](Self::num_to_draft)).
    pub fn num_to_draft_after(&self, accepted: usize) -> usize {
        match self.num_draft_tokens {
            0 => self.num_to_draft,
            proposed => self.num_to_draft.min(crate::speculative::next_draft_budget(proposed, accepted)),
        }
    }

    /// Positions whose logits the step needs: the last `num_draft_tokens + 1` when sampling,
    /// after the ones that score prompt tokens (which start at the step's first position: a step
    /// scores prompt tokens only up to the prompt's end, where sampling starts).
    pub fn num_logits_rows(&self) -> usize {
        let scored = self.prompt_logprobs.as_ref().map_or(0, |p| p.targets.len());
        scored + if self.sample.is_some() { self.num_draft_tokens + 1 } else { 0 }
    }
}

/// What the sampler needs to draw one token for one sequence.
#[derive(Debug, Clone)]
pub struct SampleRequest {
    pub params: Arc<SamplingParams>,
    /// Effective seed of this sequence (request seed mixed with the sample index).
    pub seed: u64,
    /// How many tokens this sequence has generated so far; with `seed` it fixes the random draw,
    /// so the output does not depend on batch composition or preemption.
    pub output_index: usize,
    /// Prompt then output token ids; filled only when `params.needs_history()`.
    pub history: Option<Arc<[u32]>>,
    /// Number of prompt tokens at the start of `history` (penalties other than repetition apply
    /// to output tokens only).
    pub prompt_len: usize,
    /// Token ids that must not be sampled this step (eos and stop ids while `min_tokens` is not
    /// reached).
    pub banned_token_ids: Vec<u32>,
    /// The grammar's mask for this token (structured output), computed while the model runs:
    /// the sampler waits for it and applies it before anything else.
    pub allowed: Option<Arc<MaskSlot>>,
    /// Structured output with speculation: the masks of the positions after each proposed
    /// token (`draft_masks[i]` after `i + 1` of them), computed like `allowed`.
    pub draft_masks: Vec<Arc<MaskSlot>>,
    /// Structured output with `num_to_draft > 0`: the grammar at the step's first sampled
    /// position, for the executor to walk past the tokens it keeps and draft under
    /// ([`crate::speculative::DraftChain`]).
    pub draft_grammar: Option<DraftGrammar>,
}

impl SampleRequest {
    /// Plain greedy sampling with no history, bans or logprobs (tests and tools that drive an
    /// executor by hand).
    pub fn greedy() -> Self {
        Self {
            params: Arc::new(SamplingParams::default()),
            seed: 0,
            output_index: 0,
            history: None,
            prompt_len: 0,
            banned_token_ids: Vec::new(),
            allowed: None,
            draft_masks: Vec::new(),
            draft_grammar: None,
        }
    }
}

/// One engine step: a mixed batch of prefill chunks and decodes.
#[derive(Debug, Clone, Default)]
pub struct ScheduledBatch {
    pub seqs: Vec<ScheduledSeq>,
    /// Whole-block KV copies `(src, dst)` the executor must apply, in order, before computing
    /// anything in this step (copy-on-write of a block shared by several samples or held by the
    /// prefix cache). `dst` is always a block no other sequence uses. A pair copies one whole
    /// page, every layer slot of it (a page belongs to one KV group at a time).
    pub block_copies: Vec<(u32, u32)>,
    /// What the executor drafts the proposals of sequences with `num_to_draft > 0` with,
    /// greedily, after sampling (set whenever the server has a draft, so that a draft model
    /// sees every step).
    pub executor_draft: Option<ExecutorDraft>,
    /// Sequences the executor ran before that are gone (finished, aborted or preempted): it
    /// forgets their block tables before applying this batch's updates.
    pub released: Vec<SeqId>,
    /// The images of the sequences whose tokens this step include an image placeholder, in
    /// batch order: the executor runs (or takes from its cache) each such image's encoder
    /// features and puts the rows of this step's placeholders in place of their embeddings.
    pub images: Vec<ScheduledImages>,
}

/// A sequence's images, for a step whose tokens include some of their placeholders.
#[derive(Debug, Clone)]
pub struct ScheduledImages {
    pub seq_id: SeqId,
    /// All of the prompt's images, in prompt order (the executor takes those whose
    /// placeholders fall among the step's positions, [`crate::ImageInput::features_in`]).
    pub images: Arc<[crate::multimodal::ImageInput]>,
}

/// What an executor drafts proposals with ([`ScheduledBatch::executor_draft`]): which of its
/// drafters, each a [`Proposer`](crate::speculative::Proposer), it runs after the step
/// ([`propose_after_step`](crate::speculative::propose_after_step)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExecutorDraft {
    /// The target's own first this many layers (self-speculative).
    Layers(usize),
    /// A separate, smaller model with the same vocabulary. It computes every token the target
    /// keeps in every step (prefill chunks included), so its own KV cache, paged by the same
    /// block tables, stays in step with the target's.
    Model,
}

impl ScheduledBatch {
    pub fn num_tokens(&self) -> usize {
        self.seqs.iter().map(|s| s.q_len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.seqs.is_empty()
    }

    /// The images of sequence `seq_id` when this step includes some of their placeholders.
    pub fn images_of(&self, seq_id: SeqId) -> Option<&Arc<[crate::multimodal::ImageInput]>> {
        self.images.iter().find(|i| i.seq_id == seq_id).map(|i| &i.images)
    }
}

/// Logprob of one token id.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenLogprob {
    pub token_id: u32,
    pub logprob: f32,
}

/// The sampled token's logprob and the most likely alternatives, most likely first.
#[derive(Debug, Clone, PartialEq)]
pub struct TopLogprobs {
    pub sampled: TokenLogprob,
    pub top: Vec<TokenLogprob>,
}

/// The tokens one step produced for one sequence: the draft tokens it accepted, in order, then
/// the one it drew after them (exactly one token without speculation).
#[derive(Debug, Clone, PartialEq)]
pub struct SampledToken {
    pub seq_id: SeqId,
    pub token_ids: Vec<u32>,
    /// One entry per token when logprobs were asked for.
    pub logprobs: Option<Vec<TopLogprobs>>,
    /// The executor's drafts of the tokens after `token_ids`, at most
    /// [`ScheduledSeq::num_to_draft`] of them, for the scheduler to verify next step.
    pub proposals: Vec<u32>,
}

impl SampledToken {
    /// Draft tokens accepted (all tokens but the last).
    pub fn num_accepted(&self) -> usize {
        self.token_ids.len().saturating_sub(1)
    }
}

/// The pooled hidden state of one pooling sequence ([`ScheduledSeq::pool`]): its embedding,
/// pooled and normalized as the model's configuration says.
#[derive(Debug, Clone, PartialEq)]
pub struct PooledOutput {
    pub seq_id: SeqId,
    pub values: Vec<f32>,
}

/// The logprobs of the prompt tokens one step scored, one per target of its
/// [`PromptLogprobsRequest`], in order.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptLogprobsOutput {
    pub seq_id: SeqId,
    pub logprobs: Vec<TopLogprobs>,
}

/// Result of one step: one entry per scheduled sequence with `sample: Some` in `sampled`, one
/// per sequence with `pool` in `pooled`, and one per sequence with `prompt_logprobs` in
/// `prompt_logprobs`, each in batch order.
#[derive(Debug, Clone, Default)]
pub struct StepOutput {
    pub sampled: Vec<SampledToken>,
    pub pooled: Vec<PooledOutput>,
    pub prompt_logprobs: Vec<PromptLogprobsOutput>,
}

/// Why a step could not run.
#[derive(Debug, thiserror::Error)]
pub enum ExecutorError {
    #[error("model execution failed: {0}")]
    Execution(String),
    #[error("invalid batch: {0}")]
    InvalidBatch(String),
    /// One sequence of the batch cannot run (its input is beyond what the model accepts); the
    /// rest of the batch can. The engine fails that sequence's request only and retries the
    /// step without it. `message` is meant for the client (no internal ids).
    #[error("sequence {seq_id} cannot run: {message}")]
    InvalidSequence { seq_id: SeqId, message: String },
    /// The executor cannot run any further step (device lost, corrupted state): the engine fails
    /// every request in flight and stops.
    #[error("model executor failed permanently: {0}")]
    Fatal(String),
}

/// Runs the model over one scheduled batch and samples the requested tokens.
pub trait ModelExecutor: Send {
    /// Runs one step. The batch's block-table changes and released ids
    /// ([`BlockTableStore::apply`](crate::BlockTableStore::apply)) are applied first, before
    /// anything that can fail: the scheduler sends each change once, and an `InvalidSequence`
    /// error brings the same batch back without that sequence.
    fn execute(&mut self, batch: &ScheduledBatch) -> Result<StepOutput, ExecutorError>;

    /// Size of one KV block in tokens; the scheduler uses the same.
    fn block_size(&self) -> usize;

    /// Number of KV blocks (pages) the executor allocated.
    fn num_blocks(&self) -> usize;

    /// How the executor's layers are grouped for block allocation; one full group unless it
    /// has sliding-window layers whose pages it lets the engine release.
    fn kv_groups(&self) -> crate::KvGroups {
        crate::KvGroups::single()
    }

    /// Layers the executor could draft with ([`ExecutorDraft::Layers`] must be below it);
    /// `None` when it cannot draft with its own layers.
    fn num_layers(&self) -> Option<usize> {
        None
    }

    /// Whether the executor holds a separate draft model ([`ExecutorDraft::Model`]).
    fn has_draft_model(&self) -> bool {
        false
    }

    /// Whether the executor runs a vision encoder for the images of a batch
    /// ([`ScheduledBatch::images`]); one that does not must not be sent any.
    fn takes_images(&self) -> bool {
        false
    }

    /// Installs `adapter`, prepared for this executor, as `id`; nothing is kept when it fails.
    /// Executors without adapters refuse.
    fn install_lora(&mut self, id: LoraId, adapter: PreparedLora) -> Result<(), ExecutorError> {
        let _ = (id, adapter);
        Err(ExecutorError::Execution("this executor serves no LoRA adapters".into()))
    }

    /// Drops adapter `id`; false when it was not loaded.
    fn unload_lora(&mut self, id: LoraId) -> bool {
        let _ = id;
        false
    }

    /// The shape of the pages [`Self::read_kv_pages`] returns; `None` when this executor's KV
    /// cannot be transferred (prefill/decode disaggregation, [`crate::kv_transfer`]).
    fn kv_page_layout(&self) -> Option<crate::KvPageLayout> {
        None
    }

    /// The K and V pages of `blocks`, block-major (see [`crate::kv_transfer`]).
    fn read_kv_pages(&mut self, blocks: &[u32]) -> Result<Vec<u8>, ExecutorError> {
        let _ = blocks;
        Err(ExecutorError::Execution("this executor cannot read KV pages".into()))
    }

    /// Writes `pages` (block-major, as [`Self::read_kv_pages`] returns them) into `blocks`.
    fn write_kv_pages(&mut self, blocks: &[u32], pages: &[u8]) -> Result<(), ExecutorError> {
        let _ = (blocks, pages);
        Err(ExecutorError::Execution("this executor cannot write KV pages".into()))
    }

    /// Frees the KV cache's memory (level 1) or the weights' too (level 2), see
    /// [`crate::sleep`]. The engine calls it with nothing in flight and the prefix cache
    /// empty; no step runs until [`Self::wake_up`]. Executors that cannot sleep refuse.
    fn sleep(&mut self, level: crate::SleepLevel) -> Result<(), crate::SleepError> {
        let _ = level;
        Err(crate::SleepError::Unsupported("this model executor cannot sleep".into()))
    }

    /// Takes back what [`Self::sleep`] freed: the cache (zeroed, same geometry) and the weights.
    fn wake_up(&mut self) -> Result<(), crate::SleepError> {
        Ok(())
    }
}

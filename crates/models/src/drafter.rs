//! Drafting proposals for speculative decoding in the executor ([`ExecutorDraft`]), at the end
//! of a step: after the target sampled, the drafter continues each sequence that asks for
//! proposals ([`ScheduledSeq::num_to_draft`]) from the tokens the target kept, greedily, one
//! pass per position, and returns the drafts with the step's output. The scheduler verifies
//! them in the next step like any other proposal, so nothing flows back into this step.
//!
//! Two drafters, each a [`Proposer`] like the engine's n-gram and suffix proposers (the runner
//! picks one per step by [`ScheduledBatch::executor_draft`] and runs it through
//! [`propose_after_step`](pagoda_engine::speculative::propose_after_step)):
//! - **The target's first layers** ([`SelfDrafter`], [`ExecutorDraft::Layers`],
//!   self-speculative) over the target's own cache. Below those layers the target's KV is what
//!   the drafter would compute, so the first pass feeds only each sequence's drawn token. The
//!   passes write those layers' KV into slots that the next step's verification overwrites.
//! - **A separate draft model** ([`ModelDrafter`], [`ExecutorDraft::Model`], [`DraftModel`]): a
//!   smaller model with the target's vocabulary and a KV cache of its own that the target's
//!   block tables page too.
//!   Both caches have the same block size and number of blocks, so slot `s` holds the same
//!   position in each, and the engine's block manager, prefix cache and copy-on-write serve both
//!   without knowing about the draft. For that the draft computes every token the target keeps,
//!   every step: its first pass runs each sequence's computed and accepted tokens (prefill
//!   chunks too), then the drawn token where it drafts.
//!
//! The scheduler gives the block tables slots for the drafts (`num_to_draft` past the step's
//! tokens). Slots of drafts that the verification rejects hold guesses until later steps
//! overwrite them, as in the target's cache. Under a grammar each draft is drawn under its
//! position's mask ([`DraftChain`]).
//!
//! [`ExecutorDraft`]: pagoda_engine::ExecutorDraft
//! [`ExecutorDraft::Model`]: pagoda_engine::ExecutorDraft::Model
//! [`ExecutorDraft::Layers`]: pagoda_engine::ExecutorDraft::Layers

use candle_core::Device;
use pagoda_engine::constraint::TokenMask;
use pagoda_engine::sampler::try_sample;
use pagoda_engine::speculative::{DraftChain, ProposeSeq, Proposer, ProposerKind};
use pagoda_engine::{
    BlockTableStore, BlockTableUpdate, ExecutorDraft, ExecutorError, MaskSlot, SampleRequest, ScheduledBatch,
    ScheduledSeq, SeqId,
};

use crate::error::ModelError;
use crate::kv_cache::KvCache;
use crate::model::Model;
use crate::runner::{flatten, forward_with};

/// The draft model and its cache (see the module docs).
pub struct DraftModel {
    pub(crate) model: Model,
    pub(crate) cache: KvCache,
}

impl DraftModel {
    pub fn new(model: Model, cache: KvCache) -> Self {
        Self { model, cache }
    }

    pub fn cache(&self) -> &KvCache {
        &self.cache
    }
}

type StepResult<T> = std::result::Result<T, ExecutorError>;

/// The self-drafter ([`ExecutorDraft::Layers`]): the target's first layers over the target's
/// own cache. Below those layers the target's KV is what it would compute, so its first pass
/// feeds only each sequence's drawn token.
pub struct SelfDrafter<'a>(Passes<'a>);

impl<'a> SelfDrafter<'a> {
    /// `model`'s first `num_layers` layers over its `cache`, paged by the step's `tables`.
    pub fn new(
        model: &'a Model,
        cache: &'a KvCache,
        tables: &'a BlockTableStore,
        device: &'a Device,
        num_layers: usize,
    ) -> Self {
        Self(Passes { model, cache, tables, device, how: ExecutorDraft::Layers(num_layers) })
    }
}

impl Proposer for SelfDrafter<'_> {
    type Error = ExecutorError;

    fn kind(&self) -> ProposerKind {
        ProposerKind::Executor
    }

    fn propose(&self, seqs: &mut [ProposeSeq<'_>], out: &mut [Vec<u32>]) -> StepResult<()> {
        self.0.draft(seqs, out)
    }
}

/// The draft-model drafter ([`ExecutorDraft::Model`]): a separate model over its own cache,
/// which computes every token the target kept this step, drafting or not.
pub struct ModelDrafter<'a>(Passes<'a>);

impl<'a> ModelDrafter<'a> {
    /// `draft` over its own cache, paged by the step's `tables`.
    pub fn new(draft: &'a DraftModel, tables: &'a BlockTableStore, device: &'a Device) -> Self {
        Self(Passes { model: &draft.model, cache: &draft.cache, tables, device, how: ExecutorDraft::Model })
    }
}

impl Proposer for ModelDrafter<'_> {
    type Error = ExecutorError;

    fn kind(&self) -> ProposerKind {
        ProposerKind::Executor
    }

    fn propose(&self, seqs: &mut [ProposeSeq<'_>], out: &mut [Vec<u32>]) -> StepResult<()> {
        self.0.draft(seqs, out)
    }
}

/// What both drafters run their passes on: a model (the target cut to its first layers, or
/// the draft model) over its cache.
struct Passes<'a> {
    model: &'a Model,
    cache: &'a KvCache,
    /// The step's block tables; the drafting passes' sequences add nothing to them.
    tables: &'a BlockTableStore,
    device: &'a Device,
    /// The target's first layers, over its cache, or a separate draft model over its own.
    how: ExecutorDraft,
}

/// One sequence's drafting.
struct Walk {
    seq_id: SeqId,
    /// Its index in the proposer's `seqs` and `out`.
    out: usize,
    /// The position of the token the target drew last (not in any cache yet).
    at: usize,
    want: usize,
    drafts: Vec<u32>,
    chain: Option<DraftChain>,
}

impl Passes<'_> {
    /// Drafts, into `out[i]`, the proposals of every sequence of `seqs` (the whole step, see
    /// [`Proposer::propose`]) that asks for some, after its drawn token: as many as it asks for
    /// and its block tables and the model's positions have room for. A draft model first
    /// computes every token the target kept this step, drafting or not.
    fn draft(&self, seqs: &mut [ProposeSeq<'_>], out: &mut [Vec<u32>]) -> StepResult<()> {
        let whole_steps = self.how == ExecutorDraft::Model;
        let max_len = self.model.config().max_position_embeddings;
        let block_size = self.cache.block_size();
        let mut first = Vec::with_capacity(seqs.len());
        let mut walks = Vec::new();
        for (index, s) in seqs.iter_mut().enumerate() {
            // Only the executor's sequences have block tables to draft into.
            let Some(seq_id) = s.seq_id else { continue };
            let at = s.drawn_pos();
            let slots = self.tables.get(seq_id).and_then(<[_]>::first).map_or(0, Vec::len) * block_size;
            let want = match s.drawn {
                true => s.max_tokens.min(slots.min(max_len).saturating_sub(at)),
                false => 0,
            };
            let mut token_ids = if whole_steps { s.computed().to_vec() } else { Vec::new() };
            token_ids.extend(s.drawn_token().filter(|_| want > 0));
            if token_ids.is_empty() {
                continue;
            }
            let start_pos = if whole_steps { s.start_pos } else { at };
            first.push(ScheduledSeq {
                seq_id,
                token_ids,
                start_pos,
                block_table_update: BlockTableUpdate::default(),
                sample: (want > 0).then(SampleRequest::greedy),
                num_draft_tokens: 0,
                num_to_draft: 0,
                pool: false,
                second_segment: None,
                lora: None,
                prompt_logprobs: None,
            });
            if want > 0 {
                let chain = s.grammar.take();
                walks.push(Walk { seq_id, out: index, at, want, drafts: Vec::with_capacity(want), chain });
            }
        }
        if first.is_empty() {
            return Ok(());
        }
        let masks = walks.iter_mut().map(|w| w.chain.as_mut().and_then(DraftChain::next_mask)).collect();
        let tokens = self.pass(ScheduledBatch { seqs: first, ..ScheduledBatch::default() }, masks)?;
        for (walk, token) in walks.iter_mut().zip(tokens) {
            walk.take(token);
        }
        // Pass `j` feeds each walk's draft `j - 1` at its position and draws draft `j`.
        let passes = walks.iter().map(|w| w.want).max().unwrap_or(0);
        for j in 1..passes {
            let mut members: Vec<&mut Walk> = walks.iter_mut().filter(|w| w.want > j).collect();
            let seqs = members.iter().map(|w| one_token(w.seq_id, w.drafts[j - 1], w.at + j)).collect();
            let masks =
                members.iter_mut().map(|w| w.chain.as_mut().and_then(DraftChain::next_mask)).collect();
            let tokens = self.pass(ScheduledBatch { seqs, ..ScheduledBatch::default() }, masks)?;
            for (walk, token) in members.into_iter().zip(tokens) {
                walk.take(token);
            }
        }
        for walk in walks {
            if let Some(entry) = out.get_mut(walk.out) {
                entry.extend(walk.drafts);
            }
        }
        Ok(())
    }

    /// One forward pass over `pass`, writing the drafter's cache; the greedy token of each
    /// sequence that samples, in order, under its mask in `masks` (one per such sequence) where
    /// it has one, `None` where no token can be drawn (a guess not made fails nobody's request).
    /// A pass with none still computes one row (the model's head wants at least one), which is
    /// dropped.
    fn pass(&self, mut pass: ScheduledBatch, masks: Vec<Option<TokenMask>>) -> StepResult<Vec<Option<u32>>> {
        let how = self.how;
        let num_layers = match how {
            ExecutorDraft::Layers(layers) => Some(layers),
            ExecutorDraft::Model => None,
        };
        let failed = |e: ModelError| ExecutorError::Execution(format!("drafting ({how:?}): {e}"));
        let wanted = pass.seqs.iter().filter(|s| s.sample.is_some()).count();
        if wanted == 0 {
            match pass.seqs.last_mut() {
                Some(last) => last.sample = Some(SampleRequest::greedy()),
                None => return Ok(Vec::new()),
            }
        }
        let flat = flatten(&pass, self.tables, self.model, self.cache)?;
        let (logits, _) =
            forward_with(self.model, self.cache, self.device, flat, num_layers).map_err(failed)?;
        if self.device.is_cuda() && masks.iter().all(Option::is_none) {
            // Proposals need only the greedy ids: a device argmax copies one id per row back
            // instead of every row of logits. A proposal is only a guess, so its ties and NaNs
            // need none of the host sampler's care: verification keeps the target's tokens.
            let ids = logits.argmax(candle_core::D::Minus1).and_then(|ids| ids.to_vec1::<u32>());
            return Ok(ids.map_err(|e| failed(e.into()))?.into_iter().take(wanted).map(Some).collect());
        }
        let rows = logits.to_vec2::<f32>().map_err(|e| failed(e.into()))?;
        let drawn = rows
            .into_iter()
            .zip(masks.into_iter().chain(std::iter::repeat(None)))
            .take(wanted)
            .map(|(mut row, mask)| {
                let req = SampleRequest { allowed: mask.map(MaskSlot::ready), ..SampleRequest::greedy() };
                try_sample(&mut row, &req).ok().map(|(token, _)| token)
            })
            .collect();
        Ok(drawn)
    }
}

impl Walk {
    /// Takes `token` as the next draft; without one, the walk ends with the drafts it has.
    fn take(&mut self, token: Option<u32>) {
        let Some(token) = token else {
            self.want = self.drafts.len();
            return;
        };
        self.drafts.push(token);
        if let Some(chain) = &mut self.chain {
            chain.push(token);
        }
    }
}

/// `token` at position `pos` of sequence `seq_id` alone, as a one-token step that samples (a
/// drafting pass).
fn one_token(seq_id: SeqId, token: u32, pos: usize) -> ScheduledSeq {
    ScheduledSeq {
        seq_id,
        token_ids: vec![token],
        start_pos: pos,
        block_table_update: BlockTableUpdate::default(),
        sample: Some(SampleRequest::greedy()),
        num_draft_tokens: 0,
        num_to_draft: 0,
        pool: false,
        second_segment: None,
        lora: None,
        prompt_logprobs: None,
    }
}

#[cfg(test)]
#[path = "drafter_tests.rs"]
mod tests;

//! A separate draft model for speculative decoding ([`ExecutorDraft::Model`]): a smaller model
//! with the target's vocabulary, drafting greedily, with a KV cache of its own that the
//! target's block tables page too. Both caches have the same block size and number of blocks,
//! so slot `s` holds the same position in each, and the engine's block manager, prefix cache
//! and copy-on-write serve both without knowing about the draft.
//!
//! For that the draft must compute every position the target computes, with the same token:
//! - each step it first runs the step's tokens up to each sequence's proposals (prefill chunks,
//!   plain decodes, and the last real token of every drafting sequence, whose logits give its
//!   first proposal), then one one-token pass per further proposal;
//! - after verification, a sequence that kept all `k` proposals has its last one run through
//!   the draft as well: the passes fed it the proposals before it, not that one.
//!
//! Positions of rejected proposals hold the draft's guesses in both caches until the next steps
//! overwrite them, as in the target's. Blocks filled this way and then shared through the prefix
//! cache hold the right entries in both caches, since both computed the same tokens.
//!
//! The one-token drafting passes here serve the self-speculative drafter too (the target's
//! first layers over the target's own cache, [`ExecutorDraft::Layers`]). Under a grammar, both
//! draft each position under its mask and leave the verification masks along their drafts in
//! the sample request ([`DraftChain`]).
//!
//! [`ExecutorDraft::Model`]: pagoda_engine::ExecutorDraft::Model
//! [`ExecutorDraft::Layers`]: pagoda_engine::ExecutorDraft::Layers

use std::sync::Arc;

use pagoda_engine::sampler::try_sample;
use pagoda_engine::speculative::DraftChain;
use pagoda_engine::{ExecutorError, MaskSlot, SampleRequest, SampledToken, ScheduledBatch, ScheduledSeq};

use crate::error::ModelError;
use crate::kv_cache::KvCache;
use crate::model::Model;
use crate::runner::{forward_with, ModelRunner};

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

/// What a drafting pass runs.
#[derive(Debug, Clone, Copy)]
enum Drafter {
    /// The target's first this many layers, over the target's cache (self-speculative).
    Layers(usize),
    /// The separate draft model, over its own cache.
    Model,
}

impl ModelRunner {
    /// Self-speculative drafting: fills each sequence's proposal placeholders with the greedy
    /// tokens of the first `layers` layers, one pass per position. Each pass writes those layers'
    /// K/V into the slots the verification pass then overwrites, so the draft needs no cache of
    /// its own.
    pub(crate) fn draft_with_layers(
        &mut self,
        batch: &ScheduledBatch,
        layers: usize,
    ) -> StepResult<ScheduledBatch> {
        let mut filled = batch.clone();
        let mut chains = grammar_chains(&filled);
        self.draft_passes(&mut filled, 0, Drafter::Layers(layers), &mut chains)?;
        finish_chains(&mut filled, chains);
        Ok(filled)
    }

    /// Runs the draft model over `batch`'s tokens before the placeholders, whose last rows give
    /// the first drafts, then fills the other placeholders one pass per position. Sequences
    /// whose proposals came from the scheduler (a request's own method) have all their tokens
    /// computed in the first pass, proposals included, like a prefill chunk.
    pub(crate) fn draft_with_model(&mut self, batch: &ScheduledBatch) -> StepResult<ScheduledBatch> {
        let mut filled = batch.clone();
        let context = ScheduledBatch {
            seqs: batch
                .seqs
                .iter()
                .map(|s| {
                    let drafts = if drafts_here(s) { s.num_draft_tokens } else { 0 };
                    ScheduledSeq {
                        token_ids: s.token_ids[..s.q_len() - drafts].to_vec(),
                        sample: (drafts > 0).then(SampleRequest::greedy),
                        num_draft_tokens: 0,
                        executor_drafts: false,
                        ..s.clone()
                    }
                })
                .collect(),
            ..ScheduledBatch::default()
        };
        let mut chains = grammar_chains(&filled);
        let drafting: Vec<usize> = (0..batch.seqs.len()).filter(|&i| drafts_here(&batch.seqs[i])).collect();
        let masks = drafting.iter().map(|&i| next_mask(&chains[i])).collect();
        let first = self.draft_pass(context, Drafter::Model, masks)?;
        for (&i, token) in drafting.iter().zip(first) {
            let s = &filled.seqs[i];
            let at = s.q_len() - s.num_draft_tokens;
            place_draft(&mut filled, &mut chains, i, at, token);
        }
        self.draft_passes(&mut filled, 1, Drafter::Model, &mut chains)?;
        finish_chains(&mut filled, chains);
        Ok(filled)
    }

    /// Passes `from..k` of one-token drafting: pass `j` feeds each sequence with more than `j`
    /// proposals the token before its proposal `j` (its own last token, then its proposals so
    /// far) and writes the drawn token there.
    fn draft_passes(
        &mut self,
        filled: &mut ScheduledBatch,
        from: usize,
        drafter: Drafter,
        chains: &mut [Option<DraftChain>],
    ) -> StepResult<()> {
        let passes = filled.seqs.iter().filter(|s| drafts_here(s)).map(|s| s.num_draft_tokens).max();
        for j in from..passes.unwrap_or(0) {
            let members: Vec<usize> = (0..filled.seqs.len())
                .filter(|&i| drafts_here(&filled.seqs[i]) && filled.seqs[i].num_draft_tokens > j)
                .collect();
            let input = |s: &ScheduledSeq| s.q_len() - s.num_draft_tokens - 1 + j;
            let pass = ScheduledBatch {
                seqs: members.iter().map(|&i| one_token(&filled.seqs[i], input(&filled.seqs[i]))).collect(),
                ..ScheduledBatch::default()
            };
            let masks = members.iter().map(|&i| next_mask(&chains[i])).collect();
            for (&i, token) in members.iter().zip(self.draft_pass(pass, drafter, masks)?) {
                let at = input(&filled.seqs[i]) + 1;
                place_draft(filled, chains, i, at, token);
            }
        }
        Ok(())
    }

    /// After verification: runs the last proposal of each sequence that kept all of them
    /// through the draft, the one position of the step the draft has not computed.
    pub(crate) fn complete_draft_cache(
        &mut self,
        batch: &ScheduledBatch,
        sampled: &[SampledToken],
    ) -> StepResult<()> {
        // `sampled` has one entry per sequence that sampled, in batch order.
        let seqs: Vec<ScheduledSeq> = batch
            .seqs
            .iter()
            .filter(|s| s.sample.is_some())
            .zip(sampled)
            .filter(|(s, t)| drafts_here(s) && s.seq_id == t.seq_id && t.num_accepted() == s.num_draft_tokens)
            .map(|(s, _)| one_token(s, s.q_len() - 1))
            .collect();
        if !seqs.is_empty() {
            let masks = vec![None; seqs.len()];
            self.draft_pass(ScheduledBatch { seqs, ..ScheduledBatch::default() }, Drafter::Model, masks)?;
        }
        Ok(())
    }

    /// One forward pass of `drafter` over `pass`, writing its cache; the greedy token of each
    /// sequence that samples, in order, under its grammar mask in `masks` (one per sequence that
    /// samples) where it has one. A pass with none still computes one row (the model's head
    /// wants at least one), which is dropped.
    fn draft_pass(
        &mut self,
        mut pass: ScheduledBatch,
        drafter: Drafter,
        masks: Vec<Option<Arc<MaskSlot>>>,
    ) -> StepResult<Vec<u32>> {
        let failed = |e: ModelError| ExecutorError::Execution(format!("drafting ({drafter:?}): {e}"));
        let wanted = pass.seqs.iter().filter(|s| s.sample.is_some()).count();
        if wanted == 0 {
            match pass.seqs.last_mut() {
                Some(last) => last.sample = Some(SampleRequest::greedy()),
                None => return Ok(Vec::new()),
            }
        }
        let flat = self.flatten(&pass)?;
        let (model, cache, num_layers) = match drafter {
            Drafter::Layers(layers) => (&self.model, &self.cache, Some(layers)),
            Drafter::Model => {
                let draft =
                    self.draft.as_ref().ok_or_else(|| ExecutorError::Execution("no draft model".into()))?;
                (&draft.model, &draft.cache, None)
            }
        };
        let logits = forward_with(model, cache, &self.device, &pass, flat, num_layers).map_err(failed)?;
        if self.device.is_cuda() && masks.iter().all(Option::is_none) {
            // Proposals need only the greedy ids: a device argmax copies one id per row back
            // instead of every row of logits. A proposal is only a guess, so its ties and NaNs
            // need none of the host sampler's care: verification keeps the target's tokens.
            let ids = logits.argmax(candle_core::D::Minus1).and_then(|ids| ids.to_vec1::<u32>());
            return Ok(ids.map_err(|e| failed(e.into()))?.into_iter().take(wanted).collect());
        }
        let rows = logits.to_vec2::<f32>().map_err(|e| failed(e.into()))?;
        pass.seqs
            .iter()
            .filter(|s| s.sample.is_some())
            .zip(rows)
            .zip(masks.into_iter().chain(std::iter::repeat(None)))
            .take(wanted)
            .map(|((s, mut row), allowed)| {
                try_sample(&mut row, &SampleRequest { allowed, ..SampleRequest::greedy() })
                    .map(|(token, _)| token)
                    .map_err(|e| ExecutorError::InvalidSequence { seq_id: s.seq_id, message: e.to_string() })
            })
            .collect()
    }
}

/// Whether the executor drafts `s`'s proposals this step (it has placeholders to fill).
pub(crate) fn drafts_here(s: &ScheduledSeq) -> bool {
    s.executor_drafts && s.num_draft_tokens > 0
}

/// Each sequence's grammar walk, for those under a grammar that the executor drafts for.
fn grammar_chains(batch: &ScheduledBatch) -> Vec<Option<DraftChain>> {
    batch
        .seqs
        .iter()
        .map(|s| s.sample.as_ref().filter(|_| drafts_here(s)).and_then(DraftChain::new))
        .collect()
}

/// Writes sequence `i`'s drafted `token` at offset `at` and walks its grammar past it.
fn place_draft(
    filled: &mut ScheduledBatch,
    chains: &mut [Option<DraftChain>],
    i: usize,
    at: usize,
    token: u32,
) {
    filled.seqs[i].token_ids[at] = token;
    if let Some(chain) = &mut chains[i] {
        chain.push(token);
    }
}

fn next_mask(chain: &Option<DraftChain>) -> Option<Arc<MaskSlot>> {
    chain.as_ref().map(|c| Arc::clone(c.next_mask()))
}

/// Hands each walk's masks to its sequence's sample request, for the verification.
fn finish_chains(batch: &mut ScheduledBatch, chains: Vec<Option<DraftChain>>) {
    for (s, chain) in batch.seqs.iter_mut().zip(chains) {
        if let (Some(chain), Some(req)) = (chain, s.sample.as_mut()) {
            chain.finish(req);
        }
    }
}

/// `s`'s token at offset `at` alone, as a one-token step that samples (a drafting pass).
fn one_token(s: &ScheduledSeq, at: usize) -> ScheduledSeq {
    ScheduledSeq {
        seq_id: s.seq_id,
        token_ids: vec![s.token_ids[at]],
        start_pos: s.start_pos + at,
        block_tables: s.block_tables.clone(),
        sample: Some(SampleRequest::greedy()),
        num_draft_tokens: 0,
        executor_drafts: false,
    }
}

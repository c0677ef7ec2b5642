//! One scheduled sequence's entry in the step's batch: its blocks for the step's tokens (and
//! for the drafts the executor makes after it, from blocks no other sequence's next token
//! needs), the tokens themselves with any proposals after them, its sampling request, the
//! prompt positions it scores, and the record `update` reads back ([`Scheduled`]).

use std::sync::Arc;

use crate::executor::{PromptLogprobsRequest, SampleRequest, ScheduledBatch, ScheduledSeq, SeqId};
use crate::speculative::ProposerKind;

use super::speculation::next_draft_limit;
use super::{Scheduled, Scheduler, SeqEntry};

impl Scheduler {
    /// Allocates blocks for `q` tokens of sequence `id` and appends it to the batch; the last
    /// `drafts.len()` of the `q` tokens are `drafts`, proposed after the sequence's own tokens.
    /// A decoding sequence whose proposals the executor drafts also gets slots for the drafts
    /// it makes after this step, from free blocks that no other sequence's next token needs.
    pub(super) fn push_scheduled(
        &mut self,
        id: SeqId,
        q: usize,
        drafts: Vec<u32>,
        batch: &mut ScheduledBatch,
    ) -> bool {
        let default_proposer = self.speculation.active(&self.config, self.running.len());
        let running = self.running.len();
        let Some(e) = self.seqs.get_mut(&id) else { return false };
        let start = e.seq.num_computed_tokens;
        let own = q - drafts.len();
        let pool = e.shared.pool;
        let sample = start + own == e.target() && e.fork_into <= 1 && !pool;
        debug_assert!(sample || drafts.is_empty(), "proposals for a step that samples nothing");
        // Decodes only: drafting after a prompt's last chunk would hold its first token back.
        let decoding = sample && own == 1 && e.seq.output_len() > 0;
        let kind = default_proposer.map(|default| e.shared.speculative_method.unwrap_or(default));
        let wanted = match kind {
            Some(ProposerKind::Executor) if decoding => next_draft_limit(e, &self.config, drafts.len()),
            _ => 0,
        };
        let to_draft = match wanted {
            0 => 0,
            _ => {
                // Draft slots come from blocks no other running sequence's next token needs:
                // one per sequence and group stays free for them.
                let fits = self.blocks.max_tokens_fitting(&e.seq, q + wanted).max(q);
                let reserve = running * self.blocks.groups().len();
                let left = self.blocks.num_free_blocks().checked_sub(self.blocks.blocks_needed(&e.seq, fits));
                if left.is_some_and(|left| left >= reserve) {
                    fits - q
                } else {
                    0
                }
            }
        };
        if self.blocks.allocate(&mut e.seq, q + to_draft, &mut batch.block_copies).is_err() {
            debug_assert!(false, "allocation for sequence {} failed after the fit check", e.seq.id);
            return false;
        }
        let sample_request = sample.then(|| sample_request(e));
        // Position `p` of the prompt predicts prompt token `p + 1`.
        let scored_end = (start + own).min(e.seq.prompt_len.saturating_sub(1));
        let prompt_logprobs = match e.shared.prompt_logprobs {
            Some(top) if start < scored_end => Some(PromptLogprobsRequest {
                top,
                targets: e.seq.token_ids[start + 1..scored_end + 1].to_vec(),
            }),
            _ => None,
        };
        let scored = prompt_logprobs.as_ref().map(|p| (start, p.targets.len()));
        let mut token_ids = Vec::with_capacity(q);
        token_ids.extend_from_slice(&e.seq.token_ids[start..start + own]);
        token_ids.extend_from_slice(&drafts);
        batch.seqs.push(ScheduledSeq {
            seq_id: e.seq.id,
            token_ids,
            start_pos: start,
            block_table_update: e.seq.take_table_update(),
            sample: sample_request,
            num_draft_tokens: drafts.len(),
            num_to_draft: to_draft,
            pool,
            second_segment: e.shared.second_segment,
            lora: e.shared.lora,
            prompt_logprobs,
        });
        // Prompt tokens only: a generated placeholder token has no image behind it.
        let prompt_part = start..(start + own).min(e.seq.prompt_len);
        if let Some(images) = e.seq.images_in(prompt_part) {
            let images = Arc::clone(images);
            batch.images.push(crate::executor::ScheduledImages { seq_id: e.seq.id, images });
        }
        e.last_scheduled = self.step;
        if decoding {
            self.last_stats.num_decode_tokens += q;
        } else {
            self.last_stats.num_prefill_tokens += q;
        }
        self.scheduled.push(Scheduled { seq_id: e.seq.id, q, sample, drafts, to_draft, pool, scored });
        true
    }
}

/// What the sampler needs for this sequence's next token.
fn sample_request(e: &SeqEntry) -> SampleRequest {
    let shared = &e.shared;
    let output_index = e.seq.output_len();
    SampleRequest {
        params: Arc::clone(&shared.params),
        seed: e.seq.seed,
        output_index,
        history: shared.params.needs_history().then(|| Arc::from(e.seq.token_ids.as_slice())),
        prompt_len: e.seq.prompt_len,
        banned_token_ids: if output_index < shared.stop.min_tokens {
            shared.min_tokens_banned.clone()
        } else {
            Vec::new()
        },
        // Attached by the engine when it hands the sequence's constraint to the mask worker.
        allowed: None,
        draft_masks: Vec::new(),
        draft_grammar: None,
    }
}

//! Handing sequences' grammar constraints to the mask worker for one step and taking them back
//! (see [`crate::constraint`]). A sequence that verifies proposals gets one more job per
//! proposal: a fork of its grammar advanced past the proposals before that position. A sequence
//! the executor drafts for after the step also gets a fork of its grammar, for the executor to
//! draft under ([`crate::speculative::DraftChain`]).

use std::sync::Arc;

use crate::constraint::{DraftGrammar, MaskJob, MaskSlot, SeqConstraint};
use crate::executor::ScheduledBatch;

use super::Scheduler;

impl Scheduler {
    /// Takes the constraint of every sequence in `batch` that samples this step and attaches an
    /// empty mask slot to its sample request; the engine fills the slots while the model runs.
    pub(crate) fn take_mask_jobs(&mut self, batch: &mut ScheduledBatch) -> Vec<MaskJob> {
        let mut jobs = Vec::new();
        for s in &mut batch.seqs {
            let drafts = &s.token_ids[s.token_ids.len() - s.num_draft_tokens..];
            let Some(sample) = s.sample.as_mut() else { continue };
            let Some(e) = self.seqs.get_mut(&s.seq_id) else { continue };
            let Some(SeqConstraint(constraint)) = e.constraint.take() else { continue };
            if s.num_to_draft > 0 {
                let eos = &e.shared.stop.eos_token_ids;
                sample.draft_grammar = Some(DraftGrammar::new(constraint.fork(), eos));
            }
            // The scheduler cut the proposals to what the grammar accepts. The sequence's own
            // position first: the sampler waits for it first.
            let mut state = (!drafts.is_empty()).then(|| constraint.fork());
            let slot = MaskSlot::new();
            sample.allowed = Some(Arc::clone(&slot));
            jobs.push(MaskJob { seq_id: s.seq_id, constraint, slot, restore: true });
            for &token in drafts {
                let Some(state) = state.as_mut() else { break };
                let slot = MaskSlot::new();
                if let Err(err) = state.accept_token(token) {
                    slot.fill(Err(err));
                }
                sample.draft_masks.push(Arc::clone(&slot));
                jobs.push(MaskJob { seq_id: s.seq_id, constraint: state.fork(), slot, restore: false });
            }
        }
        jobs
    }

    /// Gives the constraints back to their sequences (those that still exist).
    pub(crate) fn restore_constraints(&mut self, jobs: Vec<MaskJob>) {
        for job in jobs.into_iter().filter(|j| j.restore) {
            if let Some(e) = self.seqs.get_mut(&job.seq_id) {
                e.constraint = Some(SeqConstraint(job.constraint));
            }
        }
    }
}

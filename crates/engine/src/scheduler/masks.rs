//! Handing sequences' grammar constraints to the mask worker for one step and taking them back
//! (see [`crate::constraint`]).

use std::sync::Arc;

use crate::constraint::{MaskJob, MaskSlot, SeqConstraint};
use crate::executor::ScheduledBatch;

use super::Scheduler;

impl Scheduler {
    /// Takes the constraint of every sequence in `batch` that samples this step and attaches an
    /// empty mask slot to its sample request; the engine fills the slots while the model runs.
    pub(crate) fn take_mask_jobs(&mut self, batch: &mut ScheduledBatch) -> Vec<MaskJob> {
        let mut jobs = Vec::new();
        for s in &mut batch.seqs {
            let Some(sample) = s.sample.as_mut() else { continue };
            let Some(e) = self.seqs.get_mut(&s.seq_id) else { continue };
            let Some(SeqConstraint(constraint)) = e.constraint.take() else { continue };
            let slot = MaskSlot::new();
            sample.allowed = Some(Arc::clone(&slot));
            jobs.push(MaskJob { seq_id: s.seq_id, constraint, slot });
        }
        jobs
    }

    /// Gives the constraints back to their sequences (those that still exist).
    pub(crate) fn restore_constraints(&mut self, jobs: Vec<MaskJob>) {
        for job in jobs {
            if let Some(e) = self.seqs.get_mut(&job.seq_id) {
                e.constraint = Some(SeqConstraint(job.constraint));
            }
        }
    }
}

//! The scheduler's consistency checks: the full one, for tests between steps (block reference
//! counts, what waiting and running sequences hold, the running slot count), and the cheap one
//! every schedule runs in debug builds.

use crate::executor::ScheduledBatch;
use crate::sequence::SeqStatus;

use super::{Scheduler, SeqEntry};

impl Scheduler {
    /// Full consistency check (O(everything)), for tests, between steps: block reference counts
    /// match the block tables, waiting sequences hold no blocks, running ones hold exactly what
    /// their computed tokens and windows need, and the slot count is right.
    pub fn audit(&self) -> Result<(), String> {
        let held = self.holds.tables();
        self.blocks.audit(self.seqs.values().map(|e| e.seq.block_tables.as_slice()).chain(held))?;
        let slots: usize = self.running.iter().map(|id| self.seqs.get(id).map_or(0, SeqEntry::slots)).sum();
        if slots != self.running_slots {
            return Err(format!("running slots {} but counted {slots}", self.running_slots));
        }
        if self.running.len() + self.waiting.len() != self.seqs.len() {
            return Err(format!(
                "{} running + {} waiting != {} live sequences",
                self.running.len(),
                self.waiting.len(),
                self.seqs.len()
            ));
        }
        for id in self.waiting.iter() {
            let e = self.seqs.get(id).ok_or_else(|| format!("waiting sequence {id} is gone"))?;
            if !e.seq.block_tables.is_empty()
                || e.seq.num_computed_tokens != 0
                || e.seq.status != SeqStatus::Waiting
            {
                return Err(format!("waiting sequence {id} holds blocks or computed tokens"));
            }
        }
        for id in &self.running {
            let e = self.seqs.get(id).ok_or_else(|| format!("running sequence {id} is gone"))?;
            if e.seq.status != SeqStatus::Running {
                return Err(format!("running sequence {id} is not marked running"));
            }
            self.blocks.audit_sequence(&e.seq).map_err(|err| format!("running sequence {id}: {err}"))?;
            // Between steps a sequence holds blocks for its computed tokens only (what a step
            // allocated for rejected proposals is back in the pool).
            let needed = e.seq.num_computed_tokens.div_ceil(self.blocks.block_size());
            if e.seq.num_table_blocks() != needed {
                return Err(format!(
                    "running sequence {id} holds {} blocks for {} computed tokens",
                    e.seq.num_table_blocks(),
                    e.seq.num_computed_tokens
                ));
            }
        }
        Ok(())
    }

    /// Cheap checks that every schedule must satisfy (debug builds).
    pub(super) fn check_invariants(&self, batch: &ScheduledBatch, budget_left: usize) {
        debug_assert_eq!(
            batch.num_tokens() + budget_left,
            self.config.max_num_batched_tokens,
            "token budget"
        );
        debug_assert!(batch.num_tokens() <= self.config.max_num_batched_tokens, "token budget exceeded");
        debug_assert!(batch.seqs.len() <= self.config.max_num_seqs, "too many sequences in the batch");
        debug_assert!(self.running_slots <= self.config.max_num_seqs, "too many running sequences");
        debug_assert_eq!(
            self.blocks.num_free_blocks() + self.blocks.num_used_blocks(),
            self.blocks.num_total_blocks(),
            "free + used != total blocks"
        );
        debug_assert!(
            batch.seqs.iter().all(|s| s.q_len() > 0
                && self.seqs.get(&s.seq_id).is_some_and(|e| {
                    let tables = &e.seq.block_tables;
                    tables.len() == self.blocks.groups().len()
                        && tables.iter().all(|t| t.len() * self.blocks.block_size() >= s.context_len())
                })),
            "a scheduled sequence lacks blocks"
        );
    }
}

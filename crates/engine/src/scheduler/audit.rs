//! The scheduler's full consistency check, for tests between steps: block reference counts,
//! what waiting and running sequences hold, and the running slot count.

use crate::sequence::SeqStatus;

use super::{Scheduler, SeqEntry};

impl Scheduler {
    /// Full consistency check (O(everything)), for tests, between steps: block reference counts
    /// match the block tables, waiting sequences hold no blocks, running ones hold exactly what
    /// their computed tokens and windows need, and the slot count is right.
    pub fn audit(&self) -> Result<(), String> {
        let held = self.held.values().map(|h| h.table.as_slice());
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
        for id in &self.waiting {
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
}

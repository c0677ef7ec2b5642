//! Which LoRA adapters the scheduler's sequences use: the set running now (what `max_loras`
//! bounds when admitting), what the metrics report, and whether an adapter may be unloaded.

use super::Scheduler;
use crate::executor::{LoraId, SeqId};
use crate::stats::LoraActivity;

impl Scheduler {
    /// The adapters of sequences `ids`, ascending, each once.
    pub(super) fn adapters_of<'a>(&self, ids: impl Iterator<Item = &'a SeqId>) -> Vec<LoraId> {
        let mut adapters: Vec<LoraId> = ids.filter_map(|id| self.seqs.get(id)?.seq.lora).collect();
        adapters.sort_unstable();
        adapters.dedup();
        adapters
    }

    /// Live sequences (running or waiting) of LoRA adapter `id`.
    pub fn lora_in_use(&self, id: LoraId) -> usize {
        self.seqs.values().filter(|e| e.seq.lora == Some(id)).count()
    }

    /// The adapters of the running and of the waiting sequences.
    pub fn lora_activity(&self) -> LoraActivity {
        LoraActivity {
            running: self.adapters_of(self.running.iter()),
            waiting: self.adapters_of(self.waiting.iter()),
        }
    }
}

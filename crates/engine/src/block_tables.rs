//! The persistent batch's block tables. The scheduler does not send every sequence's whole block
//! tables each step: a scheduled sequence carries only what changed since the executor last ran
//! it ([`BlockTableUpdate`]), and a batch lists the sequences the executor may forget
//! ([`ScheduledBatch::released`](crate::ScheduledBatch::released)). The executor keeps its copy
//! in a [`BlockTableStore`], which it brings up to date at the start of each step, so that
//! per-sequence state lives across steps on its side too.
//!
//! The changes the block manager makes to a table are few, and an update has one field for
//! each: blocks appended (a step's new tokens), the tail dropped (rejected proposals and draft
//! slots), the block at the write position replaced (copy on write, which drops it and appends
//! its copy), and a windowed group's front entries released (`NULL_BLOCK`). A sequence new to
//! the executor, or one recomputed after preemption, gets its whole tables as one update
//! ([`BlockTableUpdate::replace`]).

use crate::executor::{ExecutorError, ScheduledBatch, SeqId};
use crate::id_map::IdMap;
use crate::kv_groups::NULL_BLOCK;

/// How a sequence's block tables changed since the executor last saw them; the default
/// changes nothing. Applied in field order: truncate, append, release. Applying one twice gives
/// what applying it once does: an append always comes with the length it starts at.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BlockTableUpdate {
    /// Keep only this many entries of every group's table (`None`: keep all). Required with
    /// `append`, which it positions.
    pub truncate_to: Option<usize>,
    /// Per group, the entries to append after the first `truncate_to` (empty: none in any group).
    pub append: Vec<Vec<u32>>,
    /// Per group, the entries before this index are released (`NULL_BLOCK`; empty: none).
    pub released_before: Vec<usize>,
}

impl BlockTableUpdate {
    /// Sets the whole tables (a sequence the executor has not seen, or one sent whole again).
    pub fn replace(tables: Vec<Vec<u32>>) -> Self {
        Self { truncate_to: Some(0), append: tables, released_before: Vec::new() }
    }
}

/// The executor's copy of the block tables of the sequences it runs (see the module docs).
#[derive(Debug, Default)]
pub struct BlockTableStore {
    tables: IdMap<SeqId, Vec<Vec<u32>>>,
}

impl BlockTableStore {
    pub fn new() -> Self {
        Self::default()
    }

    /// Drops the batch's released sequences and applies every scheduled sequence's update.
    /// Applying the same batch again gives the same tables (a step retried without a rejected
    /// sequence). A sequence whose update does not fit what is held is rejected on its own.
    pub fn apply(&mut self, batch: &ScheduledBatch) -> Result<(), ExecutorError> {
        for id in &batch.released {
            self.tables.remove(id);
        }
        for seq in &batch.seqs {
            self.update(seq.seq_id, &seq.block_table_update)
                .map_err(|message| ExecutorError::InvalidSequence { seq_id: seq.seq_id, message })?;
        }
        Ok(())
    }

    /// Applies one sequence's update; on an error nothing changed.
    pub fn update(&mut self, seq_id: SeqId, update: &BlockTableUpdate) -> Result<(), String> {
        let tables = match update.truncate_to {
            // The whole tables: whatever was held is replaced.
            Some(0) => {
                let tables = self.tables.entry(seq_id).or_default();
                tables.clone_from(&update.append);
                tables
            }
            truncate_to => {
                let Some(tables) = self.tables.get_mut(&seq_id) else {
                    return Err("changes to block tables that were never sent".into());
                };
                match truncate_to {
                    Some(len) => {
                        if tables.iter().any(|t| t.len() < len) {
                            return Err(format!("keeps {len} block table entries of fewer"));
                        }
                        if !update.append.is_empty() && update.append.len() != tables.len() {
                            let (got, held) = (update.append.len(), tables.len());
                            return Err(format!("appends to {got} block tables of {held}"));
                        }
                        for (g, table) in tables.iter_mut().enumerate() {
                            table.truncate(len);
                            table.extend_from_slice(update.append.get(g).map_or(&[][..], Vec::as_slice));
                        }
                    }
                    None if !update.append.is_empty() => {
                        return Err("block table entries appended without the length they start at".into());
                    }
                    None => {}
                }
                tables
            }
        };
        for (table, &end) in tables.iter_mut().zip(&update.released_before) {
            let end = end.min(table.len());
            // Released entries form a prefix: walk back to the last one already released.
            let start = table[..end].iter().rposition(|&b| b == NULL_BLOCK).map_or(0, |i| i + 1);
            table[start..end].fill(NULL_BLOCK);
        }
        Ok(())
    }

    /// A sequence's tables, one per KV group.
    pub fn get(&self, seq_id: SeqId) -> Option<&[Vec<u32>]> {
        self.tables.get(&seq_id).map(Vec::as_slice)
    }

    /// Sequences held.
    pub fn len(&self) -> usize {
        self.tables.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tables.is_empty()
    }

    /// Forgets every sequence (the cache they pointed into was replaced).
    pub fn clear(&mut self) {
        self.tables.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::executor::{SampleRequest, ScheduledSeq};

    fn seq(id: SeqId, update: BlockTableUpdate) -> ScheduledSeq {
        ScheduledSeq {
            seq_id: id,
            token_ids: vec![1],
            start_pos: 0,
            block_table_update: update,
            sample: Some(SampleRequest::greedy()),
            num_draft_tokens: 0,
            num_to_draft: 0,
            pool: false,
            second_segment: None,
            lora: None,
            prompt_logprobs: None,
        }
    }

    fn batch(seqs: Vec<ScheduledSeq>, released: Vec<SeqId>) -> ScheduledBatch {
        ScheduledBatch { seqs, released, ..ScheduledBatch::default() }
    }

    #[test]
    fn updates_append_truncate_replace_and_release() {
        let mut store = BlockTableStore::new();
        let first = batch(vec![seq(1, BlockTableUpdate::replace(vec![vec![4, 5], vec![6, 7]]))], vec![]);
        store.apply(&first).unwrap();
        // A step that only grows the tables, applied twice (retried without a rejected sequence).
        let grow =
            BlockTableUpdate { truncate_to: Some(2), append: vec![vec![8], vec![3]], ..Default::default() };
        store.apply(&batch(vec![seq(1, grow.clone())], vec![])).unwrap();
        store.apply(&batch(vec![seq(1, grow)], vec![])).unwrap();
        assert_eq!(store.get(1).unwrap(), [vec![4, 5, 8], vec![6, 7, 3]]);
        let unpositioned = BlockTableUpdate { append: vec![vec![1], vec![1]], ..Default::default() };
        assert!(store.update(1, &unpositioned).is_err());
        let first = batch(vec![seq(1, BlockTableUpdate::replace(vec![vec![4, 5], vec![6, 7]]))], vec![]);
        store.apply(&first).unwrap();
        // Copy on write of the block at index 1, one block more, and group 1's first released.
        let cow = BlockTableUpdate {
            truncate_to: Some(1),
            append: vec![vec![9, 10], vec![11, 12]],
            released_before: vec![0, 1],
        };
        let step = batch(vec![seq(1, cow)], vec![]);
        store.apply(&step).unwrap();
        store.apply(&step).unwrap();
        assert_eq!(store.get(1).unwrap(), [vec![4, 9, 10], vec![NULL_BLOCK, 11, 12]], "applied twice, once");
        // Nothing changed: nothing to do; a sequence never sent is refused.
        store.apply(&batch(vec![seq(1, BlockTableUpdate::default())], vec![])).unwrap();
        let unknown = store.apply(&batch(vec![seq(2, BlockTableUpdate::default())], vec![]));
        assert!(matches!(unknown, Err(ExecutorError::InvalidSequence { seq_id: 2, .. })), "{unknown:?}");
        let onto_unknown =
            BlockTableUpdate { truncate_to: Some(1), append: vec![vec![2]], ..Default::default() };
        assert!(store.update(2, &onto_unknown).is_err());
        assert_eq!(store.len(), 1, "a refused update leaves nothing behind");
        let too_long = BlockTableUpdate { truncate_to: Some(5), ..BlockTableUpdate::default() };
        assert!(store.update(1, &too_long).is_err());
        // Released sequences go before the batch's updates: a preempted one comes back whole.
        let back = batch(vec![seq(1, BlockTableUpdate::replace(vec![vec![3], vec![8]]))], vec![1]);
        store.apply(&back).unwrap();
        assert_eq!(store.get(1).unwrap(), [vec![3], vec![8]]);
        store.apply(&batch(vec![], vec![1])).unwrap();
        assert!(store.is_empty());
    }
}

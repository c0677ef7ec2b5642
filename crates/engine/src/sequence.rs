//! [`Sequence`]: one sample of a request as the scheduler and block manager see it — token ids
//! (prompt then output), how many of them are in the KV cache, and the blocks holding them (one
//! block table per KV group, see [`crate::kv_groups`]).

use crate::block_pool::{BlockId, CachedBlockRef};
use crate::block_tables::BlockTableUpdate;
use crate::executor::SeqId;
use crate::request::RequestId;

/// Where a sequence is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeqStatus {
    /// Queued: holds no blocks (new, or preempted and waiting to be recomputed).
    Waiting,
    /// Admitted: holds blocks and is scheduled every step the budget allows.
    Running,
    /// Done; its blocks are released.
    Finished,
}

// Laid out in order, the fields every step reads first: a step touches each running sequence
// once, with caches cold from the model's pass, so every further cache line is a miss.
#[derive(Debug, Clone)]
#[repr(C)]
pub struct Sequence {
    pub id: SeqId,
    /// Leading tokens whose KV is in the cache; the next step computes from here.
    pub num_computed_tokens: usize,
    /// Prompt then generated tokens.
    pub token_ids: Vec<u32>,
    /// Per KV group, the pages holding positions `0..num_computed_tokens` (and whatever this
    /// step adds); a windowed group's entries before its window are `NULL_BLOCK`. All tables have
    /// the same length; empty (no tables) while the sequence holds nothing.
    pub block_tables: Vec<Vec<BlockId>>,
    /// How `block_tables` changed since the executor last saw them.
    pub(crate) table_changes: TableChanges,
    pub prompt_len: usize,
    pub status: SeqStatus,
    pub request_id: RequestId,
    /// Which of the request's `n` samples this is.
    pub sample_index: usize,
    /// Sampling seed of this sample (request seed mixed with `sample_index`).
    pub seed: u64,
    /// Chained content hash of each full block of `token_ids` seen so far (extended lazily; the
    /// tokens never change, so it survives preemption).
    pub(crate) block_hashes: Vec<u64>,
    /// Per KV group, the canonical prefix-cache identity of each full, computed block, `None`
    /// where it could not be cached (or, in a windowed group, was never held); the length (the
    /// same in every group) is how many full blocks have been offered to the cache.
    pub(crate) cache_refs: Vec<Vec<Option<CachedBlockRef>>>,
    /// The LoRA adapter the sequence runs with: its blocks' hashes start from it, so that the
    /// prefix cache keeps each adapter's KV apart.
    pub lora: Option<crate::executor::LoraId>,
    /// The prompt's images, in prompt order (`None` for a text-only prompt): the hash of each
    /// enters the hashes of the blocks holding its placeholders, and a prefill chunk covering
    /// any of them hands them to the executor.
    pub images: Option<std::sync::Arc<[crate::multimodal::ImageInput]>>,
}

impl Sequence {
    /// The hashes of the images with a placeholder among prompt positions `positions`, in
    /// prompt order: what keys a block's content besides its tokens.
    pub fn image_hashes_in(
        &self,
        positions: std::ops::Range<usize>,
    ) -> impl Iterator<Item = crate::multimodal::ImageHash> + '_ {
        let images = self.images.iter().flat_map(|images| images.iter());
        images.filter(move |i| i.has_placeholder_in(positions.clone())).map(|i| i.hash)
    }
}

/// What changed in a sequence's block tables since the executor last saw them: the block
/// manager records each change as it makes it, and [`Sequence::take_table_update`] turns them
/// into the next step's [`BlockTableUpdate`] (see [`crate::block_tables`]).
#[derive(Debug, Clone, Default)]
pub(crate) struct TableChanges {
    /// Entries of every group the executor holds, plus one; 0 while it holds nothing of this
    /// sequence (new, or freed since), so the next update sends the tables whole.
    sent_len_plus_one: u32,
    /// How many leading entries of those are still the same here.
    unchanged: u32,
    /// Per group, the leading entries released here, and as the executor knows them (empty
    /// for models without windowed layers).
    released: Vec<(u32, u32)>,
}

impl TableChanges {
    /// The entries from `index` on changed (replaced or dropped).
    pub(crate) fn changed_from(&mut self, index: usize) {
        self.unchanged = self.unchanged.min(index as u32);
    }

    /// Group `group`'s entries before `end` are released.
    pub(crate) fn released(&mut self, group: usize, end: usize) {
        if self.released.len() <= group {
            self.released.resize(group + 1, (0, 0));
        }
        let here = &mut self.released[group].0;
        *here = (*here).max(end as u32);
    }

    /// The tables were dropped or rebuilt: the executor gets them whole next time.
    pub(crate) fn reset(&mut self) {
        *self = Self::default();
    }

    /// Whether the executor holds tables of this sequence.
    pub(crate) fn was_sent(&self) -> bool {
        self.sent_len_plus_one > 0
    }
}

impl Sequence {
    pub fn new(id: SeqId, request_id: RequestId, sample_index: usize, prompt: Vec<u32>, seed: u64) -> Self {
        Self {
            id,
            request_id,
            sample_index,
            prompt_len: prompt.len(),
            token_ids: prompt,
            num_computed_tokens: 0,
            block_tables: Vec::new(),
            status: SeqStatus::Waiting,
            seed,
            block_hashes: Vec::new(),
            cache_refs: Vec::new(),
            table_changes: TableChanges::default(),
            lora: None,
            images: None,
        }
    }

    pub fn len(&self) -> usize {
        self.token_ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.token_ids.is_empty()
    }

    pub fn output_len(&self) -> usize {
        self.token_ids.len() - self.prompt_len
    }

    pub fn output_token_ids(&self) -> &[u32] {
        &self.token_ids[self.prompt_len..]
    }

    /// The images with a placeholder among positions `range` (a step's chunk), or none.
    pub fn images_in(
        &self,
        range: std::ops::Range<usize>,
    ) -> Option<&std::sync::Arc<[crate::multimodal::ImageInput]>> {
        let images = self.images.as_ref()?;
        images.iter().any(|image| image.has_placeholder_in(range.clone())).then_some(images)
    }

    /// Entries of each block table (the same in every group).
    pub fn num_table_blocks(&self) -> usize {
        self.block_tables.first().map_or(0, Vec::len)
    }

    /// Tokens not yet in the KV cache.
    pub fn num_uncomputed(&self) -> usize {
        self.token_ids.len() - self.num_computed_tokens
    }

    /// A child sharing everything computed so far (the caller adds the block references). The
    /// executor has not seen it yet.
    pub(crate) fn fork(&self, id: SeqId, sample_index: usize, seed: u64) -> Self {
        Self { id, sample_index, seed, table_changes: TableChanges::default(), ..self.clone() }
    }

    /// What the executor needs to bring its copy of the block tables up to date, recorded as
    /// sent.
    pub(crate) fn take_table_update(&mut self) -> BlockTableUpdate {
        let len = self.num_table_blocks();
        let c = &mut self.table_changes;
        let update = match c.sent_len_plus_one.checked_sub(1) {
            None => BlockTableUpdate::replace(self.block_tables.clone()),
            Some(sent) => {
                let keep = (c.unchanged.min(sent) as usize).min(len);
                let released = c.released.iter().any(|&(here, sent)| here != sent);
                // An append carries the length it starts at, so that applying it twice (a
                // retried step) appends once.
                BlockTableUpdate {
                    truncate_to: (keep < sent as usize || len > keep).then_some(keep),
                    append: match len > keep {
                        true => self.block_tables.iter().map(|t| t[keep..].to_vec()).collect(),
                        false => Vec::new(),
                    },
                    released_before: match released {
                        true => c.released.iter().map(|&(here, _)| here as usize).collect(),
                        false => Vec::new(),
                    },
                }
            }
        };
        c.sent_len_plus_one = len as u32 + 1;
        c.unchanged = len as u32;
        for r in &mut c.released {
            r.1 = r.0;
        }
        update
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_split_prompt_and_output() {
        let mut s = Sequence::new(3, 9, 0, vec![1, 2, 3], 42);
        assert_eq!((s.len(), s.output_len(), s.num_uncomputed()), (3, 0, 3));
        s.num_computed_tokens = 3;
        s.token_ids.push(7);
        assert_eq!(s.output_token_ids(), &[7]);
        assert_eq!(s.num_uncomputed(), 1);
        let child = s.fork(4, 1, 43);
        assert_eq!((child.id, child.sample_index, child.seed), (4, 1, 43));
        assert_eq!((child.token_ids.clone(), child.num_computed_tokens), (s.token_ids.clone(), 3));
    }
}

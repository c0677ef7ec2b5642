//! [`Sequence`]: one sample of a request as the scheduler and block manager see it — token ids
//! (prompt then output), how many of them are in the KV cache, and the blocks holding them (one
//! block table per KV group, see [`crate::kv_groups`]).

use crate::block_pool::{BlockId, CachedBlockRef};
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

#[derive(Debug, Clone)]
pub struct Sequence {
    pub id: SeqId,
    pub request_id: RequestId,
    /// Which of the request's `n` samples this is.
    pub sample_index: usize,
    /// Prompt then generated tokens.
    pub token_ids: Vec<u32>,
    pub prompt_len: usize,
    /// Leading tokens whose KV is in the cache; the next step computes from here.
    pub num_computed_tokens: usize,
    /// Per KV group, the pages holding positions `0..num_computed_tokens` (and whatever this
    /// step adds); a windowed group's entries before its window are `NULL_BLOCK`. All tables have
    /// the same length; empty (no tables) while the sequence holds nothing.
    pub block_tables: Vec<Vec<BlockId>>,
    pub status: SeqStatus,
    /// Sampling seed of this sample (request seed mixed with `sample_index`).
    pub seed: u64,
    /// Chained content hash of each full block of `token_ids` seen so far (extended lazily; the
    /// tokens never change, so it survives preemption).
    pub(crate) block_hashes: Vec<u64>,
    /// Per KV group, the canonical prefix-cache identity of each full, computed block, `None`
    /// where it could not be cached (or, in a windowed group, was never held); the length (the
    /// same in every group) is how many full blocks have been offered to the cache.
    pub(crate) cache_refs: Vec<Vec<Option<CachedBlockRef>>>,
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

    /// Entries of each block table (the same in every group).
    pub fn num_table_blocks(&self) -> usize {
        self.block_tables.first().map_or(0, Vec::len)
    }

    /// Tokens not yet in the KV cache.
    pub fn num_uncomputed(&self) -> usize {
        self.token_ids.len() - self.num_computed_tokens
    }

    /// A child sharing everything computed so far (the caller adds the block references).
    pub(crate) fn fork(&self, id: SeqId, sample_index: usize, seed: u64) -> Self {
        Self { id, sample_index, seed, ..self.clone() }
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

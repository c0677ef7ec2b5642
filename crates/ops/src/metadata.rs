//! Per-step attention metadata: where each new token's K/V goes, where each sequence's queries
//! start, how long each context is, and each sequence's block table.
//!
//! The model runner builds one [`AttentionMetadata`] per step and passes it to every layer. It
//! holds the metadata twice: as u32 tensors on the model's device (what device kernels read) and
//! as host vectors (what the CPU kernels and the validation read), so no op ever copies metadata
//! back from the device. Build it with [`AttentionMetadata::new`] (from host vectors) or
//! [`AttentionMetadata::from_tensors`] (reads the tensors back once); both validate it.

use candle_core::{DType, Device, Result, Tensor};

use crate::check::invalid;

const OP: &str = "attention_metadata";

/// Block-table entry of a block a sliding-window layer's sequence released: no query reads it
/// (the engine's `NULL_BLOCK`, the same value).
pub const NULL_BLOCK: u32 = u32::MAX;

/// Host copies of the metadata tensors, in the same layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostAttentionMetadata {
    /// Cache slot (`block * block_size + row`) of each new token, `[num_tokens]`.
    pub slot_mapping: Vec<u32>,
    /// Query start of each sequence in the flattened batch, `[num_seqs + 1]`, from 0 to `num_tokens`.
    pub cu_seqlens_q: Vec<u32>,
    /// Cached + new tokens of each sequence after this step, `[num_seqs]`.
    pub context_lens: Vec<u32>,
    /// Row-major `[num_seqs, max_blocks_per_seq]` block ids; entries past a sequence's last
    /// block are padding and never read, and so are entries before the window of a sliding
    /// window layer's first query (`NULL_BLOCK` where released).
    pub block_tables: Vec<u32>,
    pub max_blocks_per_seq: usize,
}

impl HostAttentionMetadata {
    pub fn num_seqs(&self) -> usize {
        self.context_lens.len()
    }

    pub fn num_tokens(&self) -> usize {
        self.slot_mapping.len()
    }

    /// Query rows `[start, end)` of sequence `seq` in the flattened batch (after `validate`).
    pub(crate) fn query_range(&self, seq: usize) -> std::ops::Range<usize> {
        self.cu_seqlens_q[seq] as usize..self.cu_seqlens_q[seq + 1] as usize
    }

    /// The (padded) block table row of sequence `seq` (after `validate`).
    pub(crate) fn block_table(&self, seq: usize) -> &[u32] {
        let w = self.max_blocks_per_seq;
        &self.block_tables[seq * w..(seq + 1) * w]
    }

    /// Checks the invariants that do not depend on the cache shape: `cu_seqlens_q` starts at 0,
    /// never decreases and ends at `num_tokens`; each context holds at least its new tokens; the
    /// block table has `num_seqs` rows.
    pub fn validate(&self) -> Result<()> {
        let num_seqs = self.num_seqs();
        if self.cu_seqlens_q.len() != num_seqs + 1 {
            return Err(invalid(
                OP,
                format!(
                    "cu_seqlens_q has {} entries, expected num_seqs + 1 = {}",
                    self.cu_seqlens_q.len(),
                    num_seqs + 1
                ),
            ));
        }
        if self.cu_seqlens_q[0] != 0 {
            return Err(invalid(OP, "cu_seqlens_q must start at 0"));
        }
        if self.cu_seqlens_q[num_seqs] as usize != self.num_tokens() {
            return Err(invalid(
                OP,
                format!(
                    "cu_seqlens_q ends at {} but slot_mapping has {} tokens",
                    self.cu_seqlens_q[num_seqs],
                    self.num_tokens()
                ),
            ));
        }
        for seq in 0..num_seqs {
            let (start, end) = (self.cu_seqlens_q[seq], self.cu_seqlens_q[seq + 1]);
            if end < start {
                return Err(invalid(OP, format!("cu_seqlens_q decreases at sequence {seq}")));
            }
            if self.context_lens[seq] < end - start {
                return Err(invalid(
                    OP,
                    format!(
                        "sequence {seq} has {} new tokens but a context of only {}",
                        end - start,
                        self.context_lens[seq]
                    ),
                ));
            }
        }
        if self.block_tables.len() != num_seqs * self.max_blocks_per_seq {
            return Err(invalid(
                OP,
                format!(
                    "block_tables has {} entries, expected {num_seqs} x {}",
                    self.block_tables.len(),
                    self.max_blocks_per_seq
                ),
            ));
        }
        Ok(())
    }

    /// Checks that every block a sequence's context needs is in its table and below
    /// `num_blocks`, for a cache of `block_size`-token blocks; with a sliding `window`, only the
    /// blocks from the window of the sequence's first query on. Assumes `validate` passed.
    pub(crate) fn validate_for_cache(
        &self,
        num_blocks: usize,
        block_size: usize,
        window: Option<usize>,
        op: &'static str,
    ) -> Result<()> {
        if block_size == 0 {
            return Err(invalid(op, "block_size is 0"));
        }
        for seq in 0..self.num_seqs() {
            let needed = (self.context_lens[seq] as usize).div_ceil(block_size);
            if needed > self.max_blocks_per_seq {
                return Err(invalid(
                    op,
                    format!(
                        "sequence {seq} has a context of {} tokens ({needed} blocks of {block_size}) \
                         but its block table has only {} entries",
                        self.context_lens[seq], self.max_blocks_per_seq
                    ),
                ));
            }
            let first_query = self.context_lens[seq] as usize - self.query_range(seq).len();
            let first = window.map_or(0, |w| (first_query + 1).saturating_sub(w) / block_size);
            let read = &self.block_table(seq)[first.min(needed)..needed];
            if let Some(&bad) = read.iter().find(|&&b| b as usize >= num_blocks) {
                return Err(invalid(
                    op,
                    format!("sequence {seq} uses block {bad} but the cache has {num_blocks} blocks"),
                ));
            }
        }
        Ok(())
    }
}

/// Per-step attention metadata shared by all layers; built once per step by the model runner.
///
/// The public tensors live on the model's device; the private host copy is what CPU kernels and
/// validation use. Construct with [`AttentionMetadata::new`] or [`AttentionMetadata::from_tensors`]
/// so the two always agree.
#[derive(Debug, Clone)]
pub struct AttentionMetadata {
    /// u32 `[num_tokens]`: cache slot of each new token.
    pub slot_mapping: Tensor,
    /// u32 `[num_seqs + 1]`: query start of each sequence in the flattened batch.
    pub cu_seqlens_q: Tensor,
    /// u32 `[num_seqs]`: cached + new tokens of each sequence after this step.
    pub context_lens: Tensor,
    /// u32 `[num_seqs, max_blocks_per_seq]`, padded (padding never read).
    pub block_tables: Tensor,
    pub max_q_len: usize,
    pub max_context_len: usize,
    host: HostAttentionMetadata,
    /// Set on metadata a CUDA graph replays ([`AttentionMetadata::for_replay`]): the longest
    /// context it holds, for which the attention plan is made once, whatever the contexts.
    replay_max_context: Option<usize>,
    /// The CUDA attention plan of this step, made by the first layer and reused by the rest.
    #[cfg(feature = "cuda")]
    pub(crate) cuda_plans: crate::cuda::attention::PlanCache,
}

impl AttentionMetadata {
    /// Builds the metadata from host vectors and uploads the tensors to `device`.
    ///
    /// `block_tables` holds one row per sequence, of any length; rows are padded with 0 to the
    /// longest. `max_q_len` and `max_context_len` are computed.
    pub fn new<B: AsRef<[u32]>>(
        slot_mapping: Vec<u32>,
        cu_seqlens_q: Vec<u32>,
        context_lens: Vec<u32>,
        block_tables: &[B],
        device: &Device,
    ) -> Result<Self> {
        if block_tables.len() != context_lens.len() {
            return Err(invalid(
                OP,
                format!("{} block table rows for {} sequences", block_tables.len(), context_lens.len()),
            ));
        }
        let max_blocks_per_seq = block_tables.iter().map(|r| r.as_ref().len()).max().unwrap_or(0);
        let mut flat = vec![0u32; block_tables.len() * max_blocks_per_seq];
        for (dst, row) in flat.chunks_mut(max_blocks_per_seq.max(1)).zip(block_tables) {
            let row = row.as_ref();
            dst[..row.len()].copy_from_slice(row);
        }
        let host = HostAttentionMetadata {
            slot_mapping,
            cu_seqlens_q,
            context_lens,
            block_tables: flat,
            max_blocks_per_seq,
        };
        Self::from_host(host, device)
    }

    /// Validates `host` and uploads it to `device`.
    pub fn from_host(host: HostAttentionMetadata, device: &Device) -> Result<Self> {
        host.validate()?;
        let num_seqs = host.num_seqs();
        let slot_mapping = Tensor::from_slice(&host.slot_mapping, host.slot_mapping.len(), device)?;
        let cu_seqlens_q = Tensor::from_slice(&host.cu_seqlens_q, num_seqs + 1, device)?;
        let context_lens = Tensor::from_slice(&host.context_lens, num_seqs, device)?;
        let block_tables =
            Tensor::from_slice(&host.block_tables, (num_seqs, host.max_blocks_per_seq), device)?;
        Ok(Self::assemble(slot_mapping, cu_seqlens_q, context_lens, block_tables, host))
    }

    /// Builds the metadata from u32 tensors (on any device), reading each back to the host once.
    pub fn from_tensors(
        slot_mapping: Tensor,
        cu_seqlens_q: Tensor,
        context_lens: Tensor,
        block_tables: Tensor,
    ) -> Result<Self> {
        for t in [&slot_mapping, &cu_seqlens_q, &context_lens, &block_tables] {
            crate::check::dtype_is(t, DType::U32, OP)?;
        }
        let (rows, max_blocks_per_seq) = block_tables.dims2()?;
        let host = HostAttentionMetadata {
            slot_mapping: slot_mapping.to_vec1()?,
            cu_seqlens_q: cu_seqlens_q.to_vec1()?,
            context_lens: context_lens.to_vec1()?,
            block_tables: block_tables.flatten_all()?.to_vec1()?,
            max_blocks_per_seq,
        };
        if rows != host.num_seqs() {
            return Err(invalid(OP, format!("{rows} block table rows for {} sequences", host.num_seqs())));
        }
        host.validate()?;
        Ok(Self::assemble(slot_mapping, cu_seqlens_q, context_lens, block_tables, host))
    }

    fn assemble(
        slot_mapping: Tensor,
        cu_seqlens_q: Tensor,
        context_lens: Tensor,
        block_tables: Tensor,
        host: HostAttentionMetadata,
    ) -> Self {
        let max_q_len = (0..host.num_seqs()).map(|s| host.query_range(s).len()).max().unwrap_or(0);
        let max_context_len = host.context_lens.iter().copied().max().unwrap_or(0) as usize;
        Self {
            slot_mapping,
            cu_seqlens_q,
            context_lens,
            block_tables,
            max_q_len,
            max_context_len,
            host,
            replay_max_context: None,
            #[cfg(feature = "cuda")]
            cuda_plans: Default::default(),
        }
    }

    /// Metadata of `num_seqs` one-token decodes whose values change from step to step in the
    /// same device buffers ([`AttentionMetadata::write_replay`]), for a CUDA graph that replays
    /// the same kernels on them: block tables `max_blocks_per_seq` wide, and an attention plan
    /// made for contexts of up to `max_blocks_per_seq * block_size` keys that the kernels
    /// resolve when they run. Until written, every sequence is a padding row: a context of one
    /// token in block 0, its new token written nowhere ([`crate::PADDING_SLOT`]).
    pub fn for_replay(
        num_seqs: usize,
        max_blocks_per_seq: usize,
        block_size: usize,
        device: &Device,
    ) -> Result<Self> {
        let host = HostAttentionMetadata {
            slot_mapping: vec![crate::PADDING_SLOT; num_seqs],
            cu_seqlens_q: (0..=num_seqs as u32).collect(),
            context_lens: vec![1; num_seqs],
            block_tables: vec![0; num_seqs * max_blocks_per_seq],
            max_blocks_per_seq,
        };
        let mut meta = Self::from_host(host, device)?;
        meta.replay_max_context = Some(max_blocks_per_seq * block_size);
        Ok(meta)
    }

    /// Writes another step's decodes into replay metadata's buffers in place; `host` must have
    /// its shape (sequences, one token each, table width). The attention plan is kept.
    pub fn write_replay(&mut self, host: HostAttentionMetadata) -> Result<()> {
        host.validate()?;
        let fits = self.replay_max_context.is_some()
            && host.num_seqs() == self.num_seqs()
            && host.num_tokens() == self.num_seqs()
            && host.max_blocks_per_seq == self.host.max_blocks_per_seq;
        if !fits {
            return Err(invalid(OP, "the step does not have the replay metadata's shape"));
        }
        crate::write_u32_in_place(&self.slot_mapping, &host.slot_mapping)?;
        crate::write_u32_in_place(&self.context_lens, &host.context_lens)?;
        crate::write_u32_in_place(&self.block_tables, &host.block_tables)?;
        self.max_context_len = host.context_lens.iter().copied().max().unwrap_or(0) as usize;
        self.host = host;
        Ok(())
    }

    /// The longest context of replay metadata; `None` for one step's.
    pub fn replay_max_context(&self) -> Option<usize> {
        self.replay_max_context
    }

    /// The host copy of the metadata (what the CPU kernels read).
    pub fn host(&self) -> &HostAttentionMetadata {
        &self.host
    }

    pub fn num_seqs(&self) -> usize {
        self.host.num_seqs()
    }

    pub fn num_tokens(&self) -> usize {
        self.host.num_tokens()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two_seqs() -> AttentionMetadata {
        // Seq 0: decode at context 5 (blocks 3, 1); seq 1: 3-token prefill, fresh (block 0).
        AttentionMetadata::new(
            vec![4 * 3, 0, 1, 2],
            vec![0, 1, 4],
            vec![5, 3],
            &[vec![3, 1], vec![0]],
            &Device::Cpu,
        )
        .unwrap()
    }

    #[test]
    fn new_pads_block_tables_and_computes_maxima() {
        let m = two_seqs();
        assert_eq!(m.max_q_len, 3);
        assert_eq!(m.max_context_len, 5);
        assert_eq!(m.block_tables.to_vec2::<u32>().unwrap(), vec![vec![3, 1], vec![0, 0]]);
        assert_eq!(m.host().block_table(1), &[0, 0]);
        assert_eq!(m.host().query_range(1), 1..4);
        assert_eq!(m.cu_seqlens_q.to_vec1::<u32>().unwrap(), vec![0, 1, 4]);
        assert_eq!((m.num_seqs(), m.num_tokens()), (2, 4));
    }

    #[test]
    fn from_tensors_matches_new() {
        let a = two_seqs();
        let b = AttentionMetadata::from_tensors(
            a.slot_mapping.clone(),
            a.cu_seqlens_q.clone(),
            a.context_lens.clone(),
            a.block_tables.clone(),
        )
        .unwrap();
        assert_eq!(a.host(), b.host());
        assert_eq!((a.max_q_len, a.max_context_len), (b.max_q_len, b.max_context_len));
    }

    #[test]
    fn rejects_inconsistent_metadata() {
        let cpu = &Device::Cpu;
        let empty: &[Vec<u32>] = &[vec![0]];
        // cu_seqlens_q too short.
        assert!(AttentionMetadata::new(vec![0], vec![0], vec![1], empty, cpu).is_err());
        // Does not start at 0.
        assert!(AttentionMetadata::new(vec![0], vec![1, 1], vec![1], empty, cpu).is_err());
        // Does not end at num_tokens.
        assert!(AttentionMetadata::new(vec![0, 1], vec![0, 1], vec![1], empty, cpu).is_err());
        // Context shorter than the new tokens.
        assert!(AttentionMetadata::new(vec![0, 1], vec![0, 2], vec![1], empty, cpu).is_err());
        // Decreasing starts.
        let two: &[Vec<u32>] = &[vec![0], vec![1]];
        assert!(AttentionMetadata::new(vec![0], vec![0, 2, 1], vec![2, 2], two, cpu).is_err());
        // Block table rows != sequences.
        assert!(AttentionMetadata::new(vec![0], vec![0, 1], vec![1], two, cpu).is_err());
        // Wrong dtype for from_tensors.
        let f = Tensor::zeros(1, DType::F32, cpu).unwrap();
        let m = two_seqs();
        assert!(AttentionMetadata::from_tensors(f, m.cu_seqlens_q, m.context_lens, m.block_tables).is_err());
    }

    #[test]
    fn validate_for_cache_checks_table_coverage_and_block_ids() {
        let m = two_seqs();
        assert!(m.host().validate_for_cache(4, 4, None, "test").is_ok());
        // Block 3 is out of range for a 3-block cache.
        assert!(m.host().validate_for_cache(3, 4, None, "test").is_err());
        // Context 5 needs 3 blocks of 2, the table has 2.
        assert!(m.host().validate_for_cache(8, 2, None, "test").is_err());
        assert!(m.host().validate_for_cache(8, 0, None, "test").is_err());
        // A window of 1 at position 4 reads block 1 only, so entry 0 may be anything; a window of
        // 2 reads position 3, in entry 0.
        let released =
            AttentionMetadata::new(vec![4], vec![0, 1], vec![5], &[vec![NULL_BLOCK, 1]], &Device::Cpu)
                .unwrap();
        assert!(released.host().validate_for_cache(4, 4, Some(1), "test").is_ok());
        assert!(released.host().validate_for_cache(4, 4, Some(2), "test").is_err());
        assert!(released.host().validate_for_cache(4, 4, Some(6), "test").is_err());
        assert!(released.host().validate_for_cache(4, 4, None, "test").is_err());
    }

    #[test]
    fn empty_batch_is_valid() {
        let none: &[Vec<u32>] = &[];
        let m = AttentionMetadata::new(vec![], vec![0], vec![], none, &Device::Cpu).unwrap();
        assert_eq!((m.num_seqs(), m.num_tokens(), m.max_q_len, m.max_context_len), (0, 0, 0, 0));
        assert_eq!(m.block_tables.dims(), &[0, 0]);
    }

    #[test]
    fn replay_metadata_is_written_in_place() {
        let mut m = AttentionMetadata::for_replay(2, 3, 4, &Device::Cpu).unwrap();
        assert_eq!(m.replay_max_context(), Some(12));
        assert_eq!(m.host().context_lens, vec![1, 1]);
        let (slots, tables) = (m.slot_mapping.clone(), m.block_tables.clone());
        let step = HostAttentionMetadata {
            slot_mapping: vec![9, u32::MAX],
            cu_seqlens_q: vec![0, 1, 2],
            context_lens: vec![10, 1],
            block_tables: vec![5, 6, 2, 0, 0, 0],
            max_blocks_per_seq: 3,
        };
        m.write_replay(step.clone()).unwrap();
        assert_eq!(slots.to_vec1::<u32>().unwrap(), vec![9, u32::MAX]);
        assert_eq!(tables.flatten_all().unwrap().to_vec1::<u32>().unwrap(), step.block_tables);
        assert_eq!(m.context_lens.to_vec1::<u32>().unwrap(), vec![10, 1]);
        assert_eq!((m.host(), m.max_context_len), (&step, 10));
        // Another shape, or a step's own metadata, is refused.
        let wider = HostAttentionMetadata { block_tables: vec![0; 8], max_blocks_per_seq: 4, ..step.clone() };
        assert!(m.write_replay(wider).is_err());
        assert!(two_seqs().write_replay(step).is_err());
    }
}

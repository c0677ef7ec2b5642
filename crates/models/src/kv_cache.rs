//! The paged KV cache: one K and one V tensor per layer, each
//! `[num_blocks, block_size, num_kv_heads, head_dim]` (the layout kernels/README.md documents).

use candle_core::{DType, Device, Tensor};

use crate::config::LlamaConfig;
use crate::error::{ModelError, Result};

pub struct KvCache {
    layers: Vec<(Tensor, Tensor)>,
    block_size: usize,
    num_blocks: usize,
}

impl KvCache {
    pub fn new(
        config: &LlamaConfig,
        num_blocks: usize,
        block_size: usize,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        if num_blocks == 0 || block_size == 0 {
            return Err(ModelError::InvalidOption(format!(
                "the KV cache needs at least one block of at least one token (got {num_blocks} blocks of {block_size})"
            )));
        }
        let shape = (num_blocks, block_size, config.num_kv_heads, config.head_dim);
        let layers = (0..config.num_layers)
            .map(|_| Ok((Tensor::zeros(shape, dtype, device)?, Tensor::zeros(shape, dtype, device)?)))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self { layers, block_size, num_blocks })
    }

    /// How many blocks fit in `bytes` of cache memory.
    pub fn blocks_for_budget(config: &LlamaConfig, block_size: usize, dtype: DType, bytes: u64) -> usize {
        let per_block = (config.kv_bytes_per_token(dtype.size_in_bytes()) * block_size) as u64;
        (bytes / per_block.max(1)) as usize
    }

    pub fn layer(&self, index: usize) -> (&Tensor, &Tensor) {
        let (k, v) = &self.layers[index];
        (k, v)
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// Copies whole blocks `src -> dst` in every layer (copy-on-write of a shared partial block).
    pub fn copy_blocks(&self, pairs: &[(u32, u32)]) -> Result<()> {
        for &(src, dst) in pairs {
            let (src, dst) = (src as usize, dst as usize);
            if src >= self.num_blocks || dst >= self.num_blocks {
                return Err(ModelError::InvalidOption(format!(
                    "block copy {src} -> {dst} outside the cache of {} blocks",
                    self.num_blocks
                )));
            }
            for (k, v) in &self.layers {
                k.slice_set(&k.narrow(0, src, 1)?.contiguous()?, 0, dst)?;
                v.slice_set(&v.narrow(0, src, 1)?.contiguous()?, 0, dst)?;
            }
        }
        Ok(())
    }
}

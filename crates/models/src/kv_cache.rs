//! The paged KV cache: one K and one V tensor per slot of a page, each
//! `[num_blocks, block_size, num_kv_heads, head_dim]` (the layout kernels/README.md documents).
//! A page (block id) holds K and V for the layers of one KV group ([`KvLayout`]); layer `i`
//! reads and writes slot `slot_of(i)` through its group's block table. Without windowed layers
//! there is one group and one slot per layer.

use candle_core::{DType, Device, Tensor};

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::kv_layout::KvLayout;

pub struct KvCache {
    slots: Vec<(Tensor, Tensor)>,
    layout: KvLayout,
    block_size: usize,
    num_blocks: usize,
}

impl KvCache {
    pub fn new(
        config: &ModelConfig,
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
        let layout = KvLayout::for_config(config);
        let shape = (num_blocks, block_size, config.num_kv_heads, config.head_dim);
        let slots = (0..layout.group_size())
            .map(|_| Ok((zeros(shape, dtype, device)?, zeros(shape, dtype, device)?)))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self { slots, layout, block_size, num_blocks })
    }

    /// A cache of `num_blocks` pages that hold nothing, for an encoder: the block manager
    /// still pages its sequences (their admission and the token budget work as for any
    /// model), but its attention reads only the step's own tokens.
    pub fn accounting_only(config: &ModelConfig, num_blocks: usize, block_size: usize) -> Self {
        Self { slots: Vec::new(), layout: KvLayout::for_config(config), block_size, num_blocks }
    }

    /// How many blocks (pages) fit in `bytes` of cache memory.
    pub fn blocks_for_budget(config: &ModelConfig, block_size: usize, dtype: DType, bytes: u64) -> usize {
        let per_page =
            KvLayout::for_config(config).page_bytes(config, block_size, dtype.size_in_bytes()) as u64;
        (bytes / per_page.max(1)) as usize
    }

    /// K and V of layer `index` (its slot of every page).
    pub fn layer(&self, index: usize) -> (&Tensor, &Tensor) {
        let (k, v) = &self.slots[self.layout.slot_of(index)];
        (k, v)
    }

    /// The KV group of layer `index`, whose block table it uses.
    pub fn group_of(&self, index: usize) -> usize {
        self.layout.group_of(index)
    }

    pub fn layout(&self) -> &KvLayout {
        &self.layout
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// Copies whole pages `src -> dst`, every slot (copy-on-write of a shared partial block).
    pub fn copy_blocks(&self, pairs: &[(u32, u32)]) -> Result<()> {
        for &(src, dst) in pairs {
            let (src, dst) = (src as usize, dst as usize);
            if src >= self.num_blocks || dst >= self.num_blocks {
                return Err(ModelError::InvalidOption(format!(
                    "block copy {src} -> {dst} outside the cache of {} blocks",
                    self.num_blocks
                )));
            }
            for (k, v) in &self.slots {
                // `copy` because a contiguous narrow is a view of the very storage being written.
                k.slice_set(&k.narrow(0, src, 1)?.copy()?, 0, dst)?;
                v.slice_set(&v.narrow(0, src, 1)?.copy()?, 0, dst)?;
            }
        }
        Ok(())
    }
}

/// A zeroed cache tensor. On the CPU, 16-bit floats come from a zeroed `u16` allocation:
/// candle fills an f16/bf16 tensor element by element, which for a 1 GiB cache costs most of a
/// second at start-up, while `calloc`'s fresh pages are zero until first written.
fn zeros(shape: (usize, usize, usize, usize), dtype: DType, device: &Device) -> Result<Tensor> {
    let len = shape.0 * shape.1 * shape.2 * shape.3;
    Ok(match (dtype, device) {
        (DType::F16, Device::Cpu) => Tensor::from_vec(zeroed_16bit::<half::f16>(len), shape, device)?,
        (DType::BF16, Device::Cpu) => Tensor::from_vec(zeroed_16bit::<half::bf16>(len), shape, device)?,
        _ => Tensor::zeros(shape, dtype, device)?,
    })
}

/// Marks the half-precision types as plain 16-bit words whose all-zero pattern is +0.0.
trait ZeroIsU16: Sized {}
impl ZeroIsU16 for half::f16 {}
impl ZeroIsU16 for half::bf16 {}

fn zeroed_16bit<T: ZeroIsU16>(len: usize) -> Vec<T> {
    const { assert!(std::mem::size_of::<T>() == 2 && std::mem::align_of::<T>() == 2) };
    let mut words = std::mem::ManuallyDrop::new(vec![0u16; len]);
    let (ptr, len, cap) = (words.as_mut_ptr(), words.len(), words.capacity());
    // SAFETY: `T` is f16 or bf16, `repr(transparent)` over u16 (same size and alignment,
    // asserted above), for which every bit pattern (here zero) is a valid value; the buffer came
    // from the global allocator with this layout and is owned by the new vector alone.
    unsafe { Vec::from_raw_parts(ptr.cast::<T>(), len, cap) }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use pagoda_ops::RotaryStyle;

    pub(crate) fn config() -> ModelConfig {
        ModelConfig {
            architecture: "llama".into(),
            vocab_size: 8,
            hidden_size: 8,
            intermediate_size: 8,
            num_layers: 2,
            num_heads: 2,
            num_kv_heads: 1,
            head_dim: 4,
            rms_norm_eps: 1e-5,
            rope_theta: 10_000.0,
            rope_scaling: Default::default(),
            rope_freq_factors: None,
            rope_style: RotaryStyle::Halves,
            max_position_embeddings: 64,
            tie_word_embeddings: true,
            attention_bias: false,
            qk_norm: false,
            sliding_window: None,
            sliding_layers: vec![false; 2],
            rope_local_theta: None,
            query_pre_attn_scalar: None,
            attn_logit_softcapping: None,
            final_logit_softcapping: None,
            moe: None,
            long_rope: None,
        }
    }

    #[test]
    fn copy_blocks_copies_whole_blocks_in_every_layer() {
        let cache = KvCache::new(&config(), 4, 2, DType::F32, &Device::Cpu).unwrap();
        for (i, (k, v)) in cache.slots.iter().enumerate() {
            let fill = Tensor::full(1.0 + i as f32, (1, 2, 1, 4), &Device::Cpu).unwrap();
            k.slice_set(&fill, 0, 1).unwrap();
            v.slice_set(&(fill * 10.0).unwrap(), 0, 1).unwrap();
        }
        cache.copy_blocks(&[(1, 3)]).unwrap();
        let block = |t: &Tensor, b: usize| -> Vec<f32> {
            t.narrow(0, b, 1).unwrap().flatten_all().unwrap().to_vec1().unwrap()
        };
        for i in 0..2 {
            let (k, v) = cache.layer(i);
            assert!(block(k, 3).iter().all(|&x| x == 1.0 + i as f32));
            assert!(block(v, 3).iter().all(|&x| x == 10.0 * (1.0 + i as f32)));
            assert!(block(k, 2).iter().all(|&x| x == 0.0), "other blocks untouched");
        }
        assert!(cache.copy_blocks(&[(0, 4)]).is_err());
    }

    #[test]
    fn half_precision_caches_start_at_zero() {
        for dtype in [DType::F16, DType::BF16, DType::F32] {
            let t = zeros((3, 4, 2, 8), dtype, &Device::Cpu).unwrap();
            assert_eq!(t.dtype(), dtype);
            assert_eq!(t.dims(), [3, 4, 2, 8]);
            let values = t.to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
            assert!(values.iter().all(|&v| v.to_bits() == 0));
        }
    }
}

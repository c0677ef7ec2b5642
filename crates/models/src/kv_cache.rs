//! The paged KV cache: one K and one V tensor per slot of a page, each
//! `[num_blocks, block_size, num_kv_heads, head_dim]` (the layout kernels/README.md documents).
//! A page (block id) holds K and V for the layers of one KV group ([`KvLayout`]); layer `i`
//! reads and writes slot `slot_of(i)` through its group's block table. Without windowed layers
//! there is one group and one slot per layer.
//!
//! An FP8 (e4m3) cache stores codes with a K and a V scale per slot (`pagoda_ops::KvScales`),
//! set once at start-up by calibration (`crate::kv_calibration`); a float cache's scales are
//! unit.

use candle_core::{DType, Device, Tensor};
use pagoda_ops::KvScales;

use crate::block_copy::BlockCopyPlan;
use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::kv_layout::KvLayout;

pub struct KvCache {
    slots: Vec<(Tensor, Tensor)>,
    /// One per slot.
    scales: Vec<KvScales>,
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
        let scales = vec![KvScales::UNIT; slots.len()];
        Ok(Self { slots, scales, layout, block_size, num_blocks })
    }

    /// The same cache with `scales`, one per slot (see [`Self::num_slots`]); only an FP8 cache
    /// takes scales other than unit ones.
    pub fn with_scales(mut self, scales: Vec<KvScales>) -> Result<Self> {
        if scales.len() != self.slots.len() {
            return Err(ModelError::InvalidOption(format!(
                "{} KV scales for a cache of {} slots",
                scales.len(),
                self.slots.len()
            )));
        }
        if let Some(dtype) = self.dtype() {
            for s in &scales {
                s.check_for(dtype, "the KV cache")?;
            }
        }
        self.scales = scales;
        Ok(self)
    }

    /// A cache of `num_blocks` pages that hold nothing, for an encoder: the block manager
    /// still pages its sequences (their admission and the token budget work as for any
    /// model), but its attention reads only the step's own tokens.
    pub fn accounting_only(config: &ModelConfig, num_blocks: usize, block_size: usize) -> Self {
        Self {
            slots: Vec::new(),
            scales: Vec::new(),
            layout: KvLayout::for_config(config),
            block_size,
            num_blocks,
        }
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

    /// The K and V tensors of slot `slot`, which the layers of every KV group at that place
    /// in their group share (each group through its own pages).
    pub fn slot(&self, slot: usize) -> (&Tensor, &Tensor) {
        let (k, v) = &self.slots[slot];
        (k, v)
    }

    /// The scales of layer `index`'s K and V (those of its slot).
    pub fn scales(&self, index: usize) -> KvScales {
        self.scales[self.layout.slot_of(index)]
    }

    /// The scales of every slot, as [`Self::with_scales`] takes them (kept across sleep mode,
    /// which drops the pages and allocates them again).
    pub fn slot_scales(&self) -> Vec<KvScales> {
        self.scales.clone()
    }

    /// Slots of a page: the layers of the largest KV group.
    pub fn num_slots(&self) -> usize {
        self.slots.len()
    }

    /// The element type of the cache tensors (`None` for an encoder's, which holds none).
    pub fn dtype(&self) -> Option<DType> {
        self.slots.first().map(|(k, _)| k.dtype())
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

    /// Copies whole pages `src -> dst`, every slot (copy-on-write of a shared partial block),
    /// touching those pages alone (see `block_copy`). All or nothing: a pair outside the
    /// cache copies nothing.
    pub fn copy_blocks(&self, pairs: &[(u32, u32)]) -> Result<()> {
        if let Some(&(src, dst)) =
            pairs.iter().find(|&&(s, d)| s as usize >= self.num_blocks || d as usize >= self.num_blocks)
        {
            return Err(ModelError::InvalidOption(format!(
                "block copy {src} -> {dst} outside the cache of {} blocks",
                self.num_blocks
            )));
        }
        if pairs.is_empty() {
            return Ok(());
        }
        let plan = BlockCopyPlan::new(pairs);
        for (k, v) in &self.slots {
            plan.apply(k)?;
            plan.apply(v)?;
        }
        Ok(())
    }
}

impl KvCache {
    /// The shape of one page for prefill/decode transfers, with an FP8 cache's scales (a peer
    /// takes its pages only with the same ones); `None` with windowed layers (more than one KV
    /// group) or no stored KV (an encoder).
    pub fn page_layout(&self) -> Option<pagoda_engine::KvPageLayout> {
        if self.layout.kv_groups().len() != 1 || self.slots.is_empty() {
            return None;
        }
        let (k, _) = &self.slots[0];
        let (_, block_size, num_kv_heads, head_dim) = k.dims4().ok()?;
        Some(pagoda_engine::KvPageLayout {
            dtype: format!("{:?}", k.dtype()).to_lowercase(),
            element_bytes: k.dtype().size_in_bytes(),
            num_layers: self.slots.len(),
            block_size,
            num_kv_heads,
            head_dim,
            scales: match k.dtype() {
                DType::F8E4M3 => self.scales.iter().map(|s| [s.k.to_bits(), s.v.to_bits()]).collect(),
                _ => Vec::new(),
            },
        })
    }

    /// The pages of `blocks`, block-major: per block, every layer's K page then its V page.
    pub fn read_pages(&self, blocks: &[u32]) -> Result<Vec<u8>> {
        let layout = self.page_layout().ok_or_else(transfer_refused)?;
        let page = layout.layer_page_bytes();
        self.check_blocks(blocks)?;
        let mut out = vec![0u8; blocks.len() * layout.block_bytes()];
        if blocks.is_empty() {
            return Ok(out);
        }
        for (s, (k, v)) in self.slots.iter().enumerate() {
            for (half, t) in [k, v].into_iter().enumerate() {
                // Gathered by copies (as `write_pages` scatters them), which candle has for every
                // dtype on every device; its CUDA gather kernel lacks f8e4m3 below sm_89.
                let picked = blocks
                    .iter()
                    .map(|&b| t.narrow(0, b as usize, 1))
                    .collect::<candle_core::Result<Vec<_>>>()?;
                let bytes = tensor_bytes(&Tensor::cat(&picked, 0)?)?;
                for b in 0..blocks.len() {
                    let at = b * layout.block_bytes() + (2 * s + half) * page;
                    out[at..at + page].copy_from_slice(&bytes[b * page..(b + 1) * page]);
                }
            }
        }
        Ok(out)
    }

    /// Writes `pages` (as [`Self::read_pages`] lays them out) into `blocks`.
    pub fn write_pages(&self, blocks: &[u32], pages: &[u8]) -> Result<()> {
        let layout = self.page_layout().ok_or_else(transfer_refused)?;
        let page = layout.layer_page_bytes();
        if pages.len() != blocks.len() * layout.block_bytes() {
            return Err(ModelError::InvalidOption(format!(
                "{} bytes of KV pages for {} blocks of {} bytes",
                pages.len(),
                blocks.len(),
                layout.block_bytes()
            )));
        }
        self.check_blocks(blocks)?;
        let shape = (blocks.len(), layout.block_size, layout.num_kv_heads, layout.head_dim);
        for (s, (k, v)) in self.slots.iter().enumerate() {
            for (half, t) in [k, v].into_iter().enumerate() {
                let mut bytes = Vec::with_capacity(blocks.len() * page);
                for b in 0..blocks.len() {
                    let at = b * layout.block_bytes() + (2 * s + half) * page;
                    bytes.extend_from_slice(&pages[at..at + page]);
                }
                let src = bytes_tensor(&bytes, t.dtype(), shape, t.device())?;
                for (b, &id) in blocks.iter().enumerate() {
                    t.slice_set(&src.narrow(0, b, 1)?, 0, id as usize)?;
                }
            }
        }
        Ok(())
    }

    fn check_blocks(&self, blocks: &[u32]) -> Result<()> {
        match blocks.iter().find(|&&b| b as usize >= self.num_blocks) {
            Some(&bad) => Err(ModelError::InvalidOption(format!(
                "block {bad} is outside the cache of {} blocks",
                self.num_blocks
            ))),
            None => Ok(()),
        }
    }
}

fn transfer_refused() -> ModelError {
    ModelError::InvalidOption("this model's KV cache (windowed layers, or none) cannot be transferred".into())
}

/// A tensor's elements as little-endian bytes (copied to the host).
fn tensor_bytes(t: &Tensor) -> Result<Vec<u8>> {
    let flat = t.flatten_all()?;
    Ok(match t.dtype() {
        DType::BF16 => flat.to_vec1::<half::bf16>()?.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect(),
        DType::F16 => flat.to_vec1::<half::f16>()?.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect(),
        DType::F32 => flat.to_vec1::<f32>()?.iter().flat_map(|x| x.to_le_bytes()).collect(),
        DType::F8E4M3 => flat.to_vec1::<float8::F8E4M3>()?.iter().map(|x| x.to_bits()).collect(),
        other => {
            return Err(ModelError::InvalidOption(format!("KV pages of {other:?} cannot be transferred")))
        }
    })
}

/// The inverse of [`tensor_bytes`].
fn bytes_tensor(
    bytes: &[u8],
    dtype: DType,
    shape: (usize, usize, usize, usize),
    device: &Device,
) -> Result<Tensor> {
    let words = |n: usize| bytes.chunks_exact(n);
    Ok(match dtype {
        DType::BF16 => Tensor::from_vec(
            words(2).map(|w| half::bf16::from_bits(u16::from_le_bytes([w[0], w[1]]))).collect::<Vec<_>>(),
            shape,
            device,
        )?,
        DType::F16 => Tensor::from_vec(
            words(2).map(|w| half::f16::from_bits(u16::from_le_bytes([w[0], w[1]]))).collect::<Vec<_>>(),
            shape,
            device,
        )?,
        DType::F32 => Tensor::from_vec(
            words(4).map(|w| f32::from_le_bytes([w[0], w[1], w[2], w[3]])).collect::<Vec<_>>(),
            shape,
            device,
        )?,
        DType::F8E4M3 => Tensor::from_vec(
            bytes.iter().map(|&b| float8::F8E4M3::from_bits(b)).collect::<Vec<_>>(),
            shape,
            device,
        )?,
        other => {
            return Err(ModelError::InvalidOption(format!("KV pages of {other:?} cannot be transferred")))
        }
    })
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
    fn pages_read_from_one_cache_write_the_same_values_into_another() {
        for dtype in [DType::F32, DType::BF16, DType::F8E4M3] {
            let a = KvCache::new(&config(), 4, 2, dtype, &Device::Cpu).unwrap();
            for (i, (k, v)) in a.slots.iter().enumerate() {
                for b in 0..4 {
                    let fill = Tensor::full(1.0 + (10 * i + b) as f32, (1, 2, 1, 4), &Device::Cpu).unwrap();
                    k.slice_set(&fill.to_dtype(dtype).unwrap(), 0, b).unwrap();
                    v.slice_set(&(fill * -1.0).unwrap().to_dtype(dtype).unwrap(), 0, b).unwrap();
                }
            }
            let layout = a.page_layout().unwrap();
            assert_eq!(layout.block_bytes(), 2 * 2 * 2 * 4 * dtype.size_in_bytes());
            let pages = a.read_pages(&[3, 1]).unwrap();
            let b = KvCache::new(&config(), 4, 2, dtype, &Device::Cpu).unwrap();
            b.write_pages(&[0, 2], &pages).unwrap();
            let block = |t: &Tensor, b: usize| -> Vec<f32> {
                t.narrow(0, b, 1)
                    .unwrap()
                    .to_dtype(DType::F32)
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .to_vec1()
                    .unwrap()
            };
            for i in 0..2 {
                let ((ka, va), (kb, vb)) = (a.layer(i), b.layer(i));
                assert_eq!(block(kb, 0), block(ka, 3));
                assert_eq!(block(vb, 2), block(va, 1));
                assert_eq!(block(kb, 2), block(ka, 1));
                assert!(block(kb, 1).iter().all(|&x| x == 0.0), "other blocks untouched");
            }
            assert!(b.write_pages(&[0], &pages).is_err(), "two blocks of pages for one block");
            assert!(a.read_pages(&[4]).is_err());
        }
    }

    #[test]
    fn scales_are_per_slot_and_only_an_fp8_cache_takes_other_than_unit_ones() {
        let scales = vec![KvScales { k: 0.5, v: 0.25 }, KvScales { k: 2.0, v: 1.0 }];
        let fp8 = KvCache::new(&config(), 4, 2, DType::F8E4M3, &Device::Cpu).unwrap();
        let fp8 = fp8.with_scales(scales.clone()).unwrap();
        assert_eq!((fp8.scales(0), fp8.scales(1)), (scales[0], scales[1]));
        // Pages travel with their scales: a peer with others refuses them.
        let layout = fp8.page_layout().unwrap();
        assert_eq!(
            layout.scales,
            vec![[0.5f32.to_bits(), 0.25f32.to_bits()], [2f32.to_bits(), 1f32.to_bits()]]
        );
        assert_eq!(layout.element_bytes, 1);
        let half = || KvCache::new(&config(), 4, 2, DType::F16, &Device::Cpu).unwrap();
        assert!(half().page_layout().unwrap().scales.is_empty());
        assert_eq!(half().scales(1), KvScales::UNIT);
        let err = half().with_scales(scales.clone()).err().expect("refused").to_string();
        assert!(err.contains("f8e4m3"), "{err}");
        assert!(half().with_scales(vec![KvScales::UNIT; 2]).is_ok());
        let err = KvCache::new(&config(), 4, 2, DType::F8E4M3, &Device::Cpu)
            .unwrap()
            .with_scales(vec![KvScales { k: 0.0, v: 1.0 }; 2])
            .err()
            .expect("refused")
            .to_string();
        assert!(err.contains("positive"), "{err}");
        assert!(half().with_scales(vec![KvScales::UNIT]).is_err(), "one pair a slot");
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

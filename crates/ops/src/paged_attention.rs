//! `paged_attention`: varlen causal attention over a mixed batch of decodes and prefill chunks,
//! reading K/V from the paged caches through each sequence's block table.
//!
//! This file holds the public function, the argument checks and the candle op; the CPU kernel
//! is in `paged_attention_cpu`, the CUDA one (the op's `cuda_fwd`, reading the metadata
//! tensors of [`AttentionMetadata`] instead of the host copies) in `cuda::attention`.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp3, DType, Layout, Result, Shape, Tensor};
use float8::F8E4M3;

use crate::check::{self, invalid};
use crate::dtype::{check_cache, check_float, f32_to_storage, storage_to_f32, with_float, Float};
use crate::kv_cache::KvScales;
use crate::metadata::AttentionMetadata;
use crate::paged_attention_cpu::{self as cpu, CacheShape, CacheSlices, Queries};

const OP: &str = "paged_attention";

/// Head dims the CUDA attention kernels are instantiated for (kernels/paged_attention_*.cu); a
/// model with another head dim runs on the CPU only. 256 is there in f16 and bf16, on CUDA
/// cores only; 16 and 32 are the tiny test checkpoints'.
pub const CUDA_ATTENTION_HEAD_DIMS: [usize; 7] = [16, 32, 64, 80, 96, 128, 256];

/// Whether the CUDA attention kernels cover `head_dim` for a KV cache of `dtype`.
pub fn cuda_attention_covers(head_dim: usize, dtype: candle_core::DType) -> bool {
    CUDA_ATTENTION_HEAD_DIMS.contains(&head_dim) && (dtype != candle_core::DType::F32 || head_dim <= 128)
}

/// Varlen paged attention over a mixed batch.
///
/// `q` is `[num_tokens, num_q_heads, head_dim]`; sequence `i`'s queries are rows
/// `cu_seqlens_q[i]..cu_seqlens_q[i + 1]`, at positions `context_len - q_len .. context_len`.
/// Each query attends causally to the positions `<=` its own, reading K/V for all of them
/// (cached and new: `reshape_and_cache` has already written the new ones) through the block
/// table. Caches are `[num_blocks, block_size, num_kv_heads, head_dim]`, contiguous, f32/f16/bf16
/// or f8e4m3 (both the same dtype; an f8e4m3 cache read with unit scales here, see
/// [`paged_attention_with`]). GQA/MQA: q head `h` uses kv head `h / (num_q_heads / num_kv_heads)`.
///
/// Math is f32 with `scores = q . k * softmax_scale`. Returns `[num_tokens, num_q_heads, head_dim]`
/// in `q`'s dtype (f32, f16 or bf16; it need not match the cache's).
pub fn paged_attention(
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    meta: &AttentionMetadata,
    softmax_scale: f32,
) -> Result<Tensor> {
    paged_attention_with(q, k_cache, v_cache, meta, AttentionParams::scaled(softmax_scale))
}

/// How scores are formed and which keys a query sees.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionParams {
    /// `scores = q . k * softmax_scale`.
    pub softmax_scale: f32,
    /// Sliding window (Mistral, Gemma's local layers): a query at position `p` attends to the
    /// keys at `p + 1 - window ..= p` only. Keys before the window are never read, so their
    /// blocks may hold anything (or have been reused).
    pub window: Option<usize>,
    /// Gemma 2's soft cap: `scores = cap * tanh(scores / cap)` before the softmax.
    pub logit_softcap: Option<f32>,
    /// Give every query row the bits it gets as a one-token decode, whatever else the step
    /// holds. The CPU kernels always do; on CUDA this plans each query token as a decode of its
    /// own on the CUDA-core kernel, its key range split by its length only (`cuda::plan`).
    pub batch_invariant: bool,
    /// The per-tensor scales of an FP8 cache (read as `scale * e4m3(code)`); unit for a float
    /// cache.
    pub kv_scales: KvScales,
}

impl AttentionParams {
    /// Plain causal attention with `softmax_scale`.
    pub fn scaled(softmax_scale: f32) -> Self {
        Self {
            softmax_scale,
            window: None,
            logit_softcap: None,
            batch_invariant: false,
            kv_scales: KvScales::UNIT,
        }
    }
}

/// [`paged_attention`] with a sliding window and/or soft-capped scores (Gemma, Mistral), on
/// the CPU and on CUDA. Keys before a window are never read: a windowed layer's cache may have
/// given their blocks back.
pub fn paged_attention_with(
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    meta: &AttentionMetadata,
    params: AttentionParams,
) -> Result<Tensor> {
    let AttentionParams { softmax_scale, window, logit_softcap, batch_invariant: _, kv_scales } = params;
    if window == Some(0) {
        return Err(invalid(OP, "a sliding window must hold at least one position"));
    }
    if logit_softcap.is_some_and(|cap| !(cap.is_finite() && cap > 0.0)) {
        return Err(invalid(OP, format!("logit soft cap {logit_softcap:?} must be positive and finite")));
    }
    let [num_blocks, block_size, kv_heads, head_dim] = check::dims::<4>(k_cache)?;
    check::shape_is(v_cache, k_cache.dims(), OP, "v_cache")?;
    let [num_tokens, q_heads, q_head_dim] = check::dims::<3>(q)?;
    if q_head_dim != head_dim {
        return Err(invalid(OP, format!("q head_dim {q_head_dim} differs from the cache's {head_dim}")));
    }
    if kv_heads == 0 || q_heads == 0 || q_heads % kv_heads > 0 {
        return Err(invalid(
            OP,
            format!("num_q_heads {q_heads} is not a positive multiple of num_kv_heads {kv_heads}"),
        ));
    }
    if num_tokens != meta.num_tokens() {
        return Err(invalid(
            OP,
            format!("q has {num_tokens} tokens but the metadata has {}", meta.num_tokens()),
        ));
    }
    if !softmax_scale.is_finite() {
        return Err(invalid(OP, format!("softmax_scale {softmax_scale} is not finite")));
    }
    check_float(q.dtype(), OP)?;
    check_cache(k_cache.dtype(), OP)?;
    check::dtype_is(v_cache, k_cache.dtype(), OP)?;
    kv_scales.check_for(k_cache.dtype(), OP)?;
    check::same_device(q, k_cache, OP)?;
    check::same_device(q, v_cache, OP)?;
    check::contiguous(k_cache, OP)?;
    check::contiguous(v_cache, OP)?;
    meta.host().validate_for_cache(num_blocks, block_size, window, OP)?;
    let op = PagedAttention { meta, params };
    q.apply_op3_no_bwd(k_cache, v_cache, &op)
}

/// The candle op: inputs (q, k_cache, v_cache); metadata and scale travel in the op.
struct PagedAttention<'a> {
    meta: &'a AttentionMetadata,
    params: AttentionParams,
}

impl CustomOp3 for PagedAttention<'_> {
    fn name(&self) -> &'static str {
        OP
    }

    fn cpu_fwd(
        &self,
        q: &CpuStorage,
        q_l: &Layout,
        k: &CpuStorage,
        k_l: &Layout,
        v: &CpuStorage,
        v_l: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let &[num_tokens, q_heads, head_dim] = q_l.dims() else {
            return Err(invalid(OP, "q must be [num_tokens, num_q_heads, head_dim]"));
        };
        let &[_, block_size, kv_heads, _] = k_l.dims() else {
            return Err(invalid(OP, "k_cache must be [num_blocks, block_size, num_kv_heads, head_dim]"));
        };
        // Queries may be a strided view (e.g. out of a fused QKV projection) with contiguous
        // token rows; gather them into one dense f32 buffer.
        let rows = check::rows(q_l, 2, OP)?;
        let q_f32 = if rows.row_stride == rows.row_len {
            storage_to_f32(q, rows.start, rows.rows * rows.row_len, OP)?
        } else {
            with_float!(q.dtype(), OP, T => {
                let src = q.as_slice::<T>()?;
                if rows.end() > src.len() {
                    return Err(invalid(OP, "q view exceeds its storage"));
                }
                let mut dense = vec![0f32; rows.rows * rows.row_len];
                for (t, dst) in dense.chunks_exact_mut(rows.row_len.max(1)).enumerate() {
                    T::to_f32_slice(&src[rows.range(t)], dst);
                }
                Ok(dense)
            })?
        };
        let p = self.params;
        // An FP8 cache's K scale is folded into the queries' scale, its V scale applied to
        // each output row with the softmax's normalisation.
        let queries = Queries {
            q: &q_f32,
            q_heads,
            softmax_scale: p.softmax_scale * p.kv_scales.k,
            window: p.window,
            logit_softcap: p.logit_softcap,
            v_scale: p.kv_scales.v,
        };
        let (k0, k1) = check::contiguous_range(k_l, OP)?;
        let (v0, v1) = check::contiguous_range(v_l, OP)?;
        if k.dtype() != v.dtype() {
            return Err(candle_core::Error::DTypeMismatchBinaryOp { lhs: k.dtype(), rhs: v.dtype(), op: OP });
        }
        let shape = CacheShape { block_size, kv_heads, head_dim };
        let (k, v) =
            (CacheSlices { storage: k, start: k0, end: k1 }, CacheSlices { storage: v, start: v0, end: v1 });
        let host = self.meta.host();
        let out = match k.storage.dtype() {
            DType::F8E4M3 => cpu::paged_attention_over::<F8E4M3>(&queries, k, v, shape, host)?,
            dt => with_float!(dt, OP, T => cpu::paged_attention_over::<T>(&queries, k, v, shape, host))?,
        };
        let storage = f32_to_storage(out, q.dtype(), OP)?;
        Ok((storage, Shape::from((num_tokens, q_heads, head_dim))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        q: &candle_core::CudaStorage,
        q_l: &Layout,
        k: &candle_core::CudaStorage,
        k_l: &Layout,
        v: &candle_core::CudaStorage,
        v_l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        crate::cuda::attention::paged_attention(self.meta, &self.params, q, q_l, k, k_l, v, v_l)
    }
}

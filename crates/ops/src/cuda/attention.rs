//! CUDA implementation of `paged_attention`: plans the call (`plan`), uploads the work lists
//! once per step, and launches the CUDA-core, tensor-core and combine kernels
//! (kernels/paged_attention_*.cu) on candle's stream.

use std::sync::{Arc, Mutex};

use candle_core::backend::BackendDevice;
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::CudaSlice;
use candle_core::{CudaDevice, CudaStorage, DType, Layout, Result, Shape, Storage};

use super::device;
use super::launch::{self, AttentionArgs, AttentionKernel, CUDA_MMA_HEAD_DIMS};
use super::plan::{plan_attention, plan_replay, PlanParams, WorkItem, SIMT_MAX_ROWS, SIMT_SMALL_ROWS};
use crate::check::{self, invalid};
use crate::metadata::AttentionMetadata;
use crate::{AttentionParams, CUDA_ATTENTION_HEAD_DIMS};

const OP: &str = "paged_attention";

/// A plan's work lists in device memory.
pub(crate) struct DevicePlan {
    simt_small: Option<CudaSlice<u32>>,
    simt: Option<CudaSlice<u32>>,
    mma: Option<CudaSlice<u32>>,
    combine: Option<CudaSlice<u32>>,
    counts: [usize; 4],
    partial_rows: usize,
}

fn upload(dev: &CudaDevice, items: &[WorkItem]) -> Result<Option<CudaSlice<u32>>> {
    if items.is_empty() {
        return Ok(None);
    }
    let words: Vec<u32> = items.iter().flat_map(|it| it.words()).collect();
    Ok(Some(dev.clone_htod(&words)?))
}

/// The uploaded plan of one step's metadata, shared by every layer (and by clones of the
/// metadata). Rebuilt if a call asks for different head counts or another device.
#[derive(Clone, Default)]
pub struct PlanCache(Arc<Mutex<Option<CachedPlan>>>);

/// A plan with what it was made for.
type CachedPlan = (PlanParams, candle_core::cuda_backend::DeviceId, Arc<DevicePlan>);

impl std::fmt::Debug for PlanCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PlanCache")
    }
}

impl PlanCache {
    fn get(&self, meta: &AttentionMetadata, params: PlanParams, dev: &CudaDevice) -> Result<Arc<DevicePlan>> {
        let mut slot = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((p, id, plan)) = slot.as_ref() {
            if *p == params && *id == dev.id() {
                return Ok(Arc::clone(plan));
            }
        }
        let host = meta.host();
        let plan = match meta.replay_max_context() {
            Some(max_context) => plan_replay(host.num_seqs(), max_context, &params),
            None => plan_attention(&host.cu_seqlens_q, &host.context_lens, &params),
        };
        let uploaded = Arc::new(DevicePlan {
            simt_small: upload(dev, &plan.simt_small)?,
            simt: upload(dev, &plan.simt)?,
            mma: upload(dev, &plan.mma)?,
            combine: upload(dev, &plan.combine)?,
            counts: [plan.simt_small.len(), plan.simt.len(), plan.mma.len(), plan.combine.len()],
            partial_rows: plan.partial_rows,
        });
        *slot = Some((params, dev.id(), Arc::clone(&uploaded)));
        Ok(uploaded)
    }
}

/// `paged_attention` on CUDA. `q` may be a strided view with contiguous token rows; a q dtype
/// other than a float cache's is converted to it (and the result back), so the kernels only see
/// one dtype. Over an FP8 cache the kernels read the codes and take q in its own dtype, the K
/// scale folded into the softmax scale and the V scale applied to the output.
#[allow(clippy::too_many_arguments)]
pub(crate) fn paged_attention(
    meta: &AttentionMetadata,
    p: &AttentionParams,
    q: &CudaStorage,
    q_l: &Layout,
    k: &CudaStorage,
    k_l: &Layout,
    v: &CudaStorage,
    v_l: &Layout,
) -> Result<(CudaStorage, Shape)> {
    let &[num_tokens, q_heads, head_dim] = q_l.dims() else {
        return Err(invalid(OP, "q must be [num_tokens, num_q_heads, head_dim]"));
    };
    let shape = Shape::from((num_tokens, q_heads, head_dim));
    if k.dtype() != v.dtype() {
        return Err(candle_core::Error::DTypeMismatchBinaryOp { lhs: k.dtype(), rhs: v.dtype(), op: OP });
    }
    let fp8_cache = k.dtype() == DType::F8E4M3;
    if q.dtype() != k.dtype() && !fp8_cache {
        let q_cast = q.to_dtype(q_l, k.dtype())?;
        let (out, shape) = paged_attention(meta, p, &q_cast, &Layout::contiguous(shape), k, k_l, v, v_l)?;
        let back = out.to_dtype(&Layout::contiguous(&shape), q.dtype())?;
        return Ok((back, shape));
    }
    let &[_, block_size, kv_heads, _] = k_l.dims() else {
        return Err(invalid(OP, "k_cache must be [num_blocks, block_size, num_kv_heads, head_dim]"));
    };
    if !CUDA_ATTENTION_HEAD_DIMS.contains(&head_dim) {
        return Err(invalid(
            OP,
            format!("head_dim {head_dim} has no CUDA kernel (supported: {CUDA_ATTENTION_HEAD_DIMS:?})"),
        ));
    }
    // The queries' and output's dtype, and a float cache's.
    let dtype = q.dtype();
    if dtype == DType::F32 && !CUDA_MMA_HEAD_DIMS.contains(&head_dim) {
        return Err(invalid(
            OP,
            format!("head_dim {head_dim} has a CUDA kernel for f16 and bf16 queries only"),
        ));
    }
    let esize = k.dtype().size_in_bytes();
    let (k0, _) = check::contiguous_range(k_l, OP)?;
    let (v0, _) = check::contiguous_range(v_l, OP)?;
    if !(k0 * esize).is_multiple_of(16) || !(v0 * esize).is_multiple_of(16) {
        return Err(invalid(OP, "the caches must start at a 16-byte boundary"));
    }
    let rows = check::rows(q_l, 2, OP)?;
    let dev = q.device().clone();
    let mut out = device::alloc(&dev, dtype, num_tokens * q_heads * head_dim)?;
    if num_tokens == 0 {
        return Ok((out, shape));
    }

    let params = PlanParams {
        num_q_heads: q_heads,
        num_kv_heads: kv_heads,
        tensor_cores: dtype != DType::F32 && CUDA_MMA_HEAD_DIMS.contains(&head_dim),
        num_sms: device::num_sms(&dev)?,
        batch_invariant: p.batch_invariant,
    };
    let plan = meta.cuda_plans.get(meta, params, &dev)?;
    let (bt_storage, bt_l) = meta.block_tables.storage_and_layout();
    let Storage::Cuda(block_tables) = &*bt_storage else {
        return Err(candle_core::Error::DeviceMismatchBinaryOp {
            lhs: dev.location(),
            rhs: meta.block_tables.device().location(),
            op: OP,
        });
    };
    let (bt0, _) = check::contiguous_range(bt_l, OP)?;
    let (cl_storage, cl_l) = meta.context_lens.storage_and_layout();
    let Storage::Cuda(context_lens) = &*cl_storage else {
        return Err(invalid(OP, "context_lens must be on the device of q"));
    };
    let (cl0, _) = check::contiguous_range(cl_l, OP)?;
    let mut part_o = device::alloc(&dev, DType::F32, plan.partial_rows * head_dim)?;
    let mut part_lse = device::alloc(&dev, DType::F32, plan.partial_rows)?;

    {
        let stream = dev.cuda_stream();
        let (q_ptr, _qg) = device::ptr(q, rows.start, &stream)?;
        let (k_ptr, _kg) = device::ptr(k, k0, &stream)?;
        let (v_ptr, _vg) = device::ptr(v, v0, &stream)?;
        let (bt_ptr, _btg) = device::ptr(block_tables, bt0, &stream)?;
        let (cl_ptr, _clg) = device::ptr(context_lens, cl0, &stream)?;
        let (out_ptr, _og) = device::ptr_mut(&mut out, 0, &stream)?;
        let (po_ptr, _pog) = device::ptr_mut(&mut part_o, 0, &stream)?;
        let (pl_ptr, _plg) = device::ptr_mut(&mut part_lse, 0, &stream)?;
        let args = AttentionArgs {
            dtype,
            fp8_cache,
            head_dim,
            q: q_ptr,
            q_row_stride: rows.row_stride,
            k_cache: k_ptr,
            v_cache: v_ptr,
            block_tables: bt_ptr,
            max_blocks_per_seq: meta.host().max_blocks_per_seq,
            block_size,
            num_kv_heads: kv_heads,
            group: q_heads / kv_heads,
            softmax_scale: p.softmax_scale * p.kv_scales.k,
            window: p.window.unwrap_or(0),
            logit_softcap: p.logit_softcap.unwrap_or(0.0),
            v_scale: p.kv_scales.v,
            out: out_ptr,
            part_o: po_ptr,
            part_lse: pl_ptr,
            context_lens: cl_ptr,
        };
        let lists = [
            (&plan.simt_small, plan.counts[0], AttentionKernel::Simt { rows: SIMT_SMALL_ROWS }),
            (&plan.simt, plan.counts[1], AttentionKernel::Simt { rows: SIMT_MAX_ROWS }),
            (&plan.mma, plan.counts[2], AttentionKernel::Mma),
        ];
        let mut guards = Vec::new();
        for (items, count, kernel) in lists {
            if let Some(items) = items {
                let (items_ptr, guard) = device::ptr_u32(items, &stream);
                guards.push(guard);
                if let Some(l) = launch::attention(&args, kernel, items_ptr, count)? {
                    device::launch(&dev, &l)?;
                }
            }
        }
        if let Some(groups) = &plan.combine {
            let (groups_ptr, guard) = device::ptr_u32(groups, &stream);
            guards.push(guard);
            if let Some(l) = launch::attention_combine(&args, groups_ptr, plan.counts[3])? {
                device::launch(&dev, &l)?;
            }
        }
    }
    Ok((out, shape))
}

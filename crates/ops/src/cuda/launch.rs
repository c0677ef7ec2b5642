//! Kernel launches as plain data: which PTX module and entry point, the grid, block and
//! dynamic shared memory, and the arguments in the kernel's order (device pointers as
//! integers). The CUDA path turns a [`KernelLaunch`] into a cudarc launch on candle's stream;
//! the kernel simulator tests run the same launches on the CPU. Each builder here is the one
//! place that knows its kernel's signature in kernels/*.cu.

use candle_core::{DType, Result};

use super::plan::SIMT_SMALL_ROWS;
use crate::CUDA_ATTENTION_HEAD_DIMS;

/// The `kernels/*.cu` file (one PTX module each) an entry point lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum KernelModule {
    ReshapeAndCache,
    RmsNorm,
    Rotary,
    SiluAndMul,
    AttentionSimt,
    AttentionMma,
    AttentionCombine,
    Sampling,
    SkinnyMatmul,
    QuantMatmul,
    Fp8Matmul,
    Lora,
}

impl KernelModule {
    #[cfg(test)]
    pub const ALL: [KernelModule; 12] = [
        KernelModule::ReshapeAndCache,
        KernelModule::RmsNorm,
        KernelModule::Rotary,
        KernelModule::SiluAndMul,
        KernelModule::AttentionSimt,
        KernelModule::AttentionMma,
        KernelModule::AttentionCombine,
        KernelModule::Sampling,
        KernelModule::SkinnyMatmul,
        KernelModule::QuantMatmul,
        KernelModule::Fp8Matmul,
        KernelModule::Lora,
    ];

    /// The source file's stem: `kernels/{stem}.cu`.
    pub fn stem(self) -> &'static str {
        match self {
            KernelModule::ReshapeAndCache => "reshape_and_cache",
            KernelModule::RmsNorm => "rms_norm",
            KernelModule::Rotary => "rotary",
            KernelModule::SiluAndMul => "silu_and_mul",
            KernelModule::AttentionSimt => "paged_attention_simt",
            KernelModule::AttentionMma => "paged_attention_mma",
            KernelModule::AttentionCombine => "paged_attention_combine",
            KernelModule::Sampling => "sampling",
            KernelModule::SkinnyMatmul => "skinny_matmul",
            KernelModule::QuantMatmul => "quant_matmul",
            KernelModule::Fp8Matmul => "fp8_matmul",
            KernelModule::Lora => "lora",
        }
    }
}

/// One kernel argument, by value. `Ptr` is a device address (already offset to the first
/// element the kernel reads).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Arg {
    Ptr(u64),
    I64(i64),
    I32(i32),
    F32(f32),
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct KernelLaunch {
    pub module: KernelModule,
    pub function: String,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_mem_bytes: u32,
    pub args: Vec<Arg>,
}

/// Dynamic shared memory of the tensor-core attention kernel for `head_dim` (Q plus two
/// stages of K and V, 64 rows each, rows padded by 8 elements; over an FP8 cache, Q, one stage
/// of K and V widened and two stages of their codes); kernels/paged_attention_mma.cu.
pub(crate) fn mma_shared_bytes(head_dim: usize, fp8_cache: bool) -> u32 {
    let row = (head_dim + 8) * 2;
    match fp8_cache {
        false => (5 * 64 * row) as u32,
        true => (3 * 64 * row + 4 * 64 * head_dim) as u32,
    }
}

/// The kernel name suffix of a storage dtype.
pub(crate) fn dtype_suffix(dtype: DType, op: &'static str) -> Result<&'static str> {
    match dtype {
        DType::F32 => Ok("f32"),
        DType::F16 => Ok("f16"),
        DType::BF16 => Ok("bf16"),
        other => Err(candle_core::Error::UnsupportedDTypeForOp(other, op)),
    }
}

pub(crate) fn to_i32(v: usize, what: &str, op: &'static str) -> Result<i32> {
    i32::try_from(v)
        .map_err(|_| candle_core::Error::Msg(format!("{op}: {what} {v} exceeds the kernel's 32-bit range")))
}

pub(crate) fn to_grid(v: usize, what: &str, op: &'static str) -> Result<u32> {
    // gridDim.x allows 2^31 - 1; .y and .z 65535.
    u32::try_from(v)
        .ok()
        .filter(|&g| g <= i32::MAX as u32)
        .ok_or_else(|| candle_core::Error::Msg(format!("{op}: {v} {what} exceed one launch")))
}

/// Threads for a one-block-per-row kernel over rows of `width` elements: about 8 elements
/// per thread, a whole number of warps, 32..=1024.
pub(crate) fn row_threads(width: usize) -> u32 {
    (width.div_ceil(8).next_power_of_two().clamp(32, 1024)) as u32
}

/// `reshape_and_cache` for one cache: row `t` of `src` (rows `src_row_stride_bytes` apart) to
/// slot `slots[t]` of `cache`. `None` when there are no tokens.
pub(crate) fn reshape_and_cache(
    src: u64,
    src_row_stride_bytes: usize,
    cache: u64,
    slots: u64,
    num_tokens: usize,
    row_bytes: usize,
    num_slots: usize,
) -> Result<Option<KernelLaunch>> {
    const OP: &str = "reshape_and_cache";
    if num_tokens == 0 || row_bytes == 0 {
        return Ok(None);
    }
    Ok(Some(KernelLaunch {
        module: KernelModule::ReshapeAndCache,
        function: "pagoda_reshape_and_cache".into(),
        grid: [to_grid(num_tokens, "tokens", OP)?, 1, 1],
        block: [128, 1, 1],
        shared_mem_bytes: 0,
        args: vec![
            Arg::Ptr(src),
            Arg::I64(src_row_stride_bytes as i64),
            Arg::Ptr(cache),
            Arg::Ptr(slots),
            Arg::I32(to_i32(row_bytes, "row bytes", OP)?),
            Arg::I64(num_slots as i64),
        ],
    }))
}

/// `reshape_and_cache` into an FP8 cache: row `t` of `src` (`src_dtype`, rows
/// `src_row_stride` elements apart) times `inv_scale`, encoded, to slot `slots[t]` of `cache`
/// (`row_len` codes a slot). `None` when there are no tokens.
#[allow(clippy::too_many_arguments)]
pub(crate) fn reshape_and_cache_fp8(
    src: u64,
    src_dtype: DType,
    src_row_stride: usize,
    cache: u64,
    slots: u64,
    num_tokens: usize,
    row_len: usize,
    num_slots: usize,
    inv_scale: f32,
) -> Result<Option<KernelLaunch>> {
    const OP: &str = "reshape_and_cache";
    if num_tokens == 0 || row_len == 0 {
        return Ok(None);
    }
    Ok(Some(KernelLaunch {
        module: KernelModule::ReshapeAndCache,
        function: format!("pagoda_reshape_and_cache_fp8_{}", dtype_suffix(src_dtype, OP)?),
        grid: [to_grid(num_tokens, "tokens", OP)?, 1, 1],
        block: [128, 1, 1],
        shared_mem_bytes: 0,
        args: vec![
            Arg::Ptr(src),
            Arg::I64(src_row_stride as i64),
            Arg::Ptr(cache),
            Arg::Ptr(slots),
            Arg::I32(to_i32(row_len, "row length", OP)?),
            Arg::I64(num_slots as i64),
            Arg::F32(inv_scale),
        ],
    }))
}

/// Rows of `x` (f32/f16/bf16, `x_row_stride` elements apart) and a `hidden`-long weight.
pub(crate) struct NormArgs {
    pub x_dtype: DType,
    pub w_dtype: DType,
    pub x: u64,
    pub x_row_stride: usize,
    pub weight: u64,
    pub out: u64,
    pub rows: usize,
    pub hidden: usize,
    pub eps: f32,
}

/// `rms_norm`; `None` for an empty input.
pub(crate) fn rms_norm(a: &NormArgs) -> Result<Option<KernelLaunch>> {
    const OP: &str = "rms_norm";
    if a.rows == 0 || a.hidden == 0 {
        return Ok(None);
    }
    let name = format!("pagoda_rms_norm_{}_{}", dtype_suffix(a.x_dtype, OP)?, dtype_suffix(a.w_dtype, OP)?);
    Ok(Some(KernelLaunch {
        module: KernelModule::RmsNorm,
        function: name,
        grid: [to_grid(a.rows, "rows", OP)?, 1, 1],
        block: [row_threads(a.hidden), 1, 1],
        shared_mem_bytes: 0,
        args: vec![
            Arg::Ptr(a.x),
            Arg::I64(a.x_row_stride as i64),
            Arg::Ptr(a.weight),
            Arg::Ptr(a.out),
            Arg::I32(to_i32(a.hidden, "hidden size", OP)?),
            Arg::F32(a.eps),
        ],
    }))
}

/// `add_rms_norm`: `out` holds `2 * rows * hidden` elements (normed, then the sum).
pub(crate) fn add_rms_norm(a: &NormArgs, residual: u64, r_row_stride: usize) -> Result<Option<KernelLaunch>> {
    const OP: &str = "add_rms_norm";
    if a.rows == 0 || a.hidden == 0 {
        return Ok(None);
    }
    let name =
        format!("pagoda_add_rms_norm_{}_{}", dtype_suffix(a.x_dtype, OP)?, dtype_suffix(a.w_dtype, OP)?);
    Ok(Some(KernelLaunch {
        module: KernelModule::RmsNorm,
        function: name,
        grid: [to_grid(a.rows, "rows", OP)?, 1, 1],
        block: [row_threads(a.hidden), 1, 1],
        shared_mem_bytes: 0,
        args: vec![
            Arg::Ptr(a.x),
            Arg::I64(a.x_row_stride as i64),
            Arg::Ptr(residual),
            Arg::I64(r_row_stride as i64),
            Arg::Ptr(a.weight),
            Arg::Ptr(a.out),
            Arg::I64(a.rows as i64),
            Arg::I32(to_i32(a.hidden, "hidden size", OP)?),
            Arg::F32(a.eps),
        ],
    }))
}

pub(crate) struct RotaryArgs {
    pub dtype: DType,
    pub x: u64,
    pub x_row_stride: usize,
    pub positions: u64,
    pub cos: u64,
    pub sin: u64,
    pub max_positions: usize,
    pub out: u64,
    pub num_tokens: usize,
    pub num_heads: usize,
    pub head_dim: usize,
    pub interleaved: bool,
}

pub(crate) fn rotary(a: &RotaryArgs) -> Result<Option<KernelLaunch>> {
    const OP: &str = "rotary_embedding";
    if a.num_tokens == 0 || a.num_heads == 0 || a.head_dim == 0 {
        return Ok(None);
    }
    Ok(Some(KernelLaunch {
        module: KernelModule::Rotary,
        function: format!("pagoda_rotary_{}", dtype_suffix(a.dtype, OP)?),
        grid: [to_grid(a.num_tokens, "tokens", OP)?, 1, 1],
        // About four pairs per thread: a decode step's one token per block is a chain of
        // memory latencies, one per pair a thread walks.
        block: [row_threads(a.num_heads * a.head_dim), 1, 1],
        shared_mem_bytes: 0,
        args: vec![
            Arg::Ptr(a.x),
            Arg::I64(a.x_row_stride as i64),
            Arg::Ptr(a.positions),
            Arg::Ptr(a.cos),
            Arg::Ptr(a.sin),
            Arg::I32(to_i32(a.max_positions, "max positions", OP)?),
            Arg::Ptr(a.out),
            Arg::I32(to_i32(a.num_heads, "heads", OP)?),
            Arg::I32(to_i32(a.head_dim, "head dim", OP)?),
            Arg::I32(a.interleaved as i32),
        ],
    }))
}

pub(crate) struct SiluArgs {
    pub dtype: DType,
    pub gate: u64,
    pub gate_row_stride: usize,
    pub up: u64,
    pub up_row_stride: usize,
    pub out: u64,
    pub rows: usize,
    pub width: usize,
}

pub(crate) fn silu_and_mul(a: &SiluArgs) -> Result<Option<KernelLaunch>> {
    const OP: &str = "silu_and_mul";
    let n = a.rows * a.width;
    if n == 0 {
        return Ok(None);
    }
    // Grid-stride loop: enough blocks to fill any GPU, no more.
    let blocks = n.div_ceil(256).min(1 << 16);
    Ok(Some(KernelLaunch {
        module: KernelModule::SiluAndMul,
        function: format!("pagoda_silu_and_mul_{}", dtype_suffix(a.dtype, OP)?),
        grid: [blocks as u32, 1, 1],
        block: [256, 1, 1],
        shared_mem_bytes: 0,
        args: vec![
            Arg::Ptr(a.gate),
            Arg::I64(a.gate_row_stride as i64),
            Arg::Ptr(a.up),
            Arg::I64(a.up_row_stride as i64),
            Arg::Ptr(a.out),
            Arg::I64(a.rows as i64),
            Arg::I32(to_i32(a.width, "width", OP)?),
        ],
    }))
}

/// Threads per row of the sampler (`SAMPLE_THREADS` in kernels/sampling.cu).
pub(crate) const SAMPLE_THREADS: usize = 256;

/// The device sampler over `rows` rows of f32 logits; addresses of a plan's arrays
/// (`pagoda_engine::device_sampling::DeviceSamplingPlan`) and of the outputs. An array that
/// no row's range reaches may be 0.
pub(crate) struct SampleArgs {
    pub logits: u64,
    pub logits_row_stride: usize,
    pub vocab: usize,
    pub rows: usize,
    pub row_params: u64,
    pub bias_ids: u64,
    pub bias_values: u64,
    pub banned_ids: u64,
    pub penalty_ids: u64,
    pub penalty_counts: u64,
    pub mask_words: u64,
    /// `rows * vocab` f32 of scratch (rows that need no processing never touch theirs).
    pub work: u64,
    pub tokens: u64,
    pub token_logprobs: u64,
    pub top_ids: u64,
    pub top_logprobs: u64,
    pub max_logprobs: usize,
}

pub(crate) fn sample(a: &SampleArgs) -> Result<Option<KernelLaunch>> {
    const OP: &str = "sample";
    if a.rows == 0 {
        return Ok(None);
    }
    // Each thread counts its share of a row in 16-bit histogram cells.
    if a.vocab == 0 || a.vocab > SAMPLE_THREADS * u16::MAX as usize {
        return Err(candle_core::Error::Msg(format!("{OP}: vocabulary of {} outside 1..=16.7M", a.vocab)));
    }
    Ok(Some(KernelLaunch {
        module: KernelModule::Sampling,
        function: "pagoda_sample_f32".into(),
        grid: [to_grid(a.rows, "rows", OP)?, 1, 1],
        block: [SAMPLE_THREADS as u32, 1, 1],
        shared_mem_bytes: 0,
        args: vec![
            Arg::Ptr(a.logits),
            Arg::I64(a.logits_row_stride as i64),
            Arg::I32(to_i32(a.vocab, "vocab", OP)?),
            Arg::Ptr(a.row_params),
            Arg::Ptr(a.bias_ids),
            Arg::Ptr(a.bias_values),
            Arg::Ptr(a.banned_ids),
            Arg::Ptr(a.penalty_ids),
            Arg::Ptr(a.penalty_counts),
            Arg::Ptr(a.mask_words),
            Arg::Ptr(a.work),
            Arg::Ptr(a.tokens),
            Arg::Ptr(a.token_logprobs),
            Arg::Ptr(a.top_ids),
            Arg::Ptr(a.top_logprobs),
            Arg::I32(to_i32(a.max_logprobs, "max_logprobs", OP)?),
        ],
    }))
}

/// What every attention kernel of one call shares.
pub(crate) struct AttentionArgs {
    /// The queries' and output's dtype; a float cache's too.
    pub dtype: DType,
    /// The cache holds FP8 codes (the `_fp8` kernels), read with `softmax_scale` (which has the
    /// K scale folded in) and `v_scale`.
    pub fp8_cache: bool,
    pub head_dim: usize,
    pub q: u64,
    pub q_row_stride: usize,
    pub k_cache: u64,
    pub v_cache: u64,
    pub block_tables: u64,
    pub max_blocks_per_seq: usize,
    pub block_size: usize,
    pub num_kv_heads: usize,
    pub group: usize,
    pub softmax_scale: f32,
    /// Sliding window in keys; 0 for none.
    pub window: usize,
    /// Gemma's score cap (natural units); 0 for none.
    pub logit_softcap: f32,
    /// Each output row's factor: an FP8 cache's V scale, 1 for a float cache.
    pub v_scale: f32,
    pub out: u64,
    /// f32 `[partial_rows, head_dim]` and `[partial_rows]`; 0 when nothing is split.
    pub part_o: u64,
    pub part_lse: u64,
    /// u32 `[num_seqs]`: what items planned with their ranges at run time read.
    pub context_lens: u64,
}

/// Which attention kernel a list of work items goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AttentionKernel {
    /// CUDA cores, items of at most `rows` (4 or 8) rows.
    Simt { rows: usize },
    /// Tensor cores (f16/bf16).
    Mma,
}

const OP_ATTN: &str = "paged_attention";

/// Head dims of the tensor-core kernel; the others of [`CUDA_ATTENTION_HEAD_DIMS`] run on CUDA
/// cores (256: two stages of 64 keys would not fit an sm_80 block's shared memory).
pub(crate) const CUDA_MMA_HEAD_DIMS: [usize; 6] = [16, 32, 64, 80, 96, 128];

fn attention_common(a: &AttentionArgs) -> Result<Vec<Arg>> {
    Ok(vec![
        Arg::Ptr(a.q),
        Arg::I64(a.q_row_stride as i64),
        Arg::Ptr(a.k_cache),
        Arg::Ptr(a.v_cache),
        Arg::Ptr(a.block_tables),
        Arg::I32(to_i32(a.max_blocks_per_seq, "blocks per sequence", OP_ATTN)?),
        Arg::I32(to_i32(a.block_size, "block size", OP_ATTN)?),
        Arg::I32(to_i32(a.num_kv_heads, "kv heads", OP_ATTN)?),
        Arg::I32(to_i32(a.group, "group size", OP_ATTN)?),
        Arg::F32(a.softmax_scale * std::f32::consts::LOG2_E),
        Arg::I32(to_i32(a.window, "window", OP_ATTN)?),
        Arg::F32(a.logit_softcap * std::f32::consts::LOG2_E),
        Arg::F32(a.v_scale),
        Arg::Ptr(a.out),
    ])
}

/// One launch over `num_items` work items at `items` (u32 words) for `kernel`.
pub(crate) fn attention(
    a: &AttentionArgs,
    kernel: AttentionKernel,
    items: u64,
    num_items: usize,
) -> Result<Option<KernelLaunch>> {
    if num_items == 0 || a.num_kv_heads == 0 {
        return Ok(None);
    }
    if !CUDA_ATTENTION_HEAD_DIMS.contains(&a.head_dim) {
        return Err(candle_core::Error::Msg(format!(
            "{OP_ATTN}: head_dim {} has no CUDA kernel (supported: {CUDA_ATTENTION_HEAD_DIMS:?})",
            a.head_dim
        )));
    }
    let kv_heads = u32::try_from(a.num_kv_heads).ok().filter(|&h| h <= 65535).ok_or_else(|| {
        candle_core::Error::Msg(format!("{OP_ATTN}: {} kv heads exceed one launch", a.num_kv_heads))
    })?;
    let dt = dtype_suffix(a.dtype, OP_ATTN)?;
    let dt = if a.fp8_cache { format!("{dt}_fp8") } else { dt.to_owned() };
    let mut args = vec![Arg::Ptr(items)];
    args.extend(attention_common(a)?);
    let (module, function, shared_mem_bytes) = match kernel {
        AttentionKernel::Simt { rows } => {
            if a.dtype == DType::F32 && !CUDA_MMA_HEAD_DIMS.contains(&a.head_dim) {
                return Err(candle_core::Error::Msg(format!(
                    "{OP_ATTN}: head_dim {} has a CUDA kernel for f16 and bf16 only",
                    a.head_dim
                )));
            }
            let r = if rows <= SIMT_SMALL_ROWS { 4 } else { 8 };
            args.push(Arg::Ptr(a.part_o));
            args.push(Arg::Ptr(a.part_lse));
            args.push(Arg::Ptr(a.context_lens));
            (KernelModule::AttentionSimt, format!("pagoda_paged_attention_simt_{dt}_d{}_r{r}", a.head_dim), 0)
        }
        AttentionKernel::Mma => {
            if a.dtype == DType::F32 {
                return Err(candle_core::Error::UnsupportedDTypeForOp(
                    a.dtype,
                    "paged_attention (tensor cores)",
                ));
            }
            if !CUDA_MMA_HEAD_DIMS.contains(&a.head_dim) {
                return Err(candle_core::Error::Msg(format!(
                    "{OP_ATTN}: head_dim {} has no tensor-core kernel (supported: {CUDA_MMA_HEAD_DIMS:?})",
                    a.head_dim
                )));
            }
            // Windows and soft caps have their own entry point, so causal attention keeps its registers.
            let local = if a.window > 0 || a.logit_softcap > 0.0 { "local_" } else { "" };
            (
                KernelModule::AttentionMma,
                format!("pagoda_paged_attention_mma_{local}{dt}_d{}", a.head_dim),
                mma_shared_bytes(a.head_dim, a.fp8_cache),
            )
        }
    };
    Ok(Some(KernelLaunch {
        module,
        function,
        grid: [to_grid(num_items, "work items", OP_ATTN)?, kv_heads, 1],
        block: [128, 1, 1],
        shared_mem_bytes,
        args,
    }))
}

/// The combine launch over `num_groups` split groups (their split-0 items at `groups`).
pub(crate) fn attention_combine(
    a: &AttentionArgs,
    groups: u64,
    num_groups: usize,
) -> Result<Option<KernelLaunch>> {
    if num_groups == 0 || a.num_kv_heads == 0 {
        return Ok(None);
    }
    let dt = dtype_suffix(a.dtype, OP_ATTN)?;
    Ok(Some(KernelLaunch {
        module: KernelModule::AttentionCombine,
        function: format!("pagoda_attention_combine_{dt}"),
        grid: [to_grid(num_groups, "split groups", OP_ATTN)?, a.num_kv_heads as u32, 1],
        block: [128, 1, 1],
        shared_mem_bytes: 0,
        args: vec![
            Arg::Ptr(groups),
            Arg::Ptr(a.part_o),
            Arg::Ptr(a.part_lse),
            Arg::Ptr(a.out),
            Arg::I32(to_i32(a.num_kv_heads, "kv heads", OP_ATTN)?),
            Arg::I32(to_i32(a.group, "group size", OP_ATTN)?),
            Arg::I32(to_i32(a.head_dim, "head dim", OP_ATTN)?),
        ],
    }))
}

#[cfg(test)]
#[path = "launch_tests.rs"]
mod tests;

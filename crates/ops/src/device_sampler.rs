//! The device sampler's entry point: one token (and the requested logprobs) per row of logits
//! that stay on the GPU (kernels/sampling.cu), from a batch plan built on the host
//! (`pagoda_engine::device_sampling`). Only the plan goes up and ids and logprobs come back.
//!
//! The plan is passed as plain slices so this crate stays independent of the engine; the row
//! records are the plan's `row_bytes()`, 80 bytes each, as the kernel reads them.

use candle_core::{Result, Tensor};

/// One batch's plan, borrowed.
#[derive(Debug, Clone, Copy)]
pub struct DeviceSampleInput<'a> {
    /// The per-row records, 80 bytes each.
    pub row_bytes: &'a [u8],
    pub bias_ids: &'a [u32],
    pub bias_values: &'a [f32],
    pub banned_ids: &'a [u32],
    pub penalty_ids: &'a [u32],
    pub penalty_counts: &'a [u32],
    pub mask_words: &'a [u32],
    /// Stride of the top-logprob outputs (the largest count any row asks for).
    pub max_logprobs: usize,
}

/// Bytes of one row record (`struct SampleRow` in kernels/sampling.cu).
pub const DEVICE_SAMPLE_ROW_BYTES: usize = 80;

/// Each row's token (`u32::MAX` when nothing could be drawn), the raw logprob of that token,
/// and `max_logprobs` top entries per row (only a row's first `num_logprobs` are written).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeviceSampleOutput {
    pub tokens: Vec<u32>,
    pub token_logprobs: Vec<f32>,
    pub top_ids: Vec<u32>,
    pub top_logprobs: Vec<f32>,
}

/// Samples one token per row of `logits` (`[rows, vocab]`, on a CUDA device) by `input`.
pub fn sample_on_device(logits: &Tensor, input: &DeviceSampleInput<'_>) -> Result<DeviceSampleOutput> {
    let (rows, vocab) = logits.dims2()?;
    if vocab == 0 {
        candle_core::bail!("sample_on_device: logits rows are empty");
    }
    if input.row_bytes.len() != rows * DEVICE_SAMPLE_ROW_BYTES {
        candle_core::bail!(
            "sample_on_device: {} bytes of row records for {rows} rows of logits",
            input.row_bytes.len()
        );
    }
    if input.bias_ids.len() != input.bias_values.len()
        || input.penalty_ids.len() != input.penalty_counts.len()
    {
        candle_core::bail!("sample_on_device: the plan's id and value lists differ in length");
    }
    match logits.device() {
        #[cfg(feature = "cuda")]
        candle_core::Device::Cuda(dev) => crate::cuda::sampling::sample(dev, logits, rows, vocab, input),
        other => candle_core::bail!(
            "sample_on_device: logits on {other:?}; the CPU samples with the engine's sampler"
        ),
    }
}

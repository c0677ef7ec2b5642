//! CUDA side of the device sampler (kernels/sampling.cu): uploads a batch plan, launches one
//! block per row on candle's stream, and copies back only ids and logprobs.

use candle_core::cuda_backend::cudarc::driver::{
    CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr, SyncOnDrop,
};
use candle_core::{CudaDevice, DType, Result, Tensor};

use super::launch::{self, SampleArgs};
use crate::device_sampler::{DeviceSampleInput, DeviceSampleOutput};

/// A host list on the device; `None` when empty (the kernel reads no entry of it then).
fn upload<T: DeviceRepr + 'static>(dev: &CudaDevice, v: &[T]) -> Result<Option<CudaSlice<T>>> {
    if v.is_empty() {
        return Ok(None);
    }
    Ok(Some(dev.clone_htod(v)?))
}

/// The address of an uploaded list (0 when there is none), with its read guard.
fn read_ptr<'a, T>(s: &'a Option<CudaSlice<T>>, stream: &'a CudaStream) -> Option<(u64, SyncOnDrop<'a>)> {
    s.as_ref().map(|s| s.device_ptr(stream))
}

pub(crate) fn sample(
    dev: &CudaDevice,
    logits: &Tensor,
    rows: usize,
    vocab: usize,
    input: &DeviceSampleInput<'_>,
) -> Result<DeviceSampleOutput> {
    if rows == 0 {
        return Ok(DeviceSampleOutput::default());
    }
    let logits = logits.to_dtype(DType::F32)?.contiguous()?;
    let (storage, layout) = logits.storage_and_layout();
    let candle_core::Storage::Cuda(storage) = &*storage else {
        candle_core::bail!("sample_on_device: logits left the CUDA device");
    };
    let stream = dev.cuda_stream();
    let row_params = dev.clone_htod(input.row_bytes)?;
    let bias_ids = upload(dev, input.bias_ids)?;
    let bias_values = upload(dev, input.bias_values)?;
    let banned_ids = upload(dev, input.banned_ids)?;
    let penalty_ids = upload(dev, input.penalty_ids)?;
    let penalty_counts = upload(dev, input.penalty_counts)?;
    let mask_words = upload(dev, input.mask_words)?;
    let k = input.max_logprobs;
    // SAFETY (alloc): the kernel writes every token and logprob before they are read back, and
    // a row's top entries beyond its own count are never read.
    let mut work = unsafe { dev.alloc::<f32>(rows * vocab)? };
    let mut tokens = unsafe { dev.alloc::<u32>(rows)? };
    let mut token_logprobs = unsafe { dev.alloc::<f32>(rows)? };
    let mut top_ids = unsafe { dev.alloc::<u32>((rows * k).max(1))? };
    let mut top_logprobs = unsafe { dev.alloc::<f32>((rows * k).max(1))? };
    {
        let (logits_ptr, _g0) = super::device::ptr(storage, layout.start_offset(), &stream)?;
        let (row_ptr, _g1) = row_params.device_ptr(&stream);
        let (bias_ids_g, banned_g, pen_ids_g, pen_counts_g, mask_g) = (
            read_ptr(&bias_ids, &stream),
            read_ptr(&banned_ids, &stream),
            read_ptr(&penalty_ids, &stream),
            read_ptr(&penalty_counts, &stream),
            read_ptr(&mask_words, &stream),
        );
        let bias_values_g = read_ptr(&bias_values, &stream);
        let addr = |g: &Option<(u64, SyncOnDrop<'_>)>| g.as_ref().map_or(0, |(p, _)| *p);
        let (work_ptr, _g2) = work.device_ptr_mut(&stream);
        let (tokens_ptr, _g3) = tokens.device_ptr_mut(&stream);
        let (lp_ptr, _g4) = token_logprobs.device_ptr_mut(&stream);
        let (top_ids_ptr, _g5) = top_ids.device_ptr_mut(&stream);
        let (top_lp_ptr, _g6) = top_logprobs.device_ptr_mut(&stream);
        let args = SampleArgs {
            logits: logits_ptr,
            logits_row_stride: vocab,
            vocab,
            rows,
            row_params: row_ptr,
            bias_ids: addr(&bias_ids_g),
            bias_values: addr(&bias_values_g),
            banned_ids: addr(&banned_g),
            penalty_ids: addr(&pen_ids_g),
            penalty_counts: addr(&pen_counts_g),
            mask_words: addr(&mask_g),
            work: work_ptr,
            tokens: tokens_ptr,
            token_logprobs: lp_ptr,
            top_ids: top_ids_ptr,
            top_logprobs: top_lp_ptr,
            max_logprobs: k,
        };
        if let Some(l) = launch::sample(&args)? {
            super::device::launch(dev, &l)?;
        }
    }
    let mut out = DeviceSampleOutput {
        tokens: dev.clone_dtoh(&tokens)?,
        token_logprobs: dev.clone_dtoh(&token_logprobs)?,
        ..Default::default()
    };
    if k > 0 {
        out.top_ids = dev.clone_dtoh(&top_ids)?;
        out.top_logprobs = dev.clone_dtoh(&top_logprobs)?;
    }
    Ok(out)
}

//! Sampling on the GPU: a step's logits stay on the device, the batch's sampling requests go
//! up as a plan (`pagoda_engine::device_sampling`), and only token ids and requested logprobs
//! come back (`pagoda_ops::sample_on_device`, kernels/sampling.cu). Same semantics as the CPU
//! sampler; the runner uses it on CUDA for steps without proposed tokens to verify.

use candle_core::Tensor;
use pagoda_engine::device_sampling::DeviceSamplingPlan;
use pagoda_engine::sampler::SampleError;
use pagoda_engine::{ExecutorError, SampledToken, ScheduledBatch, TokenLogprob, TopLogprobs};
use pagoda_ops::{sample_on_device, DeviceSampleInput, DeviceSampleOutput};

/// Runs `plan` over `logits` (one row per planned request) on their CUDA device.
pub fn sample_plan(logits: &Tensor, plan: &DeviceSamplingPlan) -> candle_core::Result<DeviceSampleOutput> {
    let row_bytes = plan.row_bytes();
    let input = DeviceSampleInput {
        row_bytes: &row_bytes,
        bias_ids: &plan.bias_ids,
        bias_values: &plan.bias_values,
        banned_ids: &plan.banned_ids,
        penalty_ids: &plan.penalty_ids,
        penalty_counts: &plan.penalty_counts,
        mask_words: &plan.mask_words,
        max_logprobs: plan.max_logprobs,
    };
    sample_on_device(logits, &input)
}

/// One token per sequence of `batch` that asked for one, from `logits` (one row each, in
/// batch order). `None` when a request cannot be planned (a failed grammar mask): the CPU
/// sampler then reports it against its sequence.
pub(crate) fn sample_batch(
    batch: &ScheduledBatch,
    logits: &Tensor,
) -> Result<Option<Vec<SampledToken>>, ExecutorError> {
    let failed = |e: candle_core::Error| ExecutorError::Execution(format!("device sampler: {e}"));
    let (_, vocab) = logits.dims2().map_err(failed)?;
    let wanted: Vec<_> = batch.seqs.iter().filter_map(|s| Some((s.seq_id, s.sample.as_ref()?))).collect();
    let Ok(plan) = DeviceSamplingPlan::build(wanted.iter().map(|&(_, req)| req), vocab) else {
        return Ok(None);
    };
    let out = sample_plan(logits, &plan).map_err(failed)?;
    let k = plan.max_logprobs;
    wanted
        .iter()
        .enumerate()
        .map(|(r, &(seq_id, req))| {
            let token = out.tokens[r];
            if token == u32::MAX {
                return Err(ExecutorError::InvalidSequence {
                    seq_id,
                    message: SampleError::NoCandidate.to_string(),
                });
            }
            let logprobs = req.params.logprobs.map(|n| {
                let top = (0..n.min(vocab))
                    .map(|j| TokenLogprob {
                        token_id: out.top_ids[r * k + j],
                        logprob: out.top_logprobs[r * k + j],
                    })
                    .collect();
                vec![TopLogprobs {
                    sampled: TokenLogprob { token_id: token, logprob: out.token_logprobs[r] },
                    top,
                }]
            });
            Ok(SampledToken { seq_id, token_ids: vec![token], logprobs, drafted: Vec::new() })
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

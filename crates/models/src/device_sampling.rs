//! Sampling on the GPU: a step's logits stay on the device, the batch's sampling requests go
//! up as a plan (`pagoda_engine::device_sampling`), and only token ids and requested logprobs
//! come back (`pagoda_ops::sample_on_device`, kernels/sampling.cu). Same semantics as the CPU
//! sampler; the runner uses it for every CUDA step, speculative verification included (every
//! proposed position is drawn in the same launch, and the host keeps the accepted prefix).

use candle_core::Tensor;
use pagoda_engine::device_sampling::DeviceSamplingPlan;
use pagoda_engine::sampler::SampleError;
use pagoda_engine::speculative::{kept, position_requests};
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

/// The tokens of every sequence of `batch` that asked for some, from `logits` (its
/// [`num_logits_rows`](pagoda_engine::ScheduledSeq::num_logits_rows) rows each, in batch order).
/// A sequence with proposals gets one row per position, drawn with that position's request
/// ([`position_requests`]), and keeps the drafts up to the first draw that differs ([`kept`]):
/// the CPU's [`verify`](pagoda_engine::speculative::verify) given the same logits, with only ids
/// and logprobs coming back. `None` when a request cannot be planned (a failed grammar mask, a
/// missing draft mask): the CPU path then reports it against its sequence.
pub fn sample_batch(
    batch: &ScheduledBatch,
    logits: &Tensor,
) -> Result<Option<Vec<SampledToken>>, ExecutorError> {
    let failed = |e: candle_core::Error| ExecutorError::Execution(format!("device sampler: {e}"));
    let (_, vocab) = logits.dims2().map_err(failed)?;
    let mut wanted = Vec::new();
    let mut requests = Vec::new();
    for s in &batch.seqs {
        let Some(req) = s.sample.as_ref() else { continue };
        let Ok(positions) = position_requests(req, s.draft_tokens()) else { return Ok(None) };
        wanted.push((s, req, requests.len()));
        requests.extend(positions);
    }
    let Ok(plan) = DeviceSamplingPlan::build(&requests, vocab) else {
        return Ok(None);
    };
    let out = sample_plan(logits, &plan).map_err(failed)?;
    let k = plan.max_logprobs;
    wanted
        .iter()
        .map(|&(seq, req, first)| {
            let drafts = seq.draft_tokens();
            let drawn = &out.tokens[first..first + drafts.len() + 1];
            let n = kept(drawn, drafts);
            if drawn[..n].contains(&u32::MAX) {
                return Err(ExecutorError::InvalidSequence {
                    seq_id: seq.seq_id,
                    message: SampleError::NoCandidate.to_string(),
                });
            }
            let logprobs = req.params.logprobs.map(|num| {
                (first..first + n)
                    .map(|r| TopLogprobs {
                        sampled: TokenLogprob { token_id: out.tokens[r], logprob: out.token_logprobs[r] },
                        top: (0..num.min(vocab))
                            .map(|j| TokenLogprob {
                                token_id: out.top_ids[r * k + j],
                                logprob: out.top_logprobs[r * k + j],
                            })
                            .collect(),
                    })
                    .collect()
            });
            let (token_ids, proposals) = (drawn[..n].to_vec(), Vec::new());
            Ok(SampledToken { seq_id: seq.seq_id, token_ids, logprobs, proposals })
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

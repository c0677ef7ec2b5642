//! The device sampler (kernels/sampling.cu) on the kernel simulator, through the launch the
//! CUDA path makes, against the engine's CPU sampler on the same logits and requests: the same
//! token for every row (or the same refusal), the same top-logprob ids and the same logprobs
//! to rounding. Requests mix greedy and sampled rows with every filter, penalties over random
//! histories, logit bias (finite and +inf), bans, grammar masks (some shorter than the
//! vocabulary) and logprobs; logits mix ties, NaN, -inf and rows with nothing left to draw.

use std::collections::HashMap;
use std::sync::Arc;

use pagoda_engine::device_sampling::DeviceSamplingPlan;
use pagoda_engine::sampler::{SampleError, Sampler};
use pagoda_engine::{MaskSlot, SampleRequest, SamplingParams, TokenMask, TopLogprobs};
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};

use super::launch::{self, SampleArgs};
use super::sim;

const NO_TOKEN: u32 = u32::MAX;

struct DeviceOutput {
    tokens: Vec<u32>,
    token_logprobs: Vec<f32>,
    top_ids: Vec<u32>,
    top_logprobs: Vec<f32>,
}

fn addr<T>(v: &mut [T]) -> u64 {
    if v.is_empty() {
        0
    } else {
        v.as_mut_ptr() as u64
    }
}

/// Runs the plan on the simulator over `logits` (rows `stride` apart), outputs poisoned first.
fn sample_on_sim(logits: &[f32], stride: usize, vocab: usize, plan: &DeviceSamplingPlan) -> DeviceOutput {
    let rows = plan.rows.len();
    let mut logits = logits.to_vec();
    let mut row_bytes = plan.row_bytes();
    let mut plan = plan.clone();
    let mut work = vec![f32::NAN; rows * vocab];
    let k = plan.max_logprobs;
    let mut out = DeviceOutput {
        tokens: vec![0xDEAD_BEEF; rows],
        token_logprobs: vec![f32::NAN; rows],
        top_ids: vec![0xDEAD_BEEF; rows * k],
        top_logprobs: vec![f32::NAN; rows * k],
    };
    let args = SampleArgs {
        logits: addr(&mut logits),
        logits_row_stride: stride,
        vocab,
        rows,
        row_params: addr(&mut row_bytes),
        bias_ids: addr(&mut plan.bias_ids),
        bias_values: addr(&mut plan.bias_values),
        banned_ids: addr(&mut plan.banned_ids),
        penalty_ids: addr(&mut plan.penalty_ids),
        penalty_counts: addr(&mut plan.penalty_counts),
        mask_words: addr(&mut plan.mask_words),
        work: addr(&mut work),
        tokens: addr(&mut out.tokens),
        token_logprobs: addr(&mut out.token_logprobs),
        top_ids: addr(&mut out.top_ids),
        top_logprobs: addr(&mut out.top_logprobs),
        max_logprobs: k,
    };
    if let Some(l) = launch::sample(&args).unwrap() {
        sim::run(&l).unwrap_or_else(|e| panic!("{e}"));
    }
    out
}

fn random_logits(rng: &mut StdRng, vocab: usize, style: usize) -> Vec<f32> {
    let mut row: Vec<f32> = (0..vocab)
        .map(|_| {
            let x = rng.random_range(-6.0f32..6.0) + rng.random_range(-6.0f32..6.0);
            match style {
                // Coarse values: many exact ties, broken by id.
                1 => (x * 2.0).round() / 2.0,
                // A peaked distribution, as trained models give.
                2 => x * 3.0,
                _ => x,
            }
        })
        .collect();
    for _ in 0..rng.random_range(0..4) {
        let i = rng.random_range(0..vocab);
        row[i] = if rng.random_bool(0.5) { f32::NAN } else { f32::NEG_INFINITY };
    }
    match style {
        3 => row.fill(f32::NEG_INFINITY),
        4 => row.fill(f32::NAN),
        _ => {}
    }
    row
}

fn random_request(rng: &mut StdRng, vocab: usize) -> SampleRequest {
    let greedy = rng.random_bool(0.25);
    let mut params = SamplingParams {
        temperature: if greedy { 0.0 } else { *[0.3f32, 0.8, 1.0, 1.7].choose(rng).unwrap() },
        top_k: *[0, 0, 1, 5, 40, vocab + 3].choose(rng).unwrap(),
        top_p: *[1.0f32, 1.0, 0.95, 0.5, 0.05].choose(rng).unwrap(),
        min_p: *[0.0f32, 0.0, 0.05, 0.3].choose(rng).unwrap(),
        logprobs: if rng.random_bool(0.4) { Some(rng.random_range(0..=5)) } else { None },
        ..Default::default()
    };
    if rng.random_bool(0.4) {
        params.repetition_penalty = *[0.8f32, 1.3].choose(rng).unwrap();
    }
    if rng.random_bool(0.4) {
        params.frequency_penalty = rng.random_range(-1.0..1.5);
        params.presence_penalty = rng.random_range(-1.0..1.5);
    }
    if rng.random_bool(0.3) {
        let mut bias = HashMap::new();
        for _ in 0..rng.random_range(1..6) {
            let id = rng.random_range(0..vocab as u32 + 10);
            bias.insert(id, *[-100.0f32, -2.5, 3.0, 8.0].choose(rng).unwrap());
        }
        if rng.random_bool(0.1) {
            bias.insert(rng.random_range(0..vocab as u32), f32::INFINITY);
        }
        params.logit_bias = bias;
    }
    let history_len = rng.random_range(0..60);
    let history: Vec<u32> = (0..history_len)
        .map(|_| {
            if rng.random_bool(0.7) {
                rng.random_range(0..40)
            } else {
                rng.random_range(0..vocab as u32 + 5)
            }
        })
        .collect();
    let allowed = rng.random_bool(0.25).then(|| {
        // Some masks stop short of the vocabulary: ids past them are refused.
        let len = if rng.random_bool(0.3) { vocab / 2 } else { vocab };
        let mut mask = TokenMask::new(len);
        let density = *[0.01, 0.3, 0.9].choose(rng).unwrap();
        for id in 0..len as u32 {
            if rng.random_bool(density) {
                mask.allow(id);
            }
        }
        let slot = MaskSlot::new();
        slot.fill(Ok(mask));
        slot
    });
    SampleRequest {
        params: Arc::new(params),
        seed: rng.random(),
        output_index: rng.random_range(0..1000),
        prompt_len: rng.random_range(0..=history_len),
        history: Some(Arc::from(history)),
        banned_token_ids: (0..rng.random_range(0..3))
            .map(|_| rng.random_range(0..vocab as u32 + 3))
            .collect(),
        allowed,
        draft_masks: Vec::new(),
        draft_grammar: None,
    }
}

fn close(got: f32, want: f32) -> bool {
    got == want || (got - want).abs() <= 1e-5 * want.abs().max(1.0)
}

/// Checks row `r` of the device's output against the CPU sampler's answer.
fn check_row(r: usize, out: &DeviceOutput, k: usize, cpu: Result<(u32, Option<TopLogprobs>), SampleError>) {
    match cpu {
        Err(SampleError::NoCandidate) => {
            assert_eq!(out.tokens[r], NO_TOKEN, "row {r}: the CPU found no candidate")
        }
        Err(e) => panic!("row {r}: CPU sampler failed: {e}"),
        Ok((token, logprobs)) => {
            assert_eq!(out.tokens[r], token, "row {r}: device and CPU tokens differ");
            if let Some(lp) = logprobs {
                assert_eq!(lp.sampled.token_id, token);
                assert!(
                    close(out.token_logprobs[r], lp.sampled.logprob),
                    "row {r}: sampled logprob {} vs {}",
                    out.token_logprobs[r],
                    lp.sampled.logprob
                );
                for (j, want) in lp.top.iter().enumerate() {
                    assert_eq!(out.top_ids[r * k + j], want.token_id, "row {r}: top logprob {j}");
                    assert!(
                        close(out.top_logprobs[r * k + j], want.logprob),
                        "row {r}: top logprob {j} value"
                    );
                }
            }
        }
    }
}

fn compare_with_cpu(seed: u64, vocab: usize, rows: usize) {
    let mut rng = StdRng::seed_from_u64(seed);
    let stride = vocab + 7;
    let mut logits = vec![f32::NAN; rows * stride];
    let mut requests = Vec::new();
    for r in 0..rows {
        let style = if r < 2 { 3 + r } else { rng.random_range(0..3) };
        logits[r * stride..r * stride + vocab].copy_from_slice(&random_logits(&mut rng, vocab, style));
        requests.push(random_request(&mut rng, vocab));
    }
    let plan = DeviceSamplingPlan::build(&requests, vocab).unwrap();
    let out = sample_on_sim(&logits, stride, vocab, &plan);
    let mut sampler = Sampler::new();
    let mut drawn = 0;
    for (r, req) in requests.iter().enumerate() {
        let mut row = logits[r * stride..r * stride + vocab].to_vec();
        let cpu = sampler.sample(&mut row, req);
        drawn += usize::from(cpu.is_ok() && !req.params.is_greedy());
        check_row(r, &out, plan.max_logprobs, cpu);
    }
    assert!(drawn >= rows / 3, "only {drawn} of {rows} rows were drawn");
}

#[test]
fn device_sampler_matches_the_cpu_sampler() {
    // Below, at and past one thread per id, vocabularies that are no multiple of 32.
    for (seed, vocab, rows) in [(1, 100, 40), (2, 1537, 48), (3, 4096, 24)] {
        compare_with_cpu(seed, vocab, rows);
    }
}

#[test]
fn plain_greedy_rows_read_only_the_logits() {
    let mut rng = StdRng::seed_from_u64(9);
    let vocab = 700;
    let rows = 6;
    let mut logits: Vec<f32> = (0..rows * vocab).map(|_| rng.random_range(-3.0f32..3.0).round()).collect();
    logits[vocab + 5] = f32::NAN; // NaN never wins
    logits[2 * vocab..3 * vocab].fill(f32::NEG_INFINITY);
    let requests: Vec<SampleRequest> = (0..rows).map(|_| SampleRequest::greedy()).collect();
    let plan = DeviceSamplingPlan::build(&requests, vocab).unwrap();
    assert!(plan.all_plain_greedy());
    let out = sample_on_sim(&logits, vocab, vocab, &plan);
    for r in 0..rows {
        let mut row = logits[r * vocab..(r + 1) * vocab].to_vec();
        check_row(r, &out, 0, Sampler::new().sample(&mut row, &requests[r]));
    }
}

#[test]
fn draws_follow_the_seeded_uniform_across_the_distribution() {
    // One logits row drawn with many seeds: every draw equals the CPU's, and together they
    // cover the top of the distribution (a descent that always picked one end would not).
    let vocab = 300;
    let mut rng = StdRng::seed_from_u64(4);
    let row: Vec<f32> = (0..vocab).map(|_| rng.random_range(-2.0f32..2.0)).collect();
    let rows = 64;
    let logits: Vec<f32> = (0..rows).flat_map(|_| row.iter().copied()).collect();
    let params = Arc::new(SamplingParams { temperature: 1.0, top_p: 0.9, ..Default::default() });
    let requests: Vec<SampleRequest> = (0..rows)
        .map(|i| SampleRequest {
            params: params.clone(),
            seed: 77,
            output_index: i,
            ..SampleRequest::greedy()
        })
        .collect();
    let plan = DeviceSamplingPlan::build(&requests, vocab).unwrap();
    let out = sample_on_sim(&logits, vocab, vocab, &plan);
    for (r, req) in requests.iter().enumerate() {
        check_row(r, &out, 0, Sampler::new().sample(&mut row.clone(), req));
    }
    let distinct: std::collections::HashSet<u32> = out.tokens.iter().copied().collect();
    assert!(distinct.len() > 20, "{} distinct tokens in 64 draws", distinct.len());
}

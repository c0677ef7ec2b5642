//! The device sampler (`pagoda_models::device_sampling::sample_plan`) against the engine's CPU sampler on the
//! same logits: every token equal, logprobs equal to rounding, at Llama-3-sized and
//! SmolLM2-sized vocabularies over a mix of requests; speculative verification on the device
//! (`sample_batch` with proposals) against the CPU's `verify`; then its time per step, greedy
//! (the one-read fast path) and sampled with top-p, at 1, 32 and 128 rows.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Result;
use candle_core::{Device, Tensor};
use pagoda_engine::device_sampling::DeviceSamplingPlan;
use pagoda_engine::sampler::Sampler;
use pagoda_engine::speculative::try_verify;
use pagoda_engine::{BlockTableUpdate, SampleRequest, SamplingParams, ScheduledBatch, ScheduledSeq};
use pagoda_gpu_check::report::Report;
use pagoda_gpu_check::timing::median;
use pagoda_models::device_sampling::{sample_batch, sample_plan};
use rand::rngs::StdRng;
use rand::Rng;

const SECTION: &str = "ops";

/// Request `i` of a batch: greedy, greedy with logprobs, top-p, top-k, min-p with penalties,
/// and a repetition penalty with logit bias, in turn.
fn request(rng: &mut StdRng, i: usize, vocab: usize) -> SampleRequest {
    let mut p = SamplingParams::default();
    match i % 6 {
        0 => {}
        1 => p.logprobs = Some(5),
        2 => (p.temperature, p.top_p) = (0.8, 0.95),
        3 => (p.temperature, p.top_k, p.logprobs) = (1.0, 50, Some(2)),
        4 => (p.temperature, p.min_p, p.frequency_penalty, p.presence_penalty) = (0.7, 0.05, 0.4, 0.2),
        _ => {
            (p.temperature, p.repetition_penalty) = (1.2, 1.3);
            p.logit_bias = HashMap::from([(rng.random_range(0..vocab as u32), 5.0), (7, -100.0)]);
        }
    }
    let history: Vec<u32> = (0..200).map(|_| rng.random_range(0..vocab as u32)).collect();
    SampleRequest {
        params: Arc::new(p),
        seed: rng.random(),
        output_index: i,
        prompt_len: 150,
        history: Some(Arc::from(history)),
        ..SampleRequest::greedy()
    }
}

fn random_logits(rng: &mut StdRng, rows: usize, vocab: usize) -> Vec<f32> {
    (0..rows * vocab)
        .map(|_| (rng.random_range(-1.0f32..1.0) + rng.random_range(-1.0f32..1.0)) * 6.0)
        .collect()
}

fn compare(rng: &mut StdRng, gpu: &Device, vocab: usize, report: &mut Report) -> Result<()> {
    let rows = 60;
    let host = random_logits(rng, rows, vocab);
    let logits = Tensor::from_slice(&host, (rows, vocab), gpu)?;
    let requests: Vec<SampleRequest> = (0..rows).map(|i| request(rng, i, vocab)).collect();
    let plan = DeviceSamplingPlan::build(&requests, vocab)?;
    let out = sample_plan(&logits, &plan)?;
    let (mut mismatches, mut worst) = (0, 0f64);
    let mut sampler = Sampler::new();
    for (r, req) in requests.iter().enumerate() {
        let mut row = host[r * vocab..(r + 1) * vocab].to_vec();
        let (token, logprobs) = sampler.sample(&mut row, req)?;
        mismatches += usize::from(out.tokens[r] != token);
        if let Some(lp) = logprobs {
            worst = worst.max(f64::from((out.token_logprobs[r] - lp.sampled.logprob).abs()));
            for (j, want) in lp.top.iter().enumerate() {
                let at = r * plan.max_logprobs + j;
                mismatches += usize::from(out.top_ids[at] != want.token_id);
                worst = worst.max(f64::from((out.top_logprobs[at] - want.logprob).abs()));
            }
        }
    }
    report.expect(
        SECTION,
        &format!("sampler vocab {vocab}: tokens and top ids equal the CPU sampler's ({rows} mixed rows)"),
        mismatches == 0,
        format!("{mismatches} differ"),
    );
    report.at_most(SECTION, &format!("sampler vocab {vocab}: logprob abs error"), worst, 1e-4);
    Ok(())
}

/// A batch of 24 sequences with 0-8 proposals each (the mixed requests above), verified on the
/// device in one sampler call and on the CPU by `verify`, over the same logits. Half the
/// proposals copy each row's largest logit, so greedy rows accept some and sampled rows a few;
/// the first proposal of the plain greedy ones always does, so every run has some accepted
/// (with the clock's seed, all-random first drafts failed about one run in thirty).
fn compare_verification(rng: &mut StdRng, gpu: &Device, vocab: usize, report: &mut Report) -> Result<()> {
    let mut seqs = Vec::new();
    let mut host = Vec::new();
    for i in 0..24 {
        let drafts_len = i % 9;
        let rows = random_logits(rng, drafts_len + 1, vocab);
        let argmax = |r: usize| {
            let row = &rows[r * vocab..(r + 1) * vocab];
            (0..vocab).max_by(|&a, &b| row[a].total_cmp(&row[b])).unwrap_or(0) as u32
        };
        let drafts: Vec<u32> = (0..drafts_len)
            .map(|d| {
                let copy = rng.random_bool(0.5) || (d == 0 && i % 6 < 2);
                if copy {
                    argmax(d)
                } else {
                    rng.random_range(0..vocab as u32)
                }
            })
            .collect();
        host.extend_from_slice(&rows);
        seqs.push(ScheduledSeq {
            seq_id: i as u64,
            token_ids: [&[1u32][..], &drafts].concat(),
            start_pos: 0,
            block_table_update: BlockTableUpdate::default(),
            sample: Some(request(rng, i, vocab)),
            num_draft_tokens: drafts_len,
            num_to_draft: 0,
            pool: false,
            second_segment: None,
            lora: None,
            prompt_logprobs: None,
        });
    }
    let rows = host.len() / vocab;
    let logits = Tensor::from_slice(&host, (rows, vocab), gpu)?;
    let batch = ScheduledBatch { seqs, ..ScheduledBatch::default() };
    let device =
        sample_batch(&batch, &logits)?.ok_or_else(|| anyhow::anyhow!("the batch could not be planned"))?;
    let (mut mismatches, mut accepted, mut first) = (0, 0, 0);
    for (seq, got) in batch.seqs.iter().zip(&device) {
        let n = seq.num_logits_rows();
        let seq_rows = (first..first + n).map(|r| host[r * vocab..(r + 1) * vocab].to_vec());
        first += n;
        let (tokens, _) = try_verify(seq_rows, seq.sample.as_ref().expect("sampled"), seq.draft_tokens())?;
        mismatches += usize::from(got.token_ids != tokens);
        accepted += tokens.len() - 1;
    }
    report.expect(
        SECTION,
        &format!("speculative verification vocab {vocab}: the device keeps the CPU's tokens (24 sequences, {rows} rows)"),
        mismatches == 0 && accepted > 0,
        format!("{mismatches} sequences differ, {accepted} proposals accepted"),
    );
    Ok(())
}

/// Median milliseconds of one sampler call (upload, kernel, copy back) over `rows` rows.
fn time_rows(
    rng: &mut StdRng,
    gpu: &Device,
    rows: usize,
    vocab: usize,
    params: &SamplingParams,
) -> Result<f64> {
    let logits = Tensor::from_vec(random_logits(rng, rows, vocab), (rows, vocab), gpu)?;
    let params = Arc::new(params.clone());
    let requests: Vec<SampleRequest> = (0..rows)
        .map(|i| SampleRequest { params: params.clone(), output_index: i, ..SampleRequest::greedy() })
        .collect();
    let plan = DeviceSamplingPlan::build(&requests, vocab)?;
    sample_plan(&logits, &plan)?;
    let mut times: Vec<f64> = (0..10)
        .map(|_| {
            let t = Instant::now();
            sample_plan(&logits, &plan).map(|_| t.elapsed().as_secs_f64() * 1e3).map_err(Into::into)
        })
        .collect::<Result<_>>()?;
    Ok(median(&mut times))
}

pub fn run(rng: &mut StdRng, gpu: &Device, report: &mut Report) -> Result<()> {
    for vocab in [49152, 128256] {
        compare(rng, gpu, vocab, report)?;
        compare_verification(rng, gpu, vocab, report)?;
    }
    let sampled =
        |temperature, top_k, top_p| SamplingParams { temperature, top_k, top_p, ..Default::default() };
    let cases = [
        ("greedy", SamplingParams::default()),
        ("temperature 1 (the OpenAI defaults)", sampled(1.0, 0, 1.0)),
        ("temperature 0.8, top-k 50", sampled(0.8, 50, 1.0)),
        ("temperature 0.8, top-p 0.95", sampled(0.8, 0, 0.95)),
    ];
    for (what, params) in &cases {
        let times = [1, 32, 128]
            .iter()
            .map(|&rows| Ok(format!("{rows} rows {:.3} ms", time_rows(rng, gpu, rows, 128256, params)?)))
            .collect::<Result<Vec<_>>>()?;
        report.info(SECTION, &format!("sampler time, vocab 128256, {what}"), times.join(", "));
    }
    Ok(())
}

//! The whole default model on CUDA against the CPU. Three prompts run together through the
//! model runner in mixed batches (one prompt joins while the others decode); the CPU (f32)
//! generates 64 greedy tokens each. CUDA then runs the same batches fed the CPU's tokens
//! (teacher forcing), and at every step its greedy choice is compared with the CPU's, so one
//! early near-tie does not count as 63 disagreements. Checked in f32 and in bf16 (the
//! server's default on CUDA) on dequantized weights, and in bf16 with the GGUF's blocks kept on
//! the device (`--dequantize false`: our quantized matmul).

use std::path::Path;

use anyhow::{Context, Result};
use candle_core::{DType, Device};
use pagoda_engine::{BlockTableUpdate, SampleRequest, ScheduledBatch, ScheduledSeq};
use pagoda_gpu_check::compare::{agreement, argmax};
use pagoda_gpu_check::report::Report;
use pagoda_models::{load_model, KvCache, LoadOptions, ModelRunner};
use pagoda_text::Tokenizer;

const SECTION: &str = "model";
const STEPS: usize = 64;
const BLOCK_SIZE: usize = 16;
/// Step at which each prompt joins the batch.
const JOIN_AT: [usize; 3] = [0, 0, 5];
const PROMPTS: [&str; 3] = [
    "The capital of France is",
    "Here is a short story about a lighthouse keeper who finds a message in a bottle:",
    "def fibonacci(n):",
];

fn runner(
    model: &Path,
    device: &Device,
    dtype: DType,
    dequantize: bool,
    max_tokens: usize,
) -> Result<ModelRunner> {
    let options =
        LoadOptions { device: device.clone(), dtype, dequantize: Some(dequantize), ..LoadOptions::default() };
    let loaded = load_model(model, &options).with_context(|| format!("loading {}", model.display()))?;
    let blocks = PROMPTS.len() * max_tokens.div_ceil(BLOCK_SIZE);
    let cache = KvCache::new(loaded.model.config(), blocks, BLOCK_SIZE, dtype, device)?;
    Ok(ModelRunner::new(loaded.model, cache, device.clone())?)
}

/// Runs the prompts for STEPS greedy steps each. With `forced`, each sequence is extended by
/// the given tokens instead of its own choices. Returns every sequence's choice per step.
fn run_schedule(
    runner: &mut ModelRunner,
    prompts: &[Vec<u32>],
    forced: Option<&[Vec<u32>]>,
    max_tokens: usize,
) -> Result<Vec<Vec<u32>>> {
    let blocks_per_seq = max_tokens.div_ceil(BLOCK_SIZE);
    let mut tokens: Vec<Vec<u32>> = prompts.to_vec();
    let mut computed = vec![0usize; prompts.len()];
    let mut chosen: Vec<Vec<u32>> = vec![Vec::new(); prompts.len()];
    let mut step = 0;
    while chosen.iter().any(|c| c.len() < STEPS) {
        let mut seqs = Vec::new();
        let mut members = Vec::new();
        for (i, toks) in tokens.iter().enumerate() {
            if step < JOIN_AT[i] || chosen[i].len() >= STEPS {
                continue;
            }
            let first = (i * blocks_per_seq) as u32;
            let end = toks.len();
            seqs.push(ScheduledSeq {
                seq_id: i as u64,
                token_ids: toks[computed[i]..end].to_vec(),
                start_pos: computed[i],
                // The GPU runs models without sliding windows: one KV group.
                block_table_update: BlockTableUpdate::replace(vec![(first
                    ..first + end.div_ceil(BLOCK_SIZE) as u32)
                    .collect()]),
                sample: Some(SampleRequest::greedy()),
                num_draft_tokens: 0,
                num_to_draft: 0,
                pool: false,
                second_segment: None,
                lora: None,
                prompt_logprobs: None,
            });
            members.push(i);
        }
        let logits =
            runner.logits(&ScheduledBatch { seqs, ..ScheduledBatch::default() })?.to_vec2::<f32>()?;
        for (row, &i) in logits.iter().zip(&members) {
            computed[i] = tokens[i].len();
            let choice = argmax(row);
            let next = match forced {
                Some(f) => f[i][chosen[i].len()],
                None => choice,
            };
            chosen[i].push(choice);
            tokens[i].push(next);
        }
        step += 1;
    }
    Ok(chosen)
}

pub fn run(model: &Path, gpu: &Device, report: &mut Report) -> Result<()> {
    let tokenizer = Tokenizer::from_gguf(model)?;
    let prompts: Vec<Vec<u32>> =
        PROMPTS.iter().map(|p| tokenizer.encode(p, true)).collect::<Result<_, _>>()?;
    let max_tokens = prompts.iter().map(Vec::len).max().unwrap_or(0) + STEPS + 1;

    let mut cpu = runner(model, &Device::Cpu, DType::F32, true, max_tokens)?;
    let reference = run_schedule(&mut cpu, &prompts, None, max_tokens)?;
    drop(cpu);
    for (i, toks) in reference.iter().enumerate() {
        let text = tokenizer.decode(toks, true).unwrap_or_default();
        let shown: String = text.chars().take(50).collect::<String>().replace('\n', " ");
        report.info(SECTION, &format!("CPU f32 continuation {i}"), format!("{shown:?}"));
    }

    for (dtype, dequantize) in [(DType::F32, true), (DType::BF16, true), (DType::BF16, false)] {
        let weights = if dequantize { "" } else { ", GGUF blocks on the device" };
        let check = format!(
            "greedy agreement with the CPU, CUDA {dtype:?}{weights}, {} x {STEPS} steps",
            PROMPTS.len()
        );
        let result = runner(model, gpu, dtype, dequantize, max_tokens)
            .and_then(|mut r| run_schedule(&mut r, &prompts, Some(&reference), max_tokens));
        match result {
            Ok(chosen) => {
                let (a, b): (Vec<u32>, Vec<u32>) = (reference.concat(), chosen.concat());
                report.at_least(SECTION, &check, agreement(&b, &a), 0.95, "");
                // Also how far each sequence runs before its first disagreement.
                let prefix: Vec<usize> = reference
                    .iter()
                    .zip(&chosen)
                    .map(|(r, c)| r.iter().zip(c).take_while(|(x, y)| x == y).count())
                    .collect();
                report.info(
                    SECTION,
                    &format!("steps before the first disagreement, CUDA {dtype:?}{weights}"),
                    format!("{prefix:?}"),
                );
            }
            Err(e) => report.error(SECTION, &check, format!("{e:#}")),
        }
    }
    Ok(())
}

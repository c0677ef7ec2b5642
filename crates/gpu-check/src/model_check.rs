//! The whole default model on CUDA against the CPU. Three prompts run together through the
//! model runner in mixed batches (one prompt joins while the others decode); the CPU (f32)
//! generates 64 greedy tokens each. CUDA then runs the same batches fed the CPU's tokens
//! (teacher forcing), and at every step its greedy choice is compared with the CPU's, so one
//! early near-tie does not count as 63 disagreements. Checked in f32 and in bf16 (the
//! server's default on CUDA) on dequantized weights, and in bf16 with the GGUF's blocks kept on
//! the device (`--dequantize false`: our quantized matmul). The tiny checkpoints of every
//! architecture go through the same comparison ([`run_tiny`]).

use std::path::Path;

use crate::compare::{agreement, argmax};
use crate::report::Report;
use anyhow::{Context, Result};
use candle_core::{DType, Device};
use pagoda_engine::{BlockTableUpdate, SampleRequest, ScheduledBatch, ScheduledSeq};
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
    // Room for every prompt in each KV group (a page belongs to one group).
    let groups = pagoda_models::KvLayout::for_config(loaded.model.config()).num_groups();
    let blocks = groups * PROMPTS.len() * max_tokens.div_ceil(BLOCK_SIZE);
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
    let groups = runner.cache().layout().num_groups();
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
            let end = toks.len();
            // One table per KV group, each on blocks of its own; windowed groups keep every
            // block (their layers simply do not read the early ones).
            let tables = (0..groups)
                .map(|g| {
                    let first = ((g * prompts.len() + i) * blocks_per_seq) as u32;
                    (first..first + end.div_ceil(BLOCK_SIZE) as u32).collect()
                })
                .collect();
            seqs.push(ScheduledSeq {
                seq_id: i as u64,
                token_ids: toks[computed[i]..end].to_vec(),
                start_pos: computed[i],
                block_table_update: BlockTableUpdate::replace(tables),
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

/// The tiny random-weight checkpoints (tests/fixtures/tiny, packed as `DIR/<arch>.gguf`): every
/// architecture's whole forward pass on CUDA against the CPU, with the schedule above on
/// prompts of token ids. Their margins between top logits are small, so bf16 is held to a
/// lower agreement than f32.
pub fn run_tiny(dir: &Path, gpu: &Device, report: &mut Report) -> Result<()> {
    const TINY: &str = "tiny models";
    let mut models: Vec<_> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "gguf"))
        .collect();
    models.sort();
    anyhow::ensure!(!models.is_empty(), "no tiny checkpoints in {}", dir.display());
    for model in models {
        let name = model.file_stem().unwrap_or_default().to_string_lossy().into_owned();
        let vocab = load_model(&model, &LoadOptions::default())?.model.config().vocab_size as u64;
        // Three prompts of 7 to 40 ids spread over the vocabulary, the same on every run.
        let prompts: Vec<Vec<u32>> = [7u64, 40, 12]
            .iter()
            .enumerate()
            .map(|(p, &len)| (0..len).map(|t| ((t * 7919 + p as u64 * 104_729 + 3) % vocab) as u32).collect())
            .collect();
        let max_tokens = 40 + STEPS + 1;
        let mut cpu = runner(&model, &Device::Cpu, DType::F32, true, max_tokens)?;
        let reference = run_schedule(&mut cpu, &prompts, None, max_tokens)?;
        drop(cpu);
        for (dtype, least) in [(DType::F32, 0.98), (DType::BF16, 0.9)] {
            let check = format!("{name}: greedy agreement with the CPU, CUDA {dtype:?}");
            let result = runner(&model, gpu, dtype, true, max_tokens)
                .and_then(|mut r| run_schedule(&mut r, &prompts, Some(&reference), max_tokens));
            match result {
                Ok(chosen) => {
                    report.at_least(TINY, &check, agreement(&chosen.concat(), &reference.concat()), least, "")
                }
                Err(e) => report.error(TINY, &check, format!("{e:#}")),
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tiny section's schedule on the CPU against itself: Gemma 3's two KV groups and
    /// Qwen3-MoE run, and every check agrees fully (the CUDA comparison has the same shape).
    #[test]
    fn the_tiny_section_runs_every_kv_group_layout() {
        let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny");
        let dir = std::env::temp_dir().join(format!("pagoda-tiny-check-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for arch in ["gemma3_text", "qwen3_moe"] {
            std::fs::copy(fixtures.join(arch).join("model.gguf"), dir.join(format!("{arch}.gguf"))).unwrap();
        }
        let mut report = Report::new("cpu");
        run_tiny(&dir, &Device::Cpu, &mut report).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(report.checks(), 4, "{}", report.markdown());
        assert_eq!(report.failures(), 0, "{}", report.markdown());
    }
}

//! `--batch-invariant` on CUDA, on the default model in bf16: one sequence's logits must have
//! the same bits however its steps are built. Run 1 prefills the sequence alone and decodes
//! its last tokens one step each. Run 2 prefills it in two chunks beside another sequence's
//! prefill (the first step samples nothing: no logits rows), then verifies those tokens in one
//! speculative-shaped step (every position's logits) beside the other sequence's decode. Every
//! row must match bit for bit. The same two runs without the flag are reported (rows that
//! differ there show what the mode removes).

use std::path::Path;

use anyhow::{Context, Result};
use candle_core::{DType, Device};
use pagoda_engine::{BlockTableUpdate, SampleRequest, ScheduledBatch, ScheduledSeq};
use pagoda_gpu_check::report::Report;
use pagoda_models::{load_model, KernelPlan, KvCache, LoadOptions, ModelRunner};
use pagoda_text::Tokenizer;

const SECTION: &str = "invariance";
const BLOCK_SIZE: usize = 16;
/// Positions verified in run 2's last step (k = 9 proposals plus the bonus row): with the other
/// sequence's row, 11 rows, the skinny kernel's two-tile launch, where the decodes take one.
const VERIFIED: usize = 10;
const TEXT: &str = "Here is a short story about a lighthouse keeper who finds a message in a bottle. \
    The keeper had lived alone on the rock for eleven years, and every morning he walked the shore";
const OTHER: &str =
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n";

fn runner(model: &Path, gpu: &Device, batch_invariant: bool, blocks: usize) -> Result<ModelRunner> {
    let options = LoadOptions {
        device: gpu.clone(),
        dtype: DType::BF16,
        dequantize: Some(true),
        // On CUDA only the plan's batch-invariance applies (the row-invariant matmul).
        kernel_plan: if batch_invariant {
            KernelPlan::batch_invariant(pagoda_ops::PanelPrecision::F32)
        } else {
            KernelPlan::default()
        },
        ..LoadOptions::default()
    };
    let loaded = load_model(model, &options).with_context(|| format!("loading {}", model.display()))?;
    let cache = KvCache::new(loaded.model.config(), blocks, BLOCK_SIZE, DType::BF16, gpu)?;
    Ok(ModelRunner::new(loaded.model, cache, gpu.clone())?)
}

/// `tokens[start..end]` of sequence `id` (blocks from `first_block` on), with every position's
/// logits when `all_rows`, else the last one's.
fn chunk(
    id: u64,
    tokens: &[u32],
    start: usize,
    end: usize,
    first_block: u32,
    all_rows: bool,
) -> ScheduledSeq {
    ScheduledSeq {
        seq_id: id,
        token_ids: tokens[start..end].to_vec(),
        start_pos: start,
        block_table_update: BlockTableUpdate::replace(vec![(first_block
            ..first_block + end.div_ceil(BLOCK_SIZE) as u32)
            .collect()]),
        sample: Some(SampleRequest::greedy()),
        num_draft_tokens: if all_rows { end - start - 1 } else { 0 },
        num_to_draft: 0,
        pool: false,
        second_segment: None,
        lora: None,
        prompt_logprobs: None,
    }
}

/// Logits rows as f32 bits, `rows` of them starting at row `from`.
fn step(
    runner: &mut ModelRunner,
    seqs: Vec<ScheduledSeq>,
    from: usize,
    rows: usize,
) -> Result<Vec<Vec<u32>>> {
    let logits = runner.logits(&ScheduledBatch { seqs, ..ScheduledBatch::default() })?.to_vec2::<f32>()?;
    Ok(logits[from..from + rows].iter().map(|r| r.iter().map(|v| v.to_bits()).collect()).collect())
}

/// Rows of the last `VERIFIED` positions of `text`: run 1 (alone, one token a step) and run 2
/// (chunked beside `other`, then verified in one step).
fn both_runs(runner: &mut ModelRunner, text: &[u32], other: &[u32]) -> Result<[Vec<Vec<u32>>; 2]> {
    let n = text.len();
    let split = n - VERIFIED;
    let other_first = n.div_ceil(BLOCK_SIZE) as u32;
    let mut alone = step(runner, vec![chunk(0, text, 0, split + 1, 0, false)], 0, 1)?;
    for end in split + 2..=n {
        alone.extend(step(runner, vec![chunk(0, text, end - 1, end, 0, false)], 0, 1)?);
    }
    // Run 2 overwrites the same slots with the same K/V (same positions, same blocks).
    let (half, o) = (split / 2, other.len());
    let other_step = |end: usize| chunk(1, other, end - 1, end, other_first, false);
    // A first step of prefill chunks that sample nothing: no logits rows at all.
    let quiet = |mut s: ScheduledSeq| {
        s.sample = None;
        s
    };
    let first =
        vec![quiet(chunk(0, text, 0, half, 0, false)), quiet(chunk(1, other, 0, o - 2, other_first, false))];
    step(runner, first, 0, 0)?;
    step(runner, vec![other_step(o - 1), chunk(0, text, half, split, 0, false)], 0, 1)?;
    let verified = step(runner, vec![other_step(o), chunk(0, text, split, n, 0, true)], 1, VERIFIED)?;
    Ok([alone, verified])
}

pub fn run(model: &Path, gpu: &Device, report: &mut Report) -> Result<()> {
    let tokenizer = Tokenizer::from_gguf(model)?;
    let text = tokenizer.encode(TEXT, true)?;
    let other = tokenizer.encode(OTHER, true)?;
    anyhow::ensure!(text.len() > 2 * VERIFIED + 2 && other.len() > 3, "prompts too short");
    let blocks = (text.len() + other.len()).div_ceil(BLOCK_SIZE) + 2;
    for batch_invariant in [true, false] {
        let check = format!(
            "bf16 logits of {VERIFIED} positions: decoded alone vs verified in one step beside \
             another sequence ({} tokens), batch_invariant {batch_invariant}",
            text.len()
        );
        let result =
            runner(model, gpu, batch_invariant, blocks).and_then(|mut r| both_runs(&mut r, &text, &other));
        match result {
            Ok([alone, verified]) => {
                let differing = alone.iter().zip(&verified).filter(|(a, v)| a != v).count();
                let measured = format!("{differing} of {VERIFIED} rows differ");
                match batch_invariant {
                    true => report.expect(SECTION, &check, differing == 0, measured),
                    false => report.info(SECTION, &check, measured),
                }
            }
            Err(e) => report.error(SECTION, &check, format!("{e:#}")),
        }
    }
    Ok(())
}

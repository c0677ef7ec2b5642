//! Times one sequence's model step by number of verified positions, over the real model with
//! the server's CPU defaults, at a fixed context: the cost a speculative step adds per position.
//!
//!   cargo run --release -p pagoda-models --example step_time -- MODEL.gguf [ITERS] [CONTEXT] [POSITIONS...]
//!
//! A position count written `pN` times a prefill of N tokens from position 0 instead.

use std::time::Instant;

use candle_core::{DType, Device};
use pagoda_engine::{BlockTableUpdate, ModelExecutor, SampleRequest, ScheduledBatch, ScheduledSeq};
use pagoda_models::{load_model, resolve_kernel_plan, KernelRequest, KvCache, LoadOptions, ModelRunner};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let path = args
        .get(1)
        .ok_or_else(|| anyhow::anyhow!("usage: step_time MODEL [ITERS] [CONTEXT] [POSITIONS...]"))?;
    let iters: usize = args.get(2).map_or(Ok(200), |s| s.parse())?;
    let context: usize = args.get(3).map_or(Ok(220), |s| s.parse())?;
    let mut positions: Vec<String> = args[4.min(args.len())..].to_vec();
    if positions.is_empty() {
        positions = ["1", "2", "3", "5", "9"].map(String::from).to_vec();
    }
    // The plan `pagoda serve` resolves with its default flags.
    let mut options = LoadOptions::default();
    options.kernel_plan = resolve_kernel_plan(path.as_ref(), &options, KernelRequest::default())?.plan;
    eprintln!("kernel plan: {}", options.kernel_plan);
    let model = load_model(path.as_ref(), &options)?.model;
    let block_size = 16;
    let num_blocks = (context + 512).div_ceil(block_size);
    let cache = KvCache::new(model.config(), num_blocks, block_size, DType::F16, &Device::Cpu)?;
    let mut runner = ModelRunner::new(model, cache, Device::Cpu)?;
    let table: Vec<u32> = (0..num_blocks as u32).collect();
    let seq = |start: usize, len: usize| ScheduledSeq {
        seq_id: 1,
        token_ids: (0..len).map(|i| 100 + ((start + i) * 37 % 4000) as u32).collect(),
        start_pos: start,
        block_table_update: BlockTableUpdate::replace(vec![table.clone()]),
        sample: Some(SampleRequest::greedy()),
        num_draft_tokens: len - 1,
        num_to_draft: 0,
        pool: false,
        second_segment: None,
        lora: None,
        prompt_logprobs: None,
    };
    // The context, as a prefill in one step.
    let prefill = ScheduledSeq { num_draft_tokens: 0, ..seq(0, context) };
    runner.execute(&ScheduledBatch { seqs: vec![prefill], ..ScheduledBatch::default() })?;
    for arg in &positions {
        let (n, step) = match arg.strip_prefix('p') {
            Some(n) => {
                let n: usize = n.parse()?;
                (n, ScheduledSeq { num_draft_tokens: 0, ..seq(0, n) })
            }
            None => {
                let n: usize = arg.parse()?;
                (n, seq(context, n))
            }
        };
        let batch = ScheduledBatch { seqs: vec![step], ..ScheduledBatch::default() };
        for _ in 0..iters / 10 {
            runner.execute(&batch)?;
        }
        let mut times: Vec<f64> = (0..iters)
            .map(|_| {
                let t = Instant::now();
                runner.execute(&batch).map(|_| t.elapsed().as_secs_f64() * 1e3)
            })
            .collect::<Result<_, _>>()?;
        times.sort_by(f64::total_cmp);
        let q = |f: f64| times[((times.len() - 1) as f64 * f) as usize];
        println!("{arg:>4} ({n} tokens): median {:.3} ms (p10 {:.3}, p90 {:.3})", q(0.5), q(0.1), q(0.9));
    }
    Ok(())
}

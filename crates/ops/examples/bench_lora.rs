//! Rough timing of the CPU LoRA op over the projections of one model step at SmolLM2-135M's
//! widths (30 layers; hidden 576, k/v 192, MLP 1536), run inside a rayon pool as the model
//! runner runs a step: one row on one adapter (a 1-stream decode step) and 32 rows taking turns
//! at 4 adapters (a 32-stream decode step, every row its own segment), at rank 16 and 8; the
//! one row also on 4 adapters taking turns by step (matrices read from memory, not cache). Each
//! step either calls `lora_add` once per projection (7 per layer) or `lora_add_parts` with the
//! projections sharing an input together (Q/K/V and gate/up: 4 calls per layer).
//!
//! `lora_add_parts` also runs with the adapters' matrices in bfloat16 (an f32 model's adapter
//! kept in its file's bfloat16: half the bytes).
//!
//! Run: `cargo run --release -p pagoda-ops --example bench_lora [steps] [rows]` (rows: only the
//! steps of 1 or of 32 rows, for a profile).

use std::time::Instant;

use candle_core::{DType, Device, Result, Tensor};
use pagoda_ops::{lora_add, lora_add_parts, LoraPart, LoraSegment};

const LAYERS: usize = 30;
const HIDDEN: usize = 576;
const KV: usize = 192;
const FFN: usize = 1536;
/// (input, output) of q, k, v, o, gate, up, down.
const PROJECTIONS: [(usize, usize); 7] = [
    (HIDDEN, HIDDEN),
    (HIDDEN, KV),
    (HIDDEN, KV),
    (HIDDEN, HIDDEN),
    (HIDDEN, FFN),
    (HIDDEN, FFN),
    (FFN, HIDDEN),
];
/// Projections sharing their input, as the model groups them.
const GROUPS: [&[usize]; 4] = [&[0, 1, 2], &[3], &[4, 5], &[6]];

/// One adapter's `(a, b)` per layer and projection.
type Adapter = Vec<Vec<(Tensor, Tensor)>>;

fn adapter(rank: usize, dtype: DType) -> Result<Adapter> {
    let dev = &Device::Cpu;
    (0..LAYERS)
        .map(|_| {
            PROJECTIONS
                .iter()
                .map(|&(i, o)| {
                    Ok((
                        Tensor::randn(0f32, 0.05, (rank, i), dev)?.to_dtype(dtype)?,
                        Tensor::randn(0f32, 0.02, (rank, o), dev)?.to_dtype(dtype)?,
                    ))
                })
                .collect()
        })
        .collect()
}

/// Row `row` of step `step` takes adapter `(row + step) % adapters`: with one row, successive
/// steps take turns, so that adapters together larger than the cache are read from memory, as
/// in a server whose model weights pass through the cache between layers.
fn segments(adapters: &[Adapter], rows: usize, step: usize, layer: usize, p: usize) -> Vec<LoraSegment> {
    (0..rows)
        .map(|row| {
            let (a, b) = &adapters[(row + step) % adapters.len()][layer][p];
            LoraSegment { start: row, rows: 1, a: a.clone(), b: b.clone() }
        })
        .collect()
}

fn step(
    adapters: &[Adapter],
    xs: &[Tensor],
    bases: &[Tensor],
    rows: usize,
    n: usize,
    fused: bool,
) -> Result<()> {
    for layer in 0..LAYERS {
        if fused {
            for group in GROUPS {
                let x = &xs[PROJECTIONS[group[0]].0 / HIDDEN - 1];
                let parts: Vec<LoraPart> = group
                    .iter()
                    .map(|&p| LoraPart {
                        base: bases[p].clone(),
                        segments: segments(adapters, rows, n, layer, p),
                    })
                    .collect();
                lora_add_parts(x, &parts)?;
            }
        } else {
            for (p, &(input, _)) in PROJECTIONS.iter().enumerate() {
                let x = &xs[input / HIDDEN - 1];
                lora_add(&bases[p], x, &segments(adapters, rows, n, layer, p))?;
            }
        }
    }
    Ok(())
}

fn bench(rows: usize, adapters: usize, rank: usize, fused: bool, dtype: DType, steps: usize) -> Result<()> {
    let dev = &Device::Cpu;
    let adapters: Vec<Adapter> = (0..adapters).map(|_| adapter(rank, dtype)).collect::<Result<_>>()?;
    // x of width HIDDEN at index 0, of width FFN (the down projection's input) at index 1 and 2.
    let xs: Vec<Tensor> = [HIDDEN, FFN, FFN]
        .iter()
        .map(|&w| Tensor::randn(0f32, 1.0, (rows, w), dev))
        .collect::<Result<_>>()?;
    let bases: Vec<Tensor> =
        PROJECTIONS.iter().map(|&(_, o)| Tensor::randn(0f32, 1.0, (rows, o), dev)).collect::<Result<_>>()?;
    let pool = rayon::ThreadPoolBuilder::new().build().expect("thread pool");
    let mut times = pool.install(|| -> Result<Vec<f64>> {
        step(&adapters, &xs, &bases, rows, 0, fused)?;
        (0..steps)
            .map(|n| {
                let t = Instant::now();
                step(&adapters, &xs, &bases, rows, n, fused)?;
                Ok(t.elapsed().as_secs_f64() * 1e3)
            })
            .collect()
    })?;
    times.sort_by(f64::total_cmp);
    let macs: usize = PROJECTIONS.iter().map(|&(i, o)| rank * (i + o)).sum::<usize>() * LAYERS * rows;
    let median = times[times.len() / 2];
    println!(
        "{rows:>2} rows, {} {dtype:?} adapter(s), rank {rank:>2}, {:<14}: median {median:7.3} ms/step, min {:7.3} ms, \
         {:5.1} GMAC/s (median)",
        adapters.len(),
        if fused { "lora_add_parts" } else { "lora_add" },
        times[0],
        macs as f64 / median / 1e6
    );
    Ok(())
}

fn main() -> Result<()> {
    let steps = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(30);
    let only: Option<usize> = std::env::args().nth(2).and_then(|a| a.parse().ok());
    let bench = |rows, adapters, rank, fused, dtype, steps| match only {
        Some(r) if r != rows => Ok(()),
        _ => bench(rows, adapters, rank, fused, dtype, steps),
    };
    println!("rayon threads: {}", rayon::current_num_threads());
    for rank in [16, 8] {
        for (fused, dtype) in [(false, DType::F32), (true, DType::F32), (true, DType::BF16)] {
            bench(1, 1, rank, fused, dtype, steps * 4)?;
            bench(1, 4, rank, fused, dtype, steps * 4)?;
            bench(32, 4, rank, fused, dtype, steps)?;
        }
    }
    Ok(())
}

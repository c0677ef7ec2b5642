//! Where a decode step's time goes, on random weights of Llama-3.1-8B's shape in bf16
//! (`configs/models/llama-3.1-8b.json`), so that the gap between a step and the weight-read
//! floor can be pinned on the host or on the kernels before either is worked on.
//!
//! For batch B in 1/8/32/128, each sequence holding a 128-token context and decoding one token:
//! - **step**: `ModelExecutor::execute` (the forward, the device sampler, the ids back), as the
//!   engine calls it, wall time per step;
//! - **host enqueue**: the time `ModelRunner::logits` takes to return without anything waiting
//!   for the GPU; close to the step, the host is the limit (launches, allocations, hidden syncs);
//! - **matmuls alone**: every projection of one layer and the lm head at M = B, each timed on
//!   its own, summed over the layers, with cuBLAS and (B <= 16) with the skinny kernel the
//!   model uses; their share of the step is what faster GEMVs could win;
//! - **skinny sweep**: each projection at M = 1 and 8, cuBLAS against the skinny kernel at
//!   each warps-per-block count and at its rule, in GB/s;
//! - **one small op**: host cost of a candle op on a tiny tensor, for a count of launches.
//!
//! The floor is the weight bytes over the measured device-to-device copy bandwidth.
//!
//! Then the same steps replayed as CUDA graphs (`ModelRunner::enable_decode_graphs`): checked
//! bit for bit against the same step run uncaptured on the graph's buffers, compared with the
//! eager step (its attention plan splits keys differently, so bf16 rounding differs), timed.
//!
//! Last, one step at each batch in `PAGODA_PROFILE_BATCHES` (default 1) runs inside
//! `cuProfilerStart`/`cuProfilerStop`, so that `ncu --profile-from-start off` records the kernels
//! of exactly those steps (`scripts/gpu-step-kernels.sh`); without a profiler attached it is
//! one more step.

use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result};
use candle_core::cuda_backend::cudarc::driver::Profiler;
use candle_core::{DType, Device, Tensor};
use pagoda_engine::{BlockTableUpdate, ModelExecutor, SampleRequest, ScheduledBatch, ScheduledSeq};
use pagoda_gpu_check::report::Report;
use pagoda_gpu_check::timing::median;
use pagoda_models::{load_model, KvCache, LoadFormat, LoadOptions, ModelConfig, ModelRunner};
use pagoda_ops::SkinnyLaunch;

use crate::bench::{copy_bandwidth, time_calls};

const SECTION: &str = "steps";
pub(crate) const BLOCK_SIZE: usize = 16;
pub(crate) const CONTEXT: usize = 128;
const BATCHES: [usize; 4] = [1, 8, 32, 128];
const TIMED_STEPS: usize = 20;

/// B sequences, each decoding the token after a `CONTEXT`-token context, on blocks of its own.
pub(crate) fn decode_batch(batch: usize) -> ScheduledBatch {
    let per_seq = (CONTEXT + 1).div_ceil(BLOCK_SIZE) as u32;
    let seqs = (0..batch as u32)
        .map(|i| ScheduledSeq {
            seq_id: i as u64,
            token_ids: vec![1000 + i],
            start_pos: CONTEXT,
            block_table_update: BlockTableUpdate::replace(vec![(i * per_seq..(i + 1) * per_seq).collect()]),
            sample: Some(SampleRequest::greedy()),
            num_draft_tokens: 0,
            num_to_draft: 0,
            pool: false,
            second_segment: None,
            lora: None,
            prompt_logprobs: None,
        })
        .collect();
    ScheduledBatch { seqs, ..ScheduledBatch::default() }
}

/// Seconds of host time `logits` takes to return (median), then waited for before the next.
pub(crate) fn enqueue_time(runner: &mut ModelRunner, batch: &ScheduledBatch, gpu: &Device) -> Result<f64> {
    let mut samples = Vec::with_capacity(TIMED_STEPS);
    for _ in 0..TIMED_STEPS {
        gpu.synchronize()?;
        let t = Instant::now();
        let logits = runner.logits(batch)?;
        samples.push(t.elapsed().as_secs_f64());
        gpu.synchronize()?;
        drop(logits);
    }
    Ok(median(&mut samples))
}

/// The decode steps of [`BATCHES`] replayed as CUDA graphs. Checked: the graph's logits are
/// the bits of the same step run eagerly on the graph's buffers and attention plan (the path
/// without a capture). Reported: how far they are from the eager step's logits `eager`, whose
/// attention plan splits keys by the actual context, and the step time (MBU against `floors`).
fn graph_steps(
    runner: &mut ModelRunner,
    eager: &[Vec<Vec<f32>>],
    floors: &[f64],
    gpu: &Device,
    report: &mut Report,
) -> Result<()> {
    // As a server with a long max_model_len would plan them: the cache's whole length.
    let max_context = runner.num_blocks() * BLOCK_SIZE;
    let max_batch = *BATCHES.iter().max().unwrap_or(&1);
    for ((batch_size, want), floor) in BATCHES.into_iter().zip(eager).zip(floors) {
        let batch = decode_batch(batch_size);
        runner.enable_decode_graphs(max_batch, max_context, false);
        let uncaptured = runner.logits(&batch)?.to_dtype(DType::F32)?.to_vec2::<f32>()?;
        runner.enable_decode_graphs(max_batch, max_context, true);
        let got = runner.logits(&batch)?.to_dtype(DType::F32)?.to_vec2::<f32>()?;
        let captured = runner.decode_graph_sizes().contains(&batch_size);
        report.expect(
            SECTION,
            &format!("decode graph, batch {batch_size}: captured, the bits of the same step uncaptured"),
            captured && got == uncaptured,
            format!("captured {captured}; bit-identical {}", got == uncaptured),
        );
        let (mut worst, mut same) = (0f32, 0);
        for (g, w) in got.iter().zip(want) {
            let scale = w.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
            worst = g.iter().zip(w).map(|(a, b)| (a - b).abs() / scale).fold(worst, f32::max);
            same += usize::from(argmax(g) == argmax(w));
        }
        let step = time_calls(gpu, TIMED_STEPS, 1, || {
            runner.execute(&batch).map_err(|e| anyhow::anyhow!("{e}"))?;
            Ok(())
        })?;
        let enqueue = enqueue_time(runner, &batch, gpu)?;
        report.info(
            SECTION,
            &format!("decode step as a CUDA graph, batch {batch_size}"),
            format!(
                "step {:.2} ms (MBU {:.0}%); host enqueue {:.3} ms; against the eager step: {same}/{} \
                 greedy tokens the same, logit error {worst:.4} of the largest",
                step * 1e3,
                100.0 * floor / step,
                enqueue * 1e3,
                want.len(),
            ),
        );
    }
    Ok(())
}

fn argmax(row: &[f32]) -> usize {
    row.iter().enumerate().fold(0, |best, (i, &v)| if v > row[best] { i } else { best })
}

/// Which matmul a projection is timed with.
#[derive(Clone, Copy)]
enum Matmul {
    Cublas,
    /// `pagoda_ops::skinny_matmul` spread this way (`None`: its rule).
    Skinny(Option<SkinnyLaunch>),
}

/// Bytes of weights a timing rotates through, so that each call reads its weight from DRAM as
/// in a step: a weight that fits the L2 (O and QKV, 34-50 MB, against the H100's 50 MB) would
/// otherwise be timed from the cache.
const COLD_BYTES: usize = 512 << 20;

/// One projection's random bf16 weight `[out, inp]`, in as many copies as make `COLD_BYTES`
/// (up to 16), made once and timed with every matmul and row count.
struct ColdWeight {
    name: &'static str,
    out: usize,
    inp: usize,
    copies: Vec<Tensor>,
}

impl ColdWeight {
    fn new(name: &'static str, (out, inp): (usize, usize), gpu: &Device) -> Result<Self> {
        let copies = (0..COLD_BYTES.div_ceil(out * inp * 2).clamp(1, 16))
            .map(|_| Tensor::randn(0f32, 0.02, (out, inp), gpu)?.to_dtype(DType::BF16))
            .collect::<candle_core::Result<Vec<_>>>()?;
        Ok(Self { name, out, inp, copies })
    }

    fn bytes(&self) -> f64 {
        (self.out * self.inp * 2) as f64
    }

    /// Seconds of one `[rows, inp] . [out, inp]^T`, each call on the next copy.
    fn time(&self, rows: usize, matmul: Matmul, gpu: &Device) -> Result<f64> {
        let x = Tensor::randn(0f32, 1.0, (rows, self.inp), gpu)?.to_dtype(DType::BF16)?;
        let mut next = 0;
        time_calls(gpu, 5, 10, || {
            let w = &self.copies[next % self.copies.len()];
            next += 1;
            drop(match matmul {
                Matmul::Cublas => x.matmul(&w.t()?)?,
                Matmul::Skinny(launch) => pagoda_ops::skinny_matmul_with(&x, w, launch)?,
            });
            Ok(())
        })
    }
}

/// Each projection of a layer as the model stacks them (QKV, O, gate+up, down), then the lm
/// head.
fn projections(c: &ModelConfig, gpu: &Device) -> Result<[ColdWeight; 5]> {
    let (h, ffn) = (c.hidden_size, c.intermediate_size);
    let (q, kv) = (c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim);
    Ok([
        ColdWeight::new("QKV", (q + 2 * kv, h), gpu)?,
        ColdWeight::new("O", (h, q), gpu)?,
        ColdWeight::new("gate+up", (2 * ffn, h), gpu)?,
        ColdWeight::new("down", (h, ffn), gpu)?,
        ColdWeight::new("lm head", (c.vocab_size, h), gpu)?,
    ])
}

/// Seconds of the matmuls of one decode step at M = `rows`, each projection timed alone:
/// `(per-layer projections, lm head, weight bytes of the step)`.
fn matmul_time(
    weights: &[ColdWeight; 5],
    layers: usize,
    rows: usize,
    matmul: Matmul,
    gpu: &Device,
) -> Result<(f64, f64, f64)> {
    let [qkv, o, gate_up, down, head] = weights;
    let mut layer_seconds = 0.0;
    let mut layer_bytes = 0.0;
    for w in [qkv, o, gate_up, down] {
        layer_seconds += w.time(rows, matmul, gpu)?;
        layer_bytes += w.bytes();
    }
    let head_seconds = head.time(rows, matmul, gpu)?;
    Ok((layer_seconds * layers as f64, head_seconds, layer_bytes * layers as f64 + head.bytes()))
}

/// Each projection at M = `rows`: cuBLAS against the skinny kernel at 2..16 warps per block and
/// each (stages, group) pair (`w8s4g2`), as GB/s of weight read from DRAM, so the rule can be
/// checked on the device.
fn skinny_sweep(weights: &[ColdWeight; 5], rows: usize, gpu: &Device, report: &mut Report) -> Result<()> {
    for w in weights {
        let gbps = |seconds: f64| w.bytes() / seconds / 1e9;
        let mut cells = vec![format!("cuBLAS {:.0}", gbps(w.time(rows, Matmul::Cublas, gpu)?))];
        for warps in [2, 4, 8, 16] {
            for (stages, group) in [(8, 1), (4, 2), (2, 4), (4, 4)] {
                let launch = Some(SkinnyLaunch { warps, stages, group });
                // Spreads whose rings exceed a block's shared memory are skipped.
                if let Ok(t) = w.time(rows, Matmul::Skinny(launch), gpu) {
                    cells.push(format!("w{warps}s{stages}g{group} {:.0}", gbps(t)));
                }
            }
        }
        cells.push(format!("rule {:.0}", gbps(w.time(rows, Matmul::Skinny(None), gpu)?)));
        report.info(SECTION, &format!("GB/s, {} {}x{}, M = {rows}", w.name, w.out, w.inp), cells.join(", "));
    }
    Ok(())
}

pub fn run(config_path: &Path, gpu: &Device, report: &mut Report) -> Result<()> {
    let copy = copy_bandwidth(gpu)?;
    report.info(SECTION, "device-to-device copy, 1 GiB (read + written)", format!("{:.0} GB/s", copy / 1e9));

    // Host cost of one tiny op: launches per step are about enqueue time over this.
    let tiny = Tensor::zeros((1, 4096), DType::BF16, gpu)?;
    let op_seconds = time_calls(gpu, 5, 1000, || {
        drop(tiny.affine(1.0, 0.5)?);
        Ok(())
    })?;
    report.info(
        SECTION,
        "one small op (affine on 4096 bf16), host and GPU",
        format!("{:.1} us", op_seconds * 1e6),
    );

    let options = LoadOptions {
        device: gpu.clone(),
        dtype: DType::BF16,
        format: LoadFormat::Dummy,
        ..LoadOptions::default()
    };
    let loaded =
        load_model(config_path, &options).with_context(|| format!("loading {}", config_path.display()))?;
    let config = loaded.model.config().clone();
    let max_batch = *BATCHES.iter().max().unwrap_or(&1);
    let blocks = max_batch * (CONTEXT + 1).div_ceil(BLOCK_SIZE);
    let cache = KvCache::new(&config, blocks, BLOCK_SIZE, DType::BF16, gpu)?;
    let mut runner = ModelRunner::new(loaded.model, cache, gpu.clone())?;
    let weights = projections(&config, gpu)?;

    let mut eager = Vec::new();
    let mut floors = Vec::new();
    for batch_size in BATCHES {
        let batch = decode_batch(batch_size);
        eager.push(runner.logits(&batch)?.to_dtype(DType::F32)?.to_vec2::<f32>()?);
        // One call per round: each step waited for, the median of TIMED_STEPS.
        let step = time_calls(gpu, TIMED_STEPS, 1, || {
            runner.execute(&batch).map_err(|e| anyhow::anyhow!("{e}"))?;
            Ok(())
        })?;
        let enqueue = enqueue_time(&mut runner, &batch, gpu)?;
        let (layers, head, bytes) =
            matmul_time(&weights, config.num_layers, batch_size, Matmul::Cublas, gpu)?;
        let floor = bytes / copy;
        let skinny = if batch_size <= pagoda_ops::SKINNY_MAX_ROWS {
            let (l, h, _) = matmul_time(&weights, config.num_layers, batch_size, Matmul::Skinny(None), gpu)?;
            format!("; skinny kernel alone {:.2} ms ({:.0}% of copy)", (l + h) * 1e3, 100.0 * floor / (l + h))
        } else {
            String::new()
        };
        report.info(
            SECTION,
            &format!("decode step, batch {batch_size}"),
            format!(
                "step {:.2} ms (MBU {:.0}%); host enqueue {:.2} ms (~{:.0} ops); matmuls alone {:.2} ms \
                 (layers {:.2} + lm head {:.2}, {:.0}% of copy){}; floor {:.2} ms",
                step * 1e3,
                100.0 * floor / step,
                enqueue * 1e3,
                enqueue / op_seconds,
                (layers + head) * 1e3,
                layers * 1e3,
                head * 1e3,
                100.0 * floor / (layers + head),
                skinny,
                floor * 1e3,
            ),
        );
        floors.push(floor);
    }
    graph_steps(&mut runner, &eager, &floors, gpu, report)?;
    for rows in [1, 8] {
        skinny_sweep(&weights, rows, gpu, report)?;
    }
    let profiled = std::env::var("PAGODA_PROFILE_BATCHES").unwrap_or_else(|_| "1".into());
    for batch_size in profiled.split_whitespace() {
        let batch = decode_batch(batch_size.parse().context("PAGODA_PROFILE_BATCHES")?);
        gpu.synchronize()?;
        let profiler = Profiler::new()?;
        runner.execute(&batch).map_err(|e| anyhow::anyhow!("{e}"))?;
        gpu.synchronize()?;
        drop(profiler);
    }
    Ok(())
}

//! GGUF blocks kept on the device (`pagoda_ops::DeviceQuantWeight`), in every format the device
//! keeps:
//!
//! - **correct**: the quantized kernel (1, 3 and 8 rows) and the dequantize-then-cuBLAS path (12
//!   and 40 rows) against the CPU reference (the weight rounded to the activations' dtype, f32
//!   sums), in f16 and bf16; a row's bits whatever the rows beside it; the dequantization bit
//!   for bit; and a whole model of SmolLM2's shape with seeded random blocks (a prefill and
//!   teacher-forced decode steps) on the blocks against the same blocks dequantized on CUDA
//!   and against the CPU;
//! - **fast**: each projection of Llama-3.1-8B's shape at M = 1 and 8 in GB/s of the bytes the
//!   device holds (weights cold, as in a step), and the decode step of the whole model with every
//!   projection in Q4_K, Q8_0 and bf16 (random weights), against the floor of its bytes over the
//!   measured copy bandwidth.

use std::path::Path;

use anyhow::{Context, Result};
use candle_core::{DType, Device, Tensor};
use pagoda_engine::{BlockTableUpdate, ModelExecutor, SampleRequest, ScheduledBatch, ScheduledSeq};
use pagoda_gpu_check::compare::{argmax, rel_err, tolerance};
use pagoda_gpu_check::report::Report;
use pagoda_models::{load_model, KvCache, LoadFormat, LoadOptions, ModelConfig, ModelRunner};
use pagoda_ops::{DeviceQuantWeight, QuantFormat, QuantizedWeight};

use crate::bench::{copy_bandwidth, time_calls};
use crate::ops_check::values;
use crate::step_profile::{decode_batch, enqueue_time, BLOCK_SIZE, CONTEXT};

const SECTION: &str = "quant";
const MAGNITUDE: f32 = 0.06;

fn bits(t: &Tensor) -> Result<Vec<u32>> {
    Ok(values(t)?.iter().map(|v| v.to_bits()).collect())
}

/// The error allowed against the reference: the dtype's, twice over for the packed bf16
/// dequantization of the 4- to 6-bit formats (scale and minimum rounded to bf16).
fn allowed(format: QuantFormat, dtype: DType) -> f32 {
    match (format, dtype) {
        (QuantFormat::Q8_0, _) | (_, DType::F16) => tolerance(dtype),
        _ => 2.0 * tolerance(dtype),
    }
}

/// One format: every row count and dtype against the CPU reference; returns the worst error
/// over each dtype's tolerance, whether rows kept their bits, and whether the dequantization
/// matched.
fn check_format(format: QuantFormat, gpu: &Device, seed: &mut u64) -> Result<(f32, bool, bool)> {
    let narrow = if format.gguf_block_elems() == 256 { 2304 } else { 576 };
    let (mut worst, mut rows_same, mut dequant_same) = (0f32, true, true);
    for (n, k, row_counts) in [(70, narrow, &[1, 3, 8, 12, 32, 40][..]), (4096, 4096, &[1, 8, 32][..])] {
        *seed += 1;
        let host = QuantizedWeight::random(format, n, k, MAGNITUDE, *seed)?;
        let (on_cpu, on_gpu) =
            (DeviceQuantWeight::new(&host, &Device::Cpu)?, DeviceQuantWeight::new(&host, gpu)?);
        for dtype in [DType::F16, DType::BF16] {
            for &m in row_counts {
                let x = Tensor::randn(0f32, 1.0, (m, k), &Device::Cpu)?.to_dtype(dtype)?;
                let x_gpu = x.to_device(gpu)?;
                if m <= pagoda_ops::QUANT_MATMUL_MAX_ROWS && !on_gpu.kernel_takes(&x_gpu) {
                    anyhow::bail!("{format:?} {dtype:?} {m}x{n}x{k}: the kernel does not take it");
                }
                let want = values(&on_cpu.matmul(&x)?)?;
                let err = rel_err(&values(&on_gpu.forward(&x_gpu)?)?, &want);
                worst = worst.max(err / allowed(format, dtype));
                if m <= pagoda_ops::QUANT_MATMUL_MAX_ROWS {
                    // The pipelined entries the timing sweeps.
                    let pipelined = Some(pagoda_ops::QuantLaunch { warps: 4, pipelined: true });
                    let err = rel_err(&values(&on_gpu.matmul_with(&x_gpu, pipelined)?)?, &want);
                    worst = worst.max(err / allowed(format, dtype));
                }
                if m <= pagoda_ops::QUANT_KERNEL_MAX_ROWS {
                    // The kernel itself, two and four tiles of rows past 8.
                    let all = on_gpu.matmul(&x_gpu)?;
                    worst = worst.max(rel_err(&values(&all)?, &want) / allowed(format, dtype));
                    let alone = on_gpu.matmul(&x_gpu.narrow(0, 5.min(m - 1), 1)?)?;
                    rows_same &= bits(&alone)? == bits(&all.narrow(0, 5.min(m - 1), 1)?)?;
                }
            }
            dequant_same &= bits(&on_gpu.dequantize(dtype)?)? == bits(&on_cpu.dequantize(dtype)?)?;
        }
    }
    Ok((worst, rows_same, dequant_same))
}

fn correctness(gpu: &Device, report: &mut Report) {
    let mut seed = 11;
    let (mut rows_same, mut dequant_same) = (true, true);
    for format in QuantFormat::ALL {
        let check =
            format!("quant_matmul {format:?} against the CPU, f16 and bf16, M = 1..40 (error / tolerance)");
        match check_format(format, gpu, &mut seed) {
            Ok((worst, rows, dequant)) => {
                report.at_most(SECTION, &check, worst as f64, 1.0);
                rows_same &= rows;
                dequant_same &= dequant;
            }
            Err(e) => report.error(SECTION, &check, format!("{e:#}")),
        }
    }
    let same = |ok: bool| if ok { "identical" } else { "differ" };
    report.expect(
        SECTION,
        "quant_matmul: a row's bits whatever the rows beside it (M = 1..32)",
        rows_same,
        same(rows_same),
    );
    report.expect(
        SECTION,
        "quant_dequantize: the CPU's values bit for bit",
        dequant_same,
        same(dequant_same),
    );
}

pub(crate) const PROMPT: usize = 24;
pub(crate) const DECODE_STEPS: usize = 16;

/// The logits of one step that feeds `tokens[start..]` (positions `start..`) and predicts the
/// next token.
pub(crate) fn step(runner: &mut ModelRunner, tokens: &[u32], start: usize) -> Result<Vec<f32>> {
    let blocks: Vec<u32> = (0..(PROMPT + DECODE_STEPS).div_ceil(BLOCK_SIZE) as u32).collect();
    let seq = ScheduledSeq {
        seq_id: 0,
        token_ids: tokens[start..].to_vec(),
        start_pos: start,
        block_table_update: BlockTableUpdate::replace(vec![blocks]),
        sample: Some(SampleRequest::greedy()),
        num_draft_tokens: 0,
        num_to_draft: 0,
        pool: false,
        second_segment: None,
        lora: None,
        prompt_logprobs: None,
    };
    let logits = runner.logits(&ScheduledBatch { seqs: vec![seq], ..ScheduledBatch::default() })?;
    Ok(logits.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?)
}

/// The logits that predict each token after the prompt: a prefill of `tokens[..PROMPT]`, then
/// one decode step per later token (fed `tokens`, whatever the model would have chosen).
pub(crate) fn logits_along(runner: &mut ModelRunner, tokens: &[u32]) -> Result<Vec<Vec<f32>>> {
    let mut rows = vec![step(runner, &tokens[..PROMPT], 0)?];
    for end in PROMPT + 1..=tokens.len() {
        rows.push(step(runner, &tokens[..end], end - 1)?);
    }
    Ok(rows)
}

fn small_runner(
    config: &Path,
    format: QuantFormat,
    device: &Device,
    dtype: DType,
    dequantize: bool,
) -> Result<ModelRunner> {
    let options = LoadOptions {
        device: device.clone(),
        dtype,
        format: LoadFormat::Dummy,
        dummy_quantization: Some(format),
        dequantize: Some(dequantize),
        ..LoadOptions::default()
    };
    let loaded = load_model(config, &options).with_context(|| format!("loading {}", config.display()))?;
    let blocks = (PROMPT + DECODE_STEPS).div_ceil(BLOCK_SIZE);
    let cache = KvCache::new(loaded.model.config(), blocks, BLOCK_SIZE, dtype, device)?;
    Ok(ModelRunner::new(loaded.model, cache, device.clone())?)
}

/// The worst relative logit difference over the steps, and the share of steps whose greedy
/// choice agrees.
pub(crate) fn compare_steps(got: &[Vec<f32>], want: &[Vec<f32>]) -> (f32, f64) {
    let err = got.iter().zip(want).map(|(g, w)| rel_err(g, w)).fold(0f32, f32::max);
    let agree = got.iter().zip(want).filter(|(g, w)| argmax(g) == argmax(w)).count();
    (err, agree as f64 / want.len().max(1) as f64)
}

/// A model of SmolLM2's shape with every projection in `format`: CUDA bf16 on the blocks
/// against CUDA bf16 on the same blocks dequantized (the same weight values, other kernels),
/// and against the CPU in f32 on the blocks.
fn small_model(config: &Path, format: QuantFormat, gpu: &Device, report: &mut Report) -> Result<()> {
    let mut cpu = small_runner(config, format, &Device::Cpu, DType::F32, false)?;
    // The CPU's own greedy continuation of a fixed prompt, fed to every run.
    let mut tokens: Vec<u32> = (0..PROMPT as u32).map(|i| 1 + (i * 7919) % 40_000).collect();
    let mut reference = Vec::new();
    let mut start = 0;
    while reference.len() < DECODE_STEPS {
        let row = step(&mut cpu, &tokens, start)?;
        start = tokens.len();
        tokens.push(argmax(&row));
        reference.push(row);
    }
    let tokens = &tokens[..PROMPT + DECODE_STEPS - 1];
    drop(cpu);
    let on_blocks = logits_along(&mut small_runner(config, format, gpu, DType::BF16, false)?, tokens)?;
    let on_dense = logits_along(&mut small_runner(config, format, gpu, DType::BF16, true)?, tokens)?;
    let (err, agree) = compare_steps(&on_blocks, &on_dense);
    let check = format!(
        "{format:?} model, CUDA bf16 on blocks vs dequantized: logit error over 1 + {} steps",
        DECODE_STEPS - 1
    );
    report.at_most(SECTION, &check, err as f64, 0.05);
    let (cpu_err, cpu_agree) = compare_steps(&on_blocks, &reference);
    let (dense_cpu_err, dense_cpu_agree) = compare_steps(&on_dense, &reference);
    report.info(
        SECTION,
        &format!("{format:?} model, greedy agreement and logit error"),
        format!(
            "blocks vs dequantized {agree:.3} ({err:.4}); against the CPU f32: blocks {cpu_agree:.3} ({cpu_err:.4}), \
             dequantized {dense_cpu_agree:.3} ({dense_cpu_err:.4})"
        ),
    );
    Ok(())
}

/// Bytes a timing rotates through so that each call reads its weight from DRAM.
const COLD_BYTES: usize = 512 << 20;

/// Each projection of a layer as the model stacks it, then the lm head: (name, rows, cols).
fn projections(c: &ModelConfig) -> [(&'static str, usize, usize); 5] {
    let (h, ffn) = (c.hidden_size, c.intermediate_size);
    let (q, kv) = (c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim);
    [
        ("QKV", q + 2 * kv, h),
        ("O", h, q),
        ("gate+up", 2 * ffn, h),
        ("down", h, ffn),
        ("lm head", c.vocab_size, h),
    ]
}

/// GB/s of each projection in `format` at M = 1 and 8.
fn kernel_timings(c: &ModelConfig, format: QuantFormat, gpu: &Device, report: &mut Report) -> Result<()> {
    let mut cells = Vec::new();
    for (i, (name, rows, cols)) in projections(c).into_iter().enumerate() {
        let host = QuantizedWeight::random(format, rows, cols, MAGNITUDE, 100 + i as u64)?;
        let first = DeviceQuantWeight::new(&host, gpu)?;
        let bytes = first.size_in_bytes();
        let mut copies = vec![first];
        while copies.len() < COLD_BYTES.div_ceil(bytes).clamp(1, 16) {
            copies.push(DeviceQuantWeight::new(&host, gpu)?);
        }
        drop(host);
        for m in [1, 8] {
            let x = Tensor::randn(0f32, 1.0, (m, cols), gpu)?.to_dtype(DType::BF16)?;
            let mut spreads = Vec::new();
            let spreads_timed = std::iter::once(None).chain([2, 4, 8].into_iter().flat_map(|warps| {
                [false, true].map(|pipelined| Some(pagoda_ops::QuantLaunch { warps, pipelined }))
            }));
            for launch in spreads_timed {
                let mut next = 0;
                let seconds = time_calls(gpu, 5, 10, || {
                    drop(copies[next % copies.len()].matmul_with(&x, launch)?);
                    next += 1;
                    Ok(())
                })?;
                let label = launch.map_or("rule".to_string(), |l| {
                    format!("w{}{}", l.warps, if l.pipelined { "p" } else { "" })
                });
                spreads.push(format!("{label} {:.0}", bytes as f64 / seconds / 1e9));
            }
            cells.push(format!("{name} {rows}x{cols} M={m}: {}", spreads.join(" ")));
        }
        // Past 8 rows: the kernel's two and four tiles against the model's path (a dequantized
        // copy per call, then cuBLAS) and against a dense bf16 weight on cuBLAS, in µs.
        let dense = copies[0].dequantize(DType::BF16)?;
        for m in [16, 32] {
            let x = Tensor::randn(0f32, 1.0, (m, cols), gpu)?.to_dtype(DType::BF16)?;
            let mut next = 0;
            let mut time = |f: &mut dyn FnMut(&DeviceQuantWeight) -> candle_core::Result<Tensor>| {
                time_calls(gpu, 5, 10, || {
                    drop(f(&copies[next % copies.len()])?);
                    next += 1;
                    Ok(())
                })
            };
            let kernel = time(&mut |w| w.matmul(&x))?;
            let dequantized = time(&mut |w| w.forward(&x))?;
            let bf16 = time_calls(gpu, 5, 10, || {
                drop(x.matmul(&dense.t()?)?);
                Ok(())
            })?;
            cells.push(format!(
                "{name} M={m}: kernel {:.1} us, dequantized copy {:.1} us, bf16 cuBLAS {:.1} us (one copy)",
                kernel * 1e6,
                dequantized * 1e6,
                bf16 * 1e6
            ));
        }
    }
    report.info(
        SECTION,
        &format!("GB/s of held bytes, {format:?}, rule and warps per block"),
        cells.join("; "),
    );
    Ok(())
}

/// The decode step of the whole model with its projections in `quantization` (dense bf16 when
/// `None`), at batch 1 and 8.
fn model_steps(
    config_path: &Path,
    quantization: Option<QuantFormat>,
    copy: f64,
    gpu: &Device,
    report: &mut Report,
) -> Result<()> {
    let options = LoadOptions {
        device: gpu.clone(),
        dtype: DType::BF16,
        format: LoadFormat::Dummy,
        dummy_quantization: quantization,
        ..LoadOptions::default()
    };
    let loaded =
        load_model(config_path, &options).with_context(|| format!("loading {}", config_path.display()))?;
    let (c, load_seconds) = (loaded.model.config().clone(), loaded.load_seconds);
    // Bytes a step reads: the projections as held, plus the lm head.
    let per_element = match quantization {
        Some(f) => f.block_bytes() as f64 / 32.0,
        None => 2.0,
    };
    let [qkv, o, gate_up, down, head] = projections(&c).map(|(_, r, k)| (r * k) as f64);
    let bytes = per_element * ((qkv + o + gate_up + down) * c.num_layers as f64 + head);
    let batches = [1, 8];
    let blocks = batches.iter().max().unwrap_or(&1) * (CONTEXT + 1).div_ceil(BLOCK_SIZE);
    let cache = KvCache::new(&c, blocks, BLOCK_SIZE, DType::BF16, gpu)?;
    let mut runner = ModelRunner::new(loaded.model, cache, gpu.clone())?;
    let name = quantization.map_or("bf16".to_string(), |f| format!("{f:?}"));
    for batch_size in batches {
        let batch = decode_batch(batch_size);
        let step = time_calls(gpu, 20, 1, || {
            runner.execute(&batch).map_err(|e| anyhow::anyhow!("{e}"))?;
            Ok(())
        })?;
        // The host's time to enqueue the step: a step near it is bound by the host.
        let enqueue = enqueue_time(&mut runner, &batch, gpu)?;
        let floor = bytes / copy;
        report.info(
            SECTION,
            &format!("decode step, {name} projections, batch {batch_size}"),
            format!(
                "{:.2} ms (MBU {:.0}%); host enqueue {:.2} ms; {:.2} GB read, floor {:.2} ms; load {:.1} s",
                step * 1e3,
                100.0 * floor / step,
                enqueue * 1e3,
                bytes / 1e9,
                floor * 1e3,
                load_seconds
            ),
        );
    }
    Ok(())
}

pub fn run(config_path: &Path, gpu: &Device, report: &mut Report) -> Result<()> {
    correctness(gpu, report);
    let small = Path::new("configs/models/smollm2-135m.json");
    for format in [QuantFormat::Q4_0, QuantFormat::Q8_0, QuantFormat::Q4K] {
        if let Err(e) = small_model(small, format, gpu, report) {
            report.error(SECTION, &format!("{format:?} model"), format!("{e:#}"));
        }
    }
    let copy = copy_bandwidth(gpu)?;
    report.info(SECTION, "device-to-device copy, 1 GiB (read + written)", format!("{:.0} GB/s", copy / 1e9));
    let config = ModelConfig::from_hf_json(config_path)?;
    for format in [QuantFormat::Q4K, QuantFormat::Q6K, QuantFormat::Q8_0, QuantFormat::Q4_0] {
        if let Err(e) = kernel_timings(&config, format, gpu, report) {
            report.error(SECTION, &format!("timings {format:?}"), format!("{e:#}"));
        }
    }
    for quantization in [None, Some(QuantFormat::Q4K), Some(QuantFormat::Q8_0)] {
        if let Err(e) = model_steps(config_path, quantization, copy, gpu, report) {
            report.error(SECTION, &format!("decode steps {quantization:?}"), format!("{e:#}"));
        }
    }
    Ok(())
}

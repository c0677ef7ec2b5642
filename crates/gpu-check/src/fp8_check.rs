//! FP8 weights kept on the device (`pagoda_ops::DeviceFp8Weight`):
//!
//! - **correct**: the FP8 kernel (1, 3, 8 and up to 32 rows) and the dequantize-then-cuBLAS
//!   path (40 rows) against the CPU reference (exact code values, f32 sums, the row's scale),
//!   in f16 and bf16; a row's bits whatever the rows beside it; the dequantization bit for bit;
//!   the quantization on the device against the CPU's codes and scales;
//!   and, reported, a model of SmolLM2's shape with seeded random weights loaded with
//!   `--quantization fp8` (a prefill and teacher-forced decode steps): CUDA bf16 on FP8 codes
//!   against the CPU's f32 on the same FP8 values, and against CUDA bf16 unquantized;
//! - **fast**: each projection of Llama-3.1-8B's shape at M = 1 and 8 in GB/s of the bytes the
//!   device holds (weights cold, as in a step), beside the bf16 skinny kernel on the same shape,
//!   and the time to quantize it at load.

use std::path::Path;

use anyhow::{Context, Result};
use candle_core::{DType, Device, Tensor};
use pagoda_gpu_check::compare::{rel_err, tolerance};
use pagoda_gpu_check::report::Report;
use pagoda_models::{load_model, KvCache, LoadFormat, LoadOptions, ModelRunner, WeightQuantization};
use pagoda_ops::{DeviceFp8Weight, Fp8Weight};

use crate::bench::{copy_bandwidth, time_calls};
use crate::ops_check::values;
use crate::quant_check::{compare_steps, logits_along, step, DECODE_STEPS, PROMPT};
use crate::step_profile::BLOCK_SIZE;

const SECTION: &str = "fp8";

fn bits(t: &Tensor) -> Result<Vec<u32>> {
    Ok(values(t)?.iter().map(|v| v.to_bits()).collect())
}

/// A `[rows, cols]` weight of seeded normal values, quantized on the host.
fn host_weight(rows: usize, cols: usize, seed: u64) -> Result<Fp8Weight> {
    let device = Device::Cpu;
    device.set_seed(seed)?;
    let values: Vec<f32> = Tensor::randn(0f32, 0.05, (rows * cols,), &device)?.to_vec1()?;
    Fp8Weight::quantize(rows, cols, &values).map_err(anyhow::Error::msg)
}

/// The worst error over the dtype's tolerance, whether rows kept their bits, whether the
/// dequantization and the quantization on the device matched the CPU's.
fn check(gpu: &Device) -> Result<(f32, bool, bool, bool)> {
    let (mut worst, mut rows_same, mut dequant_same, mut quantize_same) = (0f32, true, true, true);
    for (seed, (n, k, row_counts)) in
        [(70, 576, &[1, 3, 8, 12, 32, 40][..]), (4096, 4096, &[1, 8, 32][..])].into_iter().enumerate()
    {
        let host = host_weight(n, k, 40 + seed as u64)?;
        let (on_cpu, on_gpu) =
            (DeviceFp8Weight::new(&host, &Device::Cpu)?, DeviceFp8Weight::new(&host, gpu)?);
        for dtype in [DType::F16, DType::BF16] {
            for &m in row_counts {
                let x = Tensor::randn(0f32, 1.0, (m, k), &Device::Cpu)?.to_dtype(dtype)?;
                let x_gpu = x.to_device(gpu)?;
                if m <= pagoda_ops::FP8_MATMUL_MAX_ROWS && !on_gpu.kernel_takes(&x_gpu) {
                    anyhow::bail!("{dtype:?} {m}x{n}x{k}: the kernel does not take it");
                }
                let want = values(&on_cpu.matmul(&x)?)?;
                worst = worst.max(rel_err(&values(&on_gpu.forward(&x_gpu)?)?, &want) / tolerance(dtype));
                if m <= pagoda_ops::FP8_KERNEL_MAX_ROWS {
                    let all = on_gpu.matmul(&x_gpu)?;
                    worst = worst.max(rel_err(&values(&all)?, &want) / tolerance(dtype));
                    let row = 5.min(m - 1);
                    rows_same &=
                        bits(&on_gpu.matmul(&x_gpu.narrow(0, row, 1)?)?)? == bits(&all.narrow(0, row, 1)?)?;
                }
            }
            dequant_same &= bits(&on_gpu.dequantize(dtype)?)? == bits(&on_cpu.dequantize(dtype)?)?;
            // Quantized on the device from the dense weight: the CPU's codes and scales.
            let dense = on_cpu.dequantize(dtype)?;
            let (from_gpu, from_cpu) =
                (DeviceFp8Weight::quantize(&dense.to_device(gpu)?)?, DeviceFp8Weight::quantize(&dense)?);
            quantize_same &=
                bits(&from_gpu.dequantize(DType::F32)?)? == bits(&from_cpu.dequantize(DType::F32)?)?;
        }
    }
    Ok((worst, rows_same, dequant_same, quantize_same))
}

/// Bytes a timing rotates through so that each call reads its weight from DRAM.
const COLD_BYTES: usize = 512 << 20;

/// Llama-3.1-8B's projections as the model stacks them: (name, rows, cols).
const SHAPES: [(&str, usize, usize); 4] =
    [("QKV", 6144, 4096), ("O", 4096, 4096), ("gate+up", 28_672, 4096), ("down", 4096, 14_336)];

fn timings(gpu: &Device, report: &mut Report) -> Result<()> {
    let copy = copy_bandwidth(gpu)?;
    let mut cells = Vec::new();
    for (i, (name, rows, cols)) in SHAPES.into_iter().enumerate() {
        let host = host_weight(rows, cols, 200 + i as u64)?;
        let copies: Vec<DeviceFp8Weight> = (0..COLD_BYTES.div_ceil(rows * cols).clamp(1, 16))
            .map(|_| DeviceFp8Weight::new(&host, gpu))
            .collect::<candle_core::Result<_>>()?;
        let dense: Vec<Tensor> = (0..COLD_BYTES.div_ceil(2 * rows * cols).clamp(1, 16))
            .map(|_| copies[0].dequantize(DType::BF16))
            .collect::<candle_core::Result<_>>()?;
        let fp8_bytes = copies[0].size_in_bytes() as f64;
        // Quantizing the bf16 weight on the device, as a model loads (reads 2 bytes, writes 1).
        let quantize = time_calls(gpu, 2, 5, || {
            drop(DeviceFp8Weight::quantize(&dense[0])?);
            Ok(())
        })?;
        cells.push(format!("{name} quantize {:.0} us", quantize * 1e6));
        for m in [1, 8] {
            let x = Tensor::randn(0f32, 1.0, (m, cols), gpu)?.to_dtype(DType::BF16)?;
            let mut next = 0;
            let fp8 = time_calls(gpu, 5, 10, || {
                drop(copies[next % copies.len()].matmul(&x)?);
                next += 1;
                Ok(())
            })?;
            let bf16 = time_calls(gpu, 5, 10, || {
                drop(pagoda_ops::skinny_matmul(&x, &dense[next % dense.len()])?);
                next += 1;
                Ok(())
            })?;
            cells.push(format!(
                "{name} {rows}x{cols} M={m}: fp8 {:.1} us {:.0} GB/s ({:.0}% of copy), bf16 skinny {:.1} us",
                fp8 * 1e6,
                fp8_bytes / fp8 / 1e9,
                100.0 * fp8_bytes / fp8 / copy,
                bf16 * 1e6
            ));
        }
    }
    report.info(SECTION, &format!("fp8 matmul, copy {:.0} GB/s", copy / 1e9), cells.join("; "));
    Ok(())
}

fn runner(config: &Path, device: &Device, dtype: DType, fp8: bool) -> Result<ModelRunner> {
    let options = LoadOptions {
        device: device.clone(),
        dtype,
        format: LoadFormat::Dummy,
        quantization: fp8.then_some(WeightQuantization::Fp8),
        ..LoadOptions::default()
    };
    let loaded = load_model(config, &options).with_context(|| format!("loading {}", config.display()))?;
    let blocks = (PROMPT + DECODE_STEPS).div_ceil(BLOCK_SIZE);
    let cache = KvCache::new(loaded.model.config(), blocks, BLOCK_SIZE, dtype, device)?;
    Ok(ModelRunner::new(loaded.model, cache, device.clone())?)
}

/// The whole model in FP8 on CUDA against the CPU on the same FP8 values, and against CUDA
/// unquantized, along the CPU's own greedy continuation of a fixed prompt.
fn small_model(gpu: &Device, report: &mut Report) -> Result<()> {
    let config = Path::new("configs/models/smollm2-135m.json");
    let mut cpu = runner(config, &Device::Cpu, DType::F32, true)?;
    let mut tokens: Vec<u32> = (0..PROMPT as u32).map(|i| 1 + (i * 7919) % 40_000).collect();
    let mut reference = Vec::new();
    let mut start = 0;
    while reference.len() < DECODE_STEPS {
        let row = step(&mut cpu, &tokens, start)?;
        start = tokens.len();
        tokens.push(pagoda_gpu_check::compare::argmax(&row));
        reference.push(row);
    }
    let tokens = &tokens[..PROMPT + DECODE_STEPS - 1];
    drop(cpu);
    let on_fp8 = logits_along(&mut runner(config, gpu, DType::BF16, true)?, tokens)?;
    let on_bf16 = logits_along(&mut runner(config, gpu, DType::BF16, false)?, tokens)?;
    // Information, not a pass mark: the matmul checks above hold the kernel to the CPU's
    // numbers; here bf16 activations over 30 layers of random weights add their own drift.
    let (err, agree) = compare_steps(&on_fp8, &reference);
    let (bf16_err, bf16_agree) = compare_steps(&on_fp8, &on_bf16);
    report.info(
        SECTION,
        &format!("fp8 model (random weights), greedy agreement and logit error over {DECODE_STEPS} steps"),
        format!(
            "CUDA bf16 on codes against the CPU on the same values {agree:.3} ({err:.4}); \
             against CUDA bf16 unquantized {bf16_agree:.3} ({bf16_err:.4})"
        ),
    );
    Ok(())
}

pub fn run(gpu: &Device, report: &mut Report) -> Result<()> {
    let name = "fp8_matmul against the CPU, f16 and bf16, M = 1..40 (error / tolerance)";
    match check(gpu) {
        Ok((worst, rows, dequant, quantize)) => {
            report.at_most(SECTION, name, worst as f64, 1.0);
            let same = |ok: bool| if ok { "identical" } else { "differ" };
            report.expect(SECTION, "fp8_matmul: a row's bits whatever the rows beside it", rows, same(rows));
            report.expect(SECTION, "fp8_dequantize: the CPU's values bit for bit", dequant, same(dequant));
            report.expect(SECTION, "fp8_quantize: the CPU's codes and scales", quantize, same(quantize));
        }
        Err(e) => report.error(SECTION, name, format!("{e:#}")),
    }
    if let Err(e) = small_model(gpu, report) {
        report.error(SECTION, "fp8 model", format!("{e:#}"));
    }
    timings(gpu, report)
}

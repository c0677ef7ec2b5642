//! Timings of the attention kernels on Llama-3.1-8B attention shapes (32 q heads, 8 KV heads,
//! head_dim 128, bf16, 16-token blocks handed out in shuffled order):
//!
//! - paged decode attention at batch 1/16/64 x context 1k/4k/16k, as achieved bandwidth (the
//!   bytes the call must move: the whole KV cache of the batch once, plus q and the output)
//!   and as a fraction of a measured device-to-device copy (bytes read plus written);
//! - causal prefill attention of one 4k and one 16k sequence, in TFLOP/s.
//!
//! Each number is the median over repeated calls of the public op, timed from the host with
//! the stream synchronised around each batch of calls, so launch and planning overheads
//! count as they do in the engine.

use std::time::Instant;

use anyhow::Result;
use candle_core::{DType, Device, Tensor};
use pagoda_gpu_check::report::Report;
use pagoda_gpu_check::timing::{median, AttentionShape};
use pagoda_ops::AttentionMetadata;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;

const SECTION: &str = "timings";
const BLOCK_SIZE: usize = 16;

/// Seconds per call of `f`: median over `rounds` rounds of `calls` calls each.
pub(crate) fn time_calls(
    gpu: &Device,
    rounds: usize,
    calls: usize,
    mut f: impl FnMut() -> Result<()>,
) -> Result<f64> {
    f()?;
    f()?;
    gpu.synchronize()?;
    let mut samples = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let started = Instant::now();
        for _ in 0..calls {
            f()?;
        }
        gpu.synchronize()?;
        samples.push(started.elapsed().as_secs_f64() / calls as f64);
    }
    Ok(median(&mut samples))
}

/// Device-to-device copy of 1 GiB with the driver's copy engine path (`cuMemcpyDtoDAsync`) into
/// a buffer allocated once, in bytes (read + written) per second. Candle's `Tensor::copy` would
/// time its strided-copy kernel plus an allocation, and gave well under half the card's rate.
pub(crate) fn copy_bandwidth(gpu: &Device) -> Result<f64> {
    let stream = gpu.as_cuda_device()?.cuda_stream();
    let len = 1usize << 28;
    let src = stream.alloc_zeros::<f32>(len)?;
    let mut dst = stream.alloc_zeros::<f32>(len)?;
    let seconds = time_calls(gpu, 5, 4, || {
        stream.memcpy_dtod(&src, &mut dst)?;
        Ok(())
    })?;
    Ok(2.0 * (len * 4) as f64 / seconds)
}

/// A batch of `batch` sequences with `q_len` new tokens and `context` tokens each, their
/// blocks shuffled over a cache just big enough.
fn setup(
    s: &AttentionShape,
    gpu: &Device,
    rng: &mut StdRng,
) -> Result<(Tensor, Tensor, Tensor, AttentionMetadata)> {
    let per_seq = s.context.div_ceil(BLOCK_SIZE);
    let num_blocks = s.batch * per_seq;
    let mut ids: Vec<u32> = (0..num_blocks as u32).collect();
    ids.shuffle(rng);
    let tables: Vec<Vec<u32>> = ids.chunks(per_seq).map(|c| c.to_vec()).collect();
    let (mut cu, mut slots) = (vec![0u32], Vec::new());
    for table in &tables {
        for pos in s.context - s.q_len..s.context {
            slots.push(table[pos / BLOCK_SIZE] * BLOCK_SIZE as u32 + (pos % BLOCK_SIZE) as u32);
        }
        cu.push(cu.last().unwrap() + s.q_len as u32);
    }
    let meta = AttentionMetadata::new(slots, cu, vec![s.context as u32; s.batch], &tables, gpu)?;
    let shape = (num_blocks, BLOCK_SIZE, s.kv_heads, s.head_dim);
    // Values do not change the work; random K keeps the softmax honest.
    let k = Tensor::randn(0f32, 1.0, shape, gpu)?.to_dtype(DType::BF16)?;
    let v = Tensor::zeros(shape, DType::BF16, gpu)?;
    let q =
        Tensor::randn(0f32, 1.0, (s.batch * s.q_len, s.q_heads, s.head_dim), gpu)?.to_dtype(DType::BF16)?;
    Ok((q, k, v, meta))
}

fn llama8b(batch: usize, q_len: usize, context: usize) -> AttentionShape {
    AttentionShape { batch, q_len, context, q_heads: 32, kv_heads: 8, head_dim: 128, dtype_bytes: 2 }
}

pub fn run(gpu: &Device, report: &mut Report) -> Result<()> {
    let mut rng = StdRng::seed_from_u64(7);
    let copy = copy_bandwidth(gpu)?;
    report.info(SECTION, "device-to-device copy, 1 GiB (read + written)", format!("{:.0} GB/s", copy / 1e9));
    let scale = 1.0 / 128f32.sqrt();
    for batch in [1, 16, 64] {
        for context in [1024, 4096, 16384] {
            let s = llama8b(batch, 1, context);
            let (q, k, v, meta) = setup(&s, gpu, &mut rng)?;
            let seconds = time_calls(gpu, 7, 10, || {
                drop(pagoda_ops::paged_attention(&q, &k, &v, &meta, scale)?);
                Ok(())
            })?;
            let bandwidth = s.min_bytes() / seconds;
            let check = format!("decode attention, Llama-3.1-8B shapes, batch {batch} x {}k", context / 1024);
            let measured = format!(
                "{:.0}% of copy ({:.0} GB/s, {:.1} us)",
                100.0 * bandwidth / copy,
                bandwidth / 1e9,
                seconds * 1e6
            );
            let goal = if (batch, context) == (64, 4096) { "goal >= 85% of copy" } else { "" };
            report.goal(SECTION, &check, measured, goal);
        }
    }
    for context in [4096, 16384] {
        let s = llama8b(1, context, context);
        let (q, k, v, meta) = setup(&s, gpu, &mut rng)?;
        let seconds = time_calls(gpu, 5, 2, || {
            drop(pagoda_ops::paged_attention(&q, &k, &v, &meta, scale)?);
            Ok(())
        })?;
        let tflops = s.causal_flops() / seconds / 1e12;
        let check = format!("prefill attention, causal, Llama-3.1-8B shapes, {}k tokens", context / 1024);
        report.goal(
            SECTION,
            &check,
            format!("{tflops:.0} TFLOP/s ({:.2} ms)", seconds * 1e3),
            "goal >= 350 TFLOP/s on H100",
        );
    }
    Ok(())
}

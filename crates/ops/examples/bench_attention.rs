//! Rough timing of the CPU paged-attention kernel for a decode batch, prefill chunks and the
//! few-position steps of speculative verification (SmolLM2-135M shape: 9 q heads, 3 kv heads,
//! head_dim 64, block size 16), run inside a rayon pool as the model runner runs a step.
//!
//! Run: `cargo run --release -p pagoda-ops --example bench_attention [iterations] [name filter]`
//! (`BENCH_ATTENTION_SHAPE=4,1,256` for another `q_heads,kv_heads,head_dim`: Gemma 3 270M's).

use std::time::Instant;

use candle_core::{DType, Device, Result, Tensor};
use pagoda_ops::{paged_attention, AttentionMetadata};

/// `(q_heads, kv_heads, head_dim)`: SmolLM2-135M's unless `BENCH_ATTENTION_SHAPE` says otherwise.
fn shape() -> (usize, usize, usize) {
    let Ok(s) = std::env::var("BENCH_ATTENTION_SHAPE") else { return (9, 3, 64) };
    let v: Vec<usize> =
        s.split(',').map(|x| x.trim().parse().expect("BENCH_ATTENTION_SHAPE: q,kv,hd")).collect();
    assert!(v.len() == 3 && v[1] > 0 && v[0].is_multiple_of(v[1]), "BENCH_ATTENTION_SHAPE: q,kv,hd");
    (v[0], v[1], v[2])
}
const BLOCK: usize = 16;

/// `(context, q_len)` per sequence; blocks are laid out back to back.
fn setup(seqs: &[(usize, usize)], dtype: DType) -> Result<(Tensor, Tensor, Tensor, AttentionMetadata)> {
    let dev = &Device::Cpu;
    let mut tables = Vec::new();
    let mut next = 0u32;
    let (mut cu, mut ctx, mut slots) = (vec![0u32], Vec::new(), Vec::new());
    for &(c, q) in seqs {
        let n = c.div_ceil(BLOCK) as u32;
        let table: Vec<u32> = (next..next + n).collect();
        for p in c - q..c {
            slots.push(table[p / BLOCK] * BLOCK as u32 + (p % BLOCK) as u32);
        }
        next += n;
        tables.push(table);
        cu.push(cu.last().unwrap() + q as u32);
        ctx.push(c as u32);
    }
    let num_tokens = slots.len();
    let meta = AttentionMetadata::new(slots, cu, ctx, &tables, dev)?;
    let (q_heads, kv_heads, head_dim) = shape();
    let shape = (next as usize, BLOCK, kv_heads, head_dim);
    let k = Tensor::randn(0f32, 1.0, shape, dev)?.to_dtype(dtype)?;
    let v = Tensor::randn(0f32, 1.0, shape, dev)?.to_dtype(dtype)?;
    let q = Tensor::randn(0f32, 1.0, (num_tokens, q_heads, head_dim), dev)?.to_dtype(dtype)?;
    Ok((q, k, v, meta))
}

/// CPU seconds used by this process so far (all threads), from /proc; None elsewhere. The box
/// this runs on is often shared, so CPU time is a steadier measure of work than wall time.
fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the parenthesised command name; utime and stime are the 12th and 13th.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

fn bench(name: &str, seqs: &[(usize, usize)], dtype: DType, iters: usize) -> Result<()> {
    let filter = std::env::args().nth(2).unwrap_or_default();
    if !format!("{name} {dtype:?}").contains(&filter) {
        return Ok(());
    }
    let (q, k, v, meta) = setup(seqs, dtype)?;
    let (q_heads, _, head_dim) = shape();
    let scale = 1.0 / (head_dim as f32).sqrt();
    paged_attention(&q, &k, &v, &meta, scale)?;
    let mut times = Vec::with_capacity(iters);
    let cpu0 = cpu_seconds();
    // Inside a pool, as the model runner calls it: from outside, every call would also wake
    // the pool's threads.
    let pool = rayon::ThreadPoolBuilder::new().build().expect("thread pool");
    pool.install(|| -> Result<()> {
        for _ in 0..iters {
            let t = Instant::now();
            paged_attention(&q, &k, &v, &meta, scale)?;
            times.push(t.elapsed().as_secs_f64() * 1e3);
        }
        Ok(())
    })?;
    let cpu_ms = match (cpu0, cpu_seconds()) {
        (Some(a), Some(b)) => (b - a) * 1e3 / iters as f64,
        _ => f64::NAN,
    };
    times.sort_by(f64::total_cmp);
    // Every query row attends to (position + 1) keys: 4 flops per key and head_dim element.
    let work: f64 = seqs.iter().map(|&(c, q)| (c - q..c).map(|p| (p + 1) as f64).sum::<f64>()).sum::<f64>()
        * (q_heads * head_dim * 4) as f64;
    let median = times[times.len() / 2];
    println!(
        "{name:<38} {dtype:?}: median {median:8.3} ms, min {:8.3} ms, cpu {cpu_ms:8.3} ms/call, \
         {:6.2} GFLOP/s (min), {:6.2} GFLOP/cpu-s",
        times[0],
        work / times[0] / 1e6,
        work / cpu_ms / 1e6
    );
    Ok(())
}

fn main() -> Result<()> {
    let iters = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(20);
    println!("rayon threads: {}", rayon::current_num_threads());
    for dtype in [DType::F16, DType::F32] {
        for q in [1usize, 5, 9] {
            bench(&format!("verify {q} positions x 300 ctx"), &[(300, q)], dtype, iters * 20)?;
        }
    }
    for dtype in [DType::F16, DType::F32, DType::BF16] {
        bench("decode 32 seqs x 1024 ctx", &[(1024, 1); 32], dtype, iters)?;
        bench("decode 1 seq x 2048 ctx", &[(2048, 1)], dtype, iters)?;
        bench("decode 1 seq x 4096 ctx", &[(4096, 1)], dtype, iters)?;
        bench("prefill 512 fresh", &[(512, 512)], dtype, iters.div_ceil(4))?;
        bench("prefill chunk 512 after 1536 cached", &[(2048, 512)], dtype, iters.div_ceil(4))?;
        bench("prefill 2048 fresh", &[(2048, 2048)], dtype, iters.div_ceil(4))?;
        let mut mixed = vec![(1024, 1); 16];
        mixed.push((768, 256));
        bench("mixed 16 decodes + 256-token chunk", &mixed, dtype, iters)?;
    }
    Ok(())
}

//! CPU paged attention at SmolLM2-135M's shapes (9 query heads, 3 kv heads, head_dim 64):
//! decode steps of 32 sequences, a 128-token prefill chunk and a speculative step's 9 verified
//! positions, over f32, f16 and FP8 (e4m3) caches, and a decode step over 30 layers' caches
//! (DRAM-resident, as when serving) in f16 and FP8.

use candle_core::{DType, Device, Tensor};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use pagoda_ops::{paged_attention, AttentionMetadata};

const Q_HEADS: usize = 9;
const KV_HEADS: usize = 3;
const HEAD_DIM: usize = 64;
const BLOCK: usize = 16;

/// `seqs` sequences of `q_len` new tokens each, `context` tokens in all, blocks interleaved
/// across sequences (as a busy block pool hands them out).
fn setup(
    seqs: usize,
    q_len: usize,
    context: usize,
    dtype: DType,
) -> (Tensor, Tensor, Tensor, AttentionMetadata) {
    let dev = Device::Cpu;
    let blocks_per_seq = context.div_ceil(BLOCK);
    let num_blocks = seqs * blocks_per_seq;
    let cache = |_| {
        Tensor::randn(0f32, 1.0, (num_blocks, BLOCK, KV_HEADS, HEAD_DIM), &dev)
            .unwrap()
            .to_dtype(dtype)
            .unwrap()
    };
    let (k, v) = (cache(0), cache(1));
    let tables: Vec<Vec<u32>> =
        (0..seqs).map(|s| (0..blocks_per_seq).map(|b| (b * seqs + s) as u32).collect()).collect();
    let table_refs: Vec<&[u32]> = tables.iter().map(Vec::as_slice).collect();
    let mut slots = Vec::new();
    let mut cu = vec![0u32];
    for table in &tables {
        for p in context - q_len..context {
            slots.push(table[p / BLOCK] * BLOCK as u32 + (p % BLOCK) as u32);
        }
        cu.push(cu.last().unwrap() + q_len as u32);
    }
    let meta = AttentionMetadata::new(slots, cu, vec![context as u32; seqs], &table_refs, &dev).unwrap();
    let q = Tensor::randn(0f32, 1.0, (seqs * q_len, Q_HEADS, HEAD_DIM), &dev).unwrap();
    (q, k, v, meta)
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("paged_attention");
    let scale = 1.0 / (HEAD_DIM as f32).sqrt();
    // `verify_1x9_224`: a speculative step at one stream, 8 proposals and the last token
    // verified at once over a 224-token context.
    for (name, seqs, q_len, context) in
        [("decode_32x256", 32, 1, 256), ("prefill_128", 1, 128, 128), ("verify_1x9_224", 1, 9, 224)]
    {
        for dtype in [DType::F32, DType::F16, DType::F8E4M3] {
            let (q, k, v, meta) = setup(seqs, q_len, context, dtype);
            group.bench_with_input(BenchmarkId::new(name, format!("{dtype:?}")), &(), |b, _| {
                b.iter(|| paged_attention(&q, &k, &v, &meta, scale).unwrap())
            });
        }
    }
    // A whole decode step's attention: 30 layers' caches (as SmolLM2 has), 189 MB in f16 (94 MB
    // in FP8), far more than the last-level cache, so the K/V reads come from DRAM as they do
    // when serving.
    for dtype in [DType::F16, DType::F8E4M3] {
        let layers: Vec<_> = (0..30).map(|_| setup(32, 1, 256, dtype)).collect();
        group.bench_with_input(
            BenchmarkId::new("decode_32x256_30_layers", format!("{dtype:?}")),
            &(),
            |b, _| {
                b.iter(|| {
                    for (q, k, v, meta) in &layers {
                        paged_attention(q, k, v, meta, scale).unwrap();
                    }
                })
            },
        );
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).warm_up_time(std::time::Duration::from_millis(500))
        .measurement_time(std::time::Duration::from_secs(2));
    targets = bench
}
criterion_main!(benches);

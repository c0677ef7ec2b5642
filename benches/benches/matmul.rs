//! The matmuls of SmolLM2-135M's 30 layers (fused QKV, attention output, fused gate-up, down,
//! each layer with its own weights) and its lm head, at the token counts of decode and prefill
//! steps: `quant_matmul` over the Q4_1/Q8_0 blocks, `panel_matmul` over the dequantized weights
//! packed in panels (f32, and rounded to bfloat16), the int8 panels of `--cpu-gemm-dtype int8`,
//! and candle's general f32 GEMM over the same values row-major. The crossover between the first
//! two decides the model's `DECODE_SIZED_MAX_TOKENS`. Each step runs inside a rayon pool, as the model
//! runner runs one, so the times do not include waking the pool's threads per matmul.
//!
//! `gemma3_270m`: the block kernel for each format at Gemma 3 270M's shapes (Q4_K_M file: Q5_0,
//! Q8_0, Q4_K, Q6_K; plus Q4_0 and Q5_K at the same shapes), 18 layers' own weights each, at 1
//! and 8 tokens, with criterion's throughput in bytes of weights read (as held in memory).
//! `memory_read`: a plain streaming read on all cores of 512 MiB (main memory) and of 24 MiB
//! (about one shape's 18 layers), the bandwidths to compare those with.

use std::sync::Arc;

use candle_core::{Device, Tensor};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use half::f16;
use pagoda_ops::{
    panel_matmul, quant_matmul, PanelPrecision, PanelWeight, QuantFormat, QuantizedWeight, QUANT_BLOCK,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const HIDDEN: usize = 576;
const FFN: usize = 1536;
const VOCAB: usize = 49152;
const LAYERS: usize = 30;

/// Byte offsets of the f16 fields (`d`, `m`, `dmin`) in one GGUF block of `format`.
fn half_fields(format: QuantFormat) -> &'static [usize] {
    match format {
        QuantFormat::Q4_1 | QuantFormat::Q4K | QuantFormat::Q5K => &[0, 2],
        QuantFormat::Q6K => &[208],
        _ => &[0],
    }
}

/// Random codes and sub-block scales, with `d` (and `m`, `dmin`) of a real model's magnitude.
fn random_weight(rng: &mut StdRng, format: QuantFormat, rows: usize, cols: usize) -> QuantizedWeight {
    let block_bytes = format.gguf_block_bytes();
    let blocks = rows * cols / format.gguf_block_elems();
    let scale = if format.gguf_block_elems() == QUANT_BLOCK { 0.02 } else { 0.001 };
    let mut bytes: Vec<u8> = (0..blocks * block_bytes).map(|_| rng.random()).collect();
    for block in bytes.chunks_exact_mut(block_bytes) {
        for (i, &at) in half_fields(format).iter().enumerate() {
            let v: f32 = rng.random_range(0.05 * scale..scale);
            let v = if format == QuantFormat::Q4_1 && i == 1 { -10.0 * v } else { v };
            block[at..at + 2].copy_from_slice(&f16::from_f32(v).to_le_bytes());
        }
    }
    QuantizedWeight::from_gguf(format, rows, cols, &bytes).expect("valid blocks")
}

struct Weights {
    packed: Arc<QuantizedWeight>,
    dense: Tensor,
    panels: Arc<PanelWeight>,
    bf16_panels: Arc<PanelWeight>,
    int8_panels: Arc<PanelWeight>,
    int16_panels: Arc<PanelWeight>,
}

fn weights(rng: &mut StdRng, format: QuantFormat, rows: usize, cols: usize) -> Weights {
    let packed = random_weight(rng, format, rows, cols);
    let dense = Tensor::from_vec(packed.dequantize(), (rows, cols), &Device::Cpu).expect("shape");
    let panels = Arc::new(PanelWeight::from_quantized(&packed, PanelPrecision::F32));
    let bf16_panels = Arc::new(PanelWeight::from_quantized(&packed, PanelPrecision::Bf16));
    let int8_panels = Arc::new(PanelWeight::from_quantized(&packed, PanelPrecision::Int8));
    let int16_panels = Arc::new(PanelWeight::from_quantized(&packed, PanelPrecision::Int16));
    Weights { packed: Arc::new(packed), dense, panels, bf16_panels, int8_panels, int16_panels }
}

fn bench(c: &mut Criterion) {
    let mut rng = StdRng::seed_from_u64(1);
    // Every layer's own weights, as in the model: one layer alone would sit in the L3 cache and
    // flatter the memory-bound small steps.
    let layers: Vec<Weights> = (0..LAYERS)
        .flat_map(|_| {
            [
                weights(&mut rng, QuantFormat::Q4_1, HIDDEN + 2 * 192, HIDDEN),
                weights(&mut rng, QuantFormat::Q4_1, HIDDEN, HIDDEN),
                weights(&mut rng, QuantFormat::Q4_1, 2 * FFN, HIDDEN),
                weights(&mut rng, QuantFormat::Q4_1, HIDDEN, FFN),
            ]
        })
        .collect();
    let head = weights(&mut rng, QuantFormat::Q8_0, VOCAB, HIDDEN);
    let input = |m: usize, k: usize| Tensor::randn(0f32, 1.0, (m, k), &Device::Cpu).expect("randn");

    // Each iteration runs inside a pool, as the model runner runs a step: called from outside,
    // every matmul would also pay for waking the pool's threads.
    let pool = rayon::ThreadPoolBuilder::new().build().expect("thread pool");
    let mut group = c.benchmark_group("model_matmuls");
    for m in [1usize, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16, 24, 32, 64, 128] {
        let xs: Vec<Tensor> = layers.iter().map(|w| input(m, w.packed.cols())).collect();
        group.bench_with_input(BenchmarkId::new("quant", m), &m, |b, _| {
            b.iter(|| {
                pool.install(|| {
                    for (w, x) in layers.iter().zip(&xs) {
                        quant_matmul(x, &w.packed).expect("matmul");
                    }
                })
            })
        });
        group.bench_with_input(BenchmarkId::new("dense_f32", m), &m, |b, _| {
            b.iter(|| {
                pool.install(|| {
                    for (w, x) in layers.iter().zip(&xs) {
                        x.matmul(&w.dense.t().expect("t")).expect("matmul");
                    }
                })
            })
        });
        group.bench_with_input(BenchmarkId::new("panel_f32", m), &m, |b, _| {
            b.iter(|| {
                pool.install(|| {
                    for (w, x) in layers.iter().zip(&xs) {
                        panel_matmul(x, &w.panels).expect("matmul");
                    }
                })
            })
        });
        group.bench_with_input(BenchmarkId::new("panel_bf16", m), &m, |b, _| {
            b.iter(|| {
                pool.install(|| {
                    for (w, x) in layers.iter().zip(&xs) {
                        panel_matmul(x, &w.bf16_panels).expect("matmul");
                    }
                })
            })
        });
        group.bench_with_input(BenchmarkId::new("panel_int8", m), &m, |b, _| {
            b.iter(|| {
                pool.install(|| {
                    for (w, x) in layers.iter().zip(&xs) {
                        panel_matmul(x, &w.int8_panels).expect("matmul");
                    }
                })
            })
        });
        group.bench_with_input(BenchmarkId::new("panel_int16", m), &m, |b, _| {
            b.iter(|| {
                pool.install(|| {
                    for (w, x) in layers.iter().zip(&xs) {
                        panel_matmul(x, &w.int16_panels).expect("matmul");
                    }
                })
            })
        });
    }
    group.finish();

    let mut group = c.benchmark_group("lm_head");
    for m in [1usize, 4, 5, 9, 16, 17, 32] {
        let x = input(m, HIDDEN);
        group.bench_with_input(BenchmarkId::new("quant", m), &m, |b, _| {
            b.iter(|| pool.install(|| quant_matmul(&x, &head.packed).expect("matmul")))
        });
        group.bench_with_input(BenchmarkId::new("dense_f32", m), &m, |b, _| {
            b.iter(|| pool.install(|| x.matmul(&head.dense.t().expect("t")).expect("matmul")))
        });
        group.bench_with_input(BenchmarkId::new("panel_f32", m), &m, |b, _| {
            b.iter(|| pool.install(|| panel_matmul(&x, &head.panels).expect("matmul")))
        });
        group.bench_with_input(BenchmarkId::new("panel_int8", m), &m, |b, _| {
            b.iter(|| pool.install(|| panel_matmul(&x, &head.int8_panels).expect("matmul")))
        });
        group.bench_with_input(BenchmarkId::new("panel_int16", m), &m, |b, _| {
            b.iter(|| pool.install(|| panel_matmul(&x, &head.int16_panels).expect("matmul")))
        });
    }
    group.finish();
}

const GEMMA_HIDDEN: usize = 640;
const GEMMA_LAYERS: usize = 18;

/// Gemma 3 270M's matmuls (name, format, rows, cols) as its Q4_K_M file stores them (gate and
/// up are alike), and two more formats at its shapes.
const GEMMA_SHAPES: [(&str, QuantFormat, usize, usize); 8] = [
    ("q", QuantFormat::Q5_0, 1024, GEMMA_HIDDEN),
    ("k", QuantFormat::Q5_0, 256, GEMMA_HIDDEN),
    ("v", QuantFormat::Q8_0, 256, GEMMA_HIDDEN),
    ("o", QuantFormat::Q4K, GEMMA_HIDDEN, 1024),
    ("gate", QuantFormat::Q5_0, 2048, GEMMA_HIDDEN),
    ("down", QuantFormat::Q6K, GEMMA_HIDDEN, 2048),
    ("q_as_q4_0", QuantFormat::Q4_0, 1024, GEMMA_HIDDEN),
    ("down_as_q5k", QuantFormat::Q5K, GEMMA_HIDDEN, 2048),
];

fn gemma(c: &mut Criterion) {
    let mut rng = StdRng::seed_from_u64(2);
    let input = |m: usize, k: usize| Tensor::randn(0f32, 1.0, (m, k), &Device::Cpu).expect("randn");
    let mut group = c.benchmark_group("gemma3_270m");
    for (name, format, rows, cols) in GEMMA_SHAPES {
        // Each layer's own weights, as in the model.
        let layers: Vec<Arc<QuantizedWeight>> =
            (0..GEMMA_LAYERS).map(|_| Arc::new(random_weight(&mut rng, format, rows, cols))).collect();
        let bytes: usize = layers.iter().map(|w| w.size_in_bytes()).sum();
        group.throughput(Throughput::Bytes(bytes as u64));
        for m in [1usize, 8] {
            let xs: Vec<Tensor> = layers.iter().map(|_| input(m, cols)).collect();
            let id = format!("{name}_{format:?}_{rows}x{cols}");
            group.bench_with_input(BenchmarkId::new(id, m), &m, |b, _| {
                b.iter(|| {
                    for (w, x) in layers.iter().zip(&xs) {
                        quant_matmul(x, w).expect("matmul");
                    }
                })
            });
        }
    }
    let head = Arc::new(random_weight(&mut rng, QuantFormat::Q8_0, 262_144, GEMMA_HIDDEN));
    group.throughput(Throughput::Bytes(head.size_in_bytes() as u64));
    for m in [1usize, 8] {
        let x = input(m, GEMMA_HIDDEN);
        group.bench_with_input(BenchmarkId::new("lm_head_Q8_0_262144x640", m), &m, |b, _| {
            b.iter(|| quant_matmul(&x, &head).expect("matmul"))
        });
    }
    group.finish();

    // The many-token steps: bfloat16, int8 and int16 panels at Gemma 3's shapes (all 18 layers' seven
    // matmuls as Q5_0, and the Q8_0 lm head), throughput in multiply-adds x 2 (flops).
    let mut group = c.benchmark_group("gemma3_270m_panels");
    let layer_shapes = [
        (1024, GEMMA_HIDDEN),
        (256, GEMMA_HIDDEN),
        (256, GEMMA_HIDDEN),
        (GEMMA_HIDDEN, 1024),
        (2048, GEMMA_HIDDEN),
        (2048, GEMMA_HIDDEN),
        (GEMMA_HIDDEN, 2048),
    ];
    let blocks: Vec<QuantizedWeight> = (0..GEMMA_LAYERS)
        .flat_map(|_| layer_shapes)
        .map(|(rows, cols)| random_weight(&mut rng, QuantFormat::Q5_0, rows, cols))
        .collect();
    let quant_layers: Vec<Arc<QuantizedWeight>> = blocks.iter().map(|w| Arc::new(w.clone())).collect();
    for m in [1usize, 4, 8, 16] {
        let flops: usize = quant_layers.iter().map(|w| 2 * m * w.rows() * w.cols()).sum();
        group.throughput(Throughput::Elements(flops as u64));
        let xs: Vec<Tensor> = quant_layers.iter().map(|w| input(m, w.cols())).collect();
        group.bench_with_input(BenchmarkId::new("layers_blocks", m), &m, |b, _| {
            b.iter(|| {
                for (w, x) in quant_layers.iter().zip(&xs) {
                    quant_matmul(x, w).expect("matmul");
                }
            })
        });
        group.throughput(Throughput::Elements((2 * m * 262_144 * GEMMA_HIDDEN) as u64));
        let x = input(m, GEMMA_HIDDEN);
        group.bench_with_input(BenchmarkId::new("lm_head_blocks", m), &m, |b, _| {
            b.iter(|| quant_matmul(&x, &head).expect("matmul"))
        });
    }
    for (name, precision) in
        [("bf16", PanelPrecision::Bf16), ("int8", PanelPrecision::Int8), ("int16", PanelPrecision::Int16)]
    {
        let layers: Vec<Arc<PanelWeight>> =
            blocks.iter().map(|w| Arc::new(PanelWeight::from_quantized(w, precision))).collect();
        let head_panels = Arc::new(PanelWeight::from_quantized(&head, precision));
        for m in [1usize, 4, 8, 16, 32, 128] {
            let flops: usize = layers.iter().map(|w| 2 * m * w.rows() * w.cols()).sum();
            group.throughput(Throughput::Elements(flops as u64));
            let xs: Vec<Tensor> = layers.iter().map(|w| input(m, w.cols())).collect();
            group.bench_with_input(BenchmarkId::new(format!("layers_{name}"), m), &m, |b, _| {
                b.iter(|| {
                    for (w, x) in layers.iter().zip(&xs) {
                        panel_matmul(x, w).expect("matmul");
                    }
                })
            });
            group.throughput(Throughput::Elements((2 * m * 262_144 * GEMMA_HIDDEN) as u64));
            let x = input(m, GEMMA_HIDDEN);
            group.bench_with_input(BenchmarkId::new(format!("lm_head_{name}"), m), &m, |b, _| {
                b.iter(|| panel_matmul(&x, &head_panels).expect("matmul"))
            });
        }
    }
    group.finish();
}

/// The wrapping sum of `buf`, split over `threads` scoped threads.
fn stream_sum(buf: &[u64], threads: usize) -> u64 {
    let chunk = buf.len().div_ceil(threads);
    std::thread::scope(|s| {
        let handles: Vec<_> = buf
            .chunks(chunk)
            .map(|c| s.spawn(move || c.iter().fold(0u64, |a, &b| a.wrapping_add(b))))
            .collect();
        handles.into_iter().map(|h| h.join().expect("reader")).fold(0, u64::wrapping_add)
    })
}

fn memory(c: &mut Criterion) {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut group = c.benchmark_group("memory_read");
    for mib in [512usize, 24] {
        let buf: Vec<u64> = (0..mib << 17).map(|i| i as u64).collect();
        group.throughput(Throughput::Bytes((mib << 20) as u64));
        group.bench_with_input(BenchmarkId::new("stream_sum_MiB", mib), &mib, |b, _| {
            b.iter(|| std::hint::black_box(stream_sum(&buf, threads)))
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).warm_up_time(std::time::Duration::from_millis(500))
        .measurement_time(std::time::Duration::from_secs(2));
    targets = bench, gemma, memory
}
criterion_main!(benches);

//! The matmuls of SmolLM2-135M's 30 layers (fused QKV, attention output, fused gate-up, down,
//! each layer with its own weights) and its lm head, at the token counts of decode and prefill
//! steps: `quant_matmul` over the Q4_1/Q8_0 blocks, `panel_matmul` over the dequantized weights
//! packed in panels (f32, and rounded to bfloat16), and candle's general f32 GEMM over the same values row-major. The
//! crossover between the first two decides the model's `PACKED_MAX_TOKENS`.

use std::sync::Arc;

use candle_core::{Device, Tensor};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
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

fn random_weight(rng: &mut StdRng, format: QuantFormat, rows: usize, cols: usize) -> QuantizedWeight {
    let mut bytes = Vec::with_capacity(rows * cols / QUANT_BLOCK * format.gguf_block_bytes());
    for _ in 0..rows * cols / QUANT_BLOCK {
        bytes.extend(f16::from_f32(rng.random_range(0.001..0.02)).to_le_bytes());
        if format == QuantFormat::Q4_1 {
            bytes.extend(f16::from_f32(rng.random_range(-0.15..0.0)).to_le_bytes());
        }
        let codes = format.gguf_block_bytes() - if format == QuantFormat::Q4_1 { 4 } else { 2 };
        bytes.extend((0..codes).map(|_| rng.random::<u8>()));
    }
    QuantizedWeight::from_gguf(format, rows, cols, &bytes).expect("valid blocks")
}

struct Weights {
    packed: Arc<QuantizedWeight>,
    dense: Tensor,
    panels: Arc<PanelWeight>,
    bf16_panels: Arc<PanelWeight>,
}

fn weights(rng: &mut StdRng, format: QuantFormat, rows: usize, cols: usize) -> Weights {
    let packed = random_weight(rng, format, rows, cols);
    let dense = Tensor::from_vec(packed.dequantize(), (rows, cols), &Device::Cpu).expect("shape");
    let panels = Arc::new(PanelWeight::from_quantized(&packed, PanelPrecision::F32));
    let bf16_panels = Arc::new(PanelWeight::from_quantized(&packed, PanelPrecision::Bf16));
    Weights { packed: Arc::new(packed), dense, panels, bf16_panels }
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

    let mut group = c.benchmark_group("model_matmuls");
    for m in [1usize, 4, 8, 12, 16, 24, 32, 64, 128] {
        let xs: Vec<Tensor> = layers.iter().map(|w| input(m, w.packed.cols())).collect();
        group.bench_with_input(BenchmarkId::new("quant", m), &m, |b, _| {
            b.iter(|| {
                for (w, x) in layers.iter().zip(&xs) {
                    quant_matmul(x, &w.packed).expect("matmul");
                }
            })
        });
        group.bench_with_input(BenchmarkId::new("dense_f32", m), &m, |b, _| {
            b.iter(|| {
                for (w, x) in layers.iter().zip(&xs) {
                    x.matmul(&w.dense.t().expect("t")).expect("matmul");
                }
            })
        });
        group.bench_with_input(BenchmarkId::new("panel_f32", m), &m, |b, _| {
            b.iter(|| {
                for (w, x) in layers.iter().zip(&xs) {
                    panel_matmul(x, &w.panels).expect("matmul");
                }
            })
        });
        group.bench_with_input(BenchmarkId::new("panel_bf16", m), &m, |b, _| {
            b.iter(|| {
                for (w, x) in layers.iter().zip(&xs) {
                    panel_matmul(x, &w.bf16_panels).expect("matmul");
                }
            })
        });
    }
    group.finish();

    let mut group = c.benchmark_group("lm_head");
    for m in [1usize, 4, 16, 17, 32] {
        let x = input(m, HIDDEN);
        group.bench_with_input(BenchmarkId::new("quant", m), &m, |b, _| {
            b.iter(|| quant_matmul(&x, &head.packed).expect("matmul"))
        });
        group.bench_with_input(BenchmarkId::new("dense_f32", m), &m, |b, _| {
            b.iter(|| x.matmul(&head.dense.t().expect("t")).expect("matmul"))
        });
        group.bench_with_input(BenchmarkId::new("panel_f32", m), &m, |b, _| {
            b.iter(|| panel_matmul(&x, &head.panels).expect("matmul"))
        });
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

//! One panel kernel's rate on one thread with its weight in L2, per number of activation rows:
//! what the tile itself costs, apart from DRAM and the thread pool (`model_matmuls` in
//! `benches/matmul.rs` measures those together). A 1024 x 576 Q4_1 weight (SmolLM2's K/V/Q
//! shape), packed for the chosen precision; the median and p10 of 3000 calls per row count.
//!
//!   cargo run --release -p pagoda-bench --example tile_rate -- int16|int8|bf16|f32 [ROWS...]

use std::sync::Arc;
use std::time::Instant;

use candle_core::{Device, Tensor};
use half::f16;
use pagoda_ops::{panel_matmul, PanelPrecision, PanelWeight, QuantFormat, QuantizedWeight};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const ROWS: usize = 1024;
const COLS: usize = 576;
const CALLS: usize = 3000;

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: tile_rate int16|int8|bf16|f32 [ROWS...]";
    let precision = match args.next().as_deref() {
        Some("int16") => PanelPrecision::Int16,
        Some("int8") => PanelPrecision::Int8,
        Some("bf16") => PanelPrecision::Bf16,
        Some("f32") => PanelPrecision::F32,
        _ => anyhow::bail!(usage),
    };
    let mut row_counts: Vec<usize> = args.map(|a| a.parse()).collect::<Result<_, _>>()?;
    if row_counts.is_empty() {
        row_counts = vec![1, 2, 3, 6, 7, 9];
    }
    let mut rng = StdRng::seed_from_u64(1);
    let block_bytes = QuantFormat::Q4_1.gguf_block_bytes();
    let mut bytes: Vec<u8> = (0..ROWS * COLS / 32 * block_bytes).map(|_| rng.random()).collect();
    for block in bytes.chunks_exact_mut(block_bytes) {
        block[0..2].copy_from_slice(&f16::from_f32(rng.random_range(0.001..0.02)).to_le_bytes());
        block[2..4].copy_from_slice(&f16::from_f32(rng.random_range(-0.2..-0.01)).to_le_bytes());
    }
    let weight = QuantizedWeight::from_gguf(QuantFormat::Q4_1, ROWS, COLS, &bytes)?;
    let panels = Arc::new(PanelWeight::from_quantized(&weight, precision));
    let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build()?;
    pool.install(|| -> anyhow::Result<()> {
        for &m in &row_counts {
            let x = Tensor::randn(0f32, 1.0, (m, COLS), &Device::Cpu)?;
            let mut times: Vec<f64> = (0..CALLS)
                .map(|_| {
                    let start = Instant::now();
                    std::hint::black_box(panel_matmul(&x, &panels).expect("matmul"));
                    start.elapsed().as_secs_f64()
                })
                .collect();
            times.sort_by(f64::total_cmp);
            let (p10, median) = (times[CALLS / 10], times[CALLS / 2]);
            let macs = (m * ROWS * COLS) as f64;
            println!(
                "{m:>3} rows: median {:.1} us, p10 {:.1} us ({:.1} G multiply-adds/s at p10)",
                median * 1e6,
                p10 * 1e6,
                macs / p10 / 1e9
            );
        }
        Ok(())
    })
}

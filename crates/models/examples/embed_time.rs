//! Times an encoder's forward pass in-process (`Model::embed` inside a rayon pool, as the
//! runner calls it) for one input alone and for a batch, and prints the lowest cosine of its
//! embeddings against the float64 reference of scripts/golden_embeddings.py.
//!
//!   cargo run --release -p pagoda-models --example embed_time -- [MODEL_DIR] [ITERS]
//!
//! MODEL_DIR defaults to models/all-MiniLM-L6-v2, ITERS (per shape) to 100.

use std::path::PathBuf;
use std::time::Instant;

use candle_core::{Device, Tensor};
use pagoda_models::{load_model, LoadOptions, Model};

fn main() -> anyhow::Result<()> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let args: Vec<String> = std::env::args().collect();
    let dir = args.get(1).map_or_else(|| root.join("models/all-MiniLM-L6-v2"), PathBuf::from);
    let iters: usize = args.get(2).map_or(Ok(100), |s| s.parse())?;
    let model = load_model(&dir, &LoadOptions::default())?.model;
    let pool = rayon::ThreadPoolBuilder::new().build()?;

    let fixture: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(root.join("tests/fixtures/embeddings-minilm.json"))?)?;
    let mut worst = 1f64;
    for case in fixture["cases"].as_array().into_iter().flatten() {
        let ids: Vec<u32> = serde_json::from_value(case["token_ids"].clone())?;
        let want: Vec<f64> = serde_json::from_value(case["embedding"].clone())?;
        let got = pool.install(|| embed(&model, &[ids]))?.remove(0);
        let dot: f64 = got.iter().zip(&want).map(|(&a, b)| f64::from(a) * b).sum();
        let norm = |v: &mut dyn Iterator<Item = f64>| v.map(|x| x * x).sum::<f64>().sqrt();
        worst =
            worst.min(dot / (norm(&mut got.iter().map(|&x| f64::from(x))) * norm(&mut want.iter().copied())));
    }
    println!("lowest cosine against the reference: {worst:.9} (1 - cosine = {:.2e})", 1.0 - worst);

    let input = |len: usize, seed: usize| -> Vec<u32> {
        let mut ids = vec![101];
        ids.extend((1..len - 1).map(|i| 2000 + ((i * 7919 + seed * 104_729) % 20_000) as u32));
        ids.push(102);
        ids
    };
    for (label, inputs) in [
        ("1 x 100 tokens", vec![input(100, 0)]),
        ("5 x 96 tokens", (0..5).map(|s| input(96, s)).collect::<Vec<_>>()),
    ] {
        let mut times = Vec::with_capacity(iters);
        for _ in 0..iters + 3 {
            let start = Instant::now();
            pool.install(|| embed(&model, &inputs))?;
            times.push(start.elapsed().as_secs_f64() * 1e3);
        }
        let mut times = times.split_off(3);
        times.sort_by(f64::total_cmp);
        println!("{label}: median {:.3} ms, min {:.3} ms", times[times.len() / 2], times[0]);
    }
    Ok(())
}

fn embed(model: &Model, inputs: &[Vec<u32>]) -> anyhow::Result<Vec<Vec<f32>>> {
    let ids: Vec<u32> = inputs.concat();
    let positions: Vec<u32> = inputs.iter().flat_map(|s| 0..s.len() as u32).collect();
    let mut bounds = vec![0];
    for s in inputs {
        bounds.push(bounds.last().unwrap() + s.len());
    }
    let n = ids.len();
    let device = Device::Cpu;
    let ids = Tensor::from_vec(ids, n, &device)?;
    let types = Tensor::zeros(n, candle_core::DType::U32, &device)?;
    let positions = Tensor::from_vec(positions, n, &device)?;
    Ok(model.embed(&ids, &types, &positions, &bounds)?)
}

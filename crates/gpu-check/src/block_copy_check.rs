//! `KvCache::copy_blocks` on the device: the copy-on-write of forked samples' and beams' partial
//! pages. It must be exact, leave every page not copied into alone, and cost the same in a
//! large cache as in a small one (issue 63: each copy once cloned whole cache tensors, so a
//! fork's cost grew with the cache). The binary runs it on CUDA with the default model's shape
//! (30 layers of 3 KV heads of 64) in caches of 64 MiB and 1 GiB; the tests run it on the CPU.

use std::time::Instant;

use anyhow::Result;
use candle_core::{DType, Device, Tensor};
use pagoda_models::{KvCache, ModelConfig};
use pagoda_ops::RotaryStyle;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::report::Report;
use crate::timing::median;

const SECTION: &str = "ops";
const BLOCK_SIZE: usize = 16;

/// SmolLM2-135M's KV shape.
fn config() -> ModelConfig {
    ModelConfig {
        architecture: "llama".into(),
        vocab_size: 49152,
        hidden_size: 576,
        intermediate_size: 1536,
        num_layers: 30,
        num_heads: 9,
        num_kv_heads: 3,
        head_dim: 64,
        rms_norm_eps: 1e-5,
        rope_theta: 100_000.0,
        rope_scaling: Default::default(),
        rope_freq_factors: None,
        rope_style: RotaryStyle::Halves,
        max_position_embeddings: 8192,
        tie_word_embeddings: true,
        attention_bias: false,
        qk_norm: false,
        sliding_window: None,
        sliding_layers: vec![false; 30],
        rope_local_theta: None,
        query_pre_attn_scalar: None,
        attn_logit_softcapping: None,
        final_logit_softcapping: None,
        moe: None,
        long_rope: None,
    }
}

/// `(src, dst)` page copies of one step.
type Copies = Vec<(u32, u32)>;

/// The copies of a request of `n: 64` forking (its partial page 3 into 63 fresh pages), and of
/// beams chosen again (scattered pages, one read after another pair wrote it).
fn pairs() -> (Copies, Copies) {
    let fork = (0..63).map(|i| (3, 10 + i)).collect();
    let beams = vec![(5, 100), (7, 90), (3, 150), (90, 2), (100, 101)];
    (fork, beams)
}

/// Pages enough for the pairs.
const EXACT_BLOCKS: usize = 160;

fn cache(blocks: usize, dtype: DType, device: &Device) -> Result<KvCache> {
    Ok(KvCache::new(&config(), blocks, BLOCK_SIZE, dtype, device)?)
}

/// Every K and V tensor of the cache as f32 on the host.
fn contents(cache: &KvCache) -> Result<Vec<Vec<f32>>> {
    let mut out = Vec::new();
    for slot in 0..cache.num_slots() {
        let (k, v) = cache.slot(slot);
        for t in [k, v] {
            // To the host first: candle's CUDA casts lack f8e4m3.
            out.push(t.to_device(&Device::Cpu)?.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?);
        }
    }
    Ok(out)
}

/// Copies of every pair, in `dtype`, against the same copies made page by page on the host.
fn exact(device: &Device, dtype: DType, rng: &mut StdRng) -> Result<bool> {
    let cache = cache(EXACT_BLOCKS, dtype, device)?;
    for slot in 0..cache.num_slots() {
        let (k, v) = cache.slot(slot);
        for t in [k, v] {
            let values: Vec<f32> = (0..t.elem_count()).map(|_| rng.random_range(-4.0f32..4.0)).collect();
            let host = Tensor::from_vec(values, t.dims(), &Device::Cpu)?.to_dtype(dtype)?;
            t.slice_set(&host.to_device(device)?, 0, 0)?;
        }
    }
    let page = BLOCK_SIZE * 3 * 64;
    let (fork, beams) = pairs();
    let mut ok = true;
    for list in [fork, beams] {
        let mut want = contents(&cache)?;
        for tensor in &mut want {
            for &(src, dst) in &list {
                let (src, dst) = (src as usize * page, dst as usize * page);
                tensor.copy_within(src..src + page, dst);
            }
        }
        cache.copy_blocks(&list)?;
        ok &= contents(&cache)? == want;
    }
    Ok(ok)
}

/// Median seconds of the fork's copies in a cache of `bytes`.
fn fork_seconds(device: &Device, bytes: u64) -> Result<f64> {
    let blocks = KvCache::blocks_for_budget(&config(), BLOCK_SIZE, DType::BF16, bytes);
    let cache = cache(blocks, DType::BF16, device)?;
    let (fork, _) = pairs();
    let mut samples = Vec::new();
    for _ in 0..7 {
        device.synchronize()?;
        let started = Instant::now();
        cache.copy_blocks(&fork)?;
        device.synchronize()?;
        samples.push(started.elapsed().as_secs_f64());
    }
    Ok(median(&mut samples))
}

/// The checks; the copies timed in bf16 caches of `small` and `large` bytes (at least 73
/// pages each).
pub fn run_with(device: &Device, report: &mut Report, small: u64, large: u64) -> Result<()> {
    let mut rng = StdRng::seed_from_u64(63);
    for dtype in [DType::F32, DType::BF16, DType::F16, DType::F8E4M3] {
        let check = format!("copy_blocks {dtype:?}: a fork's and beams' pages, the rest untouched");
        match exact(device, dtype, &mut rng) {
            Ok(ok) => report.expect(SECTION, &check, ok, if ok { "exact" } else { "differ" }),
            Err(e) => report.error(SECTION, &check, format!("{e:#}")),
        }
    }
    let (small_s, large_s) = (fork_seconds(device, small)?, fork_seconds(device, large)?);
    let check = format!(
        "copy_blocks: 63 page copies in a {} MiB cache against a {} MiB one (time ratio)",
        large >> 20,
        small >> 20
    );
    report.at_most(SECTION, &check, large_s / small_s.max(1e-9), 2.0);
    report.info(
        SECTION,
        "copy_blocks: 63 page copies (bf16, 30 layers)",
        format!(
            "{:.1} us in {} MiB, {:.1} us in {} MiB",
            small_s * 1e6,
            small >> 20,
            large_s * 1e6,
            large >> 20
        ),
    );
    Ok(())
}

/// The checks as the binary runs them: caches of 64 MiB and 1 GiB.
pub fn run(device: &Device, report: &mut Report) -> Result<()> {
    run_with(device, report, 64 << 20, 1 << 30)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_are_exact_on_the_cpu() {
        let mut report = Report::new("cpu");
        run_with(&Device::Cpu, &mut report, 32 << 20, 256 << 20).unwrap();
        let exact: Vec<_> = report.rows.iter().filter(|r| r.check.contains("untouched")).collect();
        assert_eq!(exact.len(), 4, "{:?}", report.rows);
        assert!(exact.iter().all(|r| r.pass == Some(true)), "{exact:?}");
        assert!(report.rows.iter().any(|r| r.check.contains("time ratio")), "{:?}", report.rows);
    }
}

//! Shared helpers of the model tests: the real model, the golden fixture, and a tiny block
//! allocator so tests can drive the runner without the engine.

#![allow(dead_code)]

pub mod real_engine;

use std::path::PathBuf;

use candle_core::{DType, Device};
use pagoda_engine::{BlockTableUpdate, SampleRequest, ScheduledBatch, ScheduledSeq};
use pagoda_models::{load_model, KernelPlan, KvCache, LoadOptions, ModelRunner, PanelPrecision};

pub const BLOCK_SIZE: usize = 16;

pub fn repo_root() -> PathBuf {
    // Cargo's run-time value: a test binary reused from a build in another checkout still
    // carries that checkout's compile-time path.
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from)
        .join("../..")
}

pub fn model_path() -> PathBuf {
    let path = repo_root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(path.exists(), "{} is missing: run scripts/fetch-model.sh (make does it)", path.display());
    path
}

/// Gemma 3 270M (Q4_K_M), the second real model.
pub fn gemma3_path() -> PathBuf {
    let path = repo_root().join("models/gemma-3-270m-q4_k_m.gguf");
    assert!(path.exists(), "{} is missing: run scripts/fetch-model.sh gemma3 (make does it)", path.display());
    path
}

/// The golden fixture of scripts/golden_gemma3.py.
pub fn gemma3_fixture() -> serde_json::Value {
    read_fixture("golden-gemma3.json", "scripts/golden_gemma3.py")
}

/// The fixture's logits case with the longest prompt (Gemma 3's goes past its 512-token window).
pub fn longest_logits_case(fixture: &serde_json::Value) -> &serde_json::Value {
    let cases = fixture["logits_cases"].as_array().expect("logits cases");
    cases.iter().max_by_key(|c| c["prompt_ids"].as_array().unwrap().len()).expect("at least one case")
}

/// Submits every request at once and collects each one's generated ids; a request that ends in
/// an error fails the test.
pub fn generate_all(
    handle: &pagoda_engine::EngineHandle,
    requests: Vec<pagoda_engine::Request>,
) -> Vec<Vec<u32>> {
    // One call: the engine adds them all before its next step, so the schedule does not depend
    // on how fast this thread submits.
    let mut streams = handle.submit_all(requests).unwrap();
    streams
        .iter_mut()
        .map(|stream| {
            let mut ids = Vec::new();
            while let Some(event) = stream.blocking_recv() {
                assert!(
                    !matches!(event.finished, Some(pagoda_engine::FinishReason::Error(_))),
                    "request failed: {:?}",
                    event.finished
                );
                ids.extend(event.token_ids);
            }
            ids
        })
        .collect()
}

/// The f32 model at `path` (GGUF blocks kept for small steps) over `num_blocks` f32 cache blocks.
pub fn runner_for(path: &std::path::Path, num_blocks: usize) -> ModelRunner {
    runner_for_with_panels(path, num_blocks, PanelPrecision::F32)
}

/// [`runner_for`] with the many-token (or, for int8, every) step's matmuls in `panels`.
pub fn runner_for_with_panels(
    path: &std::path::Path,
    num_blocks: usize,
    panels: PanelPrecision,
) -> ModelRunner {
    let options = LoadOptions {
        dequantize: Some(true),
        kernel_plan: KernelPlan::panels(panels),
        ..LoadOptions::default()
    };
    let loaded = load_model(path, &options).expect("the model loads");
    let cache =
        KvCache::new(loaded.model.config(), num_blocks, BLOCK_SIZE, DType::F32, &Device::Cpu).unwrap();
    ModelRunner::new(loaded.model, cache, Device::Cpu).unwrap()
}

fn read_fixture(name: &str, generator: &str) -> serde_json::Value {
    let path = repo_root().join("tests/fixtures").join(name);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (regenerate with {generator})", path.display()));
    serde_json::from_str(&text).expect("the fixture is valid JSON")
}

pub fn fixture() -> serde_json::Value {
    let path = repo_root().join("tests/fixtures/golden.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (regenerate with scripts/golden.py)", path.display()));
    serde_json::from_str(&text).expect("golden.json is valid JSON")
}

/// A JSON array of arrays of numbers (a reference's logits or features), as f32 rows.
pub fn rows(v: &serde_json::Value) -> Vec<Vec<f32>> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect())
        .collect()
}

pub fn ids(value: &serde_json::Value) -> Vec<u32> {
    value.as_array().expect("an array of ids").iter().map(|v| v.as_u64().unwrap() as u32).collect()
}

pub fn runner(dequantize: bool, num_blocks: usize) -> ModelRunner {
    runner_with_cache(dequantize, num_blocks, DType::F32)
}

/// The f32 model over a KV cache stored as `cache_dtype`.
pub fn runner_with_cache(dequantize: bool, num_blocks: usize, cache_dtype: DType) -> ModelRunner {
    runner_with_panels(dequantize, num_blocks, cache_dtype, PanelPrecision::F32)
}

/// The f32 model with its many-token GEMM in `panels`, over a KV cache stored as `cache_dtype`.
pub fn runner_with_panels(
    dequantize: bool,
    num_blocks: usize,
    cache_dtype: DType,
    panels: PanelPrecision,
) -> ModelRunner {
    runner_with_plan(dequantize, num_blocks, cache_dtype, KernelPlan::panels(panels))
}

/// The same with the CPU's kernels as `kernel_plan` says.
pub fn runner_with_plan(
    dequantize: bool,
    num_blocks: usize,
    cache_dtype: DType,
    kernel_plan: KernelPlan,
) -> ModelRunner {
    let options = LoadOptions { dequantize: Some(dequantize), kernel_plan, ..LoadOptions::default() };
    let loaded = load_model(&model_path(), &options).expect("the default model loads");
    let cache =
        KvCache::new(loaded.model.config(), num_blocks, BLOCK_SIZE, cache_dtype, &Device::Cpu).unwrap();
    ModelRunner::new(loaded.model, cache, Device::Cpu).unwrap()
}

/// A sequence whose blocks are the contiguous range starting at `first_block`, in each KV group
/// `stride` blocks further on.
pub struct TestSeq {
    pub id: u64,
    pub tokens: Vec<u32>,
    pub computed: usize,
    pub first_block: u32,
    pub groups: usize,
    pub stride: u32,
}

impl TestSeq {
    /// A sequence of a model with one KV group.
    pub fn new(id: u64, tokens: Vec<u32>, first_block: u32) -> Self {
        Self { id, tokens, computed: 0, first_block, groups: 1, stride: 0 }
    }

    /// A sequence of `runner`'s model whose KV groups split the cache into equal parts.
    pub fn on(runner: &ModelRunner, id: u64, tokens: Vec<u32>) -> Self {
        let groups = runner.cache().layout().num_groups();
        Self::grouped(id, tokens, 0, groups, (runner.cache().num_blocks() / groups) as u32)
    }

    /// A sequence of a model whose cache has `groups` KV groups, `stride` blocks apart.
    pub fn grouped(id: u64, tokens: Vec<u32>, first_block: u32, groups: usize, stride: u32) -> Self {
        Self { groups, stride, ..Self::new(id, tokens, first_block) }
    }

    /// The next `n` tokens as a scheduled chunk that asks for logits.
    pub fn chunk(&self, n: usize) -> ScheduledSeq {
        let end = self.computed + n;
        let blocks = end.div_ceil(BLOCK_SIZE) as u32;
        ScheduledSeq {
            seq_id: self.id,
            token_ids: self.tokens[self.computed..end].to_vec(),
            start_pos: self.computed,
            block_table_update: BlockTableUpdate::replace(
                (0..self.groups as u32)
                    .map(|g| {
                        let first = self.first_block + g * self.stride;
                        (first..first + blocks).collect()
                    })
                    .collect(),
            ),
            sample: Some(SampleRequest::greedy()),
            num_draft_tokens: 0,
            num_to_draft: 0,
            pool: false,
            second_segment: None,
            lora: None,
            prompt_logprobs: None,
        }
    }
}

pub fn batch(seqs: Vec<ScheduledSeq>) -> ScheduledBatch {
    ScheduledBatch { seqs, ..ScheduledBatch::default() }
}

pub fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best as u32
}

/// Prefills `prompt` in one chunk, then decodes greedily; returns the last-prompt-position
/// logits and `steps` generated ids.
pub fn greedy(runner: &mut ModelRunner, prompt: &[u32], steps: usize) -> (Vec<f32>, Vec<u32>) {
    let mut seq = TestSeq::on(runner, 1, prompt.to_vec());
    let mut first_logits = None;
    let mut out = Vec::new();
    while out.len() < steps {
        let n = seq.tokens.len() - seq.computed;
        let logits = runner.logits(&batch(vec![seq.chunk(n)])).unwrap();
        let row = logits.to_vec2::<f32>().unwrap().remove(0);
        seq.computed += n;
        let next = argmax(&row);
        first_logits.get_or_insert(row);
        out.push(next);
        seq.tokens.push(next);
    }
    (first_logits.unwrap(), out)
}

/// The logits after the prompt (the first `prompt` tokens, one chunk) and after each later
/// token of `tokens` (one decode step each).
pub fn teacher_forced(runner: &mut ModelRunner, tokens: &[u32], prompt: usize) -> Vec<Vec<f32>> {
    let mut seq = TestSeq::on(runner, 1, tokens.to_vec());
    let mut rows = Vec::new();
    let mut n = prompt;
    while seq.computed < tokens.len() {
        let logits = runner.logits(&batch(vec![seq.chunk(n)])).unwrap();
        rows.push(logits.to_vec2::<f32>().unwrap().remove(0));
        seq.computed += n;
        n = 1;
    }
    rows
}

/// Largest logit difference over the step's largest logit magnitude.
pub fn drift(a: &[f32], b: &[f32]) -> f32 {
    let scale = b.iter().fold(1e-6f32, |m, v| m.max(v.abs()));
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max) / scale
}

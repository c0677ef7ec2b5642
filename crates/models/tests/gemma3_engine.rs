//! Gemma 3 270M through the engine with hybrid KV allocation: its 15 sliding-window layers keep
//! only their 512-token windows, so a cache too small for the fixture's long case (742 prompt
//! tokens) under full allocation runs it, and prefix caching and preemption keep the fixture's
//! greedy tokens. Also the KV bytes per token at 8k context against full allocation.

mod common;

use std::sync::{Arc, Mutex};

use candle_core::{DType, Device};
use common::*;
use pagoda_engine::{
    Engine, EngineConfig, EngineHandle, EngineObserver, Request, SamplingParams, Shutdown, StepStats,
    StopConditions,
};
use pagoda_models::{load_model, KvCache, KvLayout, LoadOptions, ModelConfig, ModelRunner};

/// Prompt plus the fixture's 32 greedy tokens, rounded up.
const MAX_MODEL_LEN: usize = 784;
/// The step budget: the long prompt is prefilled in chunks, so a windowed group never holds
/// more than the window plus one chunk.
const BUDGET: usize = 128;
/// Pages of 3 layers x 16 tokens: what one long sequence needs with windows (49 + 5 x 41).
const PAGES: usize = 256;

#[derive(Default)]
struct PeakUsage(Mutex<usize>);

impl EngineObserver for PeakUsage {
    fn on_step(&self, stats: &StepStats) {
        let mut peak = self.0.lock().unwrap();
        *peak = (*peak).max(stats.kv_blocks_used);
    }
}

fn long_case() -> (Vec<u32>, Vec<u32>) {
    let fixture = gemma3_fixture();
    let case = longest_logits_case(&fixture);
    (ids(&case["prompt_ids"]), ids(&case["greedy"]))
}

/// The engine over Gemma 3 in `PAGES` pages, with its usage peak and the model's config.
fn engine(prefix_caching: bool) -> (EngineHandle, Arc<PeakUsage>, ModelConfig) {
    let options = LoadOptions { dequantize: Some(true), ..LoadOptions::default() };
    let loaded = load_model(&gemma3_path(), &options).unwrap();
    let model_config = loaded.model.config().clone();
    let cache = KvCache::new(loaded.model.config(), PAGES, BLOCK_SIZE, DType::F32, &Device::Cpu).unwrap();
    let runner = ModelRunner::new(loaded.model, cache, Device::Cpu).unwrap();
    let mut config = EngineConfig::for_executor(&runner, MAX_MODEL_LEN);
    config.max_num_batched_tokens = BUDGET;
    config.max_num_seqs = 4;
    config.enable_prefix_caching = prefix_caching;
    // Token ids are all these tests compare; the text side is the fake's.
    let tokenizer = Arc::new(pagoda_engine::fake::FakeDecoder);
    let peak = Arc::new(PeakUsage::default());
    let (handle, _thread) = Engine::spawn(config, runner, tokenizer, peak.clone(), Shutdown::new()).unwrap();
    (handle, peak, model_config)
}

/// Submits all prompts at once and collects each one's generated ids.
fn generate(handle: &EngineHandle, prompts: &[Vec<u32>], max_tokens: usize) -> Vec<Vec<u32>> {
    let stop = StopConditions { ignore_eos: true, ..StopConditions::default() };
    let requests = prompts
        .iter()
        .map(|p| {
            Request::new(handle.next_request_id(), p.clone(), Arc::new(SamplingParams::default()))
                .with_max_tokens(max_tokens)
                .with_stop(stop.clone())
        })
        .collect();
    generate_all(handle, requests)
}

#[test]
fn the_long_case_fits_a_cache_too_small_for_full_allocation_and_hits_the_prefix_cache() {
    let (prompt, expected) = long_case();
    assert!(prompt.len() > 512 && prompt.len() + expected.len() <= MAX_MODEL_LEN);
    let (handle, peak, config) = engine(true);
    let groups = KvLayout::for_config(&config).num_groups();
    assert_eq!(groups, 6);
    // Full allocation keeps every layer for every token: the same memory holds PAGES / 6 blocks.
    let full_capacity = PAGES / groups * BLOCK_SIZE;
    assert!(full_capacity < prompt.len() + expected.len(), "the cache would fit without windows");

    let first = generate(&handle, std::slice::from_ref(&prompt), expected.len()).remove(0);
    assert_eq!(first, expected, "hybrid allocation changed the greedy tokens");
    let used = *peak.0.lock().unwrap();
    assert!(used <= PAGES && used > PAGES / 2, "peak usage {used} pages");

    // The same prompt again: its blocks are cached (windowed ones evictable), so most of it is
    // reused, and the output does not change.
    let hits_before = handle.stats().prefix_cache_hits;
    let second = generate(&handle, std::slice::from_ref(&prompt), expected.len()).remove(0);
    let hits = handle.stats().prefix_cache_hits - hits_before;
    assert!(hits >= 512, "the second request reused only {hits} tokens");
    assert_eq!(second, expected, "a prefix-cache hit changed the greedy tokens");
    assert_eq!(handle.stats().kv_blocks_used, 0, "blocks leaked");
}

#[test]
fn preemption_under_pressure_keeps_the_greedy_tokens() {
    let (prompt, expected) = long_case();
    // Two long sequences need twice what the cache holds: one is preempted and recomputed.
    let (handle, _, _) = engine(false);
    let outputs = generate(&handle, &[prompt.clone(), prompt], expected.len());
    assert!(handle.stats().num_preemptions > 0, "no preemption");
    assert_eq!(outputs, vec![expected.clone(), expected]);
    assert_eq!(handle.stats().kv_blocks_used, 0, "blocks leaked");
}

#[test]
fn kv_bytes_per_token_at_8k_context() {
    let config = load_model(&gemma3_path(), &LoadOptions::default()).unwrap().model.config().clone();
    let layout = KvLayout::for_config(&config);
    let f16 = 2;
    let hybrid = layout.bytes_per_token(&config, 8192, 16, f16);
    let full = config.kv_bytes_per_token(f16);
    eprintln!("gemma 3 270m, f16 cache, 8k context: {hybrid:.0} bytes/token with windows vs {full} full");
    // 18 layers x 1 kv head x 256 x 2 (K, V) x 2 bytes.
    assert_eq!(full, 18 * 256 * 2 * 2);
    // A page is 16 tokens of 3 layers (3072 bytes a token): the full group's pages for every
    // token, each of the 5 windowed groups' 33 pages (512 tokens and the one being filled).
    let expected = (3072 * 8192 + 5 * 33 * 16 * 3072) as f64 / 8192.0;
    assert!((hybrid - expected).abs() < 1e-6, "{hybrid} vs {expected}");
    assert!(hybrid < full as f64 / 4.0);
}

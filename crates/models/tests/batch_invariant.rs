//! `--batch-invariant` over the real models on the CPU. SmolLM2: 64 requests (greedy and
//! seeded sampling, with logprobs) give bit-identical token ids and logprobs when each runs
//! alone on a cold cache, in random groups with chunked prefills and a warm prefix cache, all at
//! once on a cache small enough to preempt, and verified in speculative steps. Gemma 3: prompts
//! past its 512-token sliding window, alone and chunked together.

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use candle_core::{DType, Device};
use common::real_engine::{chat_ids, tokenizer, StepLog};
use common::{gemma3_fixture, gemma3_path, ids, longest_logits_case, model_path, BLOCK_SIZE};
use pagoda_engine::{
    Engine, EngineConfig, EngineHandle, FinishReason, Request, SamplingParams, Shutdown, SpeculativeConfig,
    StopConditions, TokenDecoder,
};
use pagoda_models::{load_model, KernelPlan, KvCache, LoadOptions, ModelRunner, PanelPrecision};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

/// What one request produced: its ids, and per token the bits of the sampled logprob and of
/// the top alternatives `(id, logprob bits)`.
#[derive(Debug, Clone, PartialEq)]
struct Output {
    ids: Vec<u32>,
    logprobs: Vec<(u32, Vec<(u32, u32)>)>,
}

/// An engine over the model at `path` with batch-invariant kernels in `precision`.
fn engine_for(
    path: &Path,
    decoder: Arc<dyn TokenDecoder>,
    precision: PanelPrecision,
    num_blocks: usize,
    max_model_len: usize,
    tweak: impl FnOnce(&mut EngineConfig),
) -> (EngineHandle, Arc<StepLog>) {
    let options =
        LoadOptions { kernel_plan: KernelPlan::batch_invariant(precision), ..LoadOptions::default() };
    let loaded = load_model(path, &options).unwrap();
    let cache =
        KvCache::new(loaded.model.config(), num_blocks, BLOCK_SIZE, DType::F32, &Device::Cpu).unwrap();
    let runner = ModelRunner::new(loaded.model, cache, Device::Cpu).unwrap();
    let mut config = EngineConfig::for_executor(&runner, max_model_len);
    tweak(&mut config);
    let log = Arc::new(StepLog::default());
    let (handle, _thread) = Engine::spawn(config, runner, decoder, log.clone(), Shutdown::new()).unwrap();
    (handle, log)
}

fn engine(
    precision: PanelPrecision,
    num_blocks: usize,
    tweak: impl FnOnce(&mut EngineConfig),
) -> (EngineHandle, Arc<StepLog>) {
    engine_for(&model_path(), tokenizer(), precision, num_blocks, 512, tweak)
}

/// 64 chat prompts, 16 to 300 tokens: three system prompts shared by many of them (prefix-cache
/// hits), some passages long enough to be prefilled in several chunks.
fn prompts() -> Vec<Vec<u32>> {
    let tokenizer = tokenizer();
    let systems = [
        None,
        Some("You are a concise assistant. Answer in one or two sentences."),
        Some("You are a helpful teacher who explains things step by step to curious students of every age."),
    ];
    let topics = [
        "the tides",
        "photosynthesis",
        "the Roman empire",
        "prime numbers",
        "volcanoes",
        "jazz",
        "the moon",
        "bread baking",
        "rainbows",
        "chess openings",
        "glaciers",
        "the printing press",
        "honey bees",
        "black holes",
        "the Nile",
        "origami",
    ];
    let passage =
        "The old lighthouse stood on the cliff for two hundred years, guiding ships through fog and \
                   storm, until the keeper's daughter found a map hidden in the lamp room. ";
    (0..64)
        .map(|i| {
            let topic = topics[i % topics.len()];
            let user = match i % 4 {
                0 => format!("Tell me about {topic}."),
                1 => format!("Write a short poem about {topic}."),
                2 => format!(
                    "Summarise this passage, then relate it to {topic}: {}",
                    passage.repeat(1 + i % 5)
                ),
                _ => format!("List three facts about {topic} and one question a child might ask."),
            };
            chat_ids(&tokenizer, systems[i % 3], &user)
        })
        .collect()
}

/// Request `i`: even ones greedy, odd ones seeded top-p; 6 to 12 tokens, 3 top logprobs.
fn request(handle: &EngineHandle, i: usize, prompt: &[u32]) -> Request {
    let params = if i.is_multiple_of(2) {
        SamplingParams { logprobs: Some(3), ..SamplingParams::default() }
    } else {
        SamplingParams {
            temperature: 0.9,
            top_p: 0.95,
            seed: Some(1000 + i as u64),
            logprobs: Some(3),
            ..SamplingParams::default()
        }
    };
    let stop = StopConditions { ignore_eos: true, ..StopConditions::default() };
    Request::new(handle.next_request_id(), prompt.to_vec(), Arc::new(params))
        .with_max_tokens(6 + i % 7)
        .with_stop(stop)
}

/// Submits the requests `which` at once and collects each one's output, by index.
fn run(handle: &EngineHandle, prompts: &[Vec<u32>], which: &[usize]) -> HashMap<usize, Output> {
    let mut streams: Vec<_> =
        which.iter().map(|&i| (i, handle.submit(request(handle, i, &prompts[i])).unwrap())).collect();
    streams
        .iter_mut()
        .map(|(i, stream)| {
            let mut out = Output { ids: Vec::new(), logprobs: Vec::new() };
            while let Some(event) = stream.blocking_recv() {
                assert!(
                    !matches!(event.finished, Some(FinishReason::Error(_))),
                    "request {i}: {:?}",
                    event.finished
                );
                out.ids.extend(&event.token_ids);
                for lp in event.logprobs.unwrap_or_default() {
                    let top = lp.top.iter().map(|t| (t.token_id, t.logprob.to_bits())).collect();
                    out.logprobs.push((lp.sampled.logprob.to_bits(), top));
                }
            }
            assert_eq!(out.ids.len(), out.logprobs.len(), "request {i}: one logprob per token");
            (*i, out)
        })
        .collect()
}

/// Runs `prompts` in random groups of 1 to `max_group`, one group after another.
fn in_random_groups(
    handle: &EngineHandle,
    prompts: &[Vec<u32>],
    rng: &mut StdRng,
    max_group: usize,
) -> HashMap<usize, Output> {
    let mut order: Vec<usize> = (0..prompts.len()).collect();
    order.shuffle(rng);
    let mut outputs = HashMap::new();
    let mut rest = &order[..];
    while !rest.is_empty() {
        let size = rng.random_range(1..=max_group.min(rest.len()));
        outputs.extend(run(handle, prompts, &rest[..size]));
        rest = &rest[size..];
    }
    outputs
}

fn assert_same(reference: &HashMap<usize, Output>, got: &HashMap<usize, Output>, what: &str) {
    let differing: Vec<usize> = (0..reference.len()).filter(|i| reference[i] != got[i]).collect();
    assert!(
        differing.is_empty(),
        "{what}: {} of {} requests differ from running alone on a cold cache (first: {}: {:?} vs {:?})",
        differing.len(),
        reference.len(),
        differing[0],
        reference[&differing[0]].ids,
        got[&differing[0]].ids
    );
}

fn sum_steps(log: &StepLog, f: impl Fn(&pagoda_engine::StepStats) -> u64) -> u64 {
    log.0.lock().unwrap().iter().map(f).sum()
}

fn check(precision: PanelPrecision) {
    let prompts = prompts();
    let mut rng = StdRng::seed_from_u64(19);

    // The reference: each request alone, on a cache that never hits.
    let (alone, _) = engine(precision, 256, |c| c.enable_prefix_caching = false);
    let reference: HashMap<usize, Output> =
        (0..prompts.len()).flat_map(|i| run(&alone, &prompts, &[i])).collect();

    // Random groups with chunked prefills: cold for the first requests of each system prompt,
    // then warmer as the cache fills; then all again in other groups on the warm cache.
    let (batched, log) = engine(precision, 512, |c| {
        c.max_num_batched_tokens = 48;
        c.max_num_seqs = 16;
    });
    assert_same(&reference, &in_random_groups(&batched, &prompts, &mut rng, 12), "random groups");
    assert_same(&reference, &in_random_groups(&batched, &prompts, &mut rng, 16), "random groups, warm cache");
    assert!(sum_steps(&log, |s| s.prefix_cache_hits) > 0, "the prefix cache was hit");
    let mixed =
        log.0.lock().unwrap().iter().filter(|s| s.num_prefill_tokens > 0 && s.num_decode_tokens > 0).count();
    assert!(mixed > 0, "some steps mixed prefill chunks with decodes");

    // All at once on a cache that cannot hold them: sequences are preempted and recomputed.
    let (small, log) = engine(precision, 36, |c| {
        c.max_num_batched_tokens = 256;
        c.max_num_seqs = 64;
    });
    let all: Vec<usize> = (0..prompts.len()).collect();
    assert_same(&reference, &run(&small, &prompts, &all), "preempted");
    assert!(sum_steps(&log, |s| s.num_preemptions as u64) > 0, "sequences were preempted");

    // N-gram proposals verified several positions per step.
    let spec = SpeculativeConfig { disable_by_batch_size: usize::MAX, ..SpeculativeConfig::ngram(4) };
    let (speculative, log) = engine(precision, 512, |c| c.speculative = Some(spec));
    assert_same(&reference, &in_random_groups(&speculative, &prompts, &mut rng, 8), "speculative");
    assert!(sum_steps(&log, |s| s.spec.num_draft_tokens) > 0, "proposals were verified");
}

/// Each precision the server's batch-invariant mode multiplies in on this CPU: f32 (the exact
/// block kernel at every step size; `auto` without AVX512-VNNI), bfloat16 panels where the CPU
/// multiplies bfloat16 natively, and int8 (llama.cpp's precision) and int16 (`auto`) where it
/// multiplies int8 natively; elsewhere the server falls back from those to `auto`.
#[test]
fn outputs_are_bit_identical_however_requests_are_batched() {
    let mut precisions = vec![PanelPrecision::F32];
    if PanelPrecision::cpu_has_native_bf16() {
        precisions.push(PanelPrecision::Bf16);
    }
    if PanelPrecision::cpu_has_native_int8() {
        precisions.extend([PanelPrecision::Int8, PanelPrecision::Int16]);
    }
    for precision in precisions {
        eprintln!("checking {precision:?} panels");
        check(precision);
    }
}

/// Gemma 3's windowed layers: prompts of 520 to 742 tokens (past its 512-token window), so a
/// chunk's queries see windows starting at different key positions. Each alone in one step on a
/// cold cache, then together in 96-token chunks, cold and warm.
#[test]
fn gemma3_windowed_outputs_are_bit_identical_alone_and_chunked() {
    let fixture = gemma3_fixture();
    let long = ids(&longest_logits_case(&fixture)["prompt_ids"]);
    let prompts: Vec<Vec<u32>> = [520, 601, 690, long.len()].iter().map(|&n| long[..n].to_vec()).collect();
    let decoder: Arc<dyn TokenDecoder> = Arc::new(pagoda_engine::fake::FakeDecoder);
    let precision = PanelPrecision::F32;
    let (alone, _) = engine_for(&gemma3_path(), decoder.clone(), precision, 512, 784, |c| {
        c.enable_prefix_caching = false;
        c.max_num_batched_tokens = 784;
    });
    let reference: HashMap<usize, Output> =
        (0..prompts.len()).flat_map(|i| run(&alone, &prompts, &[i])).collect();
    let (chunked, log) = engine_for(&gemma3_path(), decoder, precision, 1024, 784, |c| {
        c.max_num_batched_tokens = 96;
        c.max_num_seqs = 4;
    });
    let all: Vec<usize> = (0..prompts.len()).collect();
    assert_same(&reference, &run(&chunked, &prompts, &all), "Gemma 3, chunked together");
    assert_same(&reference, &run(&chunked, &prompts, &all), "Gemma 3, chunked together, warm cache");
    assert!(sum_steps(&log, |s| s.prefix_cache_hits) > 0, "the prefix cache was hit");
}

//! The engine over the real SmolLM2 model on the CPU: batching, preemption, prefix caching and
//! chunked prefill must not change what any request generates.

mod common;

use std::sync::Arc;

use common::real_engine::{chat_ids, engine, tokenizer};
use common::*;
use pagoda_engine::{EngineHandle, Request, SamplingParams, StopConditions};
use pagoda_text::Tokenizer;

const MAX_TOKENS: usize = 24;

/// The engine publishes its stats before it sends a step's events, so no waiting is needed.
fn assert_all_blocks_free(handle: &EngineHandle) {
    assert_eq!(handle.stats().kv_blocks_used, 0, "blocks leaked after all requests ended");
}

fn request(handle: &EngineHandle, prompt: Vec<u32>) -> Request {
    let stop = StopConditions { ignore_eos: true, ..StopConditions::default() };
    Request::new(handle.next_request_id(), prompt, Arc::new(SamplingParams::default()))
        .with_max_tokens(MAX_TOKENS)
        .with_stop(stop)
}

/// Submits all prompts at once and collects each one's generated ids.
fn generate_together(handle: &EngineHandle, prompts: &[Vec<u32>]) -> Vec<Vec<u32>> {
    generate_all(handle, prompts.iter().map(|p| request(handle, p.clone())).collect())
}

fn prompts(tokenizer: &Tokenizer) -> Vec<Vec<u32>> {
    [
        "What is the capital of France?",
        "Write a haiku about the sea.",
        "List three primary colors.",
        "How many legs does a spider have?",
        "Translate 'good morning' into Spanish.",
        "What is 12 times 12?",
        "Name a famous painting by Leonardo da Vinci.",
        "Why is the sky blue? Answer in one sentence.",
    ]
    .iter()
    .map(|q| chat_ids(tokenizer, None, q))
    .collect()
}

#[test]
fn batched_and_preempted_outputs_equal_each_prompt_alone() {
    let tokenizer = tokenizer();
    let prompts = prompts(&tokenizer);
    let (alone_engine, _) = engine(256, |_| {});
    let alone: Vec<Vec<u32>> =
        prompts.iter().map(|p| generate_together(&alone_engine, std::slice::from_ref(p)).remove(0)).collect();
    assert!(alone.iter().all(|ids| ids.len() == MAX_TOKENS));

    let (batched_engine, log) = engine(256, |_| {});
    let together = generate_together(&batched_engine, &prompts);
    assert_eq!(together, alone, "batching changed some outputs");
    let max_batch = log.0.lock().unwrap().iter().map(|s| s.num_seqs).max().unwrap();
    assert!(max_batch >= 4, "requests were not batched (largest step had {max_batch} sequences)");

    // 8 sequences of ~60 tokens need ~32 blocks; 14 force preemptions.
    let (small_engine, _) = engine(14, |c| c.max_model_len = 14 * BLOCK_SIZE);
    let preempted = generate_together(&small_engine, &prompts);
    assert!(small_engine.stats().num_preemptions > 0, "the tiny cache caused no preemption");
    assert_eq!(preempted, alone, "preemption changed some outputs");
    assert_all_blocks_free(&small_engine);
}

#[test]
fn shared_prefix_hits_the_cache_and_keeps_outputs() {
    let tokenizer = tokenizer();
    let system = "You are a careful assistant for a museum. ".repeat(12);
    let first = chat_ids(&tokenizer, Some(&system), "When does the museum open?");
    let second = chat_ids(&tokenizer, Some(&system), "Is there a cafe inside?");

    let (cached, _) = engine(256, |_| {});
    generate_together(&cached, std::slice::from_ref(&first));
    let hits_before = cached.stats().prefix_cache_hits;
    let with_cache = generate_together(&cached, std::slice::from_ref(&second)).remove(0);
    let hits = cached.stats().prefix_cache_hits - hits_before;
    assert!(hits >= 100, "the shared {}-token prefix gave only {hits} cached tokens", first.len());

    let (uncached, _) = engine(256, |c| c.enable_prefix_caching = false);
    let without_cache = generate_together(&uncached, std::slice::from_ref(&second)).remove(0);
    assert_eq!(uncached.stats().prefix_cache_hits, 0);
    assert_eq!(with_cache, without_cache, "the prefix cache changed the output");
}

#[test]
fn long_prompt_is_chunked_while_others_keep_decoding() {
    let tokenizer = tokenizer();
    let long_text = "The history of the printing press is long and varied. ".repeat(48);
    let long = tokenizer.encode(&long_text, false).unwrap();
    assert!(long.len() >= 500, "long prompt has {} tokens", long.len());
    let short: Vec<Vec<u32>> = prompts(&tokenizer).into_iter().take(3).collect();

    let (alone_engine, _) = engine(256, |_| {});
    let long_alone = generate_together(&alone_engine, std::slice::from_ref(&long)).remove(0);

    let (handle, log) = engine(256, |c| {
        c.max_num_batched_tokens = 64;
        c.max_num_seqs = 16;
    });
    // The short requests start first, so they are decoding when the long prompt arrives.
    let mut all = short.clone();
    all.push(long.clone());
    let outputs = generate_together(&handle, &all);
    assert_eq!(outputs[3], long_alone, "chunked prefill changed the long prompt's output");

    let steps = log.0.lock().unwrap().clone();
    assert!(steps.iter().all(|s| s.num_prefill_tokens + s.num_decode_tokens <= 64));
    let mixed = steps.iter().filter(|s| s.num_prefill_tokens > 0 && s.num_decode_tokens > 0).count();
    let prefill_steps = steps.iter().filter(|s| s.num_prefill_tokens > 0).count();
    assert!(
        prefill_steps >= long.len() / 64,
        "{} prompt tokens in only {prefill_steps} prefill steps",
        long.len()
    );
    assert!(mixed >= 5, "only {mixed} steps mixed prefill chunks with decodes");
}

#[test]
fn n_samples_share_the_prompt_and_each_match_the_single_greedy_output() {
    let tokenizer = tokenizer();
    // 37 tokens: the last prompt block is partial, so the samples copy it on write.
    let prompt = chat_ids(&tokenizer, None, "What is the capital of France?");
    assert_ne!(prompt.len() % BLOCK_SIZE, 0);
    let (handle, _) = engine(64, |_| {});
    let single = generate_together(&handle, std::slice::from_ref(&prompt)).remove(0);

    let mut stream = handle.submit(request(&handle, prompt).with_n(3)).unwrap();
    let mut outputs = vec![Vec::new(); 3];
    while let Some(event) = stream.blocking_recv() {
        outputs[event.index].extend(event.token_ids);
    }
    for (i, out) in outputs.iter().enumerate() {
        assert_eq!(out, &single, "sample {i} differs from the single greedy output");
    }
    assert_all_blocks_free(&handle);
}

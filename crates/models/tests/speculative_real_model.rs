//! Speculative decoding over the real SmolLM2 model on the CPU: proposals verified in the same
//! varlen batch must leave every output token-identical to decoding without them, on the golden
//! prompts and on a batch of sixteen mixed requests (with a draft, some of them choosing n-gram
//! or suffix proposals for themselves), and must actually be accepted on input-grounded prompts.

mod common;

use std::sync::Arc;

use common::real_engine::{chat_ids, engine, tokenizer};
use common::*;
use pagoda_engine::speculative::ProposerKind;
use pagoda_engine::{
    EngineHandle, Request, SamplingParams, SpeculativeConfig, SpeculativeMethod, StopConditions,
};
use pagoda_text::Tokenizer;

/// Each proposer, on at every batch size.
fn proposers() -> [SpeculativeConfig; 4] {
    [
        SpeculativeConfig { disable_by_batch_size: usize::MAX, ..SpeculativeConfig::ngram(4) },
        SpeculativeConfig::suffix(6),
        SpeculativeConfig {
            method: SpeculativeMethod::DraftLayers { num_layers: 24 },
            num_speculative_tokens: 2,
            disable_by_batch_size: usize::MAX,
        },
        // The model as its own draft (see `common::real_engine::engine`).
        SpeculativeConfig {
            method: SpeculativeMethod::DraftModel,
            num_speculative_tokens: 4,
            disable_by_batch_size: usize::MAX,
        },
    ]
}

fn request(handle: &EngineHandle, prompt: Vec<u32>, params: SamplingParams, max_tokens: usize) -> Request {
    let stop = StopConditions { ignore_eos: true, ..StopConditions::default() };
    Request::new(handle.next_request_id(), prompt, Arc::new(params))
        .with_max_tokens(max_tokens)
        .with_stop(stop)
}

/// Prompts whose answers repeat their input, where prompt lookup pays.
fn grounded(tokenizer: &Tokenizer) -> Vec<Vec<u32>> {
    [
        "Repeat this sentence exactly: The quick brown fox jumps over the lazy dog near the river bank.",
        "Copy the list: apples, oranges, pears, plums, cherries, grapes, lemons, limes.",
        "Rewrite in capital letters: the meeting is moved to Tuesday at ten in the morning.",
        "Repeat: To be or not to be, that is the question.",
    ]
    .iter()
    .map(|q| chat_ids(tokenizer, None, q))
    .collect()
}

fn chat(tokenizer: &Tokenizer) -> Vec<Vec<u32>> {
    [
        "What is the capital of France?",
        "Write a haiku about the sea.",
        "List three primary colors.",
        "Why is the sky blue?",
    ]
    .iter()
    .map(|q| chat_ids(tokenizer, None, q))
    .collect()
}

#[test]
fn golden_prompts_decode_the_same_with_every_proposer() {
    let fixture = fixture();
    let tokenizer = tokenizer();
    let mut prompts: Vec<Vec<u32>> =
        fixture["logits_cases"].as_array().unwrap().iter().map(|c| ids(&c["prompt_ids"])).collect();
    prompts.extend(grounded(&tokenizer));
    let (plain, _) = engine(256, |_| {});
    let want: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| {
            generate_all(&plain, vec![request(&plain, p.clone(), SamplingParams::default(), 32)]).remove(0)
        })
        .collect();
    for proposer in proposers() {
        let (spec, _) = engine(256, |c| c.speculative = Some(proposer));
        for (i, prompt) in prompts.iter().enumerate() {
            let got =
                generate_all(&spec, vec![request(&spec, prompt.clone(), SamplingParams::default(), 32)]);
            assert_eq!(got[0], want[i], "prompt {i}, {proposer:?}");
        }
        // The golden prompts' greedy continuations, as scripts/golden.py recorded them.
        for (case, prompt) in fixture["logits_cases"].as_array().unwrap().iter().zip(&prompts) {
            let greedy = ids(&case["greedy"]);
            let r = request(&spec, prompt.clone(), SamplingParams::default(), greedy.len());
            assert_eq!(generate_all(&spec, vec![r])[0], greedy, "{}, {proposer:?}", case["name"]);
        }
        let stats = spec.stats().spec;
        assert!(stats.num_drafts > 20 && stats.num_accepted_tokens > 5, "{stats:?}, {proposer:?}");
        if proposer.method == SpeculativeMethod::DraftModel {
            // A draft equal to the target, greedy: a proposal it rejects is one the draft made
            // from KV out of step with the target's (prefill, bonus tokens, fully kept steps).
            assert!(stats.acceptance_rate() > 0.95, "{stats:?}");
        }
        assert_eq!(spec.stats().kv_blocks_used, 0, "blocks leaked");
    }
}

#[test]
fn sixteen_mixed_requests_keep_their_outputs_with_proposals() {
    let tokenizer = tokenizer();
    let mut prompts = grounded(&tokenizer);
    prompts.extend(chat(&tokenizer));
    let prompts: Vec<Vec<u32>> = prompts.iter().chain(&prompts).cloned().collect();
    let params = |i: usize| {
        if i < 8 {
            SamplingParams::default()
        } else {
            SamplingParams { temperature: 0.8, top_p: 0.95, seed: Some(i as u64), ..Default::default() }
        }
    };
    let requests = |handle: &EngineHandle| -> Vec<Request> {
        prompts
            .iter()
            .enumerate()
            .map(|(i, p)| request(handle, p.clone(), params(i), 12 + 3 * (i % 5)))
            .collect()
    };
    let (plain, _) = engine(256, |_| {});
    let alone: Vec<Vec<u32>> =
        requests(&plain).into_iter().map(|r| generate_all(&plain, vec![r]).remove(0)).collect();
    for proposer in proposers() {
        // Speculation on at every batch size, and a cache small enough to preempt.
        let (spec, log) = engine(40, |c| {
            c.speculative = Some(SpeculativeConfig { disable_by_batch_size: usize::MAX, ..proposer });
            c.max_model_len = 40 * BLOCK_SIZE;
        });
        let mut requests = requests(&spec);
        if proposer.method.drafts_in_executor() {
            // A third of the requests keep the executor's drafts; the others bring their own
            // method, so steps mix drafted and looked-up proposals.
            for (i, r) in requests.iter_mut().enumerate() {
                r.speculative_method = [None, Some(ProposerKind::Ngram), Some(ProposerKind::Suffix)][i % 3];
            }
        }
        let together = generate_all(&spec, requests);
        for (i, (got, want)) in together.iter().zip(&alone).enumerate() {
            assert_eq!(got, want, "request {i}, {proposer:?}");
        }
        let stats = spec.stats();
        assert!(stats.spec.num_accepted_tokens > 10, "{:?}, {proposer:?}", stats.spec);
        assert!(stats.num_preemptions > 0, "the small cache caused no preemption");
        assert_eq!(stats.kv_blocks_used, 0, "blocks leaked");
        let steps = log.0.lock().unwrap();
        assert!(steps.iter().any(|s| s.num_seqs >= 8 && s.spec.num_drafts > 0), "no large step speculated");
    }
}

#[test]
fn self_speculative_drafts_from_the_first_layers_keep_outputs() {
    let fixture = fixture();
    let tokenizer = tokenizer();
    let mut prompts: Vec<Vec<u32>> =
        fixture["logits_cases"].as_array().unwrap().iter().map(|c| ids(&c["prompt_ids"])).collect();
    prompts.extend(grounded(&tokenizer).into_iter().take(2));
    let layer_skip = SpeculativeConfig {
        method: SpeculativeMethod::DraftLayers { num_layers: 20 },
        num_speculative_tokens: 3,
        disable_by_batch_size: usize::MAX,
    };
    let (plain, _) = engine(256, |_| {});
    let (spec, _) = engine(256, |c| c.speculative = Some(layer_skip));
    let ask = |h: &EngineHandle| -> Vec<Request> {
        prompts.iter().map(|p| request(h, p.clone(), SamplingParams::default(), 24)).collect()
    };
    // One at a time and all together (several drafting sequences per pass).
    let want: Vec<Vec<u32>> =
        ask(&plain).into_iter().map(|r| generate_all(&plain, vec![r]).remove(0)).collect();
    let alone: Vec<Vec<u32>> =
        ask(&spec).into_iter().map(|r| generate_all(&spec, vec![r]).remove(0)).collect();
    assert_eq!(alone, want);
    assert_eq!(generate_all(&spec, ask(&spec)), want);
    let stats = spec.stats().spec;
    assert!(stats.num_drafts > 20 && stats.num_accepted_tokens > 0, "{stats:?}");
    assert_eq!(spec.stats().kv_blocks_used, 0, "blocks leaked");
    // The draft must be shorter than the model: the engine refuses it at start-up.
    let mut config = pagoda_engine::EngineConfig::new(BLOCK_SIZE, 64, 1024);
    config.speculative =
        Some(SpeculativeConfig { method: SpeculativeMethod::DraftLayers { num_layers: 30 }, ..layer_skip });
    let refused = pagoda_engine::Engine::spawn(
        config,
        runner(false, 64),
        tokenizer,
        Arc::new(pagoda_engine::NoopObserver),
        pagoda_engine::Shutdown::new(),
    )
    .err()
    .expect("a 30-layer draft of a 30-layer model is refused");
    assert!(refused.to_string().contains("below the model's 30 layers"), "{refused}");
}

//! Property tests of the scheduler with the fake executor: random arrivals, prompt and output
//! lengths, shared prefixes, n > 1, stop conditions, aborts and caches small enough to force
//! preemption, with one KV group or with sliding-window groups (the audit after every step
//! checks that windowed groups hold exactly their windows). Every request must end, every block
//! must come back, and each request's output must equal what it produces alone on a big cache,
//! with or without speculative decoding (n-gram proposals over a 32-token vocabulary are mostly
//! rejected, so rollback is exercised hard).

mod common;

use std::sync::Arc;

use common::{drive, reference_with, VOCAB};
use pagoda_engine::fake::FakeExecutor;
use pagoda_engine::{
    EngineConfig, FinishReason, KvGroups, Request, SamplingParams, Scheduler, SpeculativeConfig,
    SpeculativeMethod, StopConditions,
};
use proptest::prelude::*;

const MAX_MODEL_LEN: usize = 48;

#[derive(Debug, Clone)]
struct Spec {
    base: usize,
    shared: usize,
    suffix: Vec<u32>,
    max_tokens: usize,
    greedy: bool,
    n: usize,
    eos: Option<u32>,
    min_tokens: usize,
    stop_string: Option<String>,
    logprobs: bool,
    arrival: usize,
    abort_at: Option<usize>,
}

fn spec() -> impl Strategy<Value = Spec> {
    (
        (0usize..3, 0usize..24, prop::collection::vec(0u32..VOCAB as u32, 0..12), 1usize..16),
        (any::<bool>(), 1usize..4, prop::option::of(0u32..VOCAB as u32), 0usize..3),
        (prop::option::of("[a-e]{1,3}"), any::<bool>(), 0usize..30, prop::option::weighted(0.2, 0usize..40)),
    )
        .prop_map(
            |(
                (base, shared, suffix, max_tokens),
                (greedy, n, eos, min_tokens),
                (stop_string, logprobs, arrival, abort_at),
            )| Spec {
                base,
                shared,
                suffix,
                max_tokens,
                greedy,
                n,
                eos,
                min_tokens,
                stop_string,
                logprobs,
                arrival,
                abort_at,
            },
        )
}

/// Three base prompts whose prefixes requests share, so the prefix cache gets hits.
fn base_prompt(base: usize) -> Vec<u32> {
    (0..24u32).map(|i| (i * (base as u32 * 2 + 3) + base as u32) % VOCAB as u32).collect()
}

fn build(id: u64, s: &Spec, max_num_seqs: usize) -> Request {
    let mut prompt: Vec<u32> = base_prompt(s.base)[..s.shared].to_vec();
    prompt.extend_from_slice(&s.suffix);
    if prompt.is_empty() {
        prompt.push(1);
    }
    prompt.truncate(MAX_MODEL_LEN - s.max_tokens);
    let params = SamplingParams {
        temperature: if s.greedy { 0.0 } else { 1.0 },
        seed: Some(id * 7919),
        logprobs: s.logprobs.then_some(2),
        ..Default::default()
    };
    let stop = StopConditions {
        eos_token_ids: s.eos.into_iter().collect(),
        stop_strings: s.stop_string.clone().into_iter().collect::<Vec<_>>().into(),
        min_tokens: s.min_tokens.min(s.max_tokens),
        ..Default::default()
    };
    Request::new(id, prompt, Arc::new(params))
        .with_max_tokens(s.max_tokens)
        .with_n(s.n.min(max_num_seqs))
        .with_stop(stop)
}

/// Runs `specs` on `config` and checks that everything ends, every block comes back and each
/// output equals the request's solo run.
fn check(config: EngineConfig, specs: &[Spec]) -> Result<(), TestCaseError> {
    let max_num_seqs = config.max_num_seqs;
    let requests: Vec<Request> =
        specs.iter().enumerate().map(|(i, s)| build(i as u64, s, max_num_seqs)).collect();
    let arrivals = specs.iter().zip(&requests).map(|(s, r)| (s.arrival, r.clone())).collect();
    let aborts = specs.iter().zip(&requests).filter_map(|(s, r)| s.abort_at.map(|a| (a, r.id))).collect();

    let mut sched = Scheduler::new(config.clone()).unwrap();
    let mut exec =
        FakeExecutor::with_groups(config.block_size, config.num_blocks, VOCAB, config.kv_groups.clone());
    let (out, _) = drive(&mut sched, &mut exec, arrivals, aborts);

    // Free includes cached blocks that are only evictable.
    prop_assert_eq!(sched.block_manager().num_free_blocks(), config.num_blocks);
    prop_assert_eq!(sched.block_manager().num_used_blocks(), 0);
    for r in &requests {
        let got = out.get(&r.id).expect("every request gets events");
        prop_assert!(got.done, "request {} has no last event", r.id);
        prop_assert_eq!(got.samples.len(), r.n);
        let want = reference_with(r, MAX_MODEL_LEN, config.kv_groups.clone());
        for (i, (g, w)) in got.samples.iter().zip(&want).enumerate() {
            if g.finish == Some(FinishReason::Abort) {
                prop_assert!(
                    w.tokens.starts_with(&g.tokens),
                    "request {} sample {i}: aborted output is not a prefix",
                    r.id
                );
            } else {
                prop_assert_eq!(g, w, "request {} sample {}", r.id, i);
            }
        }
    }
    Ok(())
}

/// Off, or n-gram proposals from suffixes of 1-4 tokens, or suffix decoding over the outputs of
/// earlier requests, or the fake's own drafts: 1-6 tokens, switched off above 1, 3 or any number
/// of running sequences.
fn speculation() -> impl Strategy<Value = Option<SpeculativeConfig>> {
    let method = prop_oneof![
        (1usize..3, 0usize..3).prop_map(|(min, extra)| SpeculativeMethod::Ngram {
            prompt_lookup_min: min,
            prompt_lookup_max: min + extra
        }),
        (4usize..12, 1usize..4, prop::sample::select(vec![0.5f32, 1.0, 3.0])).prop_map(
            |(depth, cached, factor)| SpeculativeMethod::Suffix {
                max_tree_depth: depth,
                max_cached_requests: cached,
                max_spec_factor: factor,
                min_token_prob: 0.05,
            }
        ),
        (1usize..4).prop_map(|num_layers| SpeculativeMethod::DraftLayers { num_layers }),
        Just(SpeculativeMethod::DraftModel),
    ];
    prop::option::of((method, 1usize..7, prop::sample::select(vec![1usize, 3, usize::MAX]))).prop_map(
        |spec| {
            spec.map(|(method, k, disable)| SpeculativeConfig {
                method,
                num_speculative_tokens: k,
                disable_by_batch_size: disable,
            })
        },
    )
}

/// Layouts with windowed groups: beside a full group, alone, several.
fn hybrid_groups() -> impl Strategy<Value = KvGroups> {
    (prop::sample::select(vec![1usize, 3, 5, 8, 13]), 0usize..3).prop_map(|(w, layout)| {
        let windows = match layout {
            0 => vec![None, Some(w), Some(w)],
            1 => vec![Some(w)],
            _ => vec![None, Some(w)],
        };
        KvGroups::new(windows).unwrap()
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 192, ..ProptestConfig::default() })]

    #[test]
    fn every_request_ends_blocks_return_and_outputs_match_solo_runs(
        block_size in prop::sample::select(vec![1usize, 2, 4, 8]),
        extra_blocks in 0usize..24,
        extra_budget in 0usize..64,
        max_num_seqs in 1usize..8,
        prefix_caching in any::<bool>(),
        speculative in speculation(),
        specs in prop::collection::vec(spec(), 1..10),
    ) {
        let min_blocks = MAX_MODEL_LEN.div_ceil(block_size);
        let mut config = EngineConfig::new(block_size, min_blocks + extra_blocks, MAX_MODEL_LEN);
        config.max_num_batched_tokens = max_num_seqs + extra_budget;
        config.max_num_seqs = max_num_seqs;
        config.enable_prefix_caching = prefix_caching;
        config.speculative = speculative;
        check(config, &specs)?;
    }

    #[test]
    fn windowed_groups_release_blocks_and_outputs_match_solo_runs(
        block_size in prop::sample::select(vec![1usize, 2, 4, 8]),
        groups in hybrid_groups(),
        extra_blocks in 0usize..24,
        extra_budget in 0usize..64,
        max_num_seqs in 1usize..8,
        prefix_caching in any::<bool>(),
        speculative in speculation(),
        specs in prop::collection::vec(spec(), 1..10),
    ) {
        let mut config = EngineConfig::new(block_size, 1, MAX_MODEL_LEN);
        config.max_num_batched_tokens = max_num_seqs + extra_budget;
        config.max_num_seqs = max_num_seqs;
        config.enable_prefix_caching = prefix_caching;
        config.kv_groups = groups;
        config.speculative = speculative;
        config.num_blocks = config.max_blocks_per_sequence() + extra_blocks;
        check(config, &specs)?;
    }
}

//! Speculative decoding through the scheduler and the fake executor: outputs equal the solo
//! runs without speculation (greedy and seeded sampling alike), several tokens per step when
//! proposals hold, stop conditions in the middle of an accepted run, and no block left behind
//! after heavy rejection (the audit after every step and an empty pool at the end).

mod common;

use std::collections::HashMap;
use std::sync::Arc;

use common::{drive_counting, reference, VOCAB};
use pagoda_engine::fake::FakeExecutor;
use pagoda_engine::speculative::ProposerKind;
use pagoda_engine::{
    EngineConfig, FinishReason, ModelExecutor, Request, SamplingParams, Scheduler, SpecDecodeStats,
    SpeculativeConfig, SpeculativeMethod, StepEvents, StopConditions,
};

const MAX_MODEL_LEN: usize = 96;

fn ngram(k: usize, min: usize, max: usize) -> SpeculativeConfig {
    SpeculativeConfig {
        method: SpeculativeMethod::Ngram { prompt_lookup_min: min, prompt_lookup_max: max },
        num_speculative_tokens: k,
        disable_by_batch_size: usize::MAX,
    }
}

fn config(num_blocks: usize, speculative: Option<SpeculativeConfig>) -> EngineConfig {
    let mut c = EngineConfig::new(4, num_blocks, MAX_MODEL_LEN);
    c.max_num_seqs = 8;
    c.max_num_batched_tokens = 40;
    c.speculative = speculative;
    c
}

fn run(
    config: EngineConfig,
    requests: &[Request],
) -> (HashMap<u64, common::Collected>, usize, SpecDecodeStats) {
    let mut sched = Scheduler::new(config.clone()).unwrap();
    let mut exec = FakeExecutor::new(config.block_size, config.num_blocks, VOCAB);
    let mut spec = SpecDecodeStats::default();
    let arrivals = requests.iter().enumerate().map(|(i, r)| (i / 4, r.clone())).collect();
    let (out, steps) = drive_counting(&mut sched, &mut exec, arrivals, vec![], &mut spec);
    assert_eq!(sched.block_manager().num_used_blocks(), 0, "blocks left held");
    assert_eq!(sched.block_manager().num_free_blocks(), config.num_blocks);
    (out, steps, spec)
}

/// Sixteen mixed requests: greedy and seeded sampling, n up to 2, penalties, logprobs,
/// min_tokens, stop ids and strings.
fn mixed() -> Vec<Request> {
    (0..16u64)
        .map(|i| {
            let prompt: Vec<u32> = (0..(8 + i * 3) as u32).map(|t| (t * 7 + i as u32) % 9).collect();
            let params = SamplingParams {
                temperature: if i % 3 == 0 { 0.0 } else { 0.9 },
                seed: Some(i * 31),
                logprobs: (i % 4 == 1).then_some(2),
                repetition_penalty: if i % 5 == 2 { 1.2 } else { 1.0 },
                ..Default::default()
            };
            let stop = StopConditions {
                eos_token_ids: if i % 2 == 0 { vec![3] } else { vec![] },
                stop_strings: if i % 7 == 3 { vec!["dd".to_string()].into() } else { Default::default() },
                min_tokens: (i % 3) as usize * 4,
                ..Default::default()
            };
            Request::new(i, prompt, Arc::new(params))
                .with_max_tokens(12 + (i as usize * 3) % 20)
                .with_n(if i % 6 == 5 { 2 } else { 1 })
                .with_stop(stop)
        })
        .collect()
}

#[test]
fn heavy_rejection_keeps_outputs_and_returns_every_block() {
    let requests = mixed();
    // A cache of 40 blocks of 4 tokens: the batch preempts.
    for spec in [ngram(5, 1, 1), ngram(3, 1, 3), ngram(16, 2, 4), SpeculativeConfig::suffix(6)] {
        let (out, _, stats) = run(config(40, Some(spec)), &requests);
        for r in &requests {
            let got = &out[&r.id];
            assert!(got.done);
            assert_eq!(got.samples, reference(r, MAX_MODEL_LEN), "request {} with {spec:?}", r.id);
        }
        assert!(stats.num_drafts > 5, "{stats:?}");
        assert!(stats.acceptance_rate() < 0.5, "the fake model's outputs should mostly reject: {stats:?}");
    }
}

#[test]
fn accepted_runs_produce_several_tokens_per_step_and_stop_exactly() {
    // A bias makes the output a run of token 5 (decoded "f"), which prompt lookup predicts.
    let bias = HashMap::from([(5u32, 100.0f32)]);
    let greedy = SamplingParams { logit_bias: bias.clone(), ..Default::default() };
    let sampled = SamplingParams { temperature: 1.0, seed: Some(9), logit_bias: bias, ..Default::default() };
    let requests =
        vec![
            Request::new(1, vec![1, 2, 5, 5], Arc::new(greedy.clone())).with_max_tokens(13),
            Request::new(2, vec![1, 2, 5, 5], Arc::new(sampled)).with_max_tokens(30),
            Request::new(3, vec![7, 5, 5, 5], Arc::new(greedy.clone())).with_max_tokens(40).with_stop(
                StopConditions { stop_strings: vec!["ffffff".to_string()].into(), ..Default::default() },
            ),
            Request::new(4, vec![7, 5, 5, 5], Arc::new(greedy))
                .with_max_tokens(40)
                .with_stop(StopConditions { min_tokens: 9, eos_token_ids: vec![5], ..Default::default() }),
        ];
    let (plain, plain_steps, _) = run(config(200, None), &requests);
    let (spec_out, spec_steps, stats) = run(config(200, Some(ngram(4, 1, 2))), &requests);
    for r in &requests {
        assert_eq!(spec_out[&r.id].samples, plain[&r.id].samples, "request {}", r.id);
        assert_eq!(spec_out[&r.id].samples, reference(r, MAX_MODEL_LEN), "request {}", r.id);
    }
    assert_eq!(plain[&1].samples[0].tokens.len(), 13);
    // The stop string ends the output after its sixth token (and is not part of the text).
    assert_eq!((plain[&3].samples[0].tokens.len(), plain[&3].samples[0].text.as_str()), (6, ""));
    assert_eq!(plain[&4].samples[0].tokens.len(), 10, "min_tokens then the eos");
    // Request 4 bans its eos (token 5) for nine tokens: the proposals of 5 fail there.
    assert!(stats.acceptance_rate() > 0.75, "{stats:?}");
    assert!(stats.mean_acceptance_length() > 3.5, "{stats:?}");
    assert!(spec_steps * 2 < plain_steps, "{spec_steps} steps with speculation, {plain_steps} without");
}

#[test]
fn executor_drafts_are_verified_like_any_other_proposal() {
    let requests = mixed();
    let (_, plain_steps, _) = run(config(40, None), &requests);
    // Drafted by the target's first layers or by a separate model: the engine treats both alike.
    for method in [SpeculativeMethod::DraftLayers { num_layers: 2 }, SpeculativeMethod::DraftModel] {
        let spec = SpeculativeConfig { method, num_speculative_tokens: 3, disable_by_batch_size: usize::MAX };
        let (out, steps, stats) = run(config(40, Some(spec)), &requests);
        for r in &requests {
            assert_eq!(out[&r.id].samples, reference(r, MAX_MODEL_LEN), "{method:?}, request {}", r.id);
        }
        // The fake drafter is right three times in four where the target is greedy; two requests
        // in three sample at temperature 0.9, where its greedy guesses mostly miss.
        assert!(stats.num_drafts > 50 && stats.acceptance_rate() > 0.1, "{method:?}: {stats:?}");
        assert!(steps < plain_steps, "{method:?}: {steps} steps with drafts, {plain_steps} without");
    }
}

#[test]
fn suffix_decoding_proposes_what_earlier_requests_answered() {
    // The same greedy requests twice, one after the other: the second wave's outputs are
    // proposed from the first wave's, cached when those finished.
    let first = mixed();
    let second: Vec<Request> = first
        .iter()
        .filter(|r| r.params.temperature == 0.0)
        .map(|r| {
            let mut again = r.clone();
            again.id += 100;
            again
        })
        .collect();
    let mut sched = Scheduler::new(config(400, Some(SpeculativeConfig::suffix(8)))).unwrap();
    let mut exec = FakeExecutor::new(4, 400, VOCAB);
    let mut cold = SpecDecodeStats::default();
    let arrivals = first.iter().map(|r| (0, r.clone())).collect();
    drive_counting(&mut sched, &mut exec, arrivals, vec![], &mut cold);
    let mut warm = SpecDecodeStats::default();
    let arrivals = second.iter().map(|r| (0, r.clone())).collect();
    let (out, _) = drive_counting(&mut sched, &mut exec, arrivals, vec![], &mut warm);
    for r in &second {
        assert_eq!(out[&r.id].samples, reference(r, MAX_MODEL_LEN), "request {}", r.id);
    }
    assert!(warm.acceptance_rate() > 0.8, "second wave {warm:?}");
    assert!(warm.num_accepted_tokens > 2 * cold.num_accepted_tokens, "cold {cold:?}, warm {warm:?}");
}

#[test]
fn large_batches_switch_speculation_off() {
    let params =
        Arc::new(SamplingParams { logit_bias: HashMap::from([(5u32, 100.0f32)]), ..Default::default() });
    let mut spec = ngram(4, 1, 2);
    spec.disable_by_batch_size = 2;
    let mut sched = Scheduler::new(config(400, Some(spec))).unwrap();
    let mut exec = FakeExecutor::new(4, 400, VOCAB);
    let mut events = StepEvents::default();
    for id in 0..3 {
        sched.add_request(Request::new(id, vec![5; 6], Arc::clone(&params)).with_max_tokens(30)).unwrap();
    }
    let mut step = |sched: &mut Scheduler| {
        let batch = sched.schedule();
        let drafts: Vec<usize> = batch.seqs.iter().map(|s| s.num_draft_tokens).collect();
        sched.update(exec.execute(&batch).unwrap(), &mut events).unwrap();
        sched.audit().unwrap();
        drafts
    };
    assert_eq!(step(&mut sched), vec![0, 0, 0], "prefills propose nothing");
    assert_eq!(step(&mut sched), vec![0, 0, 0], "three running sequences are above the limit");
    sched.abort_request(2, FinishReason::Abort, &mut StepEvents::default());
    assert_eq!(step(&mut sched), vec![4, 4], "two are not");
    // A limit of 0 switches speculation off altogether.
    let mut spec = ngram(4, 1, 2);
    spec.disable_by_batch_size = 0;
    let (_, _, stats) = run(config(400, Some(spec)), &mixed());
    assert_eq!(stats, SpecDecodeStats::default());
}

#[test]
fn a_request_caps_its_own_proposals() {
    // Outputs that are a run of token 5, which prompt lookup predicts. The engine proposes up to
    // 4 tokens; one request asks for none, one for at most 2.
    let params =
        Arc::new(SamplingParams { logit_bias: HashMap::from([(5u32, 100.0f32)]), ..Default::default() });
    let requests = vec![
        Request::new(0, vec![5; 6], Arc::clone(&params)).with_max_tokens(30),
        Request::new(1, vec![5; 6], Arc::clone(&params)).with_max_tokens(30).with_max_speculative_tokens(0),
        Request::new(2, vec![5; 6], Arc::clone(&params)).with_max_tokens(30).with_max_speculative_tokens(2),
    ];
    let mut sched = Scheduler::new(config(400, Some(ngram(4, 1, 2)))).unwrap();
    let mut exec = FakeExecutor::new(4, 400, VOCAB);
    let mut events = StepEvents::default();
    for r in &requests {
        sched.add_request(r.clone()).unwrap();
    }
    // The most proposals each sequence carried into one step.
    let mut most = HashMap::new();
    while sched.has_unfinished() {
        let batch = sched.schedule();
        for s in &batch.seqs {
            let m = most.entry(s.seq_id).or_insert(0);
            *m = s.num_draft_tokens.max(*m);
        }
        sched.update(exec.execute(&batch).unwrap(), &mut events).unwrap();
        sched.audit().unwrap();
    }
    let mut most: Vec<usize> = most.into_values().collect();
    most.sort_unstable();
    assert_eq!(most, vec![0, 2, 4], "the most proposals per step of each sequence");
    let (out, _, _) = run(config(400, Some(ngram(4, 1, 2))), &requests);
    for r in &requests {
        assert_eq!(out[&r.id].samples, reference(r, MAX_MODEL_LEN), "request {}", r.id);
    }
}

#[test]
fn each_request_may_choose_its_proposer() {
    // A server with a draft model; one request keeps it, the others ask for prompt lookup and
    // suffix decoding. Outputs are runs of token 5, which all three predict.
    let params =
        Arc::new(SamplingParams { logit_bias: HashMap::from([(5u32, 100.0f32)]), ..Default::default() });
    let request = |id| Request::new(id, vec![5; 6], Arc::clone(&params)).with_max_tokens(30);
    let requests = vec![
        request(0),
        request(1).with_speculative_method(ProposerKind::Ngram),
        request(2).with_speculative_method(ProposerKind::Suffix),
    ];
    let spec = SpeculativeConfig {
        method: SpeculativeMethod::DraftModel,
        num_speculative_tokens: 4,
        disable_by_batch_size: usize::MAX,
    };
    let mut sched = Scheduler::new(config(400, Some(spec))).unwrap();
    let mut exec = FakeExecutor::new(4, 400, VOCAB);
    let mut events = StepEvents::default();
    for r in &requests {
        sched.add_request(r.clone()).unwrap();
    }
    // Per sequence (ids in the order the requests came): steps that asked the executor to draft
    // after them, and steps with proposals that no step before asked the executor for (the
    // scheduler looked them up).
    let mut asked = [0; 3];
    let mut looked_up = [0; 3];
    let mut asked_last = [false; 3];
    while sched.has_unfinished() {
        let batch = sched.schedule();
        for s in &batch.seqs {
            let seq = s.seq_id as usize;
            if s.num_draft_tokens > 0 && !asked_last[seq] {
                looked_up[seq] += 1;
            }
            asked_last[seq] = s.num_to_draft > 0;
            asked[seq] += usize::from(asked_last[seq]);
        }
        sched.update(exec.execute(&batch).unwrap(), &mut events).unwrap();
        sched.audit().unwrap();
    }
    assert!(asked[0] > 0 && looked_up[0] == 0, "{asked:?} {looked_up:?}");
    for seq in [1, 2] {
        assert!(asked[seq] == 0 && looked_up[seq] > 0, "{asked:?} {looked_up:?}");
    }
    let (out, _, stats) = run(config(400, Some(spec)), &requests);
    for r in &requests {
        assert_eq!(out[&r.id].samples, reference(r, MAX_MODEL_LEN), "request {}", r.id);
    }
    assert!(stats.acceptance_rate() > 0.5, "{stats:?}");
    // Asking for a draft the engine does not have is refused when the request is added.
    let mut sched = Scheduler::new(config(400, Some(ngram(4, 1, 2)))).unwrap();
    assert!(sched.add_request(request(3).with_speculative_method(ProposerKind::Executor)).is_err());
}

#[test]
fn the_executor_drafts_what_the_next_step_verifies() {
    // One sequence with room everywhere: every draft the executor returns is verified next step
    // (the draft limit it is given is the scheduler's next one, after rejections too).
    let spec = SpeculativeConfig {
        method: SpeculativeMethod::DraftLayers { num_layers: 2 },
        num_speculative_tokens: 4,
        disable_by_batch_size: usize::MAX,
    };
    let mut sched = Scheduler::new(config(400, Some(spec))).unwrap();
    let mut exec = FakeExecutor::new(4, 400, VOCAB);
    let mut events = StepEvents::default();
    let params = Arc::new(SamplingParams { temperature: 0.0, ..Default::default() });
    sched.add_request(Request::new(0, vec![3, 1, 4, 1, 5], params).with_max_tokens(60)).unwrap();
    let (mut drafted, mut verified, mut rejections) = (Vec::new(), Vec::new(), 0);
    while sched.has_unfinished() {
        let batch = sched.schedule();
        let s = &batch.seqs[0];
        verified.push(s.num_draft_tokens);
        let out = exec.execute(&batch).unwrap();
        let t = &out.sampled[0];
        rejections += usize::from(t.num_accepted() < s.num_draft_tokens);
        drafted.push(t.proposals.len());
        sched.update(out, &mut events).unwrap();
        sched.audit().unwrap();
    }
    // Each step's drafts are the next one's proposals, except that the last step's die with the
    // sequence and the one before may draft past `max_tokens` (it cannot know how many of its
    // proposals will hold).
    let n = drafted.len();
    assert_eq!(drafted[..n - 2], verified[1..n - 1], "drafted {drafted:?}, verified {verified:?}");
    assert!(drafted[n - 2] >= verified[n - 1], "drafted {drafted:?}, verified {verified:?}");
    assert!(rejections > 3 && drafted.contains(&4), "{drafted:?}");
}

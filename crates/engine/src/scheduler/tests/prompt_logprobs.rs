//! Prompt logprobs (vLLM's `prompt_logprobs`) in the scheduler: every prompt token after the
//! first scored once, across chunks, past prefix-cache hits and through a fork, delivered on the
//! request's first token event.

use super::*;
use crate::executor::TopLogprobs;
use crate::sampler::Sampler;

/// What the fake model gives for each prompt token after the first, computed here without
/// any scheduling.
fn reference(prompt: &[u32], top: usize) -> Vec<TopLogprobs> {
    let mut sampler = Sampler::new();
    let mut logits = Vec::new();
    (1..prompt.len())
        .map(|p| {
            FakeExecutor::logits_for(&prompt[..p], VOCAB, &mut logits);
            sampler.token_logprobs(&logits, prompt[p], top)
        })
        .collect()
}

fn scored_request(id: RequestId, prompt: Vec<u32>, top: usize) -> Request {
    let mut r = req(id, prompt, 3);
    r.prompt_logprobs = Some(top);
    r
}

/// The prompt logprobs request `id` received, checking that exactly one event carried them:
/// its first one with tokens.
fn received(h: &Harness, id: RequestId) -> Vec<TopLogprobs> {
    let events = &h.received[&id];
    let carrying: Vec<_> = events.iter().filter(|e| e.prompt_logprobs.is_some()).collect();
    assert_eq!(carrying.len(), 1, "one event carries the prompt logprobs");
    let first_with_tokens = events.iter().find(|e| !e.token_ids.is_empty()).unwrap();
    assert!(first_with_tokens.prompt_logprobs.is_some(), "on the first token event");
    carrying[0].prompt_logprobs.clone().unwrap()
}

#[test]
fn a_chunked_prompt_is_scored_whole_in_order() {
    let mut config = EngineConfig::new(4, 64, 256);
    config.max_num_batched_tokens = 8;
    config.max_num_seqs = 8;
    let mut h = Harness::new(config);
    h.add(scored_request(1, prompt(21, 5), 3));
    h.run();
    let got = received(&h, 1);
    assert_eq!(got.len(), 20);
    assert_eq!(got, reference(&prompt(21, 5), 3));
    assert!(got.iter().all(|lp| lp.top.len() == 3));
    assert_eq!(h.tokens(1, 0), solo(&req(1, prompt(21, 5), 3))[0], "scoring changes no output");
}

#[test]
fn a_cached_prompt_is_computed_again_and_scored() {
    let mut h = Harness::small(4, 64);
    h.add(req(1, prompt(17, 2), 2));
    h.run();
    h.add(scored_request(2, prompt(17, 2), 0));
    let batch = h.step();
    assert_eq!(batch.seqs[0].q_len(), 17, "no prefix-cache hit for a scored prompt");
    h.run();
    assert_eq!(h.usage(2).cached_prompt_tokens, 0);
    assert_eq!(received(&h, 2), reference(&prompt(17, 2), 0));
}

#[test]
fn samples_of_a_forked_request_get_the_prompt_scored_once() {
    let mut h = Harness::small(4, 64);
    h.add(scored_request(1, prompt(9, 1), 1).with_n(3));
    h.run();
    assert_eq!(received(&h, 1), reference(&prompt(9, 1), 1));
    // A one-token prompt has nothing to score.
    h.add(scored_request(2, vec![7], 1));
    h.run();
    let events = &h.received[&2];
    assert_eq!(events.iter().find_map(|e| e.prompt_logprobs.clone()), Some(Vec::new()));
}

#[test]
fn scores_for_the_wrong_sequence_fail_the_step() {
    let mut h = Harness::small(4, 64);
    h.add(scored_request(1, prompt(5, 0), 1));
    let batch = h.sched.schedule();
    let mut output = h.exec.execute(&batch).unwrap();
    output.prompt_logprobs[0].logprobs.pop();
    let err = h.sched.update(output, &mut h.events).unwrap_err();
    assert!(matches!(err, UpdateError::PromptLogprobsMismatch { .. }), "{err}");
}

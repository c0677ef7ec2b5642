//! Beam search in the scheduler against a plain beam search of our own over the fake model's
//! distribution (the algorithm of vLLM's `beam_search`, written independently here): the same
//! best hypotheses with the same cumulative logprobs, alone and under block pressure that
//! preempts some beams of a search (their siblings wait for them); forks share
//! blocks (the fake reads each token back through the block tables), and everything is freed.

use super::*;
use crate::request::BeamSearch;

const EOS: u32 = 5;

fn log_softmax(history: &[u32]) -> Vec<f64> {
    let mut logits = Vec::new();
    FakeExecutor::logits_for(history, VOCAB, &mut logits);
    let max = logits.iter().copied().fold(f32::MIN, f32::max) as f64;
    let sum: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
    logits.iter().map(|&l| l as f64 - max - sum.ln()).collect()
}

/// The reference: (output tokens, cumulative logprob, ended by EOS) of the `n` best.
fn reference(
    prompt: &[u32],
    width: usize,
    n: usize,
    max_tokens: usize,
    penalty: f64,
) -> Vec<(Vec<u32>, f64, bool)> {
    let score = |tokens: &[u32], cum: f64, eos: bool| {
        let len = prompt.len() + tokens.len() - usize::from(eos);
        cum / (len as f64).powf(penalty)
    };
    let mut beams: Vec<(Vec<u32>, f64)> = vec![(Vec::new(), 0.0)];
    let mut done: Vec<(Vec<u32>, f64, bool)> = Vec::new();
    for _ in 0..max_tokens {
        let mut next = Vec::new();
        for (tokens, cum) in &beams {
            let history: Vec<u32> = prompt.iter().chain(tokens).copied().collect();
            let logprobs = log_softmax(&history);
            let mut order: Vec<usize> = (0..VOCAB).collect();
            order.sort_by(|&a, &b| logprobs[b].total_cmp(&logprobs[a]));
            for &t in &order[..2 * width] {
                let mut tokens = tokens.clone();
                tokens.push(t as u32);
                let cum = cum + logprobs[t];
                if t as u32 == EOS {
                    done.push((tokens, cum, true));
                } else {
                    next.push((tokens, cum));
                }
            }
        }
        next.sort_by(|a, b| b.1.total_cmp(&a.1));
        next.truncate(width);
        beams = next;
        if beams.is_empty() {
            break;
        }
    }
    done.extend(beams.into_iter().map(|(t, c)| (t, c, false)));
    done.sort_by(|a, b| score(&b.0, b.1, b.2).total_cmp(&score(&a.0, a.1, a.2)));
    done.truncate(n);
    done
}

fn beam_request(
    id: RequestId,
    prompt: Vec<u32>,
    width: usize,
    n: usize,
    max_tokens: usize,
    penalty: f32,
) -> Request {
    let stop = StopConditions { eos_token_ids: vec![EOS], ..Default::default() };
    Request::new(id, prompt, Arc::new(SamplingParams::default()))
        .with_max_tokens(max_tokens)
        .with_n(n)
        .with_stop(stop)
        .with_beam(BeamSearch { width, length_penalty: penalty })
}

/// What request `id` returned: per output index, (tokens, summed logprobs, finish reason).
fn results(h: &Harness, id: RequestId, n: usize) -> Vec<(Vec<u32>, f64, FinishReason)> {
    (0..n)
        .map(|i| {
            let events: Vec<&TokenEvent> = h.received[&id].iter().filter(|e| e.index == i).collect();
            assert_eq!(events.len(), 1, "one event per hypothesis");
            let logprobs = events[0].logprobs.as_ref().expect("logprobs");
            assert_eq!(logprobs.len(), events[0].token_ids.len());
            let cum = logprobs.iter().map(|l| f64::from(l.sampled.logprob)).sum();
            (h.tokens(id, i), cum, h.finish(id, i))
        })
        .collect()
}

fn assert_matches(got: &[(Vec<u32>, f64, FinishReason)], want: &[(Vec<u32>, f64, bool)]) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.0, w.0, "hypothesis {i}: {got:?} vs {want:?}");
        assert!((g.1 - w.1).abs() < 1e-4, "hypothesis {i}: logprob {} vs {}", g.1, w.1);
        let eos = g.2 == FinishReason::Stop(StopReason::Eos(EOS));
        assert_eq!(eos, w.2, "hypothesis {i}: {:?}", g.2);
        assert!(eos || g.2 == FinishReason::Length);
    }
}

#[test]
fn beams_match_the_reference_search() {
    let mut cases = 0;
    let mut ended_by_eos = 0;
    for (salt, width, n, max_tokens, penalty) in
        [(1, 1, 1, 6, 1.0), (2, 3, 2, 8, 1.0), (3, 4, 4, 7, 0.0), (4, 2, 1, 9, 2.0), (5, 5, 3, 10, 1.0)]
    {
        for length in [3, 9] {
            let prompt = prompt(length, salt);
            let want = reference(&prompt, width, n, max_tokens, f64::from(penalty));
            ended_by_eos += want.iter().filter(|w| w.2).count();
            let mut h = Harness::small(4, 256);
            h.add(beam_request(1, prompt.clone(), width, n, max_tokens, penalty));
            h.run();
            assert_matches(&results(&h, 1, n), &want);
            let usage = h.usage(1);
            assert_eq!(usage.completion_tokens, want.iter().map(|w| w.0.len()).sum::<usize>());
            assert_eq!(h.sched.block_manager().num_free_blocks(), 256);
            cases += 1;
        }
    }
    assert_eq!(cases, 10);
    assert!(ended_by_eos > 0, "some hypotheses end with EOS");
}

#[test]
fn beams_fork_from_one_prefill_and_share_its_blocks() {
    let mut h = Harness::small(4, 64);
    h.add(beam_request(1, prompt(10, 7), 4, 2, 5, 1.0));
    let first = h.step();
    assert_eq!(first.seqs.len(), 1, "one prefill for every beam");
    let used_after_prefill = h.sched.block_manager().num_used_blocks();
    let second = h.step();
    assert_eq!(second.seqs.len(), 4, "four beams decode");
    // The prompt's two full blocks are shared; each beam has its own copy of the third.
    assert!(h.sched.block_manager().num_used_blocks() <= used_after_prefill + 3 + 4);
    assert!(second.block_copies.len() >= 3, "{:?}", second.block_copies);
    assert!(h.received.get(&1).is_none_or(Vec::is_empty), "nothing before the search ends");
    h.run();
    assert_eq!(results(&h, 1, 2).len(), 2);
}

#[test]
fn beam_forks_copy_only_partial_blocks() {
    // Eight beams over a prompt of 9 tokens (blocks of 4) in a pool of 4096 blocks: at every
    // step a beam chosen again copies its partial block and nothing more.
    let mut h = Harness::small(4, 4096);
    h.add(beam_request(1, prompt(9, 4), 8, 2, 12, 1.0));
    let mut copies = 0;
    while h.sched.has_unfinished() {
        let (batch, _) = h.step_checking_copies();
        assert!(batch.block_copies.len() <= batch.seqs.len(), "{:?}", batch.block_copies);
        copies += batch.block_copies.len();
        // The prompt's full blocks and each beam's own: never the pool.
        assert!(h.sched.block_manager().num_used_blocks() <= 2 + 8 * 4, "{copies} copies so far");
    }
    assert!(copies >= 7, "{copies} copies");
    assert_eq!(results(&h, 1, 2).len(), 2);
    assert_eq!(h.sched.block_manager().num_free_blocks(), 4096);
}

#[test]
fn preempted_beams_give_the_same_beams() {
    let beam = |id, salt| beam_request(id, prompt(9, salt), 3, 3, 15, 1.0).with_priority(1);
    let want: Vec<_> = (0..3).map(|i| reference(&prompt(9, i), 3, 3, 15, 1.0)).collect();
    // Two plain requests of 40 tokens come first and take half of the 24 blocks; the
    // searches, less urgent, are preempted when the plain ones grow, while sibling beams
    // wait for them.
    let mut config = EngineConfig::new(4, 24, 48);
    config.max_num_batched_tokens = 12;
    config.max_num_seqs = 12;
    let mut h = Harness::new(config);
    let plain = |id, salt| Request::new(id, prompt(9, salt), params(0.0, id)).with_max_tokens(31);
    for i in 0..3u32 {
        h.add(beam(u64::from(i) + 1, i));
    }
    h.add(plain(10, 10));
    h.add(plain(11, 11));
    h.run();
    let beam_preemptions: usize =
        h.metrics.iter().filter(|m| m.request_id <= 3).map(|m| m.num_preemptions).sum();
    assert!(beam_preemptions > 0, "beams were preempted");
    for (i, want) in want.iter().enumerate() {
        assert_matches(&results(&h, i as u64 + 1, 3), want);
    }
    for id in [10, 11] {
        assert_eq!(h.tokens(id, 0), solo(&plain(id, id as u32))[0]);
    }
    assert_eq!(h.sched.block_manager().num_free_blocks(), 24);
}

#[test]
fn an_aborted_search_frees_every_beam() {
    let mut h = Harness::small(4, 64);
    h.add(beam_request(1, prompt(6, 2), 4, 2, 30, 1.0));
    for _ in 0..4 {
        h.step();
    }
    assert!(h.sched.num_running_seqs() > 1);
    assert!(h.sched.abort_request(1, FinishReason::Abort, &mut h.events));
    h.drain();
    h.sched.audit().unwrap();
    assert_eq!(h.finish(1, 0), FinishReason::Abort);
    assert_eq!(h.finish(1, 1), FinishReason::Abort);
    assert_eq!(h.sched.block_manager().num_free_blocks(), 64);
    assert_eq!(h.sched.num_running_seqs(), 0);
}

#[test]
fn beam_requests_refuse_what_they_cannot_honour() {
    let config = EngineConfig::new(4, 64, 256);
    let base = beam_request(1, prompt(4, 0), 2, 2, 4, 1.0);
    assert!(base.validate(&config).is_ok());
    let narrow = base.clone().with_n(3);
    assert!(matches!(narrow.validate(&config), Err(RequestError::BeamWidth { width: 2, n: 3, .. })));
    let hot = Request { params: params(0.8, 1), ..base.clone() };
    assert_eq!(hot.validate(&config), Err(RequestError::BeamUnsupported { what: "temperature" }));
    // Two beams of 204 tokens need 102 blocks of 4 at once.
    let long = base.clone().with_max_tokens(200);
    assert_eq!(long.validate(&config), Err(RequestError::BeamTooLarge { blocks: 102, num_blocks: 64 }));
    let scored = Request { prompt_logprobs: Some(1), ..base };
    assert_eq!(scored.validate(&config), Err(RequestError::BeamUnsupported { what: "prompt_logprobs" }));
}

#[test]
fn searches_under_slot_and_block_pressure_all_finish_as_the_reference() {
    // Wide searches beside fan-outs of other groups, on caches and slot counts where beams
    // are preempted and must rejoin siblings that hold their round: every search ends with the
    // reference's beams and every other request completes.
    let mut preempted = 0;
    for (num_blocks, max_num_seqs) in [(20, 4), (24, 4), (20, 6), (32, 6)] {
        let mut config = EngineConfig::new(4, num_blocks, 64);
        config.max_num_batched_tokens = 8;
        config.max_num_seqs = max_num_seqs;
        let mut h = Harness::new(config);
        let wants: Vec<_> = (0..2).map(|i| reference(&prompt(9, i), 3, 2, 14, 1.0)).collect();
        for i in 0..2u32 {
            h.add(beam_request(u64::from(i) + 1, prompt(9, i), 3, 2, 14, 1.0).with_priority(1));
        }
        for id in 10..13 {
            h.add(Request::new(id, prompt(7, id as u32), params(0.0, id)).with_max_tokens(20).with_n(3));
        }
        // The engine fails the queue's head after two empty steps in a row.
        let mut empty = 0;
        while h.sched.has_unfinished() {
            empty = if h.step().is_empty() { empty + 1 } else { 0 };
            assert!(empty < 2, "{num_blocks} blocks, {max_num_seqs} slots: the scheduler stalled");
        }
        for (i, want) in wants.iter().enumerate() {
            assert_matches(&results(&h, i as u64 + 1, 2), want);
        }
        for id in 10..13 {
            for index in 0..3 {
                assert_eq!(h.finish(id, index), FinishReason::Length, "{num_blocks} blocks, request {id}");
            }
        }
        preempted += h.metrics.iter().filter(|m| m.request_id <= 2).map(|m| m.num_preemptions).sum::<usize>();
        assert_eq!(h.sched.block_manager().num_free_blocks(), num_blocks);
    }
    assert!(preempted > 0, "some beams were preempted");
}

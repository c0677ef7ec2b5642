//! Scheduler unit tests, driven step by step with the fake executor.

use std::collections::HashMap;
use std::sync::Arc;

use super::*;
use crate::event::{FinishReason, StopReason, Usage};
use crate::executor::{ModelExecutor, ScheduledBatch, StepOutput};
use crate::fake::{FakeDecoder, FakeExecutor};
use crate::request::{Request, StopConditions};
use crate::sampling::SamplingParams;

const VOCAB: usize = 32;

struct Harness {
    sched: Scheduler,
    exec: FakeExecutor,
    events: StepEvents,
    output: crate::output::OutputStage,
    /// Per request: every event received, in order.
    received: HashMap<RequestId, Vec<TokenEvent>>,
    metrics: Vec<RequestMetrics>,
}

impl Harness {
    fn new(config: EngineConfig) -> Self {
        let exec = FakeExecutor::new(config.block_size, config.num_blocks, VOCAB);
        let sched = Scheduler::new(config).unwrap();
        let output = crate::output::OutputStage::new(Arc::new(FakeDecoder));
        Self {
            sched,
            exec,
            events: StepEvents::default(),
            output,
            received: HashMap::new(),
            metrics: Vec::new(),
        }
    }

    fn small(block_size: usize, num_blocks: usize) -> Self {
        Self::new(EngineConfig::new(block_size, num_blocks, block_size * num_blocks))
    }

    fn add(&mut self, r: Request) {
        self.output.add(&r);
        self.sched.add_request(r).unwrap();
    }

    /// One step; returns the batch that ran.
    fn step(&mut self) -> ScheduledBatch {
        let batch = self.sched.schedule();
        if !batch.is_empty() {
            let out = self.exec.execute(&batch).unwrap();
            self.sched.update(out, &mut self.events).unwrap();
        }
        self.drain();
        self.sched.audit().unwrap();
        batch
    }

    fn drain(&mut self) {
        for (id, ev) in self.output.process(&mut self.sched, &mut self.events) {
            self.received.entry(id).or_default().push(ev);
        }
        self.metrics.append(&mut self.events.finished);
    }

    fn run(&mut self) -> usize {
        let mut steps = 0;
        while self.sched.has_unfinished() {
            self.step();
            steps += 1;
            assert!(steps < 100_000, "no progress");
        }
        steps
    }

    /// Output token ids of sample `index` of request `id`.
    fn tokens(&self, id: RequestId, index: usize) -> Vec<u32> {
        self.received[&id].iter().filter(|e| e.index == index).flat_map(|e| e.token_ids.clone()).collect()
    }

    fn text(&self, id: RequestId, index: usize) -> String {
        self.received[&id].iter().filter(|e| e.index == index).map(|e| e.text.as_str()).collect()
    }

    fn finish(&self, id: RequestId, index: usize) -> FinishReason {
        self.received[&id].iter().filter(|e| e.index == index).find_map(|e| e.finished.clone()).unwrap()
    }

    fn usage(&self, id: RequestId) -> Usage {
        let last = self.received[&id].last().unwrap();
        assert!(last.is_last());
        last.usage.unwrap()
    }
}

fn params(temperature: f32, seed: u64) -> Arc<SamplingParams> {
    Arc::new(SamplingParams { temperature, seed: Some(seed), ..Default::default() })
}

fn req(id: RequestId, prompt: Vec<u32>, max_tokens: usize) -> Request {
    Request::new(id, prompt, params(1.0, id)).with_max_tokens(max_tokens)
}

fn prompt(len: usize, salt: u32) -> Vec<u32> {
    (0..len as u32).map(|i| (i * 7 + salt) % VOCAB as u32).collect()
}

/// Output of `r` run alone on a big cache.
fn solo(r: &Request) -> Vec<Vec<u32>> {
    let mut h = Harness::small(4, 4096);
    h.add(r.clone());
    h.run();
    (0..r.n).map(|i| h.tokens(r.id, i)).collect()
}

#[test]
fn one_request_runs_to_max_tokens_and_frees_everything() {
    let mut h = Harness::small(4, 64);
    h.add(req(1, prompt(10, 0), 7));
    let steps = h.run();
    assert_eq!(steps, 7, "one prefill step then six decodes");
    assert_eq!(h.tokens(1, 0).len(), 7);
    assert_eq!(h.finish(1, 0), FinishReason::Length);
    assert_eq!(h.usage(1), Usage { prompt_tokens: 10, completion_tokens: 7, cached_prompt_tokens: 0 });
    assert_eq!(h.sched.block_manager().num_free_blocks(), 64);
    let m = &h.metrics[0];
    let ts = m.timestamps;
    assert!(ts.first_scheduled.is_some() && ts.first_token.is_some() && ts.finished.is_some());
    assert!(ts.first_token <= ts.finished);
}

#[test]
fn long_prompt_is_chunked_while_others_decode() {
    let mut config = EngineConfig::new(16, 256, 1024);
    config.max_num_batched_tokens = 64;
    config.max_num_seqs = 8;
    let mut h = Harness::new(config);
    for id in 0..4 {
        h.add(req(id, prompt(8, id as u32), 200));
    }
    h.step(); // the four short prompts
    h.add(req(99, prompt(500, 3), 4));
    let mut chunk_steps = 0;
    let mut mixed_steps = 0;
    while h.sched.contains_request(99) {
        let batch = h.step();
        assert!(batch.num_tokens() <= 64);
        let long =
            batch.seqs.iter().find(|s| h.sched.seqs.get(&s.seq_id).is_none_or(|e| e.seq.request_id == 99));
        let decodes = batch.seqs.iter().filter(|s| s.q_len() == 1 && s.sample.is_some()).count();
        if let Some(long) = long {
            if long.q_len() > 1 {
                chunk_steps += 1;
                assert!(long.sample.is_none() || long.start_pos + long.q_len() == 500);
                if decodes == 4 {
                    mixed_steps += 1;
                }
            }
        }
    }
    // 500 tokens at most 60 per step next to four decodes: at least nine chunks.
    assert!(chunk_steps >= 9, "{chunk_steps} chunk steps");
    assert!(mixed_steps >= 8, "{mixed_steps} mixed steps");
    assert_eq!(h.tokens(99, 0), solo(&req(99, prompt(500, 3), 4))[0]);
}

#[test]
fn prefix_cache_hit_is_reported_and_does_not_change_outputs() {
    let mut h = Harness::small(4, 64);
    let r1 = req(1, prompt(21, 0), 5);
    let r2 = req(2, prompt(21, 0), 5);
    h.add(r1.clone());
    h.run();
    h.add(r2.clone());
    let first = h.step();
    // 20 of 21 tokens are in full cached blocks; one is computed.
    assert_eq!(first.seqs[0].start_pos, 20);
    assert_eq!(first.seqs[0].q_len(), 1);
    h.run();
    assert_eq!(h.usage(2).cached_prompt_tokens, 20);
    // Same seed as request 1 would give the same output; here each has its own seed.
    assert_eq!(h.tokens(2, 0), solo(&r2)[0]);
    assert_eq!(h.tokens(1, 0), solo(&r1)[0]);
    assert!(h.sched.block_manager().prefix_cache_hits() >= 20);
}

#[test]
fn fully_cached_prompt_recomputes_only_its_last_token() {
    let mut h = Harness::small(4, 64);
    let p = prompt(16, 1);
    h.add(req(1, p.clone(), 2));
    h.run();
    let r2 = Request::new(2, p, params(1.0, 1)).with_max_tokens(2);
    h.add(r2.clone());
    let batch = h.step();
    assert_eq!((batch.seqs[0].start_pos, batch.seqs[0].q_len()), (15, 1));
    assert_eq!(batch.block_copies.len(), 1, "the cached last block is copied, not written");
    h.run();
    assert_eq!(h.tokens(2, 0), h.tokens(1, 0), "same prompt and seed");
    assert_eq!(h.usage(2).cached_prompt_tokens, 15);
}

#[test]
fn samples_share_prompt_blocks_and_draw_independently() {
    let mut h = Harness::small(4, 64);
    let r = Request::new(1, prompt(10, 2), params(1.0, 5)).with_max_tokens(6).with_n(3);
    h.add(r.clone());
    h.step(); // prompt minus its last token, then the fork
    assert_eq!(h.sched.num_running_seqs(), 3);
    // Two full prompt blocks are shared; the partial one is copied on write.
    let batch = h.step();
    assert_eq!(batch.seqs.len(), 3);
    assert!(batch.seqs.iter().all(|s| s.start_pos == 9 && s.sample.is_some()));
    assert_eq!(batch.block_copies.len(), 2);
    let first_two = |s: &crate::ScheduledSeq| h.sched.block_tables(s.seq_id).unwrap()[0][..2].to_vec();
    assert!(batch.seqs.iter().all(|s| first_two(s) == first_two(&batch.seqs[0])));
    // The executor hears of the parent's copied block alone, and of the new samples' whole tables.
    let truncations: Vec<_> = batch.seqs.iter().map(|s| s.block_table_update.truncate_to).collect();
    assert_eq!(truncations, [Some(2), Some(0), Some(0)]);
    h.run();
    let outs: Vec<_> = (0..3).map(|i| h.tokens(1, i)).collect();
    assert!(outs[0] != outs[1] || outs[1] != outs[2], "independent seeds");
    assert_eq!(outs, solo(&r));
    assert_eq!(h.usage(1).completion_tokens, 18);
    assert_eq!(h.sched.block_manager().num_free_blocks(), 64);
}

/// Every block copy of `batch`, just scheduled, is the copy-on-write of a scheduled sequence's
/// partial block, the one its first new token lands in: never a full block, and never two for
/// one sequence. Returns the distinct sources.
fn assert_copies_are_partial_blocks(h: &Harness, batch: &ScheduledBatch) -> Vec<u32> {
    let bs = h.sched.block_manager().block_size();
    let mut copied_for = std::collections::HashSet::new();
    for &(src, dst) in &batch.block_copies {
        let s = batch.seqs.iter().find(|s| {
            h.sched.block_tables(s.seq_id).is_some_and(|t| t[0].get(s.start_pos / bs) == Some(&dst))
        });
        let s = s.unwrap_or_else(|| panic!("copy {src} -> {dst} is no scheduled sequence's block"));
        assert_ne!(s.start_pos % bs, 0, "copy {src} -> {dst}: a block the sequence starts afresh");
        assert!(copied_for.insert(s.seq_id), "two copies for sequence {}", s.seq_id);
    }
    let mut sources: Vec<u32> = batch.block_copies.iter().map(|&(src, _)| src).collect();
    sources.sort_unstable();
    sources.dedup();
    sources
}

impl Harness {
    /// One step, its block copies checked against the tables as scheduled; returns the batch
    /// and the copies' distinct sources.
    fn step_checking_copies(&mut self) -> (ScheduledBatch, Vec<u32>) {
        let batch = self.sched.schedule();
        let sources = assert_copies_are_partial_blocks(self, &batch);
        if !batch.is_empty() {
            let out = self.exec.execute(&batch).unwrap();
            self.sched.update(out, &mut self.events).unwrap();
        }
        self.drain();
        self.sched.audit().unwrap();
        (batch, sources)
    }
}

#[test]
fn a_fork_copies_only_its_shared_partial_block_whatever_the_pool() {
    // 64 samples of a 10-token prompt (blocks of 4) in a pool of 4096 blocks.
    let mut h = Harness::small(4, 4096);
    h.add(Request::new(1, prompt(10, 3), params(1.0, 9)).with_max_tokens(2).with_n(64));
    let prefill = h.step();
    assert!(prefill.block_copies.is_empty());
    let shared = h.sched.block_tables(prefill.seqs[0].seq_id).unwrap()[0].clone();
    assert_eq!(shared.len(), 3);
    let (batch, sources) = h.step_checking_copies();
    assert_eq!(batch.seqs.len(), 64);
    // The two full blocks are shared by reference; the partial third is copied for every
    // sample but the one left holding it, and nothing else is copied or allocated.
    assert_eq!(batch.block_copies.len(), 63);
    assert_eq!(sources, [shared[2]]);
    assert_eq!(h.sched.block_manager().num_used_blocks(), 3 + 63);
    for s in &batch.seqs {
        assert_eq!(h.sched.block_tables(s.seq_id).unwrap()[0][..2], shared[..2]);
    }
    h.run();
    assert_eq!(h.usage(1).completion_tokens, 128);
    assert_eq!(h.sched.block_manager().num_free_blocks(), 4096);
}

#[test]
fn preemption_by_recompute_keeps_outputs() {
    // 12 blocks of 4 tokens; three sequences growing to 40 tokens cannot all fit.
    let mut h = Harness::small(4, 12);
    let reqs: Vec<_> = (0..3).map(|i| req(i, prompt(8, i as u32), 32)).collect();
    for r in &reqs {
        h.add(r.clone());
    }
    h.run();
    assert!(h.sched.num_preemptions() > 0);
    for r in &reqs {
        assert_eq!(h.tokens(r.id, 0), solo(r)[0], "request {}", r.id);
    }
    assert!(h.metrics.iter().map(|m| m.num_preemptions).sum::<usize>() > 0);
    assert_eq!(h.sched.block_manager().num_free_blocks(), 12);
}

#[test]
fn abort_frees_blocks_and_finishes_every_sample() {
    let mut h = Harness::small(4, 64);
    h.add(Request::new(1, prompt(9, 0), params(1.0, 1)).with_max_tokens(50).with_n(2));
    h.add(req(2, prompt(9, 1), 50));
    h.step();
    h.step();
    assert!(h.sched.block_manager().num_used_blocks() > 0);
    assert!(h.sched.abort_request(1, FinishReason::Abort, &mut h.events));
    assert!(h.sched.abort_request(2, FinishReason::Abort, &mut h.events));
    assert!(!h.sched.abort_request(3, FinishReason::Abort, &mut h.events));
    h.drain();
    assert_eq!(h.finish(1, 0), FinishReason::Abort);
    assert_eq!(h.finish(1, 1), FinishReason::Abort);
    assert!(h.received[&1].last().unwrap().is_last());
    assert_eq!(h.sched.block_manager().num_free_blocks(), 64);
    assert!(!h.sched.has_unfinished());
    h.sched.audit().unwrap();
}

#[test]
fn abort_before_the_fork_finishes_unforked_samples() {
    let mut h = Harness::small(4, 64);
    h.add(Request::new(1, prompt(9, 0), params(1.0, 1)).with_n(3));
    assert_eq!(h.sched.num_unstarted_seqs(), 3);
    h.sched.abort_request(1, FinishReason::Abort, &mut h.events);
    h.drain();
    assert_eq!(h.received[&1].len(), 3);
    assert_eq!(h.sched.num_unstarted_seqs(), 0);
    assert_eq!(h.metrics[0].finish_reasons, vec![FinishReason::Abort; 3]);
}

#[test]
fn max_num_seqs_caps_running_sequences() {
    let mut config = EngineConfig::new(4, 256, 64);
    config.max_num_seqs = 3;
    let mut h = Harness::new(config);
    for id in 0..5 {
        h.add(req(id, prompt(5, id as u32), 4));
    }
    h.add(Request::new(9, prompt(5, 0), params(1.0, 9)).with_max_tokens(4).with_n(3));
    while h.sched.has_unfinished() {
        let batch = h.step();
        assert!(batch.seqs.len() <= 3);
        assert!(h.sched.running_slots <= 3);
    }
    assert_eq!(h.metrics.len(), 6);
}

#[test]
fn bad_requests_are_rejected() {
    let mut h = Harness::small(4, 16); // max_model_len 64
    let err = h.sched.add_request(req(1, prompt(64, 0), 1)).unwrap_err();
    assert!(matches!(err, AddRequestError::Invalid(RequestError::PromptTooLong { .. })), "{err}");
    h.add(req(2, prompt(5, 0), 1));
    assert_eq!(h.sched.add_request(req(2, prompt(5, 0), 1)), Err(AddRequestError::DuplicateId(2)));
}

#[test]
fn eos_is_banned_until_min_tokens_then_stops() {
    let mut h = Harness::small(4, 64);
    // Greedy on the fake model: find the first token of the greedy output, make it the eos.
    let probe = Request::new(1, prompt(6, 0), params(0.0, 0)).with_max_tokens(3);
    let eos = solo(&probe)[0][0];
    let stop = StopConditions { eos_token_ids: vec![eos], min_tokens: 2, ..Default::default() };
    let r = Request::new(2, prompt(6, 0), params(0.0, 0)).with_max_tokens(20).with_stop(stop.clone());
    h.add(r);
    let batch = h.step();
    assert_eq!(batch.seqs[0].sample.as_ref().unwrap().banned_token_ids, vec![eos]);
    h.run();
    let out = h.tokens(2, 0);
    assert!(out.len() >= 3);
    assert!(!out[..2].contains(&eos));
    // Without min_tokens greedy emits eos at once.
    let stop = StopConditions { min_tokens: 0, ..stop };
    h.add(Request::new(3, prompt(6, 0), params(0.0, 0)).with_max_tokens(20).with_stop(stop));
    h.run();
    assert_eq!(h.tokens(3, 0), vec![eos]);
    assert_eq!(h.finish(3, 0), FinishReason::Stop(StopReason::Eos(eos)));
    assert_eq!(h.text(3, 0), "");
}

#[test]
fn stop_strings_cut_the_text() {
    let mut h = Harness::small(4, 64);
    let probe = Request::new(1, prompt(6, 0), params(0.0, 0)).with_max_tokens(6);
    let out = solo(&probe)[0].clone();
    // Stop at the text of generated tokens 3 and 4.
    let stop_text: String = out[2..4].iter().map(|&t| FakeDecoder::piece(t)).collect();
    let before: String = out[..2].iter().map(|&t| FakeDecoder::piece(t)).collect();
    let stop = StopConditions { stop_strings: vec![stop_text.clone()].into(), ..Default::default() };
    h.add(Request::new(2, prompt(6, 0), params(0.0, 0)).with_max_tokens(6).with_stop(stop));
    h.run();
    // The first occurrence may start earlier if the pieces repeat; the text never contains it.
    let text = h.text(2, 0);
    assert!(!text.contains(&stop_text));
    assert!(before.starts_with(&text) || text.starts_with(&before));
    assert_eq!(h.finish(2, 0), FinishReason::Stop(StopReason::StopString(stop_text)));
}

#[test]
fn executor_output_mismatch_is_an_error_and_fails_the_step() {
    let mut h = Harness::small(4, 64);
    h.add(req(1, prompt(5, 0), 5));
    let _batch = h.sched.schedule();
    let err = h.sched.update(StepOutput::default(), &mut h.events).unwrap_err();
    assert_eq!(err, UpdateError::SampleCount { expected: 1, got: 0 });
    h.sched.fail_scheduled("boom", &mut h.events);
    h.drain();
    assert_eq!(h.finish(1, 0), FinishReason::Error("boom".into()));
    assert_eq!(h.sched.block_manager().num_free_blocks(), 64);
}

#[test]
fn priority_orders_the_queue() {
    let mut config = EngineConfig::new(4, 64, 64);
    config.max_num_seqs = 1;
    let mut h = Harness::new(config);
    h.add(req(1, prompt(4, 0), 2).with_priority(5));
    h.add(req(2, prompt(4, 1), 2).with_priority(-1));
    h.add(req(3, prompt(4, 2), 2).with_priority(5));
    let mut order = Vec::new();
    while h.sched.has_unfinished() {
        h.step();
        for m in h.metrics.drain(..) {
            order.push(m.request_id);
        }
    }
    assert_eq!(order, vec![2, 1, 3]);
}

#[test]
fn kv_pressure_preempts_the_least_urgent_first() {
    // As in `preemption_by_recompute_keeps_outputs`, three sequences cannot all grow to 40
    // tokens in 12 blocks; the victim is the least urgent, not the most recently admitted.
    let mut h = Harness::small(4, 12);
    let reqs: Vec<_> = [(0, 9), (1, 0), (2, 5)]
        .into_iter()
        .map(|(i, priority)| req(i, prompt(8, i as u32), 32).with_priority(priority))
        .collect();
    // The least urgent starts first, so that it is not also the most recently admitted.
    h.add(reqs[0].clone());
    h.step();
    h.step();
    h.add(reqs[1].clone());
    h.add(reqs[2].clone());
    h.run();
    assert!(h.sched.num_preemptions() > 0);
    let preempted = |id: u64| h.metrics.iter().find(|m| m.request_id == id).map_or(0, |m| m.num_preemptions);
    assert_eq!(preempted(1), 0, "the most urgent request was preempted");
    assert!(preempted(0) > 0, "the least urgent request was not preempted");
    for r in &reqs {
        assert_eq!(h.tokens(r.id, 0), solo(r)[0], "request {}", r.id);
    }
}

#[test]
fn prefix_caching_off_gives_the_same_outputs() {
    let mut config = EngineConfig::new(4, 64, 256);
    config.enable_prefix_caching = false;
    let mut h = Harness::new(config);
    let r1 = req(1, prompt(20, 0), 5);
    let r2 = req(2, prompt(20, 0), 5);
    h.add(r1.clone());
    h.run();
    h.add(r2.clone());
    h.run();
    assert_eq!(h.usage(2).cached_prompt_tokens, 0);
    assert_eq!(h.sched.block_manager().prefix_cache_queries(), 0);
    assert_eq!(h.tokens(2, 0), solo(&r2)[0]);
}

#[test]
fn a_small_request_is_admitted_past_a_large_fan_out() {
    let mut config = EngineConfig::new(4, 512, 256);
    config.max_num_seqs = 4;
    let mut h = Harness::new(config);
    // One call with 12 prompts (one group) fills every slot while it is alone.
    for id in 0..12 {
        h.add(req(id, prompt(6, id as u32), 20).with_group(100));
    }
    h.step();
    assert_eq!(h.sched.num_running_seqs(), 4);
    // Another caller arrives: it gets the first slot that frees, ahead of the call's 8 waiting
    // prompts, instead of waiting for all three waves of the call.
    h.add(req(50, prompt(6, 50), 3));
    let mut steps = 0;
    while !h.received.get(&50).is_some_and(|e| e.iter().any(TokenEvent::is_last)) {
        h.step();
        steps += 1;
        assert!(steps < 200, "the small request never finished");
    }
    let first_wave_done = h.metrics.iter().filter(|m| m.request_id < 12).count();
    assert!(first_wave_done <= 4, "the small request waited for {first_wave_done} of the call's prompts");
    let small = h.metrics.iter().find(|m| m.request_id == 50).unwrap();
    let queued = small.timestamps.first_scheduled.unwrap();
    let later_prompts = h
        .metrics
        .iter()
        .filter(|m| m.request_id >= 4 && m.request_id < 12)
        .filter(|m| m.timestamps.first_scheduled.is_some_and(|t| t < queued))
        .count();
    assert_eq!(later_prompts, 0, "prompts of the call that were queued behind it overtook it");
    h.run();
    // Alone again, the call uses every slot.
    assert!(h.metrics.iter().filter(|m| m.request_id < 12).count() == 12);
}

#[test]
fn unstarted_requests_count_their_samples() {
    let mut h = Harness::small(4, 256);
    h.add(req(1, prompt(6, 1), 4).with_n(3));
    h.add(req(2, prompt(6, 2), 4));
    assert_eq!(h.sched.num_unstarted_seqs(), 4);
    h.step();
    assert_eq!(h.sched.num_unstarted_seqs(), 0);
    h.add(req(3, prompt(6, 3), 4).with_n(5));
    assert_eq!(h.sched.num_unstarted_seqs(), 5);
    let mut out = StepEvents::default();
    assert!(h.sched.abort_request(3, FinishReason::Abort, &mut out));
    assert_eq!(h.sched.num_unstarted_seqs(), 0);
}

#[test]
fn the_draft_budget_follows_what_verification_accepted() {
    use crate::speculative::next_draft_budget;
    assert_eq!(next_draft_budget(4, 4), 8, "a whole success doubles");
    assert_eq!(next_draft_budget(12, 12), 16, "up to the most a step may propose");
    assert_eq!(next_draft_budget(8, 0), 1, "a miss at the first position probes with one");
    assert_eq!(next_draft_budget(8, 3), 4, "one past the accepted prefix");
}

/// The output stage ends a sample by its stop string whether the sequence is running or was
/// preempted and waits: its blocks and slots come back, and its request ends with that reason.
#[test]
fn finish_sample_ends_a_running_or_a_preempted_sequence() {
    let mut h = Harness::small(4, 12);
    let reqs: Vec<_> = (0..3).map(|i| req(i, prompt(8, i as u32), 32)).collect();
    for r in &reqs {
        h.add(r.clone());
    }
    // Step until a sequence with output waits after a preemption.
    let waiting_with_output = |h: &Harness| {
        h.sched.waiting.iter().find_map(|id| {
            let e = h.sched.seqs.get(id)?;
            (e.seq.output_len() > 0).then_some(e.seq.request_id)
        })
    };
    let mut steps = 0;
    while waiting_with_output(&h).is_none() {
        h.step();
        steps += 1;
        assert!(steps < 200 && h.sched.has_unfinished(), "no preemption");
    }
    let preempted = waiting_with_output(&h).unwrap();
    let running = h.sched.request_ids().find(|&id| id != preempted);
    let reason = FinishReason::Stop(StopReason::StopString("x".into()));
    for id in std::iter::once(preempted).chain(running) {
        assert!(h.sched.finish_sample(id, 0, reason.clone(), &mut h.events), "request {id}");
        assert!(!h.sched.finish_sample(id, 0, reason.clone(), &mut h.events), "ended twice");
        h.drain();
        h.sched.audit().unwrap();
        assert_eq!(h.finish(id, 0), reason);
        assert!(h.usage(id).completion_tokens > 0);
    }
    h.run();
    assert_eq!(h.sched.block_manager().num_free_blocks(), 12);
}

mod beam;
mod images;
mod lora;
mod pooling;
mod prompt_logprobs;

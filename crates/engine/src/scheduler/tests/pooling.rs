//! Pooling requests (embeddings) in the scheduler: whole inputs in one step, never from the
//! prefix cache, mixed with generation under the same budget and blocks.

use super::*;
use crate::executor::PooledOutput;

/// The pooled values of `tokens` pooled alone.
fn pooled_alone(tokens: &[u32]) -> Vec<f32> {
    let mut h = Harness::small(4, 64);
    h.add(Request::pooling(9, tokens.to_vec()));
    h.run();
    h.received[&9].last().unwrap().pooled.clone().unwrap()
}

#[test]
fn a_pooling_request_runs_whole_in_one_step_beside_generation() {
    let mut config = EngineConfig::new(4, 64, 256);
    config.max_num_batched_tokens = 32;
    config.max_num_seqs = 8;
    let mut h = Harness::new(config);
    h.add(req(1, prompt(20, 1), 6));
    h.add(Request::pooling(2, prompt(20, 2)));
    // The generating prompt takes 20 of the 32 tokens; the pooling one does not take the rest
    // as a chunk but waits.
    let first = h.step();
    assert_eq!(first.seqs.iter().map(|s| (s.q_len(), s.pool)).collect::<Vec<_>>(), vec![(20, false)]);
    let second = h.step();
    let pooled: Vec<_> = second.seqs.iter().filter(|s| s.pool).collect();
    assert_eq!(pooled.len(), 1);
    assert_eq!((pooled[0].q_len(), pooled[0].start_pos), (20, 0));
    assert!(pooled[0].sample.is_none());
    let last = h.received[&2].last().unwrap();
    assert_eq!(last.finished, Some(FinishReason::Stop(StopReason::Pooled)));
    assert_eq!(last.pooled.as_deref(), Some(pooled_alone(&prompt(20, 2)).as_slice()));
    assert_eq!(h.received[&2].len(), 1, "one event: the result");
    assert_eq!(h.usage(2), Usage { prompt_tokens: 20, completion_tokens: 0, cached_prompt_tokens: 0 });
    h.run();
    assert_eq!(h.tokens(1, 0), solo(&req(1, prompt(20, 1), 6))[0]);
    assert_eq!(h.sched.block_manager().num_free_blocks(), 64);
    let metrics = h.metrics.iter().find(|m| m.request_id == 2).unwrap();
    assert!(metrics.timestamps.first_token.is_some(), "the result counts as the first output");
}

#[test]
fn pooling_neither_reads_nor_feeds_the_prefix_cache() {
    let mut h = Harness::small(4, 64);
    h.add(req(1, prompt(16, 3), 2));
    h.run();
    let queries = h.sched.block_manager().prefix_cache_queries();
    // Its first 16 tokens are request 1's prompt, whose blocks the cache holds.
    h.add(Request::pooling(2, prompt(24, 3)));
    let batch = h.step();
    assert_eq!(batch.seqs[0].q_len(), 24, "every token computed again");
    assert_eq!(h.sched.block_manager().prefix_cache_queries(), queries);
    assert_eq!(h.usage(2).cached_prompt_tokens, 0);
    // What the pooling step wrote is not offered: the same prompt then hits request 1's
    // blocks only.
    h.add(req(3, prompt(24, 3), 1));
    h.run();
    assert_eq!(h.usage(3).cached_prompt_tokens, 16);
}

#[test]
fn many_pooling_requests_fill_the_budget_and_each_gets_its_own_result() {
    let mut config = EngineConfig::new(4, 64, 256);
    config.max_num_batched_tokens = 24;
    config.max_num_seqs = 8;
    let mut h = Harness::new(config);
    let prompts: Vec<Vec<u32>> = (0..7).map(|i| prompt(5 + i, i as u32)).collect();
    for (i, p) in prompts.iter().enumerate() {
        h.add(Request::pooling(i as u64, p.clone()));
    }
    let steps = h.run();
    assert!(steps >= 3, "7 inputs of 5..11 tokens need several steps of 24 tokens");
    for (i, p) in prompts.iter().enumerate() {
        assert_eq!(
            h.received[&(i as u64)][0].pooled.as_deref(),
            Some(pooled_alone(p).as_slice()),
            "input {i}"
        );
    }
}

#[test]
fn a_missing_or_misplaced_pooled_output_fails_the_step() {
    let mut h = Harness::small(4, 64);
    h.add(Request::pooling(1, prompt(5, 0)));
    let batch = h.sched.schedule();
    let err = h.sched.update(StepOutput::default(), &mut h.events).unwrap_err();
    let id = batch.seqs[0].seq_id;
    assert_eq!(err, UpdateError::PooledMismatch { expected: vec![id], got: vec![] });
    let wrong =
        StepOutput { pooled: vec![PooledOutput { seq_id: id + 1, values: vec![0.0] }], ..Default::default() };
    assert!(h.sched.update(wrong, &mut h.events).is_err());
    h.sched.fail_scheduled("boom", &mut h.events);
    h.drain();
    assert_eq!(h.finish(1, 0), FinishReason::Error("boom".into()));
    assert_eq!(h.sched.block_manager().num_free_blocks(), 64);
}

//! Helpers shared by the engine's integration tests: driving a [`Scheduler`] with the fake
//! executor, and the reference output of a request run alone on a big cache.

#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::Arc;

use pagoda_engine::fake::{FakeDecoder, FakeExecutor};
use pagoda_engine::output::OutputStage;
use pagoda_engine::{
    EngineConfig, FinishReason, KvGroups, ModelExecutor, Request, RequestId, Scheduler, SpecDecodeStats,
    StepEvents, TokenEvent,
};

pub const VOCAB: usize = 32;

/// What one sample produced.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SampleOutput {
    pub tokens: Vec<u32>,
    pub text: String,
    pub finish: Option<FinishReason>,
}

/// Folds a request's events into per-sample outputs; checks the stream's shape on the way.
#[derive(Debug, Clone, Default)]
pub struct Collected {
    pub samples: Vec<SampleOutput>,
    pub done: bool,
}

impl Collected {
    pub fn push(&mut self, ev: TokenEvent) {
        assert!(!self.done, "event after the last one: {ev:?}");
        if self.samples.len() <= ev.index {
            self.samples.resize(ev.index + 1, SampleOutput::default());
        }
        let s = &mut self.samples[ev.index];
        assert!(s.finish.is_none(), "event for finished sample {}: {ev:?}", ev.index);
        s.tokens.extend_from_slice(&ev.token_ids);
        s.text.push_str(&ev.text);
        s.finish = ev.finished.clone();
        if ev.is_last() {
            self.done = true;
            assert!(
                self.samples.iter().all(|s| s.finish.is_some()),
                "last event before every sample finished"
            );
        }
    }
}

/// Steps `sched` until no request is in flight, feeding `arrivals` (step, request) and
/// aborting `aborts` (step, id) on the way; audits the scheduler after every step.
pub fn drive(
    sched: &mut Scheduler,
    exec: &mut FakeExecutor,
    arrivals: Vec<(usize, Request)>,
    aborts: Vec<(usize, RequestId)>,
) -> (HashMap<RequestId, Collected>, usize) {
    drive_counting(sched, exec, arrivals, aborts, &mut SpecDecodeStats::default())
}

/// [`drive`], adding what speculative decoding did to `spec`.
pub fn drive_counting(
    sched: &mut Scheduler,
    exec: &mut FakeExecutor,
    mut arrivals: Vec<(usize, Request)>,
    mut aborts: Vec<(usize, RequestId)>,
    spec: &mut SpecDecodeStats,
) -> (HashMap<RequestId, Collected>, usize) {
    arrivals.sort_by_key(|(s, _)| *s);
    aborts.sort_by_key(|(s, _)| *s);
    let mut out: HashMap<RequestId, Collected> = HashMap::new();
    let mut events = StepEvents::default();
    let mut output = OutputStage::new(Arc::new(FakeDecoder));
    let (mut ai, mut bi) = (0, 0);
    let mut step = 0;
    while ai < arrivals.len() || sched.has_unfinished() {
        while ai < arrivals.len() && arrivals[ai].0 <= step {
            output.add(&arrivals[ai].1);
            sched.add_request(arrivals[ai].1.clone()).expect("valid request");
            ai += 1;
        }
        while bi < aborts.len() && aborts[bi].0 <= step {
            sched.abort_request(aborts[bi].1, FinishReason::Abort, &mut events);
            bi += 1;
        }
        let batch = sched.schedule();
        if !batch.is_empty() {
            let output = exec.execute(&batch).expect("the fake executor accepts every batch");
            // The executor's tables, brought up to date from the changes, are the scheduler's.
            for s in &batch.seqs {
                assert_eq!(exec.tables().get(s.seq_id), sched.block_tables(s.seq_id), "step {step}");
            }
            assert!(exec.tables().len() <= sched.num_running_seqs(), "the executor holds gone sequences");
            sched.update(output, &mut events).expect("output matches the batch");
            spec.add(sched.last_spec_stats());
        }
        for (id, ev) in output.process(sched, &mut events) {
            out.entry(id).or_default().push(ev);
        }
        events.finished.clear();
        sched.audit().unwrap();
        step += 1;
        assert!(step < 200_000, "no progress");
    }
    (out, step)
}

/// Outputs of `request` run alone on a cache big enough never to preempt.
pub fn reference(request: &Request, max_model_len: usize) -> Vec<SampleOutput> {
    reference_with(request, max_model_len, KvGroups::single())
}

/// [`reference`] for a model whose layers form `groups`.
pub fn reference_with(request: &Request, max_model_len: usize, groups: KvGroups) -> Vec<SampleOutput> {
    let blocks = (max_model_len.div_ceil(16) * request.n + 1) * groups.len();
    let mut config = EngineConfig::new(16, blocks, max_model_len);
    config.enable_prefix_caching = false;
    config.max_num_batched_tokens = max_model_len * request.n;
    config.max_num_seqs = request.n;
    config.kv_groups = groups.clone();
    let mut sched = Scheduler::new(config).unwrap();
    let mut exec = FakeExecutor::with_groups(16, sched.block_manager().num_total_blocks(), VOCAB, groups);
    // Without speculation, where a proposer of its own would be refused.
    let request = Request { speculative_method: None, ..request.clone() };
    let (mut out, _) = drive(&mut sched, &mut exec, vec![(0, request.clone())], vec![]);
    let c = out.remove(&request.id).unwrap();
    assert!(c.done);
    c.samples
}

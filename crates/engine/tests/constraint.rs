//! Structured output through the engine thread with a toy grammar: masks hold for every sample
//! (n > 1, preemption), the grammar ends the sample or `max_tokens` does, end-of-sequence only
//! where the grammar accepts, neighbours are untouched, and masks are computed while the model
//! runs.

mod common;

use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{reference, Collected, VOCAB};
use pagoda_engine::fake::{FakeDecoder, FakeExecutor};
use pagoda_engine::{
    ConstraintError, Engine, EngineConfig, EngineHandle, ExecutorError, FinishReason, ModelExecutor,
    NoopObserver, Request, SamplingParams, ScheduledBatch, SeqConstraint, Shutdown, StepOutput,
    StopConditions, StopReason, TokenConstraint, TokenMask,
};

const MAX_MODEL_LEN: usize = 256;
const EOS: u32 = 0;

/// Even tokens only; at least `min_len` of them, then end-of-sequence is allowed too, and after
/// `max_len` the grammar is complete.
#[derive(Clone)]
struct EvenTokens {
    count: usize,
    min_len: usize,
    max_len: usize,
    /// Parallelism probe: before computing a mask, wait for the executor to say it is running.
    forward_started: Option<Arc<Mutex<Receiver<()>>>>,
}

impl EvenTokens {
    fn new(min_len: usize, max_len: usize) -> Self {
        Self { count: 0, min_len, max_len, forward_started: None }
    }
}

fn allowed(token: u32) -> bool {
    token != EOS && token.is_multiple_of(2)
}

impl TokenConstraint for EvenTokens {
    fn compute_mask(&mut self) -> Result<TokenMask, ConstraintError> {
        if let Some(rx) = &self.forward_started {
            rx.lock().unwrap().recv_timeout(Duration::from_secs(5)).map_err(|_| {
                ConstraintError("the mask was computed while the model was not running".into())
            })?;
        }
        let mut mask = TokenMask::new(VOCAB);
        (0..VOCAB as u32).filter(|&t| allowed(t)).for_each(|t| mask.allow(t));
        if self.count >= self.min_len {
            mask.allow(EOS);
        }
        Ok(mask)
    }
    fn accept_token(&mut self, token: u32) -> Result<(), ConstraintError> {
        if !allowed(token) || self.count >= self.max_len {
            return Err(ConstraintError(format!("token {token} is not allowed")));
        }
        self.count += 1;
        Ok(())
    }
    fn is_finished(&self) -> bool {
        self.count >= self.max_len
    }
    fn fork(&self) -> Box<dyn TokenConstraint> {
        Box::new(self.clone())
    }
}

/// The fake model; it tells the probe when each step's forward pass starts.
struct ProbedExecutor {
    inner: FakeExecutor,
    started: Option<Sender<()>>,
}

impl ModelExecutor for ProbedExecutor {
    fn execute(&mut self, batch: &ScheduledBatch) -> Result<StepOutput, ExecutorError> {
        if let Some(tx) = &self.started {
            let _ = tx.send(());
        }
        self.inner.execute(batch)
    }
    fn block_size(&self) -> usize {
        self.inner.block_size()
    }
    fn num_blocks(&self) -> usize {
        self.inner.num_blocks()
    }
    fn num_layers(&self) -> Option<usize> {
        self.inner.num_layers()
    }
    fn has_draft_model(&self) -> bool {
        self.inner.has_draft_model()
    }
}

fn start(config: EngineConfig, started: Option<Sender<()>>) -> (EngineHandle, Shutdown) {
    let exec =
        ProbedExecutor { inner: FakeExecutor::new(config.block_size, config.num_blocks, VOCAB), started };
    let shutdown = Shutdown::new();
    let (handle, _thread) =
        Engine::spawn(config, exec, Arc::new(FakeDecoder), Arc::new(NoopObserver), shutdown.clone()).unwrap();
    (handle, shutdown)
}

fn request(id: u64, max_tokens: usize, temperature: f32) -> Request {
    let prompt = (0..6u32).map(|i| (i * 7 + id as u32) % VOCAB as u32).collect();
    let params = SamplingParams { temperature, seed: Some(id), ..Default::default() };
    let stop = StopConditions { eos_token_ids: vec![EOS], ..Default::default() };
    Request::new(id, prompt, Arc::new(params)).with_max_tokens(max_tokens).with_stop(stop)
}

fn collect(handle: &EngineHandle, r: Request) -> Collected {
    let mut stream = handle.submit(r).unwrap();
    let mut c = Collected::default();
    while let Some(ev) = stream.blocking_recv() {
        c.push(ev);
    }
    assert!(c.done);
    c
}

/// Every output token obeys the grammar; end-of-sequence appears only once `min_len` is reached.
fn assert_valid(c: &Collected, min_len: usize) {
    for s in &c.samples {
        let body = s.tokens.strip_suffix(&[EOS]).unwrap_or(&s.tokens);
        assert!(body.iter().all(|&t| allowed(t)), "{:?}", s.tokens);
        if s.tokens.last() == Some(&EOS) {
            assert!(body.len() >= min_len, "eos before the grammar accepts: {:?}", s.tokens);
        }
    }
}

#[test]
fn every_sample_follows_the_grammar_and_the_grammar_ends_it() {
    // A tiny cache forces preemption (recompute) of constrained samples.
    let mut config = EngineConfig::new(4, 24, 64);
    config.max_num_batched_tokens = 64;
    config.max_num_seqs = 16;
    let (handle, _shutdown) = start(config, None);
    let streams: Vec<_> = (0..6)
        .map(|id| {
            let r =
                request(id, 40, 1.0).with_n(3).with_constraint(SeqConstraint::new(EvenTokens::new(3, 12)));
            let h = handle.clone();
            std::thread::spawn(move || collect(&h, r))
        })
        .collect();
    let mut grammar_ends = 0;
    for t in streams {
        let c = t.join().unwrap();
        assert_eq!(c.samples.len(), 3);
        assert_valid(&c, 3);
        for s in &c.samples {
            match &s.finish {
                Some(FinishReason::Stop(StopReason::GrammarComplete)) => {
                    assert_eq!(s.tokens.len(), 12);
                    grammar_ends += 1;
                }
                Some(FinishReason::Stop(StopReason::Eos(EOS))) => {}
                other => panic!("unexpected finish {other:?} after {:?}", s.tokens),
            }
        }
    }
    assert!(grammar_ends > 0, "no sample ran to the end of the grammar");
    assert!(handle.stats().num_preemptions > 0, "the test meant to preempt");
}

#[test]
fn max_tokens_before_the_grammar_completes_is_length() {
    let (handle, _shutdown) = start(EngineConfig::new(4, 64, MAX_MODEL_LEN), None);
    let r = request(7, 5, 0.0).with_constraint(SeqConstraint::new(EvenTokens::new(50, 60)));
    let c = collect(&handle, r);
    assert_valid(&c, 50);
    assert_eq!(c.samples[0].tokens.len(), 5);
    assert_eq!(c.samples[0].finish, Some(FinishReason::Length));
}

#[test]
fn unconstrained_neighbours_are_untouched() {
    let (handle, _shutdown) = start(EngineConfig::new(4, 128, MAX_MODEL_LEN), None);
    let plain: Vec<Request> = (20..24).map(|id| request(id, 16, 1.0)).collect();
    let threads: Vec<_> = plain
        .iter()
        .cloned()
        .map(|r| {
            let h = handle.clone();
            std::thread::spawn(move || collect(&h, r))
        })
        .chain((30..34).map(|id| {
            let h = handle.clone();
            let r = request(id, 16, 1.0).with_constraint(SeqConstraint::new(EvenTokens::new(2, 10)));
            std::thread::spawn(move || collect(&h, r))
        }))
        .collect();
    let outputs: Vec<Collected> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    for (r, c) in plain.iter().zip(&outputs) {
        assert_eq!(c.samples, reference(r, MAX_MODEL_LEN));
    }
    for c in &outputs[4..] {
        assert_valid(c, 2);
    }
}

#[test]
fn masks_are_computed_while_the_model_runs() {
    let (tx, rx) = channel();
    let (handle, _shutdown) = start(EngineConfig::new(4, 64, MAX_MODEL_LEN), Some(tx));
    let mut grammar = EvenTokens::new(2, 6);
    grammar.forward_started = Some(Arc::new(Mutex::new(rx)));
    // The probe's mask waits for the step's forward pass to start: computed before `execute`
    // (or after it, by the sampler's thread) it times out and the request fails.
    let c = collect(&handle, request(9, 8, 0.0).with_constraint(SeqConstraint::new(grammar)));
    assert_valid(&c, 2);
    assert!(matches!(c.samples[0].finish, Some(FinishReason::Stop(_))), "{:?}", c.samples[0].finish);
}

#[test]
fn a_failing_grammar_fails_its_own_request_only() {
    struct Broken;
    impl TokenConstraint for Broken {
        fn compute_mask(&mut self) -> Result<TokenMask, ConstraintError> {
            Err(ConstraintError("lexer error".into()))
        }
        fn accept_token(&mut self, _: u32) -> Result<(), ConstraintError> {
            Ok(())
        }
        fn is_finished(&self) -> bool {
            false
        }
        fn fork(&self) -> Box<dyn TokenConstraint> {
            Box::new(Broken)
        }
    }
    let (handle, _shutdown) = start(EngineConfig::new(4, 64, MAX_MODEL_LEN), None);
    let healthy = request(40, 8, 1.0);
    let h = handle.clone();
    let healthy_thread = {
        let r = healthy.clone();
        std::thread::spawn(move || collect(&h, r))
    };
    let c = collect(&handle, request(41, 8, 1.0).with_constraint(SeqConstraint::new(Broken)));
    assert!(
        matches!(&c.samples[0].finish, Some(FinishReason::Rejected(m)) if m.contains("lexer error")),
        "{:?}",
        c.samples[0].finish
    );
    assert_eq!(healthy_thread.join().unwrap().samples, reference(&healthy, MAX_MODEL_LEN));
    assert!(handle.is_alive());
}

/// Every request's output, one at a time, on a fresh engine with `speculative`; with its stats.
fn run_all(
    requests: &[Request],
    speculative: Option<pagoda_engine::SpeculativeConfig>,
) -> (Vec<Collected>, pagoda_engine::EngineStatsSnapshot) {
    let mut config = EngineConfig::new(4, 96, MAX_MODEL_LEN);
    config.speculative = speculative;
    let (handle, _shutdown) = start(config, None);
    let outputs = requests.iter().map(|r| collect(&handle, r.clone())).collect();
    (outputs, handle.stats())
}

#[test]
fn proposals_under_a_grammar_are_cut_to_it_and_keep_outputs() {
    // A pull towards token 4 makes runs that prompt lookup predicts; the prompts' odd tokens,
    // which the grammar refuses, get proposed too and must be cut.
    let requests: Vec<Request> = (50..58u64)
        .map(|id| {
            let prompt = (0..12u32).map(|i| [4, 4, 7, 4, 9, 4][(i as usize + id as usize) % 6]).collect();
            let params = SamplingParams {
                temperature: if id % 2 == 0 { 0.0 } else { 1.0 },
                seed: Some(id),
                logit_bias: [(4u32, 5.0f32)].into_iter().collect(),
                ..Default::default()
            };
            let stop = StopConditions { eos_token_ids: vec![EOS], ..Default::default() };
            Request::new(id, prompt, Arc::new(params))
                .with_max_tokens(30)
                .with_stop(stop)
                .with_n(if id == 51 { 2 } else { 1 })
                .with_constraint(SeqConstraint::new(EvenTokens::new(3, 24)))
        })
        .collect();
    let (plain, _) = run_all(&requests, None);
    let mut spec = pagoda_engine::SpeculativeConfig::ngram(4);
    spec.method = pagoda_engine::SpeculativeMethod::Ngram { prompt_lookup_min: 1, prompt_lookup_max: 2 };
    let (with_spec, stats) = run_all(&requests, Some(spec));
    for ((p, s), r) in plain.iter().zip(&with_spec).zip(&requests) {
        assert_valid(s, 3);
        assert_eq!(s.samples, p.samples, "request {}", r.id);
    }
    assert!(stats.spec.num_accepted_tokens > 20, "{:?}", stats.spec);
    assert_eq!(stats.kv_blocks_used, 0);
}

#[test]
fn executor_drafts_under_a_grammar_follow_it_and_keep_outputs() {
    // The fake drafters are the fake model's greedy token, wrong a quarter of the time; under a
    // grammar they draft under each position's mask, walked along their own drafts.
    let requests: Vec<Request> = (60..68u64)
        .map(|id| {
            let stop = StopConditions { eos_token_ids: vec![EOS], ..Default::default() };
            request(id, 30, if id % 2 == 0 { 0.0 } else { 1.0 })
                .with_stop(stop)
                .with_n(if id == 61 { 2 } else { 1 })
                .with_constraint(SeqConstraint::new(EvenTokens::new(3, 24)))
        })
        .collect();
    let (plain, _) = run_all(&requests, None);
    for method in [
        pagoda_engine::SpeculativeMethod::DraftModel,
        pagoda_engine::SpeculativeMethod::DraftLayers { num_layers: 2 },
    ] {
        let spec = pagoda_engine::SpeculativeConfig {
            method,
            num_speculative_tokens: 3,
            disable_by_batch_size: usize::MAX,
        };
        let (with_spec, stats) = run_all(&requests, Some(spec));
        for ((p, s), r) in plain.iter().zip(&with_spec).zip(&requests) {
            assert_valid(s, 3);
            assert_eq!(s.samples, p.samples, "{method:?}, request {}", r.id);
        }
        // Greedy requests keep most drafts; unmasked drafts would be odd half the time.
        let spec = stats.spec;
        assert!(
            spec.num_draft_tokens > 50 && spec.num_accepted_tokens * 3 > spec.num_draft_tokens,
            "{spec:?}"
        );
        assert_eq!(stats.kv_blocks_used, 0);
    }
}

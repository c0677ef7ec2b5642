//! The engine thread end to end with the fake executor: streaming to blocking and async callers,
//! aborts and dropped streams, admission limits, executor failures, shutdown and metrics.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{channel, sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::{reference, Collected, VOCAB};
use pagoda_engine::fake::{FakeDecoder, FakeExecutor};
use pagoda_engine::{
    Engine, EngineConfig, EngineError, EngineHandle, EngineObserver, ExecutorError, FinishReason, FlushError,
    ModelExecutor, Request, RequestError, RequestMetrics, RequestStream, SamplingParams, ScheduledBatch,
    Shutdown, StepOutput, StepStats,
};

const MAX_MODEL_LEN: usize = 256;

#[derive(Default)]
struct Recorder {
    steps: Mutex<Vec<StepStats>>,
    finished: Mutex<Vec<RequestMetrics>>,
}

impl EngineObserver for Recorder {
    fn on_step(&self, stats: &StepStats) {
        self.steps.lock().unwrap().push(*stats);
    }
    fn on_request_finished(&self, metrics: &RequestMetrics) {
        self.finished.lock().unwrap().push(metrics.clone());
    }
}

/// What the test can make the executor do.
#[derive(Default)]
struct Faults {
    fail_next: AtomicUsize,
    fatal_next: AtomicBool,
    /// A prompt starting with this token is rejected as a sequence the model cannot run.
    reject_prompt_token: Option<u32>,
    /// Reject it after running the whole step (as a sampling error would), not before.
    reject_after_running: bool,
}

/// The fake executor, plus injected failures and an optional gate that holds each step until
/// the test lets it go.
struct TestExecutor {
    inner: FakeExecutor,
    faults: Arc<Faults>,
    gate: Option<(std::sync::mpsc::Sender<()>, Receiver<()>)>,
}

impl ModelExecutor for TestExecutor {
    fn execute(&mut self, batch: &ScheduledBatch) -> Result<StepOutput, ExecutorError> {
        if let Some((entered, go)) = &self.gate {
            let _ = entered.send(());
            let _ = go.recv();
        }
        if self.faults.fatal_next.swap(false, Ordering::SeqCst) {
            return Err(ExecutorError::Fatal("device lost".into()));
        }
        if let Some(poison) = self.faults.reject_prompt_token {
            let bad = batch.seqs.iter().find(|s| s.start_pos == 0 && s.token_ids.first() == Some(&poison));
            if let Some(seq) = bad {
                if self.faults.reject_after_running {
                    self.inner.execute(batch)?;
                }
                let message = "the prompt is beyond what the model accepts".to_string();
                return Err(ExecutorError::InvalidSequence { seq_id: seq.seq_id, message });
            }
        }
        let fail = self.faults.fail_next.load(Ordering::SeqCst);
        if fail > 0 {
            self.faults.fail_next.store(fail - 1, Ordering::SeqCst);
            return Err(ExecutorError::Execution("kernel failed".into()));
        }
        self.inner.execute(batch)
    }
    fn block_size(&self) -> usize {
        self.inner.block_size()
    }
    fn num_blocks(&self) -> usize {
        self.inner.num_blocks()
    }
}

struct TestEngine {
    handle: EngineHandle,
    thread: Option<JoinHandle<()>>,
    recorder: Arc<Recorder>,
    faults: Arc<Faults>,
    shutdown: Shutdown,
    /// With a gate: receives one message per step entered; send to let a step run.
    entered: Option<Receiver<()>>,
    go: Option<SyncSender<()>>,
}

fn config() -> EngineConfig {
    EngineConfig::new(4, 256, MAX_MODEL_LEN)
}

fn start(config: EngineConfig, gated: bool) -> TestEngine {
    start_with(config, gated, Faults::default())
}

fn start_with(config: EngineConfig, gated: bool, faults: Faults) -> TestEngine {
    let faults = Arc::new(faults);
    let (gate, entered, go) = if gated {
        let (entered_tx, entered_rx) = channel();
        // Rendezvous: each send lets exactly one step run.
        let (go_tx, go_rx) = sync_channel(0);
        (Some((entered_tx, go_rx)), Some(entered_rx), Some(go_tx))
    } else {
        (None, None, None)
    };
    let exec = TestExecutor {
        inner: FakeExecutor::new(config.block_size, config.num_blocks, VOCAB),
        faults: Arc::clone(&faults),
        gate,
    };
    let recorder = Arc::new(Recorder::default());
    let shutdown = Shutdown::new();
    let observer: Arc<dyn EngineObserver> = recorder.clone();
    let (handle, thread) =
        Engine::spawn(config, exec, Arc::new(FakeDecoder), observer, shutdown.clone()).unwrap();
    TestEngine { handle, thread: Some(thread), recorder, faults, shutdown, entered, go }
}

impl TestEngine {
    /// Waits until the next step is about to run (gated engines).
    fn wait_step(&self) {
        self.entered.as_ref().unwrap().recv().unwrap();
    }

    /// Lets the step that is waiting run.
    fn step(&self) {
        self.go.as_ref().unwrap().send(()).unwrap();
    }

    /// Lets every step from now on run.
    fn release_all(&self) {
        let go = self.go.as_ref().unwrap().clone();
        std::thread::spawn(move || while go.send(()).is_ok() {});
    }
}

impl Drop for TestEngine {
    fn drop(&mut self) {
        self.shutdown.trigger();
        self.go.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn request(id: u64, prompt_len: usize, max_tokens: usize) -> Request {
    let prompt = (0..prompt_len as u32).map(|i| (i * 5 + id as u32) % VOCAB as u32).collect();
    let params = SamplingParams { temperature: 1.0, seed: Some(id), ..Default::default() };
    Request::new(id, prompt, Arc::new(params)).with_max_tokens(max_tokens)
}

fn collect(stream: &mut RequestStream) -> Collected {
    let mut c = Collected::default();
    while let Some(ev) = stream.blocking_recv() {
        c.push(ev);
    }
    assert!(c.done, "stream ended without a last event");
    c
}

fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < Duration::from_secs(10), "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn blocking_caller_gets_tokens_usage_and_metrics() {
    let e = start(config(), false);
    let r = request(1, 10, 8);
    let mut stream = e.handle.submit(r.clone()).unwrap();
    let got = collect(&mut stream);
    assert_eq!(got.samples, reference(&r, MAX_MODEL_LEN));
    wait_until("metrics", || e.recorder.finished.lock().unwrap().len() == 1);
    let m = e.recorder.finished.lock().unwrap()[0].clone();
    assert_eq!((m.usage.prompt_tokens, m.usage.completion_tokens), (10, 8));
    assert!(m.timestamps.ttft().is_some() && m.timestamps.e2e() >= m.timestamps.ttft());
    let steps = e.recorder.steps.lock().unwrap().clone();
    assert_eq!(steps.iter().map(|s| s.num_prefill_tokens).sum::<usize>(), 10);
    assert_eq!(steps.iter().map(|s| s.num_decode_tokens).sum::<usize>(), 7);
    wait_until("stats", || e.handle.stats().num_finished_requests == 1);
    let stats = e.handle.stats();
    assert_eq!((stats.num_requests, stats.kv_blocks_used, stats.kv_blocks_total), (0, 0, 256));
}

#[test]
fn async_caller_gets_the_same_stream() {
    let e = start(config(), false);
    let r = request(2, 7, 6).with_n(2);
    let want = reference(&r, MAX_MODEL_LEN);
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let got = rt.block_on(async {
        let mut stream = e.handle.submit(r).unwrap();
        let mut c = Collected::default();
        while let Some(ev) = stream.recv().await {
            c.push(ev);
        }
        c
    });
    assert!(got.done);
    assert_eq!(got.samples, want);
}

#[test]
fn dropped_stream_aborts_the_request_and_frees_its_blocks() {
    let e = start(config(), true);
    let mut stream = e.handle.submit(request(3, 20, 200)).unwrap();
    e.wait_step();
    e.step();
    assert!(stream.blocking_recv().is_some());
    e.wait_step();
    drop(stream);
    e.release_all();
    wait_until("the abort", || e.recorder.finished.lock().unwrap().len() == 1);
    assert_eq!(e.recorder.finished.lock().unwrap()[0].finish_reasons, vec![FinishReason::Abort]);
    wait_until("free blocks", || {
        let s = e.handle.stats();
        s.num_requests == 0 && s.kv_blocks_used == 0
    });
    assert_eq!(e.recorder.steps.lock().unwrap().len(), 2);
}

#[test]
fn stream_dropped_before_its_first_event_is_reaped_without_a_send() {
    let e = start(config(), true);
    let stream = e.handle.submit(request(4, 20, 200)).unwrap();
    e.wait_step(); // the request's first step is running
    drop(stream);
    e.release_all();
    // The next loop iteration finds the closed receiver before scheduling the request again.
    wait_until("the abort", || e.recorder.finished.lock().unwrap().len() == 1);
    assert_eq!(e.recorder.steps.lock().unwrap().len(), 1);
    wait_until("free blocks", || e.handle.stats().kv_blocks_used == 0);
}

#[test]
fn explicit_abort_ends_the_stream_with_abort() {
    let e = start(config(), true);
    let mut stream = e.handle.submit(request(5, 8, 200).with_n(2)).unwrap();
    e.wait_step();
    e.step();
    e.wait_step();
    e.handle.abort(5);
    e.release_all();
    let mut c = Collected::default();
    while let Some(ev) = stream.blocking_recv() {
        c.push(ev);
    }
    assert!(c.done);
    assert!(c.samples.iter().all(|s| s.finish == Some(FinishReason::Abort)));
}

#[test]
fn full_waiting_queue_rejects_with_overloaded() {
    let mut cfg = config();
    cfg.max_waiting_requests = 2;
    let e = start(cfg, true);
    let mut first = e.handle.submit(request(10, 4, 2)).unwrap();
    e.wait_step(); // request 10 is running: it no longer counts as waiting
    let mut a = e.handle.submit(request(11, 4, 2)).unwrap();
    let mut b = e.handle.submit(request(12, 4, 2)).unwrap();
    assert_eq!(e.handle.submit(request(13, 4, 2)).unwrap_err(), EngineError::Overloaded { max_waiting: 2 });
    assert_eq!(e.handle.num_pending(), 2);
    e.release_all();
    for s in [&mut first, &mut a, &mut b] {
        collect(s);
    }
    assert_eq!(e.handle.num_pending(), 0);
    assert!(e.handle.submit(request(14, 4, 2)).is_ok());
}

#[test]
fn the_waiting_queue_counts_samples_and_takes_a_call_whole_or_not_at_all() {
    let mut cfg = config();
    cfg.max_waiting_requests = 6;
    let e = start(cfg, true);
    let mut first = e.handle.submit(request(70, 4, 2)).unwrap();
    e.wait_step();
    // Seven samples can never wait at once: 400, not a 429 to retry forever.
    let too_many = vec![request(71, 4, 2).with_n(4), request(72, 4, 2).with_n(3)];
    assert_eq!(
        e.handle.submit_all(too_many).unwrap_err(),
        EngineError::NeverFits { requested: 7, max_waiting: 6 }
    );
    let mut call =
        e.handle.submit_all(vec![request(73, 4, 2).with_n(2), request(74, 4, 2).with_n(2)]).unwrap();
    assert_eq!(e.handle.num_pending(), 4);
    // Three more samples do not fit next to the four waiting: none of the call is admitted.
    let rest = vec![request(75, 4, 2), request(76, 4, 2).with_n(2)];
    assert_eq!(e.handle.submit_all(rest).unwrap_err(), EngineError::Overloaded { max_waiting: 6 });
    assert_eq!(e.handle.num_pending(), 4);
    e.release_all();
    collect(&mut first);
    for s in &mut call {
        assert_eq!(collect(s).samples.len(), 2);
    }
    assert_eq!(e.handle.num_pending(), 0);
}

#[test]
fn a_reader_that_falls_behind_gets_everything_in_few_events() {
    let e = start(config(), false);
    let r = request(80, 6, 200);
    let mut stream = e.handle.submit(r.clone()).unwrap();
    // Not read at all until the request has finished in the engine.
    wait_until("the request to finish", || {
        e.recorder.finished.lock().unwrap().iter().any(|m| m.request_id == 80)
    });
    let mut events = 0;
    let mut c = Collected::default();
    while let Some(ev) = stream.blocking_recv() {
        events += 1;
        c.push(ev);
    }
    assert!(c.done);
    assert_eq!(c.samples, reference(&r, MAX_MODEL_LEN));
    // 200 token events did not pile up one by one: what the channel could not hold was merged.
    assert!(events <= 64 + 2, "{events} events");
}

#[test]
fn executor_error_fails_the_batch_and_the_engine_carries_on() {
    let e = start(config(), false);
    e.faults.fail_next.store(1, Ordering::SeqCst);
    let mut failed = e.handle.submit(request(20, 6, 4)).unwrap();
    let got = collect(&mut failed);
    assert!(matches!(&got.samples[0].finish, Some(FinishReason::Error(m)) if m.contains("kernel failed")));
    assert!(e.handle.is_alive());
    let r = request(21, 6, 4);
    let mut ok = e.handle.submit(r.clone()).unwrap();
    assert_eq!(collect(&mut ok).samples, reference(&r, MAX_MODEL_LEN));
    wait_until("free blocks", || e.handle.stats().kv_blocks_used == 0);
}

#[test]
fn a_rejected_sequence_fails_its_request_only_and_never_kills_the_engine() {
    rejected_sequences_fail_alone(false);
}

#[test]
fn a_sequence_rejected_after_its_step_ran_leaves_the_rest_exact() {
    // The retries run the rest of the step again after the executor already applied it: the
    // block-table changes (the healthy request's new block) must apply once.
    rejected_sequences_fail_alone(true);
}

fn rejected_sequences_fail_alone(reject_after_running: bool) {
    const POISON: u32 = VOCAB as u32 - 1;
    let faults = Faults { reject_prompt_token: Some(POISON), reject_after_running, ..Default::default() };
    let e = start_with(config(), true, faults);
    // Held inside its first step, the healthy request shares the next step with every
    // rejected one: each rejection retries the rest of that step, in which the healthy
    // request's ninth token starts a block.
    let healthy = request(50, 8, 120);
    let mut healthy_stream = e.handle.submit(healthy.clone()).unwrap();
    e.wait_step();
    let mut poisoned: Vec<RequestStream> = (0..10)
        .map(|id| {
            let r = Request::new(60 + id, vec![POISON; 5], Arc::new(SamplingParams::default()));
            e.handle.submit(r.with_max_tokens(4)).unwrap()
        })
        .collect();
    e.release_all();
    for stream in &mut poisoned {
        let got = collect(stream);
        assert!(
            matches!(&got.samples[0].finish, Some(FinishReason::Rejected(m)) if m.contains("beyond")),
            "{:?}",
            got.samples[0].finish
        );
    }
    assert!(e.handle.is_alive());
    assert_eq!(collect(&mut healthy_stream).samples, reference(&healthy, MAX_MODEL_LEN));
    let after = request(51, 6, 4);
    assert_eq!(
        collect(&mut e.handle.submit(after.clone()).unwrap()).samples,
        reference(&after, MAX_MODEL_LEN)
    );
    wait_until("free blocks", || e.handle.stats().kv_blocks_used == 0);
}

#[test]
fn repeated_executor_errors_stop_the_engine() {
    let e = start(config(), false);
    e.faults.fail_next.store(usize::MAX, Ordering::SeqCst);
    for id in 0..3 {
        let mut s = e.handle.submit(request(30 + id, 6, 4)).unwrap();
        let got = collect(&mut s);
        assert!(matches!(got.samples[0].finish, Some(FinishReason::Error(_))));
    }
    wait_until("death", || !e.handle.is_alive());
    assert!(matches!(e.handle.submit(request(40, 6, 4)), Err(EngineError::Dead(_))));
    assert!(matches!(e.handle.health(), Err(EngineError::Dead(m)) if m.contains("3 steps failed")));
}

#[test]
fn fatal_executor_error_fails_everything_and_stops() {
    let mut e = start(config(), true);
    let mut running = e.handle.submit(request(50, 6, 50)).unwrap();
    e.wait_step();
    e.step();
    e.wait_step(); // second step
    let mut waiting = e.handle.submit(request(51, 6, 50)).unwrap();
    e.faults.fatal_next.store(true, Ordering::SeqCst);
    e.release_all();
    for s in [&mut running, &mut waiting] {
        let got = collect(s);
        assert!(matches!(&got.samples[0].finish, Some(FinishReason::Error(m)) if m.contains("device lost")));
    }
    e.thread.take().unwrap().join().unwrap();
    assert!(!e.handle.is_alive());
    assert!(matches!(e.handle.submit(request(52, 6, 4)), Err(EngineError::Dead(_))));
}

#[test]
fn shutdown_aborts_in_flight_requests_and_stops_the_thread() {
    let mut e = start(config(), true);
    let mut stream = e.handle.submit(request(60, 6, 200)).unwrap();
    e.wait_step();
    e.step();
    assert!(stream.blocking_recv().is_some());
    e.wait_step();
    e.shutdown.trigger();
    e.release_all();
    let mut c = Collected::default();
    while let Some(ev) = stream.blocking_recv() {
        c.push(ev);
    }
    assert!(c.done);
    assert_eq!(c.samples[0].finish, Some(FinishReason::Abort));
    e.thread.take().unwrap().join().unwrap();
    assert!(!e.handle.is_alive());
    assert_eq!(e.handle.submit(request(61, 6, 4)).unwrap_err(), EngineError::ShuttingDown);
}

#[test]
fn idle_engine_sleeps_until_a_command_arrives() {
    let e = start(config(), false);
    let mut s = e.handle.submit(request(70, 6, 3)).unwrap();
    collect(&mut s);
    wait_until("publish", || e.handle.stats().num_steps == 3);
    std::thread::sleep(Duration::from_millis(50));
    // Nothing ran while idle, and the engine still answers.
    assert_eq!(e.handle.stats().num_steps, 3);
    let mut s = e.handle.submit(request(71, 6, 2)).unwrap();
    collect(&mut s);
}

#[test]
fn dropping_handles_without_shutdown_ends_the_thread() {
    let faults = Arc::new(Faults::default());
    let exec = TestExecutor { inner: FakeExecutor::new(4, 256, VOCAB), faults, gate: None };
    let shutdown = Shutdown::new();
    let (handle, thread) = Engine::spawn(
        config(),
        exec,
        Arc::new(FakeDecoder),
        Arc::new(pagoda_engine::NoopObserver),
        shutdown.clone(),
    )
    .unwrap();
    let mut s = handle.submit(request(71, 6, 3)).unwrap();
    drop(handle);
    // The request in flight still completes, then the idle thread exits.
    collect(&mut s);
    thread.join().unwrap();
    assert!(!shutdown.is_triggered());
}

#[test]
fn duplicate_and_invalid_requests_are_refused() {
    let e = start(config(), true);
    let _first = e.handle.submit(request(80, 6, 10)).unwrap();
    e.wait_step();
    let mut dup = e.handle.submit(request(80, 6, 10)).unwrap();
    e.release_all();
    let got = collect(&mut dup);
    assert!(
        matches!(&got.samples[0].finish, Some(FinishReason::Error(m)) if m.contains("already in flight"))
    );
    let err = e.handle.submit(request(81, MAX_MODEL_LEN, 1)).unwrap_err();
    assert!(matches!(err, EngineError::InvalidRequest(RequestError::PromptTooLong { .. })), "{err}");
    let err = e.handle.submit(request(82, 6, 1).with_n(0)).unwrap_err();
    assert_eq!(err, EngineError::InvalidRequest(RequestError::ZeroSamples));
}

#[test]
fn spawn_checks_the_config_against_the_executor() {
    let exec = FakeExecutor::new(8, 64, VOCAB);
    let err = Engine::spawn(
        config(),
        exec,
        Arc::new(FakeDecoder),
        Arc::new(pagoda_engine::NoopObserver),
        Shutdown::new(),
    )
    .err()
    .unwrap();
    assert!(matches!(err, EngineError::Config(_)), "{err}");
}

#[test]
fn concurrent_submitters_get_their_solo_outputs() {
    let mut cfg = config();
    cfg.num_blocks = 80; // tight enough to preempt
    cfg.max_num_batched_tokens = 32;
    cfg.max_num_seqs = 8;
    let e = start(cfg, false);
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let handle = e.handle.clone();
            std::thread::spawn(move || {
                for i in 0..6u64 {
                    let id = 100 + t * 10 + i;
                    let r = request(id, 8 + (id as usize % 30), 20 + (id as usize % 40))
                        .with_n(1 + (id as usize % 2));
                    let mut s = handle.submit(r.clone()).unwrap();
                    assert_eq!(collect(&mut s).samples, reference(&r, MAX_MODEL_LEN), "request {id}");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    wait_until("idle", || {
        let s = e.handle.stats();
        s.num_requests == 0 && s.kv_blocks_used == 0 && s.num_finished_requests == 24
    });
}

#[test]
fn handles_and_streams_cross_threads() {
    fn assert_send_sync<T: Send + Sync + Clone>() {}
    fn assert_send<T: Send>() {}
    assert_send_sync::<EngineHandle>();
    assert_send_sync::<Shutdown>();
    assert_send::<RequestStream>();
}

#[test]
fn flushing_the_prefix_cache_waits_for_an_idle_engine_and_forgets_prompts() {
    let e = start(config(), true);
    let flush = |handle: &EngineHandle| {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(handle.flush_prefix_cache())
    };
    let long = request(30, 40, 200);
    let mut stream = e.handle.submit(long.clone()).unwrap();
    e.wait_step();
    // In flight: its blocks are its KV, so nothing is flushed. (The engine takes the command
    // between steps, so the steps must run for it to answer.)
    let handle = e.handle.clone();
    let busy = std::thread::spawn(move || flush(&handle));
    e.release_all();
    let busy = busy.join().unwrap().unwrap_err();
    assert!(matches!(busy, FlushError::Busy(b) if b.running + b.waiting == 1), "{busy:?}");
    e.handle.abort(30);
    collect(&mut stream);
    wait_until("idle", || e.handle.stats().num_requests == 0);
    // The 40-token prompt filled at least 10 blocks of 4.
    assert!(flush(&e.handle).unwrap() >= 10);
    assert_eq!(flush(&e.handle).unwrap(), 0);
    // The same prompt again finds nothing cached; once more, it finds its blocks.
    let mut hits = vec![e.handle.stats().prefix_cache_hits];
    for id in [31, 32] {
        let mut again = e.handle.submit(Request { id, ..long.clone() }.with_max_tokens(1)).unwrap();
        collect(&mut again);
        wait_until("idle", || e.handle.stats().num_requests == 0);
        hits.push(e.handle.stats().prefix_cache_hits);
    }
    assert!(hits[1] == hits[0] && hits[2] > hits[1], "{hits:?}");
}

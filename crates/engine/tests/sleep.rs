//! Sleep mode in the engine ([`pagoda_engine::sleep`]) with the fake executor: new requests
//! are refused while asleep, those in flight finish within the drain and fail past it, the
//! executor's memory is dropped and taken back, and an executor that cannot sleep keeps serving.

mod common;

use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;
use std::time::Duration;

use common::{reference, Collected, VOCAB};
use pagoda_engine::fake::{FakeDecoder, FakeExecutor};
use pagoda_engine::{
    Engine, EngineConfig, EngineError, EngineHandle, ExecutorError, FinishReason, ModelExecutor,
    NoopObserver, Request, RequestStream, SamplingParams, ScheduledBatch, Shutdown, SleepError, SleepLevel,
    StepOutput,
};

const MAX_MODEL_LEN: usize = 64;

/// The fake executor, each step waiting for a permit when gated; `sleeps` says whether it
/// forwards sleep mode (else it refuses, as the trait's default does).
struct Exec {
    inner: FakeExecutor,
    permits: Option<Receiver<()>>,
    sleeps: bool,
}

impl ModelExecutor for Exec {
    fn execute(&mut self, batch: &ScheduledBatch) -> Result<StepOutput, ExecutorError> {
        if let Some(permits) = &self.permits {
            permits.recv().map_err(|_| ExecutorError::Fatal("the test ended".into()))?;
        }
        self.inner.execute(batch)
    }

    fn block_size(&self) -> usize {
        self.inner.block_size()
    }

    fn num_blocks(&self) -> usize {
        self.inner.num_blocks()
    }

    fn sleep(&mut self, level: SleepLevel) -> Result<(), SleepError> {
        if self.sleeps {
            self.inner.sleep(level)
        } else {
            Err(SleepError::Unsupported("this executor cannot sleep".into()))
        }
    }

    fn wake_up(&mut self) -> Result<(), SleepError> {
        self.inner.wake_up()
    }
}

struct TestEngine {
    handle: EngineHandle,
    shutdown: Shutdown,
    permits: Option<SyncSender<()>>,
    rt: tokio::runtime::Runtime,
}

impl Drop for TestEngine {
    fn drop(&mut self) {
        self.shutdown.trigger();
        self.permits.take();
    }
}

fn start(gated: bool, sleeps: bool) -> TestEngine {
    let config = EngineConfig::new(4, 64, MAX_MODEL_LEN);
    let (tx, rx) = if gated {
        let (tx, rx) = sync_channel(1024);
        (Some(tx), Some(rx))
    } else {
        (None, None)
    };
    let exec =
        Exec { inner: FakeExecutor::new(config.block_size, config.num_blocks, VOCAB), permits: rx, sleeps };
    let shutdown = Shutdown::new();
    let (handle, _thread) =
        Engine::spawn(config, exec, Arc::new(FakeDecoder), Arc::new(NoopObserver), shutdown.clone()).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
    TestEngine { handle, shutdown, permits: tx, rt }
}

impl TestEngine {
    fn sleep(&self, level: SleepLevel, drain: Duration) -> Result<(), SleepError> {
        self.rt.block_on(self.handle.sleep(level, drain))
    }

    fn wake_up(&self) -> Result<(), SleepError> {
        self.rt.block_on(self.handle.wake_up())
    }

    /// Lets `n` more steps run (gated engines).
    fn steps(&self, n: usize) {
        for _ in 0..n {
            self.permits.as_ref().unwrap().send(()).unwrap();
        }
    }
}

fn request(id: u64, max_tokens: usize) -> Request {
    let prompt = (0..9u32).map(|i| (i * 5 + 3) % VOCAB as u32).collect();
    let params = SamplingParams { temperature: 1.0, seed: Some(7), ..Default::default() };
    Request::new(id, prompt, Arc::new(params)).with_max_tokens(max_tokens)
}

/// The first sample's finish reason.
fn finish(c: &Collected) -> Option<FinishReason> {
    c.samples.first().and_then(|s| s.finish.clone())
}

fn collect(stream: &mut RequestStream) -> Collected {
    let mut c = Collected::default();
    while let Some(ev) = stream.blocking_recv() {
        c.push(ev);
    }
    c
}

#[test]
fn asleep_the_engine_refuses_requests_and_awake_again_answers_alike() {
    let e = start(false, true);
    let want = reference(&request(1, 6), MAX_MODEL_LEN);
    assert_eq!(collect(&mut e.handle.submit(request(1, 6)).unwrap()).samples, want);
    for level in [SleepLevel::Cache, SleepLevel::Weights] {
        e.sleep(level, Duration::from_secs(5)).unwrap();
        assert_eq!(e.handle.sleep_level(), Some(level));
        assert!(matches!(e.handle.submit(request(2, 6)), Err(EngineError::Asleep)));
        // Asleep already: nothing changes, not even the level.
        e.sleep(SleepLevel::Cache, Duration::ZERO).unwrap();
        assert_eq!(e.handle.sleep_level(), Some(level));
        e.wake_up().unwrap();
        assert_eq!(e.handle.sleep_level(), None);
        // The fake's KV came back empty and the prefix cache with it: the prompt is computed
        // again and answers as before.
        assert_eq!(collect(&mut e.handle.submit(request(3, 6)).unwrap()).samples, want);
    }
    // Awake already: nothing to do.
    e.wake_up().unwrap();
}

#[test]
fn a_request_in_flight_finishes_before_the_engine_sleeps() {
    let e = start(true, true);
    let mut running = e.handle.submit(request(1, 8)).unwrap();
    e.steps(1);
    let asleep = std::thread::scope(|scope| {
        let sleeping = scope.spawn(|| e.sleep(SleepLevel::Cache, Duration::from_secs(30)));
        std::thread::sleep(Duration::from_millis(50));
        assert!(!sleeping.is_finished(), "the sleep waits for the request");
        // Refused from the sleep's call on, while it drains.
        let mut late = e.handle.submit(request(2, 4)).unwrap();
        e.steps(64);
        let late = collect(&mut late);
        assert!(matches!(finish(&late), Some(FinishReason::Error(m)) if m.contains("asleep")), "{late:?}");
        let got = collect(&mut running);
        assert_eq!(got.samples, reference(&request(1, 8), MAX_MODEL_LEN));
        sleeping.join().unwrap()
    });
    asleep.unwrap();
    assert_eq!(e.handle.sleep_level(), Some(SleepLevel::Cache));
}

#[test]
fn past_the_drain_what_still_runs_fails_cleanly() {
    let e = start(true, true);
    let mut running = e.handle.submit(request(1, 30)).unwrap();
    std::thread::scope(|scope| {
        let sleeping = scope.spawn(|| e.sleep(SleepLevel::Weights, Duration::ZERO));
        std::thread::sleep(Duration::from_millis(50));
        e.steps(2);
        sleeping.join().unwrap().unwrap();
    });
    let got = collect(&mut running);
    assert!(got.done, "the stream ended");
    assert!(
        matches!(finish(&got), Some(FinishReason::Error(m)) if m.contains("sleep")),
        "the request failed for the sleep: {got:?}"
    );
    assert_eq!(e.handle.stats().num_running_seqs, 0);
    e.wake_up().unwrap();
    e.steps(64);
    assert_eq!(
        collect(&mut e.handle.submit(request(2, 6)).unwrap()).samples,
        reference(&request(2, 6), MAX_MODEL_LEN)
    );
}

#[test]
fn an_executor_that_cannot_sleep_keeps_serving() {
    let e = start(false, false);
    let err = e.sleep(SleepLevel::Cache, Duration::from_secs(1)).unwrap_err();
    assert!(matches!(err, SleepError::Unsupported(_)), "{err:?}");
    assert_eq!(e.handle.sleep_level(), None);
    let want = reference(&request(1, 5), MAX_MODEL_LEN);
    assert_eq!(collect(&mut e.handle.submit(request(1, 5)).unwrap()).samples, want);
}

//! Scheduler overhead per engine step: `schedule()` + `update()` (together and each alone) with
//! 256 running decode sequences, driven by the fake executor (whose own time is not counted:
//! it leaves the caches cold, as a model's pass does), and the output
//! stage's time for the same step's events (detokenizing and stop strings, which run on the
//! callers' side of the streams, not on the engine thread).

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use pagoda_engine::fake::{FakeDecoder, FakeExecutor};
use pagoda_engine::output::OutputStage;
use pagoda_engine::{EngineConfig, ModelExecutor, Request, SamplingParams, Scheduler, StepEvents};

const SEQS: usize = 256;
const PROMPT: usize = 64;
/// Decode steps measured on one scheduler before it is rebuilt (bounds sequence length).
const STEPS_PER_STATE: u64 = 512;
const VOCAB: usize = 64;

/// A scheduler with `SEQS` sequences that have all finished their prompts and are decoding.
fn decoding_state(stop_strings: bool) -> (Scheduler, FakeExecutor, StepEvents, OutputStage) {
    let block_size = 16;
    let max_model_len = 2048;
    let mut config = EngineConfig::new(block_size, SEQS * max_model_len / block_size, max_model_len);
    config.max_num_seqs = SEQS;
    config.max_num_batched_tokens = 4096;
    let mut sched = Scheduler::new(config).expect("valid config");
    let mut exec = FakeExecutor::new(block_size, sched.block_manager().num_total_blocks(), VOCAB);
    let mut output = OutputStage::new(Arc::new(FakeDecoder));
    let params = Arc::new(SamplingParams { temperature: 1.0, seed: Some(1), ..Default::default() });
    for id in 0..SEQS as u64 {
        let prompt = (0..PROMPT as u32).map(|t| (t * 13 + id as u32) % VOCAB as u32).collect();
        let mut r = Request::new(id, prompt, params.clone()).with_max_tokens(max_model_len - PROMPT);
        if stop_strings {
            r.stop.stop_strings = vec!["zzzzzz".into(), "never".into()].into();
        }
        output.add(&r);
        sched.add_request(r).expect("valid request");
    }
    let mut events = StepEvents::default();
    while sched.num_running_seqs() < SEQS || sched.last_schedule_stats().num_prefill_tokens > 0 {
        step(&mut sched, &mut exec, &mut events, &mut output);
    }
    (sched, exec, events, output)
}

/// What one step cost outside the executor.
struct StepTimes {
    schedule: Duration,
    update: Duration,
    /// `schedule()` and `update()`: the engine thread's share.
    scheduler: Duration,
    /// The output stage over the step's events: the callers' share.
    output: Duration,
}

/// One step; returns the time spent in the scheduler and in the output stage.
fn step(
    sched: &mut Scheduler,
    exec: &mut FakeExecutor,
    events: &mut StepEvents,
    out: &mut OutputStage,
) -> StepTimes {
    let t0 = Instant::now();
    let batch = sched.schedule();
    let scheduled = t0.elapsed();
    let output = exec.execute(&batch).expect("fake executor");
    let t1 = Instant::now();
    sched.update(output, events).expect("matching output");
    let updated = t1.elapsed();
    let t2 = Instant::now();
    std::hint::black_box(out.process(sched, events));
    let output = t2.elapsed();
    events.clear();
    StepTimes { schedule: scheduled, update: updated, scheduler: scheduled + updated, output }
}

fn bench_decode_steps(c: &mut Criterion, name: &str, stop_strings: bool, part: fn(&StepTimes) -> Duration) {
    c.bench_function(name, |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            let mut done = 0;
            while done < iters {
                let (mut sched, mut exec, mut events, mut output) = decoding_state(stop_strings);
                for _ in 0..STEPS_PER_STATE.min(iters - done) {
                    total += part(&step(&mut sched, &mut exec, &mut events, &mut output));
                    done += 1;
                }
                assert_eq!(sched.num_running_seqs(), SEQS);
            }
            total
        })
    });
}

fn scheduler(c: &mut Criterion) {
    let scheduler = |t: &StepTimes| t.scheduler;
    let output = |t: &StepTimes| t.output;
    bench_decode_steps(c, "schedule+update/256 decodes", false, scheduler);
    bench_decode_steps(c, "schedule/256 decodes", false, |t| t.schedule);
    bench_decode_steps(c, "update/256 decodes", false, |t| t.update);
    bench_decode_steps(c, "schedule+update/256 decodes, 2 stop strings", true, scheduler);
    bench_decode_steps(c, "output stage/256 decodes", false, output);
    bench_decode_steps(c, "output stage/256 decodes, 2 stop strings", true, output);
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));
    targets = scheduler
}
criterion_main!(benches);

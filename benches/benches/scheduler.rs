//! Scheduler overhead per engine step: `schedule()` + `update()` with 256 running decode
//! sequences, driven by the fake executor (whose own time is not counted).

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use pagoda_engine::fake::{FakeDecoder, FakeExecutor};
use pagoda_engine::{EngineConfig, ModelExecutor, Request, SamplingParams, Scheduler, StepEvents};

const SEQS: usize = 256;
const PROMPT: usize = 64;
/// Decode steps measured on one scheduler before it is rebuilt (bounds sequence length).
const STEPS_PER_STATE: u64 = 512;
const VOCAB: usize = 64;

/// A scheduler with `SEQS` sequences that have all finished their prompts and are decoding.
fn decoding_state(stop_strings: bool) -> (Scheduler, FakeExecutor, StepEvents) {
    let block_size = 16;
    let max_model_len = 2048;
    let mut config = EngineConfig::new(block_size, SEQS * max_model_len / block_size, max_model_len);
    config.max_num_seqs = SEQS;
    config.max_num_batched_tokens = 4096;
    let mut sched = Scheduler::new(config, Arc::new(FakeDecoder)).expect("valid config");
    let mut exec = FakeExecutor::new(block_size, sched.block_manager().num_total_blocks(), VOCAB);
    let params = Arc::new(SamplingParams { temperature: 1.0, seed: Some(1), ..Default::default() });
    for id in 0..SEQS as u64 {
        let prompt = (0..PROMPT as u32).map(|t| (t * 13 + id as u32) % VOCAB as u32).collect();
        let mut r = Request::new(id, prompt, params.clone()).with_max_tokens(max_model_len - PROMPT);
        if stop_strings {
            r.stop.stop_strings = vec!["zzzzzz".into(), "never".into()].into();
        }
        sched.add_request(r).expect("valid request");
    }
    let mut events = StepEvents::default();
    while sched.num_running_seqs() < SEQS || sched.last_schedule_stats().num_prefill_tokens > 0 {
        step(&mut sched, &mut exec, &mut events);
    }
    (sched, exec, events)
}

/// One step; returns the time spent in the scheduler (not in the executor).
fn step(sched: &mut Scheduler, exec: &mut FakeExecutor, events: &mut StepEvents) -> Duration {
    let t0 = Instant::now();
    let batch = sched.schedule();
    let scheduled = t0.elapsed();
    let output = exec.execute(&batch).expect("fake executor");
    let t1 = Instant::now();
    sched.update(output, events).expect("matching output");
    events.clear();
    scheduled + t1.elapsed()
}

fn bench_decode_steps(c: &mut Criterion, name: &str, stop_strings: bool) {
    c.bench_function(name, |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            let mut done = 0;
            while done < iters {
                let (mut sched, mut exec, mut events) = decoding_state(stop_strings);
                for _ in 0..STEPS_PER_STATE.min(iters - done) {
                    total += step(&mut sched, &mut exec, &mut events);
                    done += 1;
                }
                assert_eq!(sched.num_running_seqs(), SEQS);
            }
            total
        })
    });
}

fn scheduler(c: &mut Criterion) {
    bench_decode_steps(c, "schedule+update/256 decodes", false);
    bench_decode_steps(c, "schedule+update/256 decodes, 2 stop strings", true);
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));
    targets = scheduler
}
criterion_main!(benches);

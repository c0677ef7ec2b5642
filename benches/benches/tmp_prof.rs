use std::sync::Arc;
use std::time::{Duration, Instant};
use pagoda_engine::fake::{FakeDecoder, FakeExecutor};
use pagoda_engine::{EngineConfig, ModelExecutor, Request, SamplingParams, Scheduler, StepEvents};
fn main() {
    let block_size = 16; let max_model_len = 2048; const SEQS: usize = 256;
    let mut config = EngineConfig::new(block_size, SEQS * max_model_len / block_size, max_model_len);
    config.max_num_seqs = SEQS; config.max_num_batched_tokens = 4096;
    let mut sched = Scheduler::new(config, Arc::new(FakeDecoder)).unwrap();
    let mut exec = FakeExecutor::new(block_size, sched.block_manager().num_total_blocks(), 64);
    let params = Arc::new(SamplingParams { temperature: 1.0, seed: Some(1), ..Default::default() });
    for id in 0..SEQS as u64 {
        let prompt = (0..64u32).map(|t| (t * 13 + id as u32) % 64).collect();
        sched.add_request(Request::new(id, prompt, params.clone()).with_max_tokens(1900)).unwrap();
    }
    let mut events = StepEvents::default();
    for _ in 0..5 { let b = sched.schedule(); let o = exec.execute(&b).unwrap(); sched.update(o, &mut events).unwrap(); events.clear(); }
    let (mut bs, mut bu) = (Duration::MAX, Duration::MAX);
    for _ in 0..30 {
        let (mut ts, mut tu) = (Duration::ZERO, Duration::ZERO);
        let n = 50;
        for _ in 0..n {
            let t0 = Instant::now(); let b = sched.schedule(); ts += t0.elapsed();
            let o = exec.execute(&b).unwrap();
            let t1 = Instant::now(); sched.update(o, &mut events).unwrap(); tu += t1.elapsed();
            events.clear();
            drop(b);
        }
        bs = bs.min(ts / n); bu = bu.min(tu / n);
    }
    let (ts, tu, n) = (bs, bu, 1);
    println!("schedule {:?} update {:?}", ts / n, tu / n);
    use pagoda_engine::TokenDecoder;
    let dec = FakeDecoder;
    let mut dets: Vec<_> = (0..256).map(|_| pagoda_text::IncrementalDetokenizer::new(&[1,2,3,4,5,6,7], true)).collect();
    let mut best = Duration::MAX;
    for r in 0..200u32 {
        let t = Instant::now();
        let mut total = 0;
        for d in dets.iter_mut() { total += d.push(&dec as &dyn TokenDecoder, r % 50).len(); }
        best = best.min(t.elapsed());
        std::hint::black_box(total);
    }
    println!("detok 256 pushes {:?}", best);
}
#[allow(dead_code)]
fn detok_only() {}

//! Property test of the whole engine thread: random requests whose callers read them to the
//! end, drop their stream part-way, or abort them, on caches small enough to preempt. Every
//! request is reported finished exactly once, every block comes back, and every output read to
//! the end equals the request's solo output (aborted ones are a prefix of it).

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{reference, Collected, VOCAB};
use pagoda_engine::fake::{FakeDecoder, FakeExecutor};
use pagoda_engine::{
    Engine, EngineConfig, EngineObserver, FinishReason, Request, RequestMetrics, SamplingParams, Shutdown,
};
use proptest::prelude::*;

const MAX_MODEL_LEN: usize = 64;

#[derive(Debug, Clone, Copy)]
enum Fate {
    ReadAll,
    DropAfter(usize),
    AbortAfter(usize),
}

fn fate() -> impl Strategy<Value = Fate> {
    prop_oneof![
        2 => Just(Fate::ReadAll),
        1 => (0usize..6).prop_map(Fate::DropAfter),
        1 => (0usize..6).prop_map(Fate::AbortAfter),
    ]
}

#[derive(Default)]
struct Finished(Mutex<Vec<RequestMetrics>>);

impl EngineObserver for Finished {
    fn on_request_finished(&self, m: &RequestMetrics) {
        self.0.lock().unwrap().push(m.clone());
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn engine_loses_nothing_and_matches_solo_outputs(
        block_size in prop::sample::select(vec![2usize, 4, 8]),
        extra_blocks in 0usize..16,
        budget in 8usize..64,
        prefix_caching in any::<bool>(),
        reqs in prop::collection::vec(
            (0u32..3, 1usize..40, 1usize..24, 1usize..3, any::<bool>(), fate()),
            1..12,
        ),
    ) {
        let mut config = EngineConfig::new(block_size, MAX_MODEL_LEN.div_ceil(block_size) + extra_blocks, MAX_MODEL_LEN);
        config.max_num_batched_tokens = budget;
        config.max_num_seqs = 4;
        config.enable_prefix_caching = prefix_caching;
        let observer = Arc::new(Finished::default());
        let exec = FakeExecutor::new(block_size, config.num_blocks, VOCAB);
        let shutdown = Shutdown::new();
        let (handle, thread) = Engine::spawn(config, exec, Arc::new(FakeDecoder), observer.clone(), shutdown.clone()).unwrap();

        let requests: Vec<(Request, Fate)> = reqs
            .iter()
            .enumerate()
            .map(|(i, &(salt, prompt_len, max_tokens, n, greedy, fate))| {
                // Prompts of one salt share their prefix.
                let prompt = (0..prompt_len as u32).map(|t| (t * 3 + salt) % VOCAB as u32).collect();
                let max_tokens = max_tokens.min(MAX_MODEL_LEN - prompt_len);
                let params = SamplingParams { temperature: if greedy { 0.0 } else { 0.8 }, seed: Some(i as u64), ..Default::default() };
                (Request::new(i as u64, prompt, Arc::new(params)).with_max_tokens(max_tokens).with_n(n), fate)
            })
            .collect();
        let mut streams: Vec<_> = requests.iter().map(|(r, _)| handle.submit(r.clone()).unwrap()).collect();

        for ((r, fate), stream) in requests.iter().zip(streams.drain(..)) {
            let mut stream = stream;
            let mut got = Collected::default();
            let read = |stream: &mut pagoda_engine::RequestStream, got: &mut Collected, limit: usize| {
                let mut k = 0;
                while k < limit && !got.done {
                    match stream.blocking_recv() {
                        Some(ev) => got.push(ev),
                        None => break,
                    }
                    k += 1;
                }
            };
            match *fate {
                Fate::ReadAll => read(&mut stream, &mut got, usize::MAX),
                Fate::DropAfter(k) => {
                    read(&mut stream, &mut got, k);
                    drop(stream);
                    continue;
                }
                Fate::AbortAfter(k) => {
                    read(&mut stream, &mut got, k);
                    handle.abort(r.id);
                    read(&mut stream, &mut got, usize::MAX);
                }
            }
            prop_assert!(got.done, "request {} ended without a last event", r.id);
            let want = reference(r, MAX_MODEL_LEN);
            for (i, (g, w)) in got.samples.iter().zip(&want).enumerate() {
                if g.finish == Some(FinishReason::Abort) {
                    prop_assert!(w.tokens.starts_with(&g.tokens), "request {} sample {i}: not a prefix", r.id);
                } else {
                    prop_assert_eq!(g, w, "request {} sample {}", r.id, i);
                }
            }
        }

        let start = Instant::now();
        loop {
            let s = handle.stats();
            if s.num_requests == 0 && s.kv_blocks_used == 0 && observer.0.lock().unwrap().len() == requests.len() {
                break;
            }
            prop_assert!(start.elapsed() < Duration::from_secs(10), "engine did not drain: {:?}", s);
            std::thread::sleep(Duration::from_millis(1));
        }
        let mut ids: Vec<u64> = observer.0.lock().unwrap().iter().map(|m| m.request_id).collect();
        ids.sort_unstable();
        prop_assert_eq!(ids, (0..requests.len() as u64).collect::<Vec<_>>());
        prop_assert_eq!(handle.num_pending(), 0);
        shutdown.trigger();
        thread.join().unwrap();
    }
}

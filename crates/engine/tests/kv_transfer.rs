//! Prefill/decode transfers between two engines with the fake executor: a prefill holds its
//! prompt's blocks under a key, the pages read from it and imported into a second engine are a
//! prefix-cache hit there, and the decode's output equals a request run alone. The fake checks
//! every slot it reads holds the expected token and position, so pages landing in the wrong
//! blocks would fail the run. Also: holds expire, a failed prefill and a read hold say so at
//! once, holds give way to admission, a wrong layout is refused, and the blocks are accounted
//! for throughout.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{reference, Collected, VOCAB};
use pagoda_engine::fake::{FakeDecoder, FakeExecutor};
use pagoda_engine::{
    Engine, EngineConfig, EngineHandle, FinishReason, HeldExport, KvHold, KvPrefix, KvTransferError,
    NoopObserver, Request, SamplingParams, Shutdown,
};

const MAX_MODEL_LEN: usize = 256;
const BLOCK: usize = 16;

fn engine(num_blocks: usize) -> EngineHandle {
    engine_with(num_blocks, MAX_MODEL_LEN)
}

fn engine_with(num_blocks: usize, max_model_len: usize) -> EngineHandle {
    let config = EngineConfig::new(BLOCK, num_blocks, max_model_len);
    let exec = FakeExecutor::new(BLOCK, num_blocks, VOCAB);
    let (handle, _thread) =
        Engine::spawn(config, exec, Arc::new(FakeDecoder), Arc::new(NoopObserver), Shutdown::new()).unwrap();
    handle
}

fn prompt(len: usize) -> Vec<u32> {
    (0..len as u32).map(|i| (i * 7 + 3) % VOCAB as u32).collect()
}

fn request(handle: &EngineHandle, prompt: Vec<u32>, max_tokens: usize) -> Request {
    Request::new(handle.next_request_id(), prompt, Arc::new(SamplingParams::default()))
        .with_max_tokens(max_tokens)
}

fn run(handle: &EngineHandle, request: Request) -> (Collected, usize) {
    let mut stream = handle.submit(request).unwrap();
    let mut out = Collected::default();
    let mut cached = 0;
    while let Some(ev) = stream.blocking_recv() {
        if let Some(usage) = ev.usage {
            cached = usage.cached_prompt_tokens;
        }
        out.push(ev);
    }
    (out, cached)
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(f)
}

/// The prefix held under `key`, which must be there.
fn take(handle: &EngineHandle, key: &str) -> KvPrefix {
    match block_on(handle.export_held(key)).unwrap() {
        HeldExport::Ready(prefix) => prefix,
        other => panic!("nothing held under {key}: {other:?}"),
    }
}

/// Polls until `check` holds (5 s at most).
fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !check() {
        assert!(std::time::Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn hold(key: &str, secs: u64) -> Option<KvHold> {
    Some(KvHold { key: key.into(), timeout: Duration::from_secs(secs) })
}

#[test]
fn a_decode_instance_continues_from_imported_pages() {
    let (prefill, decode) = (engine(64), engine(64));
    let tokens = prompt(75);
    let mut first = request(&prefill, tokens.clone(), 1);
    first.kv_hold = hold("t1", 60);
    let (out, _) = run(&prefill, first);
    assert!(out.done);
    // Four whole blocks of the 75-token prompt are held, and pinned while held.
    assert_eq!(prefill.stats().kv_held_blocks, 4);
    assert_eq!(prefill.stats().kv_blocks_used, 4);

    assert_eq!(block_on(prefill.export_held("other")).unwrap(), HeldExport::Pending);
    let prefix = take(&prefill, "t1");
    assert_eq!(prefix.token_ids, tokens[..64]);
    assert_eq!(prefix.num_blocks(), 4);
    assert_eq!(prefill.stats().kv_held_blocks, 0);
    assert_eq!(prefill.stats().kv_blocks_used, 0);
    // Read once: the key is gone, and says so.
    assert!(
        matches!(block_on(prefill.export_held("t1")).unwrap(), HeldExport::Gone(r) if r.contains("read"))
    );

    assert_eq!(block_on(decode.import_prefix(prefix.clone(), None)).unwrap(), 64);
    let wanted = request(&decode, tokens.clone(), 20);
    let (out, cached) = run(&decode, wanted.clone());
    assert_eq!(cached, 64, "the imported blocks are a prefix-cache hit");
    assert_eq!(out.samples, reference(&wanted, MAX_MODEL_LEN));
    // Importing again writes nothing new and still covers the prefix.
    assert_eq!(block_on(decode.import_prefix(prefix, None)).unwrap(), 64);
}

#[test]
fn pages_written_to_the_wrong_positions_are_caught() {
    // The check above is meaningful only if a bad import shows up: pages of other tokens
    // registered under this prompt make the fake's reads fail or differ.
    let (prefill, decode) = (engine(64), engine(64));
    let mut other = request(&prefill, prompt(40).into_iter().map(|t| (t + 1) % VOCAB as u32).collect(), 1);
    other.kv_hold = hold("x", 60);
    run(&prefill, other);
    let mut prefix = take(&prefill, "x");
    let tokens = prompt(40);
    prefix.token_ids = tokens[..32].to_vec();
    block_on(decode.import_prefix(prefix, None)).unwrap();
    let wanted = request(&decode, tokens, 10);
    let (out, _) = run(&decode, wanted.clone());
    assert_ne!(out.samples, reference(&wanted, MAX_MODEL_LEN));
}

#[test]
fn holds_expire_and_free_their_blocks() {
    let prefill = engine(64);
    let mut first = request(&prefill, prompt(50), 1);
    first.kv_hold = Some(KvHold { key: "late".into(), timeout: Duration::from_secs(1) });
    run(&prefill, first);
    assert_eq!(prefill.stats().kv_held_blocks, 3);
    eventually("the hold expires", || prefill.stats().kv_expired_holds == 1);
    let stats = prefill.stats();
    assert_eq!((stats.kv_held_blocks, stats.kv_blocks_used), (0, 0));
    assert!(
        matches!(block_on(prefill.export_held("late")).unwrap(), HeldExport::Gone(r) if r.contains("expired"))
    );
}

#[test]
fn a_prefill_that_ends_without_its_blocks_says_so() {
    let prefill = engine(64);
    let mut first = request(&prefill, prompt(50), 200);
    first.kv_hold = hold("gone", 60);
    let id = first.id;
    let mut stream = prefill.submit(first).unwrap();
    prefill.abort(id);
    let mut finish = None;
    while let Some(ev) = stream.blocking_recv() {
        finish = ev.finished.or(finish);
    }
    // The abort may come after the 200 tokens; either way the key tells a reader what it holds.
    let found = block_on(prefill.export_held("gone")).unwrap();
    match finish {
        Some(FinishReason::Abort) => {
            assert_eq!(prefill.stats().kv_held_blocks, 0);
            assert!(matches!(found, HeldExport::Gone(ref r) if r.contains("did not finish")), "{found:?}");
        }
        other => assert!(matches!(found, HeldExport::Ready(_)), "finished {other:?}, found {found:?}"),
    }
}

#[test]
fn holds_give_way_to_requests() {
    // 16 blocks: holds take at most half, and an admission that finds none free gets them.
    let prefill = engine_with(16, 256);
    // Prompts that share nothing, so that every hold pins blocks of its own.
    let distinct = |len: usize, salt: u32| -> Vec<u32> {
        prompt(len).into_iter().map(|t| (t + salt) % VOCAB as u32).collect()
    };
    for (i, key) in ["a", "b", "c"].into_iter().enumerate() {
        let mut r = request(&prefill, distinct(64 + i, 1 + i as u32), 1);
        r.kv_hold = hold(key, 60);
        run(&prefill, r);
    }
    // Each prompt holds 4 blocks; the third hold pushed out the first.
    assert_eq!(prefill.stats().kv_held_blocks, 8);
    assert!(matches!(block_on(prefill.export_held("a")).unwrap(), HeldExport::Gone(r) if r.contains("room")));
    // A request needing 13 blocks is served: the holds go rather than the request failing.
    let (out, _) = run(&prefill, request(&prefill, distinct(200, 9), 8));
    assert!(matches!(out.samples[0].finish, Some(FinishReason::Length)), "{:?}", out.samples[0].finish);
    assert_eq!(prefill.stats().kv_held_blocks, 0);
}

#[test]
fn a_different_layout_is_refused_and_the_cache_is_untouched() {
    let (prefill, decode) = (engine(64), engine(64));
    let mut first = request(&prefill, prompt(40), 1);
    first.kv_hold = hold("k", 60);
    run(&prefill, first);
    let mut prefix = take(&prefill, "k");
    prefix.layout.num_kv_heads = 2;
    let err = block_on(decode.import_prefix(prefix.clone(), None)).unwrap_err();
    assert!(matches!(err, KvTransferError::Refused(ref m) if m.contains("layout")), "{err}");
    prefix.layout.num_kv_heads = 1;
    prefix.pages.pop();
    assert!(block_on(decode.import_prefix(prefix, None)).is_err());
    let (_, cached) = run(&decode, request(&decode, prompt(40), 4));
    assert_eq!(cached, 0);
}

#[test]
fn an_import_takes_only_the_free_blocks() {
    let (prefill, decode) = (engine(64), engine_with(3, 3 * BLOCK));
    let tokens = prompt(75);
    let mut first = request(&prefill, tokens.clone(), 1);
    first.kv_hold = hold("big", 60);
    run(&prefill, first);
    let prefix = take(&prefill, "big");
    assert_eq!(block_on(decode.import_prefix(prefix, None)).unwrap(), 3 * BLOCK);
}

#[test]
fn holds_take_one_sample() {
    let prefill = engine(64);
    let mut r = request(&prefill, prompt(10), 1).with_n(2);
    r.kv_hold = hold("n", 60);
    assert!(prefill.submit(r).is_err());
}

//! Prompt logprobs of the real SmolLM2 through the engine against the numpy reference of
//! scripts/golden.py (`prompt_logprobs_cases`): every prompt token's logprob and the five most
//! likely tokens at each position, cold, with the prompt in the prefix cache, and chunked.

mod common;

use std::sync::Arc;

use common::real_engine::engine;
use pagoda_engine::{EngineHandle, Request, TopLogprobs};

const TOLERANCE: f32 = 2e-3;

/// The prompt logprobs request `id` for `prompt` gets, and its first generated token.
fn score(handle: &EngineHandle, id: u64, prompt: &[u32]) -> Vec<TopLogprobs> {
    let mut request = Request::new(id, prompt.to_vec(), Arc::new(Default::default())).with_max_tokens(2);
    request.prompt_logprobs = Some(5);
    let mut stream = handle.submit(request).unwrap();
    let mut scored = None;
    while let Some(event) = stream.blocking_recv() {
        assert!(event.finished.as_ref().is_none_or(|f| !f.is_failure()), "{:?}", event.finished);
        if let Some(lp) = event.prompt_logprobs {
            assert!(scored.replace(lp).is_none(), "one event carries them");
        }
    }
    scored.expect("the prompt's logprobs")
}

fn check(case: &serde_json::Value, got: &[TopLogprobs], what: &str) -> f32 {
    let name = case["name"].as_str().unwrap();
    let reference = case["logprobs"].as_array().unwrap();
    let prompt = common::ids(&case["prompt_ids"]);
    assert_eq!(got.len(), prompt.len() - 1, "{name} {what}");
    let mut worst = 0f32;
    for (p, (ours, theirs)) in got.iter().zip(reference).enumerate() {
        assert_eq!(ours.sampled.token_id, prompt[p + 1], "{name} {what}: position {p} scores the next token");
        let target = theirs[0].as_f64().unwrap() as f32;
        worst = worst.max((ours.sampled.logprob - target).abs());
        assert_eq!(ours.top.len(), 5);
        for (rank, (top, want)) in ours.top.iter().zip(theirs[1].as_array().unwrap()).enumerate() {
            let want = want[1].as_f64().unwrap() as f32;
            worst = worst.max((top.logprob - want).abs());
            assert!((top.logprob - want).abs() <= TOLERANCE, "{name} {what}: position {p} rank {rank}");
        }
    }
    assert!(worst <= TOLERANCE, "{name} {what}: largest difference {worst}");
    worst
}

#[test]
fn prompt_logprobs_match_the_reference_cold_cached_and_chunked() {
    let fixture = common::fixture();
    let cases = fixture["prompt_logprobs_cases"].as_array().unwrap();
    let (handle, _) = engine(256, |_| {});
    let (chunked, _) = engine(256, |c| {
        c.max_num_seqs = 4;
        c.max_num_batched_tokens = 16;
    });
    let mut worst = 0f32;
    for (i, case) in cases.iter().enumerate() {
        let prompt = common::ids(&case["prompt_ids"]);
        worst = worst.max(check(case, &score(&handle, 10 * i as u64, &prompt), "cold"));
        // Now the prompt's blocks are in the prefix cache: they are computed again to be scored.
        worst = worst.max(check(case, &score(&handle, 10 * i as u64 + 1, &prompt), "cached"));
        worst = worst.max(check(case, &score(&chunked, 10 * i as u64 + 2, &prompt), "chunked"));
    }
    eprintln!("largest logprob difference {worst:.2e}");
}

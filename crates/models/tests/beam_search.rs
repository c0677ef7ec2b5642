//! Beam search of the real SmolLM2 through the engine against scripts/golden_beam.py's search
//! over the float64 numpy model (tests/fixtures/beam-search.json): the same best hypotheses, in
//! the same order, with the same cumulative logprobs, ended the same way; all cases at once
//! (beams of several searches in one batch, sharing the cache) and each alone.

mod common;

use std::sync::Arc;

use common::real_engine::engine;
use pagoda_engine::{BeamSearch, EngineHandle, FinishReason, Request, StopConditions, StopReason};

/// Cumulative logprobs are sums of up to ten f32 logprobs of a quantized model's f32 pass.
const TOLERANCE: f64 = 2e-3;

fn fixture() -> serde_json::Value {
    let path = common::repo_root().join("tests/fixtures/beam-search.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn request(id: u64, case: &serde_json::Value, eos: u32) -> Request {
    let number = |key: &str| case[key].as_u64().unwrap() as usize;
    let beam = BeamSearch {
        width: number("width"),
        length_penalty: case["length_penalty"].as_f64().unwrap() as f32,
    };
    let stop = StopConditions { eos_token_ids: vec![eos], ..Default::default() };
    Request::new(id, common::ids(&case["prompt_ids"]), Arc::new(Default::default()))
        .with_max_tokens(number("max_tokens"))
        .with_n(number("n"))
        .with_stop(stop)
        .with_beam(beam)
}

/// Per hypothesis: output tokens, summed logprobs, finish reason.
fn collect(mut stream: pagoda_engine::RequestStream, n: usize) -> Vec<(Vec<u32>, f64, FinishReason)> {
    let mut out = vec![None; n];
    while let Some(event) = stream.blocking_recv() {
        let finish = event.finished.clone().expect("one finished event per hypothesis");
        assert!(!finish.is_failure(), "{finish:?}");
        let cum = event.logprobs.as_ref().unwrap().iter().map(|l| f64::from(l.sampled.logprob)).sum();
        assert!(out[event.index].replace((event.token_ids, cum, finish)).is_none());
    }
    out.into_iter().map(|h| h.expect("every hypothesis")).collect()
}

fn check(case: &serde_json::Value, got: &[(Vec<u32>, f64, FinishReason)], eos: u32, what: &str) -> f64 {
    let name = format!("{} width {} {what}", case["name"].as_str().unwrap(), case["width"]);
    let want = case["hypotheses"].as_array().unwrap();
    assert_eq!(got.len(), want.len(), "{name}");
    let mut worst = 0f64;
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let ended = w["eos"].as_bool().unwrap();
        assert_eq!(g.0, common::ids(&w["token_ids"]), "{name}: hypothesis {i}");
        let reason = if ended { FinishReason::Stop(StopReason::Eos(eos)) } else { FinishReason::Length };
        assert_eq!(g.2, reason, "{name}: hypothesis {i}");
        let diff = (g.1 - w["cum_logprob"].as_f64().unwrap()).abs();
        assert!(diff <= TOLERANCE, "{name}: hypothesis {i}: cumulative logprob off by {diff}");
        worst = worst.max(diff);
    }
    worst
}

fn run(
    handle: &EngineHandle,
    cases: &[serde_json::Value],
    eos: u32,
    first_id: u64,
) -> Vec<Vec<(Vec<u32>, f64, FinishReason)>> {
    let requests = cases.iter().enumerate().map(|(i, c)| request(first_id + i as u64, c, eos)).collect();
    let streams = handle.submit_all(requests).unwrap();
    streams.into_iter().zip(cases).map(|(s, c)| collect(s, c["n"].as_u64().unwrap() as usize)).collect()
}

#[test]
fn beam_search_matches_the_reference_together_and_alone() {
    let fixture = fixture();
    let eos = fixture["eos_token_id"].as_u64().unwrap() as u32;
    let cases = fixture["cases"].as_array().unwrap();
    assert!(cases.len() >= 5);
    assert!(cases.iter().any(|c| c["hypotheses"][0]["eos"].as_bool().unwrap()), "a hypothesis ends with EOS");
    let (handle, _) = engine(512, |c| c.max_num_seqs = 32);
    let mut worst = 0f64;
    for (case, got) in cases.iter().zip(run(&handle, cases, eos, 0)) {
        worst = worst.max(check(case, &got, eos, "batched"));
    }
    for (i, case) in cases.iter().enumerate() {
        let got = run(&handle, std::slice::from_ref(case), eos, 100 + i as u64).remove(0);
        worst = worst.max(check(case, &got, eos, "alone"));
    }
    eprintln!("largest cumulative logprob difference {worst:.2e}");
}

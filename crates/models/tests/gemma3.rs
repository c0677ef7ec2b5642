//! Gemma 3 270M (Q4_K_M GGUF) against the golden fixture of scripts/golden_gemma3.py (a numpy
//! float64 forward pass over the weights that the `gguf` package dequantizes): last-position
//! logits and greedy continuations, a prompt longer than the 512-token sliding window included,
//! prefilled at once and in chunks.

mod common;

use common::*;

/// Largest difference from the reference logits accepted: the reference is float64, we are f32.
const TOLERANCE: f32 = 1e-3;

fn check_top20(name: &str, logits: &[f32], case: &serde_json::Value) -> f32 {
    let mut worst = 0f32;
    for pair in case["top20"].as_array().unwrap() {
        let id = pair[0].as_u64().unwrap() as usize;
        let reference = pair[1].as_f64().unwrap() as f32;
        let diff = (logits[id] - reference).abs();
        worst = worst.max(diff);
        assert!(diff <= TOLERANCE, "{name}: logit of token {id}: ours {}, reference {reference}", logits[id]);
    }
    worst
}

#[test]
fn logits_and_greedy_continuations_match_the_reference() {
    let fixture = gemma3_fixture();
    let mut runner = runner_for(&gemma3_path(), 6 * 50);
    let cases = fixture["logits_cases"].as_array().unwrap();
    assert!(
        cases.iter().any(|c| c["prompt_ids"].as_array().unwrap().len() > 512),
        "a case beyond the window"
    );
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let prompt = ids(&case["prompt_ids"]);
        let expected = ids(&case["greedy"]);
        let (logits, generated) = greedy(&mut runner, &prompt, expected.len());
        let worst = check_top20(name, &logits, case);
        eprintln!("{name}: {} prompt tokens, worst top-20 logit difference {worst:.2e}", prompt.len());
        assert_eq!(generated, expected, "{name}: greedy continuation differs");
    }
}

#[test]
fn long_prompt_prefilled_in_chunks_matches_the_reference() {
    let fixture = gemma3_fixture();
    let case = longest_logits_case(&fixture);
    let prompt = ids(&case["prompt_ids"]);
    let mut runner = runner_for(&gemma3_path(), 6 * 50);
    // Chunks that straddle the window's edge and block boundaries: the last chunk's queries see
    // keys written by earlier steps, partly outside their windows.
    let mut seq = TestSeq::on(&runner, 1, prompt.clone());
    let mut logits = Vec::new();
    while seq.computed < prompt.len() {
        let n = 97.min(prompt.len() - seq.computed);
        logits = runner.logits(&batch(vec![seq.chunk(n)])).unwrap().to_vec2::<f32>().unwrap().remove(0);
        seq.computed += n;
    }
    check_top20("chunked", &logits, case);
    assert_eq!(argmax(&logits), ids(&case["greedy"])[0]);
}

/// `--cpu-gemm-dtype int8` on Gemma 3: every matmul multiplies the GGUF codes (Q5_0, Q8_0,
/// Q4_K, Q6_K) by 8-bit activations, llama.cpp's precision. Its top-20 logits stay within 2 of
/// the float64 reference (measured: 0.62) and, these prompts' top-2 margins being wider than
/// that drift, the first 16 greedy tokens of every prompt agree.
#[test]
fn int8_gemm_stays_close_to_the_reference() {
    let fixture = gemma3_fixture();
    let mut runner = runner_for_with_panels(&gemma3_path(), 6 * 50, pagoda_models::PanelPrecision::Int8);
    let mut worst = 0f32;
    for case in fixture["logits_cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let prompt = ids(&case["prompt_ids"]);
        let expected = ids(&case["greedy"]);
        let (logits, generated) = greedy(&mut runner, &prompt, 16);
        for pair in case["top20"].as_array().unwrap() {
            let id = pair[0].as_u64().unwrap() as usize;
            let diff = (logits[id] - pair[1].as_f64().unwrap() as f32).abs();
            worst = worst.max(diff);
            assert!(diff <= 2.0, "{name}: token {id} logit off by {diff}");
        }
        assert_eq!(generated, expected[..16], "{name}: int8 greedy continuation differs");
    }
    eprintln!("largest logit difference with int8 GEMMs: {worst}");
}

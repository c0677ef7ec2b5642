//! A LoRA adapter on the real default model (SmolLM2-135M, dequantized f32 path) against
//! transformers + PEFT in float32 (scripts/smollm2_lora.py, tests/fixtures/smollm2-lora): the
//! PEFT adapter and llama.cpp's GGUF conversion of it, beside the base model, in one batch fed a
//! token per step: the logits at every prompt position, then 16 greedy tokens each. The GGUF
//! model keeps llama.cpp's Q/K row order, so this also checks that a PEFT adapter's rows are
//! reordered to it and that a GGUF adapter's already are.

mod common;

use common::*;
use serde_json::Value;

/// f32 on both sides, the same dequantized weights and bf16-exact adapter values: measured
/// 9.2e-5 (summation order); the adapter moves logits by up to 8.
const TOLERANCE: f32 = 1e-3;

fn fixture(name: &str) -> std::path::PathBuf {
    repo_root().join("tests/fixtures/smollm2-lora").join(name)
}

#[test]
fn peft_and_gguf_adapters_match_transformers_at_every_position() {
    let reference: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("reference.json")).unwrap()).unwrap();
    let mut runner = runner(true, 64);
    runner.add_lora(1, &fixture("adapter"), 8).unwrap();
    runner.add_lora(2, &fixture("adapter.gguf"), 8).unwrap();
    // (reference key, adapter id) of the three sequences of every step.
    let runs = [("base", None), ("adapter", Some(1)), ("adapter", Some(2))];
    let mut worst = 0f32;
    for case in reference["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let prompt = ids(&case["prompt_ids"]);
        let mut seqs: Vec<TestSeq> =
            (0..3).map(|i| TestSeq::new(i as u64 + 1, prompt.clone(), 20 * i as u32)).collect();
        let mut generated = vec![Vec::new(); 3];
        let steps = prompt.len() + 15;
        for step in 0..steps {
            let chunks = seqs
                .iter()
                .zip(&runs)
                .map(|(seq, (_, lora))| {
                    let mut chunk = seq.chunk(1);
                    chunk.lora = *lora;
                    chunk
                })
                .collect();
            let rows = runner.logits(&batch(chunks)).unwrap().to_vec2::<f32>().unwrap();
            for (i, row) in rows.iter().enumerate() {
                let (key, lora) = runs[i];
                if step < prompt.len() {
                    for pair in case[key]["logits"][step].as_array().unwrap() {
                        let (id, want) =
                            (pair[0].as_u64().unwrap() as usize, pair[1].as_f64().unwrap() as f32);
                        let diff = (row[id] - want).abs();
                        assert!(
                            diff <= TOLERANCE,
                            "{name}, {key} {lora:?}, position {step}, token {id}: {diff}"
                        );
                        worst = worst.max(diff);
                    }
                }
                seqs[i].computed += 1;
                if seqs[i].computed == seqs[i].tokens.len() {
                    let next = argmax(row);
                    generated[i].push(next);
                    seqs[i].tokens.push(next);
                }
            }
        }
        for (i, (key, lora)) in runs.iter().enumerate() {
            assert_eq!(generated[i], ids(&case[key]["greedy"]), "{name}: {key} {lora:?} greedy tokens");
        }
    }
    eprintln!("largest logit difference from transformers + PEFT: {worst}");
}

#[test]
fn a_gguf_adapter_fits_a_hugging_face_model_and_llama_cpp_names_are_checked() {
    // The tiny llama from safetensors keeps Hugging Face's Q/K order: llama.cpp's conversion of
    // adapter `a` is reordered back and gives PEFT's logits.
    let tiny = repo_root().join("tests/fixtures/tiny");
    let reference: Value =
        serde_json::from_str(&std::fs::read_to_string(tiny.join("lora/reference.json")).unwrap()).unwrap();
    let mut runner = runner_for(&tiny.join("llama"), 64);
    runner.add_lora(1, &tiny.join("lora/a.gguf"), 16).unwrap();
    let mut seq = TestSeq::new(1, ids(&reference["prompts"]["short"]), 0);
    for (pos, want) in reference["a"]["short_logits"].as_array().unwrap().iter().enumerate() {
        let mut chunk = seq.chunk(1);
        chunk.lora = Some(1);
        let got = runner.logits(&batch(vec![chunk])).unwrap().to_vec2::<f32>().unwrap().remove(0);
        let want: Vec<f32> = want.as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect();
        let diff = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(diff <= 1e-4, "position {pos}: {diff}");
        seq.computed += 1;
    }
    // An adapter of another architecture, and a GGUF that is not an adapter.
    let err = |r: pagoda_models::Result<()>| r.unwrap_err().to_string();
    let mut qwen = runner_for(&tiny.join("qwen2"), 8);
    assert!(err(qwen.add_lora(1, &tiny.join("lora/a.gguf"), 16)).contains("the adapter is for `llama`"));
    assert!(err(runner.add_lora(2, &tiny.join("llama/model.gguf"), 16)).contains("not a LoRA adapter"));
}

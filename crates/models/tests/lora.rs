//! PEFT LoRA adapters on the tiny llama against transformers + PEFT (scripts/tiny_lora.py,
//! tests/fixtures/tiny/lora; float64 reference): every position's logits under each adapter and
//! the base model, fed one token per step; the three in one batch (a mixed step: rows of two
//! adapters and of the base); greedy continuations through the engine, the three requests
//! batched together; and the adapters' refusals.

mod common;

use std::path::PathBuf;
use std::sync::Arc;

use common::*;
use pagoda_engine::{Engine, EngineConfig, NoopObserver, Request, Shutdown};
use pagoda_models::ModelRunner;
use pagoda_text::Tokenizer;
use serde_json::Value;

const TOLERANCE: f32 = 1e-4;
/// The adapters as the runner knows them: (reference key, id).
const ADAPTERS: [(&str, Option<u32>); 3] = [("base", None), ("a", Some(1)), ("b", Some(2))];

fn tiny(path: &str) -> PathBuf {
    repo_root().join("tests/fixtures/tiny").join(path)
}

fn reference() -> Value {
    serde_json::from_str(&std::fs::read_to_string(tiny("lora/reference.json")).unwrap()).unwrap()
}

fn runner() -> ModelRunner {
    let mut runner = runner_for(&tiny("llama"), 64);
    runner.add_lora(1, &tiny("lora/a"), 16).unwrap();
    runner.add_lora(2, &tiny("lora/b"), 16).unwrap();
    runner
}

fn largest_difference(ours: &[f32], want: &Value) -> f32 {
    let want: Vec<f32> = want.as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect();
    assert_eq!(ours.len(), want.len());
    ours.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max)
}

#[test]
fn adapters_match_peft_at_every_position_alone_and_mixed() {
    let reference = reference();
    let prompt = ids(&reference["prompts"]["short"]);
    let mut runner = runner();
    let mut worst = 0f32;
    for (i, (key, lora)) in ADAPTERS.iter().enumerate() {
        let mut seq = TestSeq::new(10 + i as u64, prompt.clone(), 0);
        for (pos, want) in reference[key]["short_logits"].as_array().unwrap().iter().enumerate() {
            let mut chunk = seq.chunk(1);
            chunk.lora = *lora;
            let got = runner.logits(&batch(vec![chunk])).unwrap().to_vec2::<f32>().unwrap().remove(0);
            let diff = largest_difference(&got, want);
            assert!(diff <= TOLERANCE, "{key}, position {pos}: logits off by {diff}");
            worst = worst.max(diff);
            seq.computed += 1;
        }
    }
    // One step: the whole prompt under a, under the base and under b, in their own blocks.
    let order = [1, 0, 2];
    let seqs: Vec<TestSeq> =
        order.iter().map(|&i| TestSeq::new(20 + i as u64, prompt.clone(), 4 * i as u32)).collect();
    let chunks = seqs
        .iter()
        .zip(order)
        .map(|(s, i)| {
            let mut chunk = s.chunk(prompt.len());
            chunk.lora = ADAPTERS[i].1;
            chunk
        })
        .collect();
    let rows = runner.logits(&batch(chunks)).unwrap().to_vec2::<f32>().unwrap();
    for (got, i) in rows.iter().zip(order) {
        let key = ADAPTERS[i].0;
        let want = reference[key]["short_logits"].as_array().unwrap().last().unwrap();
        let diff = largest_difference(got, want);
        assert!(diff <= TOLERANCE, "{key} in a mixed batch: logits off by {diff}");
        worst = worst.max(diff);
    }
    eprintln!("largest logit difference {worst:.1e}");
}

#[test]
fn a_mixed_batch_generates_each_adapters_greedy_text() {
    let reference = reference();
    let prompt = ids(&reference["prompts"]["long"]);
    let config = EngineConfig::new(BLOCK_SIZE, 64, 256);
    let tokenizer = Arc::new(Tokenizer::from_dir(tiny("llama")).unwrap());
    let handle =
        Engine::spawn(config, runner(), tokenizer, Arc::new(NoopObserver), Shutdown::new()).unwrap().0;
    // Each adapter twice: the second copy of each hits the prefix cache of its own adapter only.
    let requests = (0..6)
        .map(|i| {
            let mut r = Request::new(i, prompt.clone(), Arc::new(Default::default())).with_max_tokens(16);
            r.stop.ignore_eos = true;
            r.lora = ADAPTERS[i as usize % 3].1;
            r
        })
        .collect();
    let streams = handle.submit_all(requests).unwrap();
    for (i, mut stream) in streams.into_iter().enumerate() {
        let mut tokens = Vec::new();
        while let Some(event) = stream.blocking_recv() {
            assert!(event.finished.as_ref().is_none_or(|f| !f.is_failure()), "{:?}", event.finished);
            tokens.extend(event.token_ids);
        }
        let key = ADAPTERS[i % 3].0;
        assert_eq!(tokens, ids(&reference[key]["long_greedy"]), "{key} (request {i})");
    }
    handle.shutdown().trigger();
}

#[test]
fn adapters_that_do_not_fit_are_refused_whole() {
    let mut runner = runner();
    let err = |r: pagoda_models::Result<()>| r.unwrap_err().to_string();
    // Rank 8 over a maximum of 4.
    assert!(err(runner.add_lora(3, &tiny("lora/b"), 4)).contains("--max-lora-rank"));
    assert!(err(runner.add_lora(1, &tiny("lora/b"), 16)).contains("already loaded"));
    assert!(err(runner.add_lora(3, &tiny("lora/missing"), 16)).contains("adapter_config.json"));
    // An adapter of another model's shape.
    let dir = tempfile::tempdir().unwrap();
    let config = std::fs::read_to_string(tiny("lora/a/adapter_config.json")).unwrap();
    std::fs::write(dir.path().join("adapter_config.json"), config.replace("\"r\": 4", "\"r\": 2")).unwrap();
    std::fs::copy(tiny("lora/a/adapter_model.safetensors"), dir.path().join("adapter_model.safetensors"))
        .unwrap();
    assert!(err(runner.add_lora(3, dir.path(), 16)).contains("not of rank 2"));
    // One projection of another model's width.
    let weights = tiny("lora/a/adapter_model.safetensors");
    let mut tensors = candle_core::safetensors::load(&weights, &candle_core::Device::Cpu).unwrap();
    let key = tensors.keys().find(|k| k.contains("lora_B")).unwrap().clone();
    let narrowed = tensors[&key].narrow(0, 0, 2).unwrap();
    tensors.insert(key, narrowed);
    std::fs::copy(tiny("lora/a/adapter_config.json"), dir.path().join("adapter_config.json")).unwrap();
    candle_core::safetensors::save(&tensors, dir.path().join("adapter_model.safetensors")).unwrap();
    assert!(err(runner.add_lora(3, dir.path(), 16)).contains("do not fit the model"));
    // Nothing was half-loaded: id 3 is free, and an unknown id fails its sequence only.
    runner.add_lora(3, &tiny("lora/a"), 16).unwrap();
    assert!(runner.remove_lora(3) && !runner.remove_lora(3));
    let mut chunk = TestSeq::new(1, vec![1, 2, 3], 0).chunk(3);
    chunk.lora = Some(3);
    assert!(runner.logits(&batch(vec![chunk])).unwrap_err().to_string().contains("not loaded"));
}

/// Adapters of the other layouts against PEFT (float64) at every position of each model's short
/// prompt: Phi-3's fused qkv_proj and gate_up_proj, Gemma 3's seven projections, Qwen3-MoE's
/// attention; and an MoE adapter of the MLP refused.
#[test]
fn fused_gemma_and_moe_adapters_match_peft() {
    for arch in ["phi3", "gemma3_text", "qwen3_moe"] {
        let dir = tiny(&format!("lora/{arch}"));
        let reference: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap()).unwrap();
        let mut runner = runner_for(&tiny(arch), 64);
        runner.add_lora(1, &dir, 16).unwrap();
        let mut seq = TestSeq::on(&runner, 1, ids(&reference["prompt"]));
        for (pos, want) in reference["logits"].as_array().unwrap().iter().enumerate() {
            let mut chunk = seq.chunk(1);
            chunk.lora = Some(1);
            let got = runner.logits(&batch(vec![chunk])).unwrap().to_vec2::<f32>().unwrap().remove(0);
            let diff = largest_difference(&got, want);
            assert!(diff <= TOLERANCE, "{arch}, position {pos}: logits off by {diff}");
            seq.computed += 1;
        }
    }
    // The MoE adapter with a down projection added: refused, naming the experts.
    let dir = tempfile::tempdir().unwrap();
    let moe = tiny("lora/qwen3_moe");
    let config = std::fs::read_to_string(moe.join("adapter_config.json")).unwrap();
    std::fs::write(
        dir.path().join("adapter_config.json"),
        config.replace("\"o_proj\"", "\"o_proj\", \"down_proj\""),
    )
    .unwrap();
    let mut tensors =
        candle_core::safetensors::load(moe.join("adapter_model.safetensors"), &candle_core::Device::Cpu)
            .unwrap();
    let layers = tensors.keys().filter(|k| k.contains("q_proj.lora_A")).count();
    for i in 0..layers {
        let key = |ab: &str| format!("base_model.model.model.layers.{i}.mlp.down_proj.lora_{ab}.weight");
        let zeros = |shape: &[usize]| {
            candle_core::Tensor::zeros(shape, candle_core::DType::F32, &candle_core::Device::Cpu)
        };
        tensors.insert(key("A"), zeros(&[8, 32]).unwrap());
        tensors.insert(key("B"), zeros(&[64, 8]).unwrap());
    }
    candle_core::safetensors::save(&tensors, dir.path().join("adapter_model.safetensors")).unwrap();
    let mut runner = runner_for(&tiny("qwen3_moe"), 8);
    let err = runner.add_lora(1, dir.path(), 16).unwrap_err().to_string();
    assert!(err.contains("mixture of experts"), "{err}");
}

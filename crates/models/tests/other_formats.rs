//! The Hugging Face safetensors loader (halves-style rotary) and dummy weights, checked against
//! the GGUF path: the GGUF's weights are written out as a Hugging Face directory, with the Q/K
//! rows un-permuted back to Hugging Face order, and must give the same logits.

mod common;

use std::collections::HashMap;

use candle_core::quantized::gguf_file;
use candle_core::{DType, Device, Tensor};
use common::*;
use pagoda_models::{load_model, KvCache, LoadFormat, LoadOptions, ModelRunner};

/// llama.cpp stores Q/K rows so rotary pairs adjacent dims; Hugging Face pairs i with i + d/2.
fn unpermute(w: &Tensor, heads: usize) -> Tensor {
    let (rows, cols) = w.dims2().unwrap();
    w.reshape((heads, rows / heads / 2, 2, cols))
        .unwrap()
        .transpose(1, 2)
        .unwrap()
        .reshape((rows, cols))
        .unwrap()
}

fn hf_name(gguf: &str) -> String {
    let map = [
        ("attn_norm", "input_layernorm"),
        ("ffn_norm", "post_attention_layernorm"),
        ("attn_q", "self_attn.q_proj"),
        ("attn_k", "self_attn.k_proj"),
        ("attn_v", "self_attn.v_proj"),
        ("attn_output", "self_attn.o_proj"),
        ("ffn_gate", "mlp.gate_proj"),
        ("ffn_up", "mlp.up_proj"),
        ("ffn_down", "mlp.down_proj"),
    ];
    match gguf {
        "token_embd.weight" => "model.embed_tokens.weight".into(),
        "output_norm.weight" => "model.norm.weight".into(),
        _ => {
            let parts: Vec<&str> = gguf.splitn(4, '.').collect();
            let module = map.iter().find(|(g, _)| *g == parts[2]).unwrap().1;
            format!("model.layers.{}.{module}.{}", parts[1], parts[3])
        }
    }
}

fn prompt_logits(runner: &mut ModelRunner, prompt: &[u32]) -> Vec<f32> {
    let seq = TestSeq::new(1, prompt.to_vec(), 0);
    runner.logits(&batch(vec![seq.chunk(prompt.len())])).unwrap().to_vec2::<f32>().unwrap().remove(0)
}

#[test]
fn safetensors_directory_matches_the_gguf() {
    let path = model_path();
    let mut file = std::fs::File::open(&path).unwrap();
    let content = gguf_file::Content::read(&mut file).unwrap();
    let meta = |k: &str| content.metadata[k].to_u32().unwrap() as usize;
    let (heads, kv_heads) = (meta("llama.attention.head_count"), meta("llama.attention.head_count_kv"));
    let mut tensors = HashMap::new();
    for name in content.tensor_infos.keys() {
        let mut t = content.tensor(&mut file, name, &Device::Cpu).unwrap().dequantize(&Device::Cpu).unwrap();
        if name.contains("attn_q.") {
            t = unpermute(&t, heads);
        } else if name.contains("attn_k.") {
            t = unpermute(&t, kv_heads);
        }
        tensors.insert(hf_name(name), t);
    }
    let dir = tempfile::tempdir().unwrap();
    candle_core::safetensors::save(&tensors, dir.path().join("model.safetensors")).unwrap();
    let config = format!(
        r#"{{"model_type":"llama","vocab_size":49152,"hidden_size":576,"intermediate_size":1536,
        "num_hidden_layers":30,"num_attention_heads":{heads},"num_key_value_heads":{kv_heads},
        "rms_norm_eps":1e-5,"rope_theta":100000.0,"max_position_embeddings":8192,"tie_word_embeddings":true}}"#
    );
    std::fs::write(dir.path().join("config.json"), config).unwrap();

    let loaded = load_model(dir.path(), &LoadOptions::default()).unwrap();
    assert_eq!(loaded.format, LoadFormat::Safetensors);
    let cache = KvCache::new(loaded.model.config(), 16, BLOCK_SIZE, DType::F32, &Device::Cpu).unwrap();
    let mut hf = ModelRunner::new(loaded.model, cache, Device::Cpu).unwrap();

    // Same f32 weights, other rotary pairing: only rounding may differ.
    let mut gguf = runner(true, 16);
    let prompt: Vec<u32> = vec![1, 504, 3575, 282, 4649, 314, 7042, 30, 378, 1345];
    let a = prompt_logits(&mut hf, &prompt);
    let b = prompt_logits(&mut gguf, &prompt);
    assert_eq!(argmax(&a), argmax(&b));
    let diff = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max);
    assert!(diff < 1e-3, "safetensors vs GGUF logits differ by {diff}");

    // Batch-invariant, the dense weights run the panel GEMM: the last position's logits have the
    // same bits from a 24-token prefill and from a 23-token one followed by a 1-token step.
    let kernel_plan = pagoda_models::KernelPlan::batch_invariant(pagoda_models::PanelPrecision::F32);
    let options = LoadOptions { kernel_plan, ..LoadOptions::default() };
    let loaded = load_model(dir.path(), &options).unwrap();
    let cache = KvCache::new(loaded.model.config(), 16, BLOCK_SIZE, DType::F32, &Device::Cpu).unwrap();
    let mut invariant = ModelRunner::new(loaded.model, cache, Device::Cpu).unwrap();
    let long: Vec<u32> = prompt.iter().cycle().take(24).copied().collect();
    let whole = prompt_logits(&mut invariant, &long);
    let mut seq = TestSeq::new(1, long.clone(), 0);
    invariant.logits(&batch(vec![seq.chunk(23)])).unwrap();
    seq.computed = 23;
    let split = invariant.logits(&batch(vec![seq.chunk(1)])).unwrap().to_vec2::<f32>().unwrap().remove(0);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert!(bits(&whole) == bits(&split), "batch-invariant logits depend on the step's size");
}

#[test]
fn dummy_weights_follow_the_shape_config() {
    let config = repo_root().join("configs/models/smollm2-135m.json");
    let options = LoadOptions { format: LoadFormat::Dummy, ..LoadOptions::default() };
    let loaded = load_model(&config, &options).unwrap();
    assert_eq!(loaded.model.config().num_layers, 30);
    let cache = KvCache::new(loaded.model.config(), 4, BLOCK_SIZE, DType::F32, &Device::Cpu).unwrap();
    let mut runner = ModelRunner::new(loaded.model, cache, Device::Cpu).unwrap();
    let logits = prompt_logits(&mut runner, &[1, 2, 3, 4, 5]);
    assert_eq!(logits.len(), 49152);
    assert!(logits.iter().all(|v| v.is_finite()));
}

/// Dummy weights with every projection in a GGUF block format load as blocks and run; the
/// logits differ between formats (the blocks are what is multiplied), stay finite, and repeat
/// with the blocks dequantized (the same seeded values).
#[test]
fn dummy_weights_in_block_formats_run() {
    let config = repo_root().join("configs/models/smollm2-135m.json");
    let logits = |format, dequantize| {
        let options = LoadOptions {
            format: LoadFormat::Dummy,
            dummy_quantization: Some(format),
            dequantize: Some(dequantize),
            ..LoadOptions::default()
        };
        let loaded = load_model(&config, &options).unwrap();
        let cache = KvCache::new(loaded.model.config(), 4, BLOCK_SIZE, DType::F32, &Device::Cpu).unwrap();
        let mut runner = ModelRunner::new(loaded.model, cache, Device::Cpu).unwrap();
        prompt_logits(&mut runner, &[1, 2, 3, 4, 5])
    };
    let mut firsts = Vec::new();
    for format in [pagoda_ops::QuantFormat::Q4K, pagoda_ops::QuantFormat::Q8_0, pagoda_ops::QuantFormat::Q4_0]
    {
        let (blocks, dense) = (logits(format, false), logits(format, true));
        assert_eq!(blocks.len(), 49152);
        assert!(blocks.iter().all(|v| v.is_finite()), "{format:?}");
        let scale = dense.iter().fold(1e-6f32, |m, v| m.max(v.abs()));
        let worst = blocks.iter().zip(&dense).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        println!("{format:?}: blocks and dense differ by {worst} of {scale}");
        assert!(worst / scale < 1e-3, "{format:?}: blocks and dense differ by {worst} of {scale}");
        firsts.push(blocks[..16].to_vec());
    }
    assert_ne!(firsts[0], firsts[1]);
}

#[test]
fn auto_mode_dequantizes_small_gguf_models_only_when_asked_or_small() {
    let auto = load_model(&model_path(), &LoadOptions::default()).unwrap();
    assert!(!auto.model.is_quantized(), "a 135M model's f32 weights fit the auto budget");
    let forced = LoadOptions { dequantize: Some(false), ..LoadOptions::default() };
    assert!(load_model(&model_path(), &forced).unwrap().model.is_quantized());
}

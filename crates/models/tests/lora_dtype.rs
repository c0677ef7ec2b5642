//! How an f32 model stores LoRA adapters (`LoraDtype`, the server's `--lora-dtype`), on the tiny
//! llama with copies of scripts/tiny_lora.py's adapter `a` (rank 4, alpha 8: scale 2):
//!
//! - auto keeps a bfloat16 file in bfloat16, and its logits are bit for bit those of an f32
//!   file holding the same values (the kernels widen bfloat16 exactly and sum in f32), alone
//!   and in a step mixed with the base model and the f32 copy;
//! - auto keeps f32 where bfloat16 would change a value (scale 1.5, not a power of two), and
//!   float32 keeps f32 always;
//! - the same for GGUF adapters (llama.cpp's conversion of `a`, rewritten with BF16 and with
//!   F32 tensors of the same values);
//! - bfloat16 rounds an f32 file: within [`ROUNDED_TOLERANCE`] of the f32 adapter's logits, and
//!   exactly the bfloat16 copy's (same rounded values: the scale is a power of two).

mod common;

use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use common::*;
use pagoda_models::lora::LoraDtype;
use pagoda_models::ModelRunner;
use serde_json::Value;

/// Largest logit difference allowed between adapter `a` and its values rounded to bfloat16
/// (relative error up to 2^-9 per weight), as a fraction of the adapter's own largest effect on
/// a logit. The tiny llama's random weights amplify: measured 0.40 against an effect of 20.8 (1.9%).
const ROUNDED_TOLERANCE: f32 = 0.05;

fn tiny(path: &str) -> PathBuf {
    repo_root().join("tests/fixtures/tiny").join(path)
}

/// A copy of adapter `a` in `dir`: its values rounded to bfloat16, stored as `dtype`, with
/// `lora_alpha` set to `alpha`.
fn rounded_copy(dir: &Path, dtype: DType, alpha: u32) {
    let src = tiny("lora/a");
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("adapter_config.json")).unwrap()).unwrap();
    let mut config = config.as_object().unwrap().clone();
    config.insert("lora_alpha".into(), alpha.into());
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("adapter_config.json"), serde_json::to_string(&config).unwrap()).unwrap();
    let tensors =
        candle_core::safetensors::load(src.join("adapter_model.safetensors"), &Device::Cpu).unwrap();
    let rounded: std::collections::HashMap<String, Tensor> = tensors
        .into_iter()
        .map(|(k, t)| (k, t.to_dtype(DType::BF16).unwrap().to_dtype(dtype).unwrap()))
        .collect();
    candle_core::safetensors::save(&rounded, dir.join("adapter_model.safetensors")).unwrap();
}

fn runner_with(lora_dtype: LoraDtype, adapters: &[&Path]) -> ModelRunner {
    let mut runner = runner_for(&tiny("llama"), 64);
    runner.set_lora_dtype(lora_dtype);
    for (i, dir) in adapters.iter().enumerate() {
        runner.add_lora(i as u32 + 1, dir, 16).unwrap();
    }
    runner
}

/// Each position's logits of the short prompt, one token a step, under adapter `lora`.
fn logits(runner: &mut ModelRunner, lora: Option<u32>, seed: u64) -> Vec<Vec<f32>> {
    let reference: Value =
        serde_json::from_str(&std::fs::read_to_string(tiny("lora/reference.json")).unwrap()).unwrap();
    let prompt = ids(&reference["prompts"]["short"]);
    let mut seq = TestSeq::new(seed, prompt.clone(), 8 * seed as u32);
    (0..prompt.len())
        .map(|_| {
            let mut chunk = seq.chunk(1);
            chunk.lora = lora;
            let got = runner.logits(&batch(vec![chunk])).unwrap().to_vec2::<f32>().unwrap().remove(0);
            seq.computed += 1;
            got
        })
        .collect()
}

fn bits(rows: &[Vec<f32>]) -> Vec<Vec<u32>> {
    rows.iter().map(|r| r.iter().map(|v| v.to_bits()).collect()).collect()
}

#[test]
fn a_bfloat16_file_stays_bfloat16_and_gives_the_f32_bits() {
    let dir = tempfile::tempdir().unwrap();
    let (half, full) = (dir.path().join("bf16"), dir.path().join("f32"));
    rounded_copy(&half, DType::BF16, 8);
    rounded_copy(&full, DType::F32, 8);
    let mut runner = runner_with(LoraDtype::Auto, &[&half, &full]);
    assert_eq!(runner.model().lora_weight_dtype(1), Some(DType::BF16));
    assert_eq!(runner.model().lora_weight_dtype(2), Some(DType::F32));
    let (got, want) = (logits(&mut runner, Some(1), 1), logits(&mut runner, Some(2), 2));
    assert_eq!(bits(&got), bits(&want));
    let base = logits(&mut runner, None, 3);
    assert_ne!(bits(&got), bits(&base), "the adapter changes the logits");
    // One step of the whole prompt under the bfloat16 copy, the base model and the f32 copy.
    let reference: Value =
        serde_json::from_str(&std::fs::read_to_string(tiny("lora/reference.json")).unwrap()).unwrap();
    let prompt = ids(&reference["prompts"]["short"]);
    let chunks = [Some(1), None, Some(2)]
        .iter()
        .enumerate()
        .map(|(i, &lora)| {
            let mut chunk = TestSeq::new(10 + i as u64, prompt.clone(), 4 * i as u32).chunk(prompt.len());
            chunk.lora = lora;
            chunk
        })
        .collect();
    let rows = runner.logits(&batch(chunks)).unwrap().to_vec2::<f32>().unwrap();
    assert_eq!(
        rows[0].iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        rows[2].iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
    // float32 keeps the bfloat16 file in f32: the same bits again.
    let mut as_f32 = runner_with(LoraDtype::Float32, &[&half]);
    assert_eq!(as_f32.model().lora_weight_dtype(1), Some(DType::F32));
    assert_eq!(bits(&logits(&mut as_f32, Some(1), 1)), bits(&want));
}

#[test]
fn auto_keeps_f32_where_bfloat16_would_round() {
    // alpha 6 over rank 4: B times 1.5 needs a ninth significant bit.
    let dir = tempfile::tempdir().unwrap();
    let (half, full) = (dir.path().join("bf16"), dir.path().join("f32"));
    rounded_copy(&half, DType::BF16, 6);
    rounded_copy(&full, DType::F32, 6);
    let mut runner = runner_with(LoraDtype::Auto, &[&half, &full]);
    assert_eq!(runner.model().lora_weight_dtype(1), Some(DType::F32));
    assert_eq!(bits(&logits(&mut runner, Some(1), 1)), bits(&logits(&mut runner, Some(2), 2)));
}

#[test]
fn bfloat16_rounds_an_f32_adapter_within_tolerance() {
    let dir = tempfile::tempdir().unwrap();
    let half = dir.path().join("bf16");
    rounded_copy(&half, DType::BF16, 8);
    let original = tiny("lora/a");
    let mut f32_runner = runner_with(LoraDtype::Auto, &[&original]);
    assert_eq!(f32_runner.model().lora_weight_dtype(1), Some(DType::F32), "an f32 file stays f32");
    let mut rounded = runner_with(LoraDtype::Bfloat16, &[&original, &half]);
    assert_eq!(rounded.model().lora_weight_dtype(1), Some(DType::BF16));
    let (got, want) = (logits(&mut rounded, Some(1), 1), logits(&mut f32_runner, Some(1), 1));
    let worst =
        got.iter().flatten().zip(want.iter().flatten()).map(|(g, w)| (g - w).abs()).fold(0f32, f32::max);
    // The adapter's own effect: how far it moves a logit from the base model's.
    let base = logits(&mut f32_runner, None, 3);
    let effect =
        want.iter().flatten().zip(base.iter().flatten()).map(|(w, b)| (w - b).abs()).fold(0f32, f32::max);
    assert!(worst <= ROUNDED_TOLERANCE * effect, "logits off by {worst}, the adapter moves them by {effect}");
    assert!(worst > 0.0, "rounding changed nothing: the adapter was not rounded");
    eprintln!("bfloat16-rounded adapter: logits within {worst} of the f32 adapter's (effect {effect})");
    // The rounded values are the bfloat16 copy's (A's rounded, and 2 B's as 2 times B's).
    assert_eq!(bits(&got), bits(&logits(&mut rounded, Some(2), 2)));
}

/// llama.cpp's conversion of `a` rewritten to `path`: its tensors rounded to bfloat16 and
/// stored as `dtype` (BF16 or F32), its metadata as it was.
fn rounded_gguf(path: &Path, dtype: candle_core::quantized::GgmlDType) {
    use candle_core::quantized::{gguf_file, QTensor};
    let src = tiny("lora/a.gguf");
    let mut file = std::fs::File::open(&src).unwrap();
    let content = gguf_file::Content::read(&mut file).unwrap();
    let tensors: Vec<(String, QTensor)> = content
        .tensor_infos
        .keys()
        .map(|name| {
            let t = content.tensor(&mut file, name, &Device::Cpu).unwrap().dequantize(&Device::Cpu).unwrap();
            let rounded = t.to_dtype(DType::BF16).unwrap().to_dtype(DType::F32).unwrap();
            (name.clone(), QTensor::quantize(&rounded, dtype).unwrap())
        })
        .collect();
    let metadata: Vec<(&str, &gguf_file::Value)> =
        content.metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensors: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, t)| (k.as_str(), t)).collect();
    let mut out = std::fs::File::create(path).unwrap();
    gguf_file::write(&mut out, &metadata, &tensors).unwrap();
}

#[test]
fn a_bfloat16_gguf_adapter_stays_bfloat16_and_gives_the_f32_bits() {
    use candle_core::quantized::GgmlDType;
    let dir = tempfile::tempdir().unwrap();
    let (half, full) = (dir.path().join("bf16.gguf"), dir.path().join("f32.gguf"));
    rounded_gguf(&half, GgmlDType::BF16);
    rounded_gguf(&full, GgmlDType::F32);
    let mut runner = runner_with(LoraDtype::Auto, &[&half, &full, &tiny("lora/a.gguf")]);
    assert_eq!(runner.model().lora_weight_dtype(1), Some(DType::BF16));
    assert_eq!(runner.model().lora_weight_dtype(2), Some(DType::F32));
    let got = logits(&mut runner, Some(1), 1);
    assert_eq!(bits(&got), bits(&logits(&mut runner, Some(2), 2)));
    assert_ne!(bits(&got), bits(&logits(&mut runner, Some(3), 3)), "the copies' values are rounded");
}

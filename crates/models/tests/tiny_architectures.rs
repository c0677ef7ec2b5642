//! Every architecture against Hugging Face transformers on a tiny random-weight checkpoint
//! (tests/fixtures/tiny, made by scripts/tiny_models.py; the reference is transformers' own
//! forward pass in float64): loaded from the safetensors directory (with its legacy config keys,
//! and with transformers 5's `rope_parameters` only) and from the GGUF conversion, run through
//! the paged runner token by token, as whole prompts, and batched together, with greedy
//! continuations compared exactly.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use pagoda_models::ModelRunner;
use serde_json::Value;

const MODELS: [&str; 9] =
    ["llama", "qwen2", "qwen3", "qwen3_moe", "mixtral", "phi3", "gemma2", "mistral", "gemma3_text"];

fn dir(name: &str) -> PathBuf {
    repo_root().join("tests/fixtures/tiny").join(name)
}

fn reference(name: &str) -> Value {
    let path = dir(name).join("reference.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

/// Gemma 2's attention was sharpened so its soft cap matters, which magnifies f32 rounding
/// (its own f32-vs-f64 deviation is 4e-4).
fn tolerance(name: &str) -> f32 {
    if name == "gemma2" {
        5e-4
    } else {
        1e-4
    }
}

fn assert_close(what: &str, ours: &[f32], reference: &[f32], tolerance: f32) -> f32 {
    assert_eq!(ours.len(), reference.len(), "{what}: vocabulary size");
    let (i, diff) = ours
        .iter()
        .zip(reference)
        .map(|(a, b)| (a - b).abs())
        .enumerate()
        .fold((0, 0f32), |best, (i, d)| if d > best.1 { (i, d) } else { best });
    assert!(
        diff <= tolerance,
        "{what}: logit {i} is {} against {} (tolerance {tolerance})",
        ours[i],
        reference[i]
    );
    diff
}

/// Each prompt fed one token per step (every position's logits), then the whole prompt at once,
/// then all prompts in one batch; and the greedy continuation.
fn check_runner(name: &str, how: &str, runner: &mut ModelRunner) {
    let reference = reference(name);
    let tol = tolerance(name);
    let prompts = reference["prompts"].as_array().unwrap();
    let mut lasts = Vec::new();
    let mut worst = 0f32;
    for prompt in prompts {
        let pname = prompt["name"].as_str().unwrap();
        let ids = ids(&prompt["ids"]);
        let expected = rows(&prompt["logits"]);
        let mut seq = TestSeq::on(runner, 1, ids.clone());
        for (pos, row) in expected.iter().enumerate() {
            let got = runner.logits(&batch(vec![seq.chunk(1)])).unwrap().to_vec2::<f32>().unwrap().remove(0);
            seq.computed += 1;
            assert_close(
                &format!("{name} ({how}) {pname} position {pos}, one token per step"),
                &got,
                row,
                tol,
            );
        }
        let (last, greedy) = greedy(runner, &ids, prompt["greedy"].as_array().unwrap().len());
        assert_close(&format!("{name} ({how}) {pname} whole prompt"), &last, expected.last().unwrap(), tol);
        assert_eq!(greedy, common::ids(&prompt["greedy"]), "{name} ({how}) {pname}: greedy continuation");
        lasts.push(expected.last().unwrap().clone());
    }
    // All prompts in one step, each in its own blocks of every KV group.
    let groups = runner.cache().layout().num_groups();
    let stride = (runner.cache().num_blocks() / groups) as u32;
    let seqs: Vec<TestSeq> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| TestSeq::grouped(i as u64 + 1, ids(&p["ids"]), 4 * i as u32, groups, stride))
        .collect();
    let out = runner.logits(&batch(seqs.iter().map(|s| s.chunk(s.tokens.len())).collect())).unwrap();
    for (i, (got, want)) in out.to_vec2::<f32>().unwrap().iter().zip(&lasts).enumerate() {
        worst = worst.max(assert_close(&format!("{name} ({how}) prompt {i} in a batch"), got, want, tol));
    }
    eprintln!("{name} ({how}): largest logit difference {worst:.1e}");
}

/// A copy of the checkpoint whose config keeps only transformers 5's `rope_parameters`.
fn without_legacy_rope_keys(name: &str, into: &Path) -> PathBuf {
    let src = dir(name);
    let out = into.join(name);
    std::fs::create_dir_all(&out).unwrap();
    std::fs::copy(src.join("model.safetensors"), out.join("model.safetensors")).unwrap();
    let mut config: Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    let map = config.as_object_mut().unwrap();
    assert!(map.contains_key("rope_parameters"), "{name}: config has rope_parameters");
    for key in ["rope_theta", "rope_scaling", "rope_local_base_freq", "partial_rotary_factor"] {
        map.remove(key);
    }
    std::fs::write(out.join("config.json"), serde_json::to_string(&config).unwrap()).unwrap();
    out
}

#[test]
fn tiny_checkpoints_match_transformers_from_safetensors_and_gguf() {
    let scratch = tempfile::tempdir().unwrap();
    for name in MODELS {
        check_runner(name, "safetensors", &mut runner_for(&dir(name), 128));
        check_runner(
            name,
            "rope_parameters",
            &mut runner_for(&without_legacy_rope_keys(name, scratch.path()), 128),
        );
        check_runner(name, "gguf", &mut runner_for(&dir(name).join("model.gguf"), 128));
    }
}

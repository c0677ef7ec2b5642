//! Split GGUF files (`-00001-of-0000N.gguf`, as llama.cpp's `gguf-split` writes them): the
//! default model rewritten as three parts loads from its first part and gives exactly the
//! logits of the whole file; wrong or missing parts are clear errors.

mod common;

use std::path::{Path, PathBuf};

use candle_core::quantized::{gguf_file, QTensor};
use candle_core::Device;
use common::*;
use pagoda_models::{load_model, LoadOptions};

const PARTS: usize = 3;

/// Writes the default model as `PARTS` files in `dir`: metadata (plus the split keys) in the
/// first, tensors dealt round-robin over all of them. Returns the parts' paths.
fn write_split(dir: &Path) -> Vec<PathBuf> {
    let path = model_path();
    let mut file = std::fs::File::open(&path).unwrap();
    let content = gguf_file::Content::read(&mut file).unwrap();
    let mut names: Vec<&String> = content.tensor_infos.keys().collect();
    names.sort();
    let tensors: Vec<(String, QTensor)> =
        names.iter().map(|n| ((*n).clone(), content.tensor(&mut file, n, &Device::Cpu).unwrap())).collect();
    let count = gguf_file::Value::U16(PARTS as u16);
    let total = gguf_file::Value::I32(tensors.len() as i32);
    (0..PARTS)
        .map(|part| {
            let number = gguf_file::Value::U16(part as u16);
            let mut metadata: Vec<(&str, &gguf_file::Value)> =
                vec![("split.no", &number), ("split.count", &count), ("split.tensors.count", &total)];
            if part == 0 {
                metadata.extend(content.metadata.iter().map(|(k, v)| (k.as_str(), v)));
            }
            let mine: Vec<(&str, &QTensor)> = tensors
                .iter()
                .enumerate()
                .filter(|(i, _)| i % PARTS == part)
                .map(|(_, (n, t))| (n.as_str(), t))
                .collect();
            let out = dir.join(format!("smol-{:05}-of-{PARTS:05}.gguf", part + 1));
            gguf_file::write(&mut std::fs::File::create(&out).unwrap(), &metadata, &mine).unwrap();
            out
        })
        .collect()
}

fn load_error(path: &Path) -> String {
    match load_model(path, &LoadOptions::default()) {
        Ok(_) => panic!("{} loaded", path.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn split_parts_load_as_one_model_with_identical_logits() {
    let dir = tempfile::tempdir().unwrap();
    let parts = write_split(dir.path());
    let prompt: Vec<u32> = vec![1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173];
    let (whole, _) = greedy(&mut runner_for(&model_path(), 16), &prompt, 4);
    let (split, _) = greedy(&mut runner_for(&parts[0], 16), &prompt, 4);
    assert_eq!(whole, split, "the split model's logits differ from the whole file's");

    let e = load_error(&parts[1]);
    assert!(e.contains("pass the first part") && e.contains("-00001-of-00003.gguf"), "{e}");
    std::fs::remove_file(&parts[2]).unwrap();
    let e = load_error(&parts[0]);
    assert!(
        e.contains("split part") && e.contains("smol-00003-of-00003.gguf") && e.contains("missing"),
        "{e}"
    );
}

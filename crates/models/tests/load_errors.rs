//! Bad model inputs give one clear error naming the file and the problem, never a panic.

mod common;

use std::collections::HashMap;

use candle_core::quantized::gguf_file;
use candle_core::{DType, Device, Tensor};
use pagoda_models::{load_model, LoadOptions};

fn load_error(path: &std::path::Path) -> String {
    match load_model(path, &LoadOptions::default()) {
        Ok(_) => panic!("{} loaded but should not have", path.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn missing_file_names_the_path() {
    let e = load_error(std::path::Path::new("/nonexistent/model.gguf"));
    assert!(e.contains("/nonexistent/model.gguf") && e.contains("no such file"), "{e}");
}

#[test]
fn truncated_gguf_is_reported_as_truncated() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cut.gguf");
    let bytes = std::fs::read(common::model_path()).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    let e = load_error(&path);
    assert!(e.contains("cut.gguf") && e.contains("truncated"), "{e}");

    // Cut inside the header: the metadata itself cannot be read.
    std::fs::write(&path, &bytes[..1000]).unwrap();
    let e = load_error(&path);
    assert!(e.contains("cut.gguf") && e.contains("not a readable GGUF"), "{e}");

    std::fs::write(&path, b"this is not a gguf file at all").unwrap();
    let e = load_error(&path);
    assert!(e.contains("cut.gguf") && e.contains("not a readable GGUF"), "{e}");
}

#[test]
fn unsupported_architecture_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gpt2.gguf");
    let mut file = std::fs::File::create(&path).unwrap();
    let arch = gguf_file::Value::String("gpt2".into());
    gguf_file::write(&mut file, &[("general.architecture", &arch)], &[]).unwrap();
    drop(file);
    let e = load_error(&path);
    assert!(e.contains("gpt2.gguf") && e.contains("unsupported architecture `gpt2`"), "{e}");
}

#[test]
fn unsupported_safetensors_dtype_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let config = r#"{"model_type":"llama","vocab_size":16,"hidden_size":8,"intermediate_size":16,
        "num_hidden_layers":1,"num_attention_heads":2,"num_key_value_heads":1,"max_position_embeddings":32}"#;
    std::fs::write(dir.path().join("config.json"), config).unwrap();
    let embed = Tensor::zeros((16, 8), DType::I64, &Device::Cpu).unwrap();
    let tensors = HashMap::from([("model.embed_tokens.weight".to_string(), embed)]);
    candle_core::safetensors::save(&tensors, dir.path().join("model.safetensors")).unwrap();
    let e = load_error(dir.path());
    assert!(
        e.contains("model.embed_tokens.weight") && e.contains("unsupported dtype") && e.contains("I64"),
        "{e}"
    );
}

/// `batch_invariant` combinations without kernels are refused before any weight is read: half
/// precision on the CPU (CUDA's dtypes) and candle's quantized matmul anywhere.
#[test]
fn batch_invariant_without_kernels_is_refused() {
    let refused = |dtype: DType, dequantize: Option<bool>| {
        let kernel_plan = pagoda_models::KernelPlan::batch_invariant(pagoda_models::PanelPrecision::F32);
        let options = LoadOptions { kernel_plan, dtype, dequantize, ..LoadOptions::default() };
        match load_model(&common::model_path(), &options) {
            Ok(_) => panic!("batch-invariant {dtype:?} {dequantize:?} loaded"),
            Err(e) => e.to_string(),
        }
    };
    for dtype in [DType::BF16, DType::F16] {
        let e = refused(dtype, None);
        assert!(e.contains("batch-invariant") && e.contains("float32 on the CPU"), "{e}");
    }
    let e = refused(DType::F32, Some(false));
    assert!(e.contains("batch-invariant") && e.contains("needs dequantized weights"), "{e}");
}

//! Helpers shared by the integration tests: locating the real model, temp dirs, and writing
//! small GGUF files.

// Each test binary compiles this module and uses only part of it.
#![allow(dead_code)]

use std::path::PathBuf;

use pagoda_text::Tokenizer;

/// The default model, fetched by `scripts/fetch-model.sh`. Tests fail (never skip) without it.
pub fn model_path() -> PathBuf {
    models_file("SmolLM2-135M-Instruct.Q4_1.gguf", "scripts/fetch-model.sh")
}

/// Gemma 3 270M (a SentencePiece vocabulary), fetched by `scripts/fetch-model.sh gemma3`. Tests
/// fail (never skip) without it.
pub fn gemma3_path() -> PathBuf {
    models_file("gemma-3-270m-q4_k_m.gguf", "scripts/fetch-model.sh gemma3")
}

/// `models/<name>` at the repository root; panics, naming the `fetch` command, if it is missing.
fn models_file(name: &str, fetch: &str) -> PathBuf {
    // Cargo's run-time value: a test binary reused from a build in another checkout still
    // carries that checkout's compile-time path.
    let path = std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from)
        .join("../../models")
        .join(name);
    assert!(path.is_file(), "{} is missing: run {fetch} to download the test model", path.display());
    path
}

/// The tokenizer of the default model.
pub fn smollm2() -> Tokenizer {
    Tokenizer::from_gguf(model_path()).expect("the default model's tokenizer loads")
}

/// The tokenizer of Gemma 3 270M.
pub fn gemma3() -> Tokenizer {
    Tokenizer::from_gguf(gemma3_path()).expect("Gemma 3's tokenizer loads")
}

/// A fresh, empty directory under the system temp dir, unique to this process and `name`.
pub fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("pagoda-text-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// Writes a minimal GGUF v3 file holding only the given metadata.
pub struct GgufWriter {
    bytes: Vec<u8>,
    count: u64,
}

impl GgufWriter {
    pub fn new() -> Self {
        Self { bytes: Vec::new(), count: 0 }
    }

    fn string_raw(&mut self, s: &str) {
        self.bytes.extend_from_slice(&(s.len() as u64).to_le_bytes());
        self.bytes.extend_from_slice(s.as_bytes());
    }

    fn key(&mut self, key: &str, ty: u32) {
        self.count += 1;
        self.string_raw(key);
        self.bytes.extend_from_slice(&ty.to_le_bytes());
    }

    pub fn str(mut self, key: &str, value: &str) -> Self {
        self.key(key, 8);
        self.string_raw(value);
        self
    }

    pub fn u32(mut self, key: &str, value: u32) -> Self {
        self.key(key, 4);
        self.bytes.extend_from_slice(&value.to_le_bytes());
        self
    }

    pub fn bool(mut self, key: &str, value: bool) -> Self {
        self.key(key, 7);
        self.bytes.push(u8::from(value));
        self
    }

    pub fn strs(mut self, key: &str, values: &[String]) -> Self {
        self.key(key, 9);
        self.bytes.extend_from_slice(&8u32.to_le_bytes());
        self.bytes.extend_from_slice(&(values.len() as u64).to_le_bytes());
        for v in values {
            self.string_raw(v);
        }
        self
    }

    pub fn i32s(mut self, key: &str, values: &[i32]) -> Self {
        self.key(key, 9);
        self.bytes.extend_from_slice(&5u32.to_le_bytes());
        self.bytes.extend_from_slice(&(values.len() as u64).to_le_bytes());
        for v in values {
            self.bytes.extend_from_slice(&v.to_le_bytes());
        }
        self
    }

    pub fn f32s(mut self, key: &str, values: &[f32]) -> Self {
        self.key(key, 9);
        self.bytes.extend_from_slice(&6u32.to_le_bytes());
        self.bytes.extend_from_slice(&(values.len() as u64).to_le_bytes());
        for v in values {
            self.bytes.extend_from_slice(&v.to_le_bytes());
        }
        self
    }

    pub fn write(self, path: &std::path::Path) {
        let mut out = b"GGUF".to_vec();
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(&0u64.to_le_bytes());
        out.extend_from_slice(&self.count.to_le_bytes());
        out.extend_from_slice(&self.bytes);
        std::fs::write(path, out).expect("write gguf");
    }
}

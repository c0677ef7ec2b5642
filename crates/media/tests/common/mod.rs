//! Shared helpers of the integration tests: the fixture directory written by
//! scripts/tiny_media.py and its manifest.

#![allow(dead_code)]

use std::path::PathBuf;

use pagoda_media::RgbImage;
use serde_json::Value;

pub fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/media")
}

pub fn read(rel: &str) -> Vec<u8> {
    let path = fixtures().join(rel);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e} (run scripts/tiny_media.py)", path.display()))
}

pub fn manifest() -> Value {
    serde_json::from_slice(&read("manifest.json")).expect("manifest.json")
}

/// PIL's own decode + `convert_to_rgb` of a fixture image (the processors' input).
pub fn pil_rgb(name: &str) -> RgbImage {
    let m = manifest();
    let info = &m["images"][name];
    let (w, h) = (info["width"].as_u64().unwrap() as u32, info["height"].as_u64().unwrap() as u32);
    RgbImage::from_raw(w, h, read(info["decoded"].as_str().unwrap())).expect("decoded size")
}

pub fn f32_le_bytes(data: &[f32]) -> Vec<u8> {
    data.iter().flat_map(|v| v.to_le_bytes()).collect()
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

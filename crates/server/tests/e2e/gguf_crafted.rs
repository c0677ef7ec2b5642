//! Crafted model GGUFs through the real binary: `pagoda serve --model crafted.gguf` with
//! `general.alignment = 0`, `block_count` 2^33, `context_length` 2^62 or a NaN
//! `rms_norm_eps` exits at once with a clear error (no panic, no abort, no server that passes
//! `/health` and then fails every request), while a harmless change serves as before. The files
//! are the tiny llama's GGUF with one metadata entry replaced by [`with_metadata`]; the full
//! crafted set runs at the loader (crates/models/tests/crafted_gguf.rs).

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Result;
use serde_json::json;

use crate::harness::{client, post_json, TestServer};
use crate::lora::tiny;

/// GGUF value types.
pub(crate) const U32: u32 = 4;
pub(crate) const F32: u32 = 6;
pub(crate) const U64: u32 = 10;

fn entry(key: &str, value_type: u32, value: &[u8]) -> Vec<u8> {
    let mut out = (key.len() as u64).to_le_bytes().to_vec();
    out.extend(key.as_bytes());
    out.extend(value_type.to_le_bytes());
    out.extend(value);
    out
}

/// `gguf` (version 2 or 3, tensor data aligned to 32) with metadata `key` set to `value` of
/// `value_type`: an existing entry is renamed out of the way (its last letter becomes `~`) and
/// the new one goes first, with a filler entry that keeps the tensor data where it was aligned.
pub(crate) fn with_metadata(gguf: &[u8], key: &str, value_type: u32, value: &[u8]) -> Vec<u8> {
    let mut bytes = gguf.to_vec();
    let old = entry(key, value_type, &[]);
    let old = &old[..old.len() - 4];
    if let Some(at) = bytes.windows(old.len()).position(|w| w == old) {
        bytes[at + old.len() - 1] = b'~';
    }
    let mut inserted = entry(key, value_type, value);
    let filler_key = "pagoda.filler";
    let filler_fixed = 8 + filler_key.len() + 4 + 8;
    let pad = (32 - (inserted.len() + filler_fixed) % 32) % 32;
    let mut filler = (pad as u64).to_le_bytes().to_vec();
    filler.extend(vec![b' '; pad]);
    inserted.extend(entry(filler_key, 8, &filler));
    let kv_count = u64::from_le_bytes(bytes[16..24].try_into().unwrap()) + 2;
    bytes[16..24].copy_from_slice(&kv_count.to_le_bytes());
    bytes.splice(24..24, inserted);
    bytes
}

/// A child process killed when dropped, so that a failing test leaves no server behind (it
/// would hold whatever the test process holds, such as a build lock).
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Runs `pagoda serve --model model`; its exit code and stderr once it exits, or an error when
/// it is still running after a minute (it is killed then).
fn serve_exit(model: &Path) -> Result<(Option<i32>, String)> {
    let mut child = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_pagoda"))
            .args(["serve", "--model", model.to_str().unwrap(), "--port", "0", "--kv-cache-memory", "16MiB"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()?,
    );
    let started = Instant::now();
    while child.0.try_wait()?.is_none() {
        if started.elapsed() > Duration::from_secs(60) {
            anyhow::bail!("{} started serving", model.display());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut stderr = String::new();
    child.0.stderr.take().expect("piped").read_to_string(&mut stderr)?;
    Ok((child.0.wait()?.code(), stderr))
}

#[test]
fn crafted_model_ggufs_exit_with_a_clear_error() -> Result<()> {
    let base = std::fs::read(tiny("llama/model.gguf"))?;
    let dir = tempfile::tempdir()?;
    let cases = [
        ("general.alignment", U32, 0u32.to_le_bytes().to_vec()),
        ("llama.block_count", U64, (1u64 << 33).to_le_bytes().to_vec()),
        ("llama.context_length", U64, (1u64 << 62).to_le_bytes().to_vec()),
        ("llama.attention.layer_norm_rms_epsilon", F32, f32::NAN.to_le_bytes().to_vec()),
    ];
    for (key, value_type, value) in cases {
        let path = dir.path().join("crafted.gguf");
        std::fs::write(&path, with_metadata(&base, key, value_type, &value))?;
        let (code, stderr) = serve_exit(&path)?;
        assert_eq!(code, Some(1), "{key}: exit {code:?} (none: a signal)\n{stderr}");
        assert!(stderr.contains(key) && !stderr.contains("panicked"), "{key}:\n{stderr}");
    }
    Ok(())
}

/// The rewriting itself keeps a model sound: a harmless change serves.
#[tokio::test]
async fn a_harmless_metadata_change_still_serves() -> Result<()> {
    let base = std::fs::read(tiny("llama/model.gguf"))?;
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("renamed.gguf");
    let name = "crafted".as_bytes();
    let mut value = (name.len() as u64).to_le_bytes().to_vec();
    value.extend(name);
    std::fs::write(&path, with_metadata(&base, "general.name", 8, &value))?;
    let server = TestServer::start_with_model(path.to_str().unwrap(), &["--max-model-len", "256"]);
    let body = json!({"model": "smol", "prompt": "hello", "max_tokens": 8, "ignore_eos": true});
    let (status, reply) = post_json(&client(), &server.url("/v1/completions"), &body).await?;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["usage"]["completion_tokens"], 8);
    server.signal_stop();
    Ok(())
}

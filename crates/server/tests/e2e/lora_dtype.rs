//! How the server stores LoRA adapters on an f32 model (`--lora-dtype`), through `pagoda serve`
//! on the tiny llama with copies of scripts/tiny_lora.py's adapter `a` (rank 4, alpha 8: scale
//! 2) whose values are rounded to bfloat16, one copy stored as BF16 and one as F32:
//!
//! - by default (auto) the BF16 copy stays bfloat16, and its greedy text and logprobs are exactly
//!   the F32 copy's: the kernels widen bfloat16 to f32 exactly and sum in f32, so the same
//!   values give the same bits; also for the BF16 copy loaded while serving;
//! - `--lora-dtype bfloat16` rounds the f32 adapter `a` to exactly the BF16 copy's values
//!   (round to nearest; the scale 2 commutes with rounding), so it answers as the copies do,
//!   and its first token's logprobs stay within [`ROUNDED_LOGPROB_TOLERANCE`] of the f32 `a`'s;
//! - a bad value is refused by the parser, and the flag without `--enable-lora` at start-up.

use anyhow::Result;
use clap::Parser;
use pagoda_server::config::ServerConfig;
use serde_json::{json, Value};

use crate::harness::{client, post_json, Cli, TestServer};
use crate::lora::tiny;

/// How far a top-3 logprob of the first generated token may move when `a`'s weights are
/// rounded to bfloat16 (relative error up to 2^-9 each). The tiny llama's random weights make
/// the adapter move logits by up to 20, so its rounding shows: measured 0.05.
const ROUNDED_LOGPROB_TOLERANCE: f64 = 0.2;

/// Rounds an f32 to the nearest bfloat16 (ties to even), as its bits.
fn to_bf16(v: f32) -> u16 {
    let bits = v.to_bits();
    ((bits + 0x7fff + ((bits >> 16) & 1)) >> 16) as u16
}

/// A copy of adapter `a` in `dir`, its F32 values rounded to bfloat16 and stored as `dtype`
/// ("BF16" or "F32"): the safetensors file rewritten by hand (8-byte header length, JSON
/// header, data).
fn rounded_copy(dir: &std::path::Path, dtype: &str) -> Result<String> {
    let src = std::path::PathBuf::from(tiny("lora/a"));
    std::fs::create_dir_all(dir)?;
    std::fs::copy(src.join("adapter_config.json"), dir.join("adapter_config.json"))?;
    let bytes = std::fs::read(src.join("adapter_model.safetensors"))?;
    let n = u64::from_le_bytes(bytes[..8].try_into()?) as usize;
    let header: serde_json::Map<String, Value> = serde_json::from_slice(&bytes[8..8 + n])?;
    let data = &bytes[8 + n..];
    let (mut out_header, mut out_data) = (serde_json::Map::new(), Vec::new());
    for (name, info) in &header {
        if name == "__metadata__" {
            out_header.insert(name.clone(), info.clone());
            continue;
        }
        anyhow::ensure!(info["dtype"] == "F32", "{name} is not F32");
        let range = &info["data_offsets"];
        let (start, end) = (range[0].as_u64().unwrap() as usize, range[1].as_u64().unwrap() as usize);
        let first = out_data.len();
        for chunk in data[start..end].chunks_exact(4) {
            let half = to_bf16(f32::from_le_bytes(chunk.try_into()?));
            match dtype {
                "BF16" => out_data.extend_from_slice(&half.to_le_bytes()),
                _ => out_data.extend_from_slice(&((half as u32) << 16).to_le_bytes()),
            }
        }
        out_header.insert(
            name.clone(),
            json!({"dtype": dtype, "shape": info["shape"], "data_offsets": [first, out_data.len()]}),
        );
    }
    let header = serde_json::to_vec(&out_header)?;
    let mut file = (header.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(&header);
    file.extend_from_slice(&out_data);
    std::fs::write(dir.join("adapter_model.safetensors"), file)?;
    Ok(dir.display().to_string())
}

/// The greedy text and logprobs of `model` on the reference's long prompt.
async fn answer(server: &TestServer, model: &str) -> Result<Value> {
    let reference: Value = serde_json::from_str(&std::fs::read_to_string(tiny("lora/reference.json"))?)?;
    let body = json!({"model": model, "prompt": reference["prompts"]["long"], "max_tokens": 12,
                      "logprobs": 3, "temperature": 0, "ignore_eos": true});
    let (status, reply) = post_json(&client(), &server.url("/v1/completions"), &body).await?;
    anyhow::ensure!(status == 200, "{model}: {reply}");
    Ok(json!([reply["choices"][0]["text"], reply["choices"][0]["logprobs"]]))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bfloat16_adapters_answer_as_f32_ones_of_the_same_values() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let half = rounded_copy(&dir.path().join("bf16"), "BF16")?;
    let full = rounded_copy(&dir.path().join("f32"), "F32")?;
    let modules = [format!("h={half}"), format!("f={full}"), format!("a={}", tiny("lora/a"))];
    let dirs = dir.path().display().to_string();
    let mut flags = vec!["--max-model-len", "256", "--enable-lora", "--lora-modules"];
    flags.extend(modules.iter().map(String::as_str));
    flags.extend(["--max-loras", "1", "--max-cpu-loras", "4", "--allow-runtime-lora-updating"]);
    flags.extend(["--lora-dirs", &dirs]);
    let server = TestServer::start_with_model(&tiny("llama"), &flags);
    // One request at a time: each runs alone, in steps of the same shapes.
    let (h, f, a, base) = (
        answer(&server, "h").await?,
        answer(&server, "f").await?,
        answer(&server, "a").await?,
        answer(&server, "smol").await?,
    );
    assert_eq!(h, f, "a bfloat16 file against an f32 file of the same values");
    assert_ne!(h[1], base[1], "the adapter changes the logprobs");
    assert_ne!(h[1], a[1], "the copies' values are rounded");
    // Loaded while serving: the same reader, the same storage.
    let load = json!({"lora_name": "r", "lora_path": half});
    let resp = client().post(server.url("/v1/load_lora_adapter")).json(&load).send().await?;
    assert_eq!(resp.status(), 200, "{}", resp.text().await?);
    assert_eq!(answer(&server, "r").await?, f, "loaded while serving");
    server.signal_stop();

    // `--lora-dtype bfloat16` over the f32 adapter: its rounded values are the copies'.
    let a_flag = format!("a={}", tiny("lora/a"));
    let flags =
        ["--max-model-len", "256", "--enable-lora", "--lora-modules", &a_flag, "--lora-dtype", "bfloat16"];
    let rounded_server = TestServer::start_with_model(&tiny("llama"), &flags);
    let rounded = answer(&rounded_server, "a").await?;
    assert_eq!(rounded, f, "--lora-dtype bfloat16 on the f32 adapter against its bfloat16 copy");
    rounded_server.signal_stop();
    // Against the f32 adapter: the first token's top logprobs, token by token.
    let first = |v: &Value| v[1]["top_logprobs"][0].as_object().cloned().unwrap_or_default();
    let (got, want) = (first(&rounded), first(&a));
    assert!(!want.is_empty(), "{a}");
    let mut worst = 0f64;
    for (token, w) in &want {
        if let Some(g) = got.get(token) {
            worst = worst.max((g.as_f64().unwrap() - w.as_f64().unwrap()).abs());
        }
    }
    eprintln!("--lora-dtype bfloat16: first-token top logprobs within {worst} of the f32 adapter's");
    assert!(worst <= ROUNDED_LOGPROB_TOLERANCE, "{rounded} against {a}");
    Ok(())
}

#[test]
fn bad_lora_dtypes_are_refused() -> Result<()> {
    let model = tiny("llama");
    let parse = |extra: &[&str]| {
        let mut argv = vec!["pagoda", "--model", &model, "--max-model-len", "256"];
        argv.extend_from_slice(extra);
        Cli::try_parse_from(argv)
    };
    let err = parse(&["--enable-lora", "--lora-dtype", "float8"]).err().map(|e| e.to_string());
    assert!(err.as_deref().is_some_and(|e| e.contains("--lora-dtype") && e.contains("bfloat16")), "{err:?}");
    let off = ServerConfig::from_args(parse(&["--lora-dtype", "bfloat16"])?.args);
    let message = off.err().map(|e| e.to_string());
    assert!(
        message.as_deref().is_some_and(|e| e.contains("--lora-dtype") && e.contains("--enable-lora")),
        "{message:?}"
    );
    assert!(ServerConfig::from_args(parse(&["--enable-lora", "--lora-dtype", "bf16"])?.args).is_ok());
    Ok(())
}

//! Run-time LoRA loads of hostile files, on the tiny llama with `--lora-dirs` a fresh directory:
//! `adapter_config.json` or the weights symlinked to `/dev/urandom` or `/dev/zero`, a FIFO in
//! their place, symlinks leaving `--lora-dirs`, a GGUF adapter with `general.alignment = 0` and
//! a safetensors header that claims more than the file holds are each a quick 400 whose message
//! names no path, while generation goes on and the engine keeps serving; a load whose client
//! gives up leaves no adapter behind, half-loaded or orphaned.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::Result;
use serde_json::{json, Value};

use crate::gguf_crafted::{with_metadata, U32};
use crate::harness::{assert_error_shape, client, post_json, TestServer};
use crate::lora::tiny;

/// The directory `--lora-dirs` allows (with the PID: the messages must not show it).
fn root() -> &'static Path {
    static ROOT: OnceLock<PathBuf> = OnceLock::new();
    ROOT.get_or_init(|| {
        // A static is never dropped, so each run clears the directories of runs that have ended.
        let stale = std::fs::read_dir(std::env::temp_dir()).into_iter().flatten().flatten().filter(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.strip_prefix("pagoda-lora-hostile-")
                .is_some_and(|pid| !Path::new("/proc").join(pid).exists())
        });
        for entry in stale {
            let _ = std::fs::remove_dir_all(entry.path());
        }
        let root = std::env::temp_dir().join(format!("pagoda-lora-hostile-{}", std::process::id()));
        std::fs::create_dir_all(&root).unwrap();
        root
    })
}

fn server() -> &'static TestServer {
    static SERVER: OnceLock<TestServer> = OnceLock::new();
    SERVER.get_or_init(|| {
        let dirs = root().display().to_string();
        let flags = [
            "--max-model-len",
            "256",
            "--enable-lora",
            "--max-loras",
            "2",
            "--max-cpu-loras",
            "8",
            "--max-lora-rank",
            "65536",
            "--allow-runtime-lora-updating",
            "--lora-dirs",
            &dirs,
        ];
        TestServer::start_with_model(&tiny("llama"), &flags)
    })
}

/// One file of an adapter directory.
enum Source {
    /// A copy of adapter a's file.
    Copy,
    Symlink(PathBuf),
    Fifo,
    Bytes(Vec<u8>),
}

/// Adapter directory `name` under the root with its config and weights as given.
fn adapter_dir(name: &str, config: Source, weights: Source) -> String {
    let dir = root().join(name);
    std::fs::create_dir_all(&dir).unwrap();
    for (file, source) in [("adapter_config.json", config), ("adapter_model.safetensors", weights)] {
        let path = dir.join(file);
        let _ = std::fs::remove_file(&path);
        match source {
            Source::Copy => drop(std::fs::copy(Path::new(&tiny("lora/a")).join(file), &path).unwrap()),
            Source::Symlink(target) => std::os::unix::fs::symlink(target, &path).unwrap(),
            Source::Fifo => {
                assert!(std::process::Command::new("mkfifo").arg(&path).status().unwrap().success())
            }
            Source::Bytes(bytes) => std::fs::write(&path, bytes).unwrap(),
        }
    }
    dir.display().to_string()
}

async fn load(name: &str, path: &str) -> Result<(u16, Value, Duration)> {
    let started = Instant::now();
    let body = json!({"lora_name": name, "lora_path": path});
    let resp = client().post(server().url("/v1/load_lora_adapter")).json(&body).send().await?;
    let status = resp.status().as_u16();
    let text = resp.text().await?;
    let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
    Ok((status, value, started.elapsed()))
}

async fn unload(name: &str) -> Result<u16> {
    let body = json!({"lora_name": name});
    Ok(client().post(server().url("/v1/unload_lora_adapter")).json(&body).send().await?.status().as_u16())
}

/// A 400 about `lora_path` within five seconds, whose message shows no path, PID or backtrace.
fn assert_refused(case: &str, (status, reply, took): &(u16, Value, Duration)) -> String {
    assert_eq!(*status, 400, "{case}: {reply}");
    assert!(*took < Duration::from_secs(5), "{case}: answered after {took:?}");
    let error = assert_error_shape(reply);
    assert_eq!(error["param"], "lora_path", "{case}: {reply}");
    let message = error["message"].as_str().unwrap().to_owned();
    let root = root().display().to_string();
    for leak in [root.as_str(), "/dev/", "/tmp", "panicked", "backtrace", "RUST_BACKTRACE"] {
        assert!(!message.contains(leak), "{case}: the message shows {leak:?}: {message}");
    }
    message
}

async fn complete(model: &str, max_tokens: u32) -> Result<(u16, Value)> {
    let body = json!({"model": model, "prompt": "hello", "max_tokens": max_tokens, "ignore_eos": true});
    post_json(&client(), &server().url("/v1/completions"), &body).await
}

async fn adapter_names() -> Result<Vec<String>> {
    let list: Value = client().get(server().url("/v1/models")).send().await?.json().await?;
    Ok(list["data"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap().to_owned()).collect())
}

#[tokio::test]
async fn device_files_are_refused_at_once() -> Result<()> {
    let cases = [
        ("config-urandom", Source::Symlink("/dev/urandom".into()), Source::Copy),
        ("config-zero", Source::Symlink("/dev/zero".into()), Source::Copy),
        ("weights-urandom", Source::Copy, Source::Symlink("/dev/urandom".into())),
        ("weights-zero", Source::Copy, Source::Symlink("/dev/zero".into())),
    ];
    let mut names = Vec::new();
    for (name, config, weights) in cases {
        let dir = adapter_dir(name, config, weights);
        assert_refused(name, &load(name, &dir).await?);
        names.push(name);
    }
    let listed = adapter_names().await?;
    assert!(!listed.iter().any(|n| names.contains(&n.as_str())), "{listed:?}");
    Ok(())
}

#[tokio::test]
async fn fifos_are_refused_while_generation_goes_on() -> Result<()> {
    for (name, config, weights) in
        [("config-fifo", Source::Fifo, Source::Copy), ("weights-fifo", Source::Copy, Source::Fifo)]
    {
        let dir = adapter_dir(name, config, weights);
        let generation = tokio::spawn(complete("smol", 40));
        let refused = tokio::time::timeout(Duration::from_secs(20), load(name, &dir)).await??;
        assert_refused(name, &refused);
        let (status, reply) = tokio::time::timeout(Duration::from_secs(20), generation).await???;
        assert_eq!((status, reply["usage"]["completion_tokens"].clone()), (200, json!(40)), "{reply}");
    }
    Ok(())
}

#[tokio::test]
async fn symlinks_leaving_the_lora_dirs_are_refused() -> Result<()> {
    let outside = Path::new(&tiny("lora/a")).to_path_buf();
    let linked = |file: &str| Source::Symlink(outside.join(file));
    let dir =
        adapter_dir("files-outside", linked("adapter_config.json"), linked("adapter_model.safetensors"));
    let message = assert_refused("files outside", &load("files-outside", &dir).await?);
    assert!(message.contains("outside"), "{message}");
    let link = root().join("dir-outside");
    if !link.exists() {
        std::os::unix::fs::symlink(&outside, &link)?;
    }
    assert_refused("directory outside", &load("dir-outside", link.to_str().unwrap()).await?);

    // Symlinks that stay inside are fine.
    let inner = adapter_dir("inner-original", Source::Copy, Source::Copy);
    let inner = Path::new(&inner);
    let inside = |file: &str| Source::Symlink(inner.join(file));
    let dir = adapter_dir("inner-links", inside("adapter_config.json"), inside("adapter_model.safetensors"));
    let (status, reply, _) = load("inner-links", &dir).await?;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(complete("inner-links", 4).await?.0, 200);
    assert_eq!(unload("inner-links").await?, 200);
    Ok(())
}

#[tokio::test]
async fn a_gguf_adapter_with_alignment_zero_is_refused_and_serving_goes_on() -> Result<()> {
    let gguf = std::fs::read(tiny("lora/a.gguf"))?;
    let path = root().join("aligned-zero.gguf");
    std::fs::write(&path, with_metadata(&gguf, "general.alignment", U32, &0u32.to_le_bytes()))?;
    let message = assert_refused("alignment 0", &load("aligned-zero", path.to_str().unwrap()).await?);
    assert!(message.contains("alignment"), "{message}");
    let (status, reply) = complete("smol", 8).await?;
    assert_eq!(status, 200, "the engine still serves: {reply}");
    let health = client().get(server().url("/health")).send().await?.status();
    assert_eq!(health, 200);
    let sound = root().join("sound.gguf");
    std::fs::copy(tiny("lora/a.gguf"), &sound)?;
    let (status, reply, _) = load("sound-gguf", sound.to_str().unwrap()).await?;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(complete("sound-gguf", 4).await?.0, 200);
    assert_eq!(unload("sound-gguf").await?, 200);
    Ok(())
}

#[tokio::test]
async fn safetensors_headers_that_claim_more_than_the_file_are_refused() -> Result<()> {
    let weights = std::fs::read(Path::new(&tiny("lora/a")).join("adapter_model.safetensors"))?;
    let cut = weights[..weights.len() - 1000].to_vec();
    let mut huge_header = (1u64 << 40).to_le_bytes().to_vec();
    huge_header.extend(&weights[8..]);
    for (name, bytes) in [("cut-weights", cut), ("huge-header", huge_header)] {
        let dir = adapter_dir(name, Source::Copy, Source::Bytes(bytes));
        assert_refused(name, &load(name, &dir).await?);
    }
    Ok(())
}

/// PEFT files of a q_proj-only adapter of `rank` on the tiny llama (3 layers, width 64), zeros.
fn big_adapter(rank: usize) -> (Vec<u8>, Vec<u8>) {
    let config = json!({"peft_type": "LORA", "r": rank, "lora_alpha": 8, "target_modules": ["q_proj"]});
    let mut header = serde_json::Map::new();
    let mut offset = 0;
    for layer in 0..3 {
        for (ab, shape) in [("A", [rank, 64]), ("B", [64, rank])] {
            let bytes = rank * 64 * 4;
            let name = format!("base_model.model.model.layers.{layer}.self_attn.q_proj.lora_{ab}.weight");
            header.insert(
                name,
                json!({"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + bytes]}),
            );
            offset += bytes;
        }
    }
    let header = serde_json::to_vec(&header).unwrap();
    let mut weights = (header.len() as u64).to_le_bytes().to_vec();
    weights.extend(header);
    weights.resize(weights.len() + offset, 0);
    (serde_json::to_vec(&config).unwrap(), weights)
}

#[tokio::test]
async fn a_load_abandoned_by_its_client_leaves_nothing_behind() -> Result<()> {
    let (config, weights) = big_adapter(16384);
    let dir = adapter_dir("big", Source::Bytes(config), Source::Bytes(weights));
    // The client gives up before the 25 MB adapter is read and installed; a load from the page
    // cache can beat a timeout, so a shorter one is tried after each load that answered.
    let body = json!({"lora_name": "big", "lora_path": dir});
    let mut gave_up = false;
    for ms in [30, 10, 3, 1] {
        let impatient = reqwest::Client::builder().timeout(Duration::from_millis(ms)).build()?;
        match impatient.post(server().url("/v1/load_lora_adapter")).json(&body).send().await {
            Err(_) => {
                gave_up = true;
                break;
            }
            Ok(answered) => {
                assert_eq!(answered.status(), 200, "a load within {ms} ms");
                assert_eq!(unload("big").await?, 200);
            }
        }
    }
    assert!(gave_up, "every load answered before its client gave up, the last within 1 ms");

    // The name is free or fully loaded, and every later load works.
    let (status, reply, _) = load("big", &dir).await?;
    let names = adapter_names().await?;
    match status {
        200 => {}
        400 => {
            assert!(reply.to_string().contains("already loaded") && names.contains(&"big".into()), "{reply}")
        }
        _ => panic!("{reply}"),
    }
    assert_eq!(names.iter().filter(|n| *n == "big").count(), 1, "{names:?}");
    let small = adapter_dir("small", Source::Copy, Source::Copy);
    let (status, reply, _) = load("small", &small).await?;
    assert_eq!(status, 200, "a later load: {reply}");
    assert_eq!(complete("small", 4).await?.0, 200);
    assert_eq!(unload("small").await?, 200);
    assert_eq!(unload("big").await?, 200);
    Ok(())
}

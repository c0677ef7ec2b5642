//! `--model ORG/NAME/FILE.gguf` served from a Hugging Face cache (`--download-dir`) laid out as
//! the hub client writes it. No network here, so the file is already cached; downloading
//! uses the same lookup first.

use anyhow::Result;
use serde_json::json;

use crate::harness::{client, model_path, post_json, TestServer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_a_hub_id_from_the_cache() -> Result<()> {
    let cache = tempfile::tempdir()?;
    let snapshot = cache.path().join("models--HuggingFaceTB--SmolLM2-135M-Instruct-GGUF/snapshots/5a1b");
    std::fs::create_dir_all(&snapshot)?;
    std::os::unix::fs::symlink(model_path(), snapshot.join("smollm2.Q4_1.gguf"))?;
    let refs = cache.path().join("models--HuggingFaceTB--SmolLM2-135M-Instruct-GGUF/refs");
    std::fs::create_dir_all(&refs)?;
    std::fs::write(refs.join("main"), "5a1b")?;

    let dir = cache.path().display().to_string();
    let server = tokio::task::spawn_blocking(move || {
        TestServer::start_with_model(
            "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF/smollm2.Q4_1.gguf",
            &["--download-dir", &dir],
        )
    })
    .await?;
    let body = json!({"model": "smol", "messages": [{"role": "user", "content": "What is the capital of France?"}],
                      "max_tokens": 12, "temperature": 0});
    let (status, reply) = post_json(&client(), &server.url("/v1/chat/completions"), &body).await?;
    assert_eq!(status, 200, "{reply}");
    let text = reply["choices"][0]["message"]["content"].as_str().unwrap_or_default();
    assert!(text.contains("Paris"), "{text}");
    tokio::task::spawn_blocking(move || server.join()).await??;
    Ok(())
}

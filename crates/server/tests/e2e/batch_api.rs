//! OpenAI's Files and Batch APIs (`--batch-dir`) through the official OpenAI Python SDK
//! (tests/sdk/check_batch.py): chat, completions and embeddings batches on one server (SmolLM2
//! with `--pooling last` also embeds), a malformed line in the error file beside the answered
//! ones, cancel, and a server stopped mid-batch whose successor, on the same directory, resumes
//! the batch without running its answered lines again. Raw HTTP checks the refusals' error shape
//! and that a server without `--batch-dir` says how to turn the API on.

use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::json;

use crate::harness::{assert_error_shape, client, shared, TestServer, API_KEY};
use crate::sdk::{python_check, repo_root, tools_python};

const SCRIPT_TIMEOUT: Duration = Duration::from_secs(600);

fn batch_dir(name: &str) -> String {
    let dir = std::env::temp_dir().join(format!("pagoda-batch-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir.display().to_string()
}

fn start(dir: &str) -> TestServer {
    // Two sequences: one batch line in flight at a time, so a batch is slow enough to cancel.
    let flags = [
        "--pooling",
        "last",
        "--api-key",
        API_KEY,
        "--batch-dir",
        dir,
        "--max-num-seqs",
        "2",
        "--shutdown-timeout",
        "1",
    ];
    TestServer::start(&flags)
}

fn server() -> &'static TestServer {
    static SERVER: OnceLock<TestServer> = OnceLock::new();
    SERVER.get_or_init(|| start(&batch_dir("shared")))
}

/// Runs tests/sdk/check_batch.py with `extra` arguments; returns its stdout.
async fn check_batch(server: &TestServer, extra: &[&str]) -> Result<String> {
    let python = tools_python("sdk", "sdk-tools");
    let script = repo_root().join("tests/sdk/check_batch.py");
    let child = python_check(&python, Path::new(&script))
        .args(["--base-url", &server.url("/v1"), "--api-key", API_KEY, "--model", "smol", "--timeout", "240"])
        .args(extra)
        .spawn()
        .with_context(|| format!("starting {}", python.display()))?;
    let output = tokio::time::timeout(SCRIPT_TIMEOUT, child.wait_with_output())
        .await
        .context("check_batch.py timed out")?
        .context("waiting for check_batch.py")?;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "check_batch.py {extra:?} failed:\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
    );
    print!("{stdout}");
    Ok(stdout)
}

#[tokio::test]
async fn openai_python_sdk_files_and_batches() -> Result<()> {
    check_batch(server(), &[]).await.map(drop)
}

#[tokio::test]
async fn a_restarted_server_resumes_its_unfinished_batch() -> Result<()> {
    let dir = batch_dir("restart");
    let first = start(&dir);
    let stdout = check_batch(&first, &["--suite", "restart-start"]).await?;
    let id = stdout
        .lines()
        .find_map(|l| l.strip_prefix("BATCH_ID="))
        .context("check_batch.py printed no BATCH_ID")?
        .to_owned();
    first.signal_stop();
    tokio::task::spawn_blocking(move || first.join()).await??;
    let state: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(
        Path::new(&dir).join("batches").join(format!("{id}.json")),
    )?)?;
    assert_eq!(state["status"], "in_progress", "{state}");
    // The lines answered before the stop, by custom_id, with the request id that answered them.
    let partial =
        std::fs::read_to_string(Path::new(&dir).join("batches").join(format!("{id}.output.jsonl")))?;
    let before: Vec<(String, String)> = partial
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("a complete output line");
            (
                v["custom_id"].as_str().unwrap().to_owned(),
                v["response"]["request_id"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert!(before.len() >= 2, "{partial}");
    let second = start(&dir);
    check_batch(&second, &["--suite", "restart-finish", "--batch-id", &id]).await?;
    // Not run again: the final output keeps their first answers.
    let batch: serde_json::Value =
        client().get(second.url(&format!("/v1/batches/{id}"))).send().await?.json().await?;
    let output_id = batch["output_file_id"].as_str().context("no output file")?;
    let output =
        client().get(second.url(&format!("/v1/files/{output_id}/content"))).send().await?.text().await?;
    for (custom_id, request_id) in &before {
        let line = output.lines().find(|l| l.contains(&format!("\"custom_id\":\"{custom_id}\""))).unwrap();
        assert!(line.contains(request_id.as_str()), "{custom_id} ran again: {line}");
    }
    second.signal_stop();
    tokio::task::spawn_blocking(move || second.join()).await??;
    Ok(())
}

#[tokio::test]
async fn bad_uploads_are_400s_and_the_api_is_off_without_batch_dir() -> Result<()> {
    let c = client();
    let url = server().url("/v1/files");
    let resp = c.post(&url).bearer_auth(API_KEY).json(&json!({"purpose": "batch"})).send().await?;
    assert_eq!(resp.status(), 400);
    let body: serde_json::Value = resp.json().await?;
    assert_eq!(assert_error_shape(&body)["param"], "file", "{body}");
    let resp = c.post(server().url("/v1/batches")).bearer_auth(API_KEY).body("{").send().await?;
    assert_eq!(resp.status(), 400);
    let resp = reqwest::Client::new().get(server().url("/v1/batches")).send().await?;
    assert_eq!(resp.status(), 401, "the Batch API is behind the API key");
    let resp = c.get(shared().url("/v1/batches")).bearer_auth(API_KEY).send().await?;
    assert_eq!(resp.status(), 404);
    let body: serde_json::Value = resp.json().await?;
    let message = assert_error_shape(&body)["message"].as_str().unwrap_or_default().to_owned();
    assert!(message.contains("--batch-dir"), "{message}");
    Ok(())
}

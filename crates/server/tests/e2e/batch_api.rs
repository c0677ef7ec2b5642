//! OpenAI's Files and Batch APIs (`--batch-dir`) through the official OpenAI Python SDK
//! (tests/sdk/check_batch.py): chat, completions and embeddings batches on one server (SmolLM2
//! with `--pooling last` also embeds), a malformed line in the error file beside the answered
//! ones, cancel, and a server stopped mid-batch whose successor, on the same directory, resumes
//! the batch without running its answered lines again. Raw HTTP checks the refusals' error shape,
//! that a server without `--batch-dir` says how to turn the API on, and that online requests do
//! not queue behind a running batch.

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
    let _ = std::fs::remove_dir_all(&dir);
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

/// `lines` uploaded as a batch input file; returns the file's id.
async fn upload(server: &TestServer, lines: &str) -> Result<String> {
    let boundary = "pagoda-e2e-boundary";
    let body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n\
         --{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\n\
         Content-Type: application/jsonl\r\n\r\n{lines}\r\n--{boundary}--\r\n"
    );
    let resp = client()
        .post(server.url("/v1/files"))
        .header("content-type", format!("multipart/form-data; boundary={boundary}"))
        .body(body)
        .send()
        .await?;
    anyhow::ensure!(resp.status() == 200, "upload: {}", resp.text().await?);
    let file: serde_json::Value = resp.json().await?;
    Ok(file["id"].as_str().context("file id")?.to_owned())
}

/// Batch lines run beside online requests, not ahead of them: at most half the sequence slots
/// hold batch lines, and under `--scheduling-policy priority` they come after every online
/// request. An online request sent while a long batch runs finishes while most of the batch is
/// still to run (in a first-come queue behind the batch, it would wait for nearly all of it).
#[tokio::test]
async fn online_requests_do_not_wait_for_a_running_batch() -> Result<()> {
    const LINES: u64 = 24;
    let dir = batch_dir("yield");
    let server =
        TestServer::start(&["--batch-dir", &dir, "--max-num-seqs", "4", "--scheduling-policy", "priority"]);
    let lines: String = (0..LINES)
        .map(|i| {
            let body = json!({
                "model": "smol",
                "messages": [{"role": "user", "content": format!("Count upward from {i}.")}],
                "max_tokens": 48,
                "ignore_eos": true,
                "temperature": 0,
            });
            json!({"custom_id": format!("line-{i}"), "method": "POST", "url": "/v1/chat/completions", "body": body})
                .to_string()
                + "\n"
        })
        .collect();
    let file = upload(&server, &lines).await?;
    let c = client();
    let batch: serde_json::Value = c
        .post(server.url("/v1/batches"))
        .json(&json!({"input_file_id": file, "endpoint": "/v1/chat/completions", "completion_window": "24h"}))
        .send()
        .await?
        .json()
        .await?;
    let id = batch["id"].as_str().context("batch id")?.to_owned();
    let counts = |b: &serde_json::Value| b["request_counts"]["completed"].as_u64().unwrap_or(0);
    let batch_url = server.url(&format!("/v1/batches/{id}"));
    // Running, with its first lines answered.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let b: serde_json::Value = c.get(&batch_url).send().await?.json().await?;
        if counts(&b) >= 1 {
            break;
        }
        anyhow::ensure!(tokio::time::Instant::now() < deadline, "the batch never started: {b}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let online = (0..3).map(|i| {
        let c = c.clone();
        let url = server.url("/v1/chat/completions");
        async move {
            let body = json!({
                "model": "smol",
                "messages": [{"role": "user", "content": format!("Say hello {i}.")}],
                "max_tokens": 8,
                "temperature": 0,
            });
            let resp = c.post(url).json(&body).send().await?;
            anyhow::ensure!(resp.status() == 200, "online request: {}", resp.status());
            Ok::<_, anyhow::Error>(())
        }
    });
    futures_util::future::try_join_all(online).await?;
    let b: serde_json::Value = c.get(&batch_url).send().await?.json().await?;
    assert!(counts(&b) <= LINES * 3 / 4, "the online requests waited for the batch: {b}");
    c.post(server.url(&format!("/v1/batches/{id}/cancel"))).send().await?;
    tokio::task::spawn_blocking(move || server.join()).await??;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// `pagoda run-batch`, as vLLM's `run_batch`: a file mixing chat, completions and embeddings
/// lines and a malformed one is answered offline, in input order, by the same engine (the chat
/// line's greedy answer equals the served one's).
#[tokio::test]
async fn run_batch_answers_a_file_offline_in_input_order() -> Result<()> {
    let dir = std::env::temp_dir().join(format!("pagoda-run-batch-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let chat = json!({
        "model": "smol",
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_tokens": 12,
        "temperature": 0,
    });
    let lines = [
        json!({"custom_id": "chat", "method": "POST", "url": "/v1/chat/completions", "body": chat})
            .to_string(),
        json!({"custom_id": "embed", "method": "POST", "url": "/v1/embeddings",
               "body": {"model": "smol", "input": ["one", "two"]}})
        .to_string(),
        "{not json".to_owned(),
        json!({"custom_id": "complete", "method": "POST", "url": "/v1/completions",
               "body": {"model": "smol", "prompt": "1, 2, 3,", "max_tokens": 5, "temperature": 0}})
        .to_string(),
    ];
    let (input, output) = (dir.join("in.jsonl"), dir.join("out.jsonl"));
    std::fs::write(&input, lines.join("\n") + "\n")?;
    let model = crate::harness::model_path();
    let status = tokio::process::Command::new(env!("CARGO_BIN_EXE_pagoda"))
        .args(["run-batch", "-i", input.to_str().unwrap(), "-o", output.to_str().unwrap()])
        .args(["--model", model.to_str().unwrap(), "--served-model-name", "smol", "--pooling", "last"])
        .args(["--max-model-len", "1024", "--kv-cache-memory", "96MiB"])
        .kill_on_drop(true)
        .status();
    let status =
        tokio::time::timeout(Duration::from_secs(300), status).await.context("run-batch timed out")??;
    assert!(status.success(), "run-batch exited {status}");
    let answers: Vec<serde_json::Value> =
        std::fs::read_to_string(&output)?.lines().map(serde_json::from_str).collect::<Result<_, _>>()?;
    assert_eq!(answers.len(), 4, "{answers:#?}");
    let ids: Vec<_> = answers.iter().map(|a| a["custom_id"].as_str()).collect();
    assert_eq!(ids, [Some("chat"), Some("embed"), None, Some("complete")], "input order");
    for i in [0, 1, 3] {
        assert_eq!(answers[i]["response"]["status_code"], 200, "{}", answers[i]);
        assert!(answers[i]["error"].is_null(), "{}", answers[i]);
    }
    assert_eq!(answers[1]["response"]["body"]["data"].as_array().map(Vec::len), Some(2));
    assert!(answers[2]["error"]["message"].is_string() && answers[2]["response"].is_null(), "{}", answers[2]);
    assert!(answers[3]["response"]["body"]["choices"][0]["text"].is_string(), "{}", answers[3]);
    // The engine that serves: the same greedy answer.
    let served: serde_json::Value = client()
        .post(shared().url("/v1/chat/completions"))
        .bearer_auth(API_KEY)
        .json(&chat)
        .send()
        .await?
        .json()
        .await?;
    assert_eq!(
        answers[0]["response"]["body"]["choices"][0]["message"]["content"],
        served["choices"][0]["message"]["content"],
        "{}",
        answers[0]
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

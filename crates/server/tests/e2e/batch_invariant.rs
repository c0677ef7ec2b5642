//! `pagoda serve --batch-invariant`: a chat's tokens and logprobs are bit-identical whether it
//! is served alone or among others, on a cold or a warm prefix cache, with its prompt prefilled
//! in one step or in chunks beside other requests' decodes.

use anyhow::Result;
use serde_json::{json, Value};

use crate::harness::{client, post_json, TestServer};

fn bodies() -> Vec<Value> {
    let passage = "A river starts as rain on the hills, gathers in streams and reaches the sea. ";
    let questions = [
        "What is the capital of France?".to_owned(),
        "Write a haiku about autumn leaves.".to_owned(),
        format!("Summarise: {}", passage.repeat(6)),
        "List three uses of copper.".to_owned(),
        format!("Rewrite politely: {}", passage.repeat(2)),
        "Why do cats purr?".to_owned(),
    ];
    questions
        .iter()
        .enumerate()
        .map(|(i, q)| {
            let mut body = json!({"model": "smol", "messages": [{"role": "user", "content": q}],
                                  "max_tokens": 10 + i, "logprobs": true, "top_logprobs": 3});
            // Half greedy, half seeded sampling (its draws read the same logits' bits).
            body["temperature"] = if i % 2 == 0 { json!(0) } else { json!(0.9) };
            if i % 2 == 1 {
                body["seed"] = json!(100 + i);
            }
            body
        })
        .collect()
}

/// The parts of an answer that must not move: content, finish reason, logprobs, token count.
async fn answer(body: Value, url: String) -> Result<Value> {
    let (status, resp) = post_json(&client(), &url, &body).await?;
    assert_eq!(status, 200, "{resp}");
    let c = &resp["choices"][0];
    Ok(json!([
        c["message"]["content"],
        c["finish_reason"],
        c["logprobs"],
        resp["usage"]["completion_tokens"]
    ]))
}

async fn all_at_once(server: &TestServer) -> Result<Vec<Value>> {
    let url = server.url("/v1/chat/completions");
    let tasks: Vec<_> = bodies().into_iter().map(|b| tokio::spawn(answer(b, url.clone()))).collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await??);
    }
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_are_bit_identical_alone_and_batched() -> Result<()> {
    // A small token budget: the longer prompts are prefilled in chunks next to the others'
    // decodes when they run together.
    let server = TestServer::start(&[
        "--batch-invariant",
        "--max-num-batched-tokens",
        "40",
        "--max-num-seqs",
        "8",
        "--no-enable-prefix-caching",
    ]);
    let url = server.url("/v1/chat/completions");
    let mut alone = Vec::new();
    for body in bodies() {
        alone.push(answer(body, url.clone()).await?);
    }
    let batched = all_at_once(&server).await?;
    for (i, (a, b)) in alone.iter().zip(&batched).enumerate() {
        assert_eq!(a, b, "request {i}: alone vs batched");
    }
    server.signal_stop();
    server.join()?;

    // With the prefix cache: the first wave is cold, the second hits every prompt.
    let cached =
        TestServer::start(&["--batch-invariant", "--max-num-batched-tokens", "40", "--max-num-seqs", "8"]);
    for wave in ["cold", "warm"] {
        let got = all_at_once(&cached).await?;
        for (i, (a, b)) in alone.iter().zip(&got).enumerate() {
            assert_eq!(a, b, "request {i}: alone vs batched on a {wave} prefix cache");
        }
    }
    cached.signal_stop();
    cached.join()
}

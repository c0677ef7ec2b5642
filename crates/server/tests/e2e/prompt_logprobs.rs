//! Prompt logprobs on `/v1/completions`: OpenAI's legacy `echo` with `logprobs` (the prompt's
//! tokens first, the first one's logprob null) and vLLM's `prompt_logprobs`, whole and streamed,
//! against the numpy reference's `prompt_logprobs_cases` (tests/fixtures/golden.json). The
//! server's CPU kernels round some products to bfloat16, so the values are checked loosely here;
//! crates/models/tests/prompt_logprobs.rs checks them tightly on the f32 path.

use anyhow::Result;
use serde_json::{json, Value};

use crate::harness::{assert_error_shape, client, post_json, read_sse, shared};

/// Logprobs within this of the reference, for a likely token.
const TOLERANCE: f64 = 0.1;

/// Whether `got` is within tolerance of the reference `want`. The shared server's CPU kernels
/// differ in precision with a step's size (exact blocks for a few tokens, bfloat16 or int16
/// panels for more), and so with how a prompt is batched beside the other tests' requests and
/// chunked; their logit errors grow with the logit, so an unlikely token's logprob (-14 against
/// the reference's -13.8, seen in CI) may drift further than a likely one's: the tolerance
/// doubles at a logprob of -10.
fn close(got: f64, want: f64) -> bool {
    (got - want).abs() < TOLERANCE * (1.0 + want.abs() / 10.0)
}

fn golden_case() -> Value {
    let path = std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")), std::path::PathBuf::from)
        .join("../../tests/fixtures/golden.json");
    let golden: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    golden["prompt_logprobs_cases"][1].clone()
}

fn prompt_ids(case: &Value) -> Vec<u64> {
    case["prompt_ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect()
}

#[tokio::test]
async fn echo_with_logprobs_scores_the_prompt_first() -> Result<()> {
    let case = golden_case();
    let ids = prompt_ids(&case);
    let body = json!({"prompt": ids, "max_tokens": 3, "temperature": 0, "logprobs": 2, "echo": true, "n": 2});
    let (status, reply) = post_json(&client(), &shared().url("/v1/completions"), &body).await?;
    assert_eq!(status, 200, "{reply}");
    let reference = case["logprobs"].as_array().unwrap();
    for choice in reply["choices"].as_array().unwrap() {
        let lp = &choice["logprobs"];
        let tokens = lp["tokens"].as_array().unwrap();
        let values = lp["token_logprobs"].as_array().unwrap();
        assert_eq!(tokens.len(), ids.len() + 3, "{choice}");
        assert!(values[0].is_null() && lp["top_logprobs"][0].is_null(), "nothing predicts the first token");
        for (p, want) in reference.iter().enumerate() {
            let got = values[p + 1].as_f64().unwrap();
            let want = want[0].as_f64().unwrap();
            assert!(close(got, want), "prompt token {}: {got} vs {want}", p + 1);
            assert_eq!(lp["top_logprobs"][p + 1].as_object().unwrap().len(), 2);
        }
        let offsets: Vec<u64> =
            lp["text_offset"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
        assert!(offsets.windows(2).all(|w| w[0] <= w[1]) && offsets[0] == 0, "{offsets:?}");
        assert!(choice["text"].as_str().unwrap().starts_with("The quick brown fox"), "{choice}");
    }
    Ok(())
}

#[tokio::test]
async fn prompt_logprobs_come_in_vllms_shape_whole_and_streamed() -> Result<()> {
    let case = golden_case();
    let ids = prompt_ids(&case);
    let url = shared().url("/v1/completions");
    let body = json!({"prompt": ids, "max_tokens": 2, "temperature": 0, "prompt_logprobs": 3});
    let (status, reply) = post_json(&client(), &url, &body).await?;
    assert_eq!(status, 200, "{reply}");
    let scored = reply["choices"][0]["prompt_logprobs"].as_array().unwrap().clone();
    assert_eq!(scored.len(), ids.len());
    assert!(scored[0].is_null());
    for (p, entry) in scored.iter().enumerate().skip(1) {
        let map = entry.as_object().unwrap();
        let target = &map[&ids[p].to_string()];
        let want = case["logprobs"][p - 1][0].as_f64().unwrap();
        assert!(close(target["logprob"].as_f64().unwrap(), want), "{p}: {target}");
        assert!(target["decoded_token"].is_string());
        let ranked = map.values().filter(|v| v["rank"].as_u64().is_some_and(|r| r <= 3)).count();
        assert_eq!(ranked, 3, "{p}: {entry}");
    }
    assert!(reply["choices"][0]["logprobs"].is_null(), "logprobs were not asked for");

    // Streamed, with echo and logprobs: each choice opens with the prompt's part.
    let mut stream_body = json!({"prompt": ids, "max_tokens": 2, "temperature": 0, "prompt_logprobs": 3,
                                 "echo": true, "logprobs": 1, "stream": true});
    let resp = client().post(&url).json(&stream_body).send().await?;
    assert_eq!(resp.status(), 200);
    let (events, done) = read_sse(resp).await?;
    assert!(done);
    let first = &events[0]["choices"][0];
    assert!(first["text"].as_str().unwrap().starts_with("The quick brown fox"), "{first}");
    assert_eq!(first["logprobs"]["tokens"].as_array().unwrap().len(), ids.len());
    let streamed = first["prompt_logprobs"].as_array().unwrap();
    assert_eq!(streamed.len(), ids.len());
    assert!(streamed[0].is_null());
    for (p, entry) in streamed.iter().enumerate().skip(1) {
        let got = entry[ids[p].to_string()]["logprob"].as_f64().unwrap();
        let want = case["logprobs"][p - 1][0].as_f64().unwrap();
        assert!(close(got, want), "streamed {p}: {got} vs {want}");
    }
    let streamed_tokens: usize =
        events.iter().filter_map(|e| e["choices"][0]["logprobs"]["tokens"].as_array()).map(Vec::len).sum();
    assert_eq!(streamed_tokens, ids.len() + 2);
    stream_body["prompt_logprobs"] = json!(21);
    let (status, reply) = post_json(&client(), &url, &stream_body).await?;
    assert_eq!(status, 400, "{reply}");
    assert_eq!(assert_error_shape(&reply)["param"], "prompt_logprobs");
    Ok(())
}

/// Chat: the rendered prompt's logprobs at the response's top level (the golden chat case is the
/// same conversation through the same template); not with `stream`.
#[tokio::test]
async fn chat_prompt_logprobs_score_the_rendered_prompt() -> Result<()> {
    let path = std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")), std::path::PathBuf::from)
        .join("../../tests/fixtures/golden.json");
    let golden: Value = serde_json::from_str(&std::fs::read_to_string(path)?)?;
    let case = &golden["prompt_logprobs_cases"][0];
    assert_eq!(case["name"], "chat_capital_of_france");
    let ids = prompt_ids(case);
    let url = shared().url("/v1/chat/completions");
    let messages = json!([{"role": "user", "content": "What is the capital of France?"}]);
    let body = json!({"messages": messages, "max_tokens": 2, "temperature": 0, "prompt_logprobs": 0});
    let (status, reply) = post_json(&client(), &url, &body).await?;
    assert_eq!(status, 200, "{reply}");
    let scored = reply["prompt_logprobs"].as_array().unwrap();
    assert_eq!(scored.len(), ids.len(), "{reply}");
    assert!(scored[0].is_null());
    for (p, entry) in scored.iter().enumerate().skip(1) {
        let got = entry[ids[p].to_string()]["logprob"].as_f64().unwrap();
        let want = case["logprobs"][p - 1][0].as_f64().unwrap();
        assert!(close(got, want), "{p}: {got} vs {want}");
    }
    let streamed = json!({"messages": messages, "prompt_logprobs": 1, "stream": true});
    let (status, reply) = post_json(&client(), &url, &streamed).await?;
    assert_eq!(status, 400, "{reply}");
    assert_eq!(assert_error_shape(&reply)["param"], "prompt_logprobs");
    Ok(())
}

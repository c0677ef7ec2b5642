//! Gemma 3 270M (Q4_K_M GGUF, the base model: SentencePiece vocabulary from the GGUF, K-quant
//! and Q5_0 weights, sliding-window layers) served by `pagoda serve`: greedy completions equal
//! the golden fixture of scripts/golden_gemma3.py, from token ids and from text; the model card
//! names the architecture; chat needs a template the base model does not have.

use anyhow::Result;
use serde_json::{json, Value};

use crate::harness::*;

pub fn gemma3_path() -> std::path::PathBuf {
    let path = std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")), std::path::PathBuf::from)
        .join("../../models/gemma-3-270m-q4_k_m.gguf");
    assert!(path.exists(), "{} is missing: run `make model-gemma3` first", path.display());
    path
}

fn fixture() -> Value {
    let path = std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")), std::path::PathBuf::from)
        .join("../../tests/fixtures/golden-gemma3.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).expect("valid JSON")
}

fn start() -> TestServer {
    TestServer::start_with_model(&gemma3_path().display().to_string(), &[])
}

fn ids(v: &Value) -> Vec<u64> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn gemma3_completions_follow_the_golden_greedy_continuations() -> Result<()> {
    let server = start();
    let c = client();
    let fixture = fixture();

    let models: Value = c.get(server.url("/v1/models")).send().await?.json().await?;
    assert_eq!(models["data"][0]["architecture"], "gemma3");
    assert_eq!(models["data"][0]["context_length"], 32768);
    assert_eq!(models["data"][0]["max_model_len"], 1024);
    // The base model has no chat template: the playground offers completion mode only.
    let info: Value = c.get(server.url("/model_info")).send().await?.json().await?;
    assert_eq!(info["has_chat_template"], false, "{info}");

    for case in fixture["logits_cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let greedy = ids(&case["greedy"]);
        let body = json!({
            "model": "smol", "prompt": case["prompt_ids"], "max_tokens": greedy.len(),
            "temperature": 0, "ignore_eos": true,
        });
        let (status, out) = post_json(&c, &server.url("/v1/completions"), &body).await?;
        assert_eq!(status, 200, "{name}: {out}");
        assert_eq!(out["usage"]["prompt_tokens"], case["prompt_ids"].as_array().unwrap().len());
        assert_eq!(out["usage"]["completion_tokens"], greedy.len(), "{name}");
        assert_eq!(out["choices"][0]["text"], case["greedy_text"], "{name}: greedy text differs");
    }

    // The same prompt as text: tokenized from the GGUF's SentencePiece vocabulary, with BOS.
    let case = &fixture["logits_cases"][0];
    let text_case = fixture["tokenizer_cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| {
            let mut with_bos = vec![2u64];
            with_bos.extend(ids(&t["ids"]));
            t["add_special_tokens"] == false && with_bos == ids(&case["prompt_ids"])
        })
        .expect("the first logits case's prompt is also a tokenizer case");
    let body = json!({
        "model": "smol", "prompt": text_case["text"], "max_tokens": 8, "temperature": 0, "ignore_eos": true,
    });
    let (status, out) = post_json(&c, &server.url("/v1/completions"), &body).await?;
    assert_eq!(status, 200, "{out}");
    assert_eq!(out["usage"]["prompt_tokens"], case["prompt_ids"].as_array().unwrap().len());
    let greedy_text = case["greedy_text"].as_str().unwrap();
    let text = out["choices"][0]["text"].as_str().unwrap();
    assert!(greedy_text.starts_with(text), "{text:?} is not a prefix of {greedy_text:?}");

    // Streaming gives the same text as the whole response.
    let body = json!({
        "model": "smol", "prompt": text_case["text"], "max_tokens": 8, "temperature": 0, "ignore_eos": true,
        "stream": true,
    });
    let resp = c.post(server.url("/v1/completions")).json(&body).send().await?;
    assert_eq!(resp.status(), 200);
    let (events, done) = read_sse(resp).await?;
    assert!(done);
    let streamed: String =
        events.iter().filter_map(|e| e["choices"][0]["text"].as_str()).collect::<Vec<_>>().concat();
    assert_eq!(streamed, text);

    // The base model has no chat template.
    let body = json!({"model": "smol", "messages": [{"role": "user", "content": "hi"}]});
    let (status, out) = post_json(&c, &server.url("/v1/chat/completions"), &body).await?;
    assert_eq!(status, 400, "{out}");
    assert!(out["error"]["message"].as_str().unwrap().contains("no chat template"), "{out}");
    server.signal_stop();
    server.join()
}

/// `--cpu-gemm-dtype int8` (8-bit activations at every step, llama.cpp's precision): the four
/// golden prompts sent at once, so their prefills and decodes share steps, each continue with
/// the reference's first 16 greedy tokens (the model test measures the logit drift: 0.62).
#[tokio::test(flavor = "multi_thread")]
async fn gemma3_with_int8_gemms_keeps_the_golden_greedy_tokens() -> Result<()> {
    let server =
        TestServer::start_with_model(&gemma3_path().display().to_string(), &["--cpu-gemm-dtype", "int8"]);
    let c = client();
    let fixture = fixture();
    let cases = fixture["logits_cases"].as_array().unwrap().clone();
    let requests = cases.iter().map(|case| {
        let body = json!({
            "model": "smol", "prompt": case["prompt_ids"], "max_tokens": 16, "temperature": 0,
            "ignore_eos": true,
        });
        let (c, url) = (c.clone(), server.url("/v1/completions"));
        async move { post_json(&c, &url, &body).await }
    });
    for (case, result) in cases.iter().zip(futures_util::future::join_all(requests).await) {
        let name = case["name"].as_str().unwrap();
        let (status, out) = result?;
        assert_eq!(status, 200, "{name}: {out}");
        let text = out["choices"][0]["text"].as_str().unwrap();
        let greedy_text = case["greedy_text"].as_str().unwrap();
        assert!(!text.is_empty() && greedy_text.starts_with(text), "{name}: {text:?} vs {greedy_text:?}");
        assert_eq!(out["usage"]["completion_tokens"], 16, "{name}");
    }
    server.signal_stop();
    server.join()
}

//! Images on a vision model (issue 67): `pagoda serve` on the tiny Idefics3 checkpoint
//! (tests/fixtures/tiny/idefics3), spoken to over raw HTTP and through the official SDKs
//! (tests/sdk/check_images.py): chat `image_url` data URLs whole and streamed, Anthropic base64
//! blocks, Responses `input_image`; two images of equal token counts give different greedy
//! answers; the same image again is read from the prefix cache. Hostile images are in
//! `images_hostile.rs`, against the same server.

use std::path::PathBuf;
use std::sync::OnceLock;

use anyhow::Result;
use base64::Engine as _;
use serde_json::{json, Value};

use crate::harness::{metric, metrics_text, post_json, read_sse, TestServer};

/// The most images a request may hold on the images server.
pub const IMAGE_LIMIT: usize = 2;

pub fn repo_path(rel: &str) -> PathBuf {
    crate::sdk::repo_root().join(rel)
}

/// A committed test image (tests/fixtures/media) as bytes.
pub fn fixture(name: &str) -> Vec<u8> {
    let path = repo_path("tests/fixtures/media").join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

pub fn data_url(mime: &str, bytes: &[u8]) -> String {
    format!("data:{mime};base64,{}", base64::engine::general_purpose::STANDARD.encode(bytes))
}

/// The directory `file://` URLs may name on the images server (holds `ok.png`).
pub fn media_dir() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("pagoda-media-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("allowed")).expect("media dir");
        std::fs::write(dir.join("allowed/ok.png"), fixture("landscape.png")).expect("ok.png");
        std::fs::write(dir.join("secret.png"), fixture("landscape.png")).expect("secret.png");
        let _ = std::os::unix::fs::symlink(dir.join("secret.png"), dir.join("allowed/link.png"));
        dir
    })
}

/// The tiny Idefics3 model served with image URLs from 127.0.0.1 and `file://` under
/// `media_dir()/allowed`, at most [`IMAGE_LIMIT`] images a request.
pub fn server() -> &'static TestServer {
    static SERVER: OnceLock<TestServer> = OnceLock::new();
    SERVER.get_or_init(|| {
        let model = repo_path("tests/fixtures/tiny/idefics3").display().to_string();
        let allowed = media_dir().join("allowed").display().to_string();
        let limit = format!("{{\"image\": {IMAGE_LIMIT}}}");
        TestServer::start_with_model(
            &model,
            &[
                "--max-model-len",
                "256",
                "--allowed-media-domains",
                "127.0.0.1",
                "--allowed-local-media-path",
                &allowed,
                "--limit-mm-per-prompt",
                &limit,
                "--media-fetch-timeout",
                "2",
            ],
        )
    })
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder().timeout(std::time::Duration::from_secs(120)).build().unwrap()
}

/// Two images with equal tile grids (2x2 + global = 80 placeholders on the tiny processor).
fn image_a() -> String {
    data_url("image/png", &fixture("landscape.png"))
}
fn image_b() -> String {
    data_url("image/jpeg", &fixture("photo.jpg"))
}

fn chat_body(url: &str, extra: Value) -> Value {
    let mut body = json!({
        "model": "smol", "max_tokens": 8, "temperature": 0,
        "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": url}},
            {"type": "text", "text": "what is this"},
        ]}],
    });
    body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    body
}

async fn chat(url: &str, extra: Value) -> Result<Value> {
    let (status, out) =
        post_json(&client(), &server().url("/v1/chat/completions"), &chat_body(url, extra)).await?;
    assert_eq!(status, 200, "{out}");
    Ok(out)
}

fn content(out: &Value) -> &str {
    out["choices"][0]["message"]["content"].as_str().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn images_reach_the_model_on_chat_messages_and_responses() -> Result<()> {
    let c = client();
    let s = server();
    let a = chat(&image_a(), json!({"ignore_eos": true})).await?;
    let b = chat(&image_b(), json!({"ignore_eos": true})).await?;
    assert_eq!(a["usage"]["prompt_tokens"], b["usage"]["prompt_tokens"], "equal grids, equal prompts");
    assert!(a["usage"]["prompt_tokens"].as_u64().unwrap() > 80, "{a}");
    assert_ne!(content(&a), content(&b), "two images gave the same greedy answer");
    // Text alone still works on the vision model.
    let (status, text) = post_json(
        &c,
        &s.url("/v1/chat/completions"),
        &json!({"model": "smol", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await?;
    assert_eq!(status, 200, "{text}");

    // Streamed: the deltas add up to the whole answer.
    let whole = chat(&image_a(), json!({})).await?;
    let resp = c
        .post(s.url("/v1/chat/completions"))
        .json(&chat_body(&image_a(), json!({"stream": true})))
        .send()
        .await?;
    assert_eq!(resp.status(), 200);
    let (events, done) = read_sse(resp).await?;
    assert!(done);
    let streamed: String =
        events.iter().filter_map(|e| e["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!(streamed, content(&whole));

    // Anthropic's base64 block and Responses' input_image: the same prompt, the same answer.
    let png = base64::engine::general_purpose::STANDARD.encode(fixture("landscape.png"));
    let (status, msg) = post_json(
        &c,
        &s.url("/v1/messages"),
        &json!({"model": "smol", "max_tokens": 8, "temperature": 0, "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png}},
            {"type": "text", "text": "what is this"},
        ]}]}),
    )
    .await?;
    assert_eq!(status, 200, "{msg}");
    assert_eq!(msg["content"][0]["text"].as_str().unwrap_or_default(), content(&whole), "{msg}");
    let (status, counted) = post_json(
        &c,
        &s.url("/v1/messages/count_tokens"),
        &json!({"model": "smol", "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png}},
            {"type": "text", "text": "what is this"},
        ]}]}),
    )
    .await?;
    assert_eq!(status, 200, "{counted}");
    assert_eq!(counted["input_tokens"], whole["usage"]["prompt_tokens"]);
    let (status, r) = post_json(
        &c,
        &s.url("/v1/responses"),
        &json!({"model": "smol", "max_output_tokens": 8, "temperature": 0, "store": false, "input": [
            {"role": "user", "content": [
                {"type": "input_image", "image_url": image_a()},
                {"type": "input_text", "text": "what is this"},
            ]},
        ]}),
    )
    .await?;
    assert_eq!(status, 200, "{r}");
    let out: String = r["output"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|i| i["content"].as_array().cloned().unwrap_or_default())
        .filter_map(|p| p["text"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(out, content(&whole), "{r}");

    // A file:// URL under the allowed directory is the same image as its data URL.
    let file = format!("file://{}", media_dir().join("allowed/ok.png").display());
    assert_eq!(content(&chat(&file, json!({})).await?), content(&whole));
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn the_same_image_again_is_read_from_the_prefix_cache() -> Result<()> {
    let c = client();
    let s = server();
    // An image no other test sends (its own hash), twice.
    let url = data_url("image/png", &fixture("portrait.png"));
    let first = chat(&url, json!({})).await?;
    let before = metric(&metrics_text(&c, s).await?, "pagoda:prefix_cache_hits_total", "").unwrap_or(0.0);
    let second = chat(&url, json!({})).await?;
    let after = metric(&metrics_text(&c, s).await?, "pagoda:prefix_cache_hits_total", "").unwrap_or(0.0);
    assert_eq!(content(&first), content(&second));
    assert!(after - before >= 16.0, "prefix-cache hits {before} -> {after}");
    // The encoder ran for images; the counters are the engine's (a repeat whose blocks all
    // come from the prefix cache needs no features at all).
    let text = metrics_text(&c, s).await?;
    let misses = metric(&text, "pagoda:encoder_cache_misses_total", "").expect("encoder cache metrics");
    assert!(misses >= 1.0, "{misses}");
    assert!(metric(&text, "pagoda:encoder_cache_hits_total", "").is_some());
    Ok(())
}

/// OpenAI's and Anthropic's Python SDKs with images (tests/sdk/check_images.py).
#[tokio::test(flavor = "multi_thread")]
async fn openai_and_anthropic_sdks_send_images() -> Result<()> {
    crate::sdk::run_script("check_images.py", &server().url(""), &[]).await
}

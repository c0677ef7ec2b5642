//! `/v1/embeddings` on a server of the real all-MiniLM-L6-v2 (`make model-minilm`): the
//! embeddings against the float64 reference of scripts/golden_embeddings.py through HTTP,
//! float and base64 alike, text cut at the model's 256 tokens, the OpenAI SDK's own checks
//! (tests/sdk/check_embeddings.py), every refusal a 400 naming its parameter, overload a 429,
//! the metrics counting embedding requests, and a generating model refusing embeddings.

use std::path::PathBuf;
use std::sync::OnceLock;

use anyhow::Result;
use base64::Engine as _;
use serde_json::{json, Value};

use crate::harness::{
    assert_error_shape, client, metric, metrics_text, post_json, shared, TestServer, API_KEY,
};

fn model_dir() -> PathBuf {
    let dir = std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from)
        .join("../../models/all-MiniLM-L6-v2");
    assert!(dir.join("model.safetensors").exists(), "{} is missing: run `make model-minilm`", dir.display());
    dir
}

pub(crate) fn server() -> &'static TestServer {
    static SERVER: OnceLock<TestServer> = OnceLock::new();
    SERVER.get_or_init(|| {
        let dir = model_dir().display().to_string();
        TestServer::start_with_model(&dir, &["--max-model-len", "256", "--api-key", API_KEY])
    })
}

/// A server that lets at most 4 sequences wait.
fn small_queue() -> &'static TestServer {
    static SERVER: OnceLock<TestServer> = OnceLock::new();
    SERVER.get_or_init(|| {
        let dir = model_dir().display().to_string();
        TestServer::start_with_model(
            &dir,
            &["--max-model-len", "256", "--api-key", API_KEY, "--max-waiting-requests", "4"],
        )
    })
}

fn fixture_cases() -> Vec<Value> {
    let path = model_dir().join("../../tests/fixtures/embeddings-minilm.json");
    let fixture: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    fixture["cases"].as_array().unwrap().clone()
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect()
}

fn cosine(a: &[f64], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let norm = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
    dot / (norm(a) * norm(b))
}

async fn embed(body: Value) -> Result<(u16, Value)> {
    post_json(&client(), &server().url("/v1/embeddings"), &body).await
}

#[tokio::test]
async fn embeddings_match_the_reference_in_float_and_base64() -> Result<()> {
    let cases = fixture_cases();
    let texts: Vec<&str> = cases.iter().map(|c| c["text"].as_str().unwrap()).collect();
    let (status, body) = embed(json!({"model": "smol", "input": texts})).await?;
    assert_eq!(status, 200, "{body}");
    let (status, b64) = embed(json!({"input": texts, "encoding_format": "base64"})).await?;
    assert_eq!(status, 200, "{b64}");
    assert_eq!(body["object"], "list");
    assert_eq!(body["model"], "smol");
    let data = body["data"].as_array().unwrap();
    assert_eq!(data.len(), cases.len());
    let mut worst = 1.0f64;
    let mut tokens = 0;
    for (i, case) in cases.iter().enumerate() {
        assert_eq!(
            (data[i]["index"].as_u64(), data[i]["object"].as_str()),
            (Some(i as u64), Some("embedding"))
        );
        let got = floats(&data[i]["embedding"]);
        worst = worst.min(cosine(&got, &floats(&case["embedding"])));
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(b64["data"][i]["embedding"].as_str().unwrap())
            .unwrap();
        let decoded: Vec<f32> =
            bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
        // JSON writes each float32 in its shortest form, which reads back as the same float32.
        let as_f32: Vec<f32> = got.iter().map(|&x| x as f32).collect();
        assert_eq!(decoded, as_f32, "base64 of input {i} equals its floats");
        tokens += case["token_ids"].as_array().unwrap().len();
    }
    assert!(worst >= 0.9999, "lowest cosine {worst}");
    // The long texts count their 256 tokens only: they were cut as sentence-transformers cuts.
    assert_eq!(body["usage"]["prompt_tokens"].as_u64(), Some(tokens as u64));
    assert_eq!(body["usage"]["total_tokens"].as_u64(), Some(tokens as u64));
    Ok(())
}

#[tokio::test]
async fn token_inputs_and_the_models_own_dimensions_are_accepted() -> Result<()> {
    let case = &fixture_cases()[7];
    let ids = case["token_ids"].clone();
    let (status, body) = embed(json!({"input": [ids], "dimensions": 384})).await?;
    assert_eq!(status, 200, "{body}");
    assert!(cosine(&floats(&body["data"][0]["embedding"]), &floats(&case["embedding"])) >= 0.9999);
    Ok(())
}

#[tokio::test]
async fn bad_embedding_requests_are_400s_naming_the_parameter() -> Result<()> {
    let long_ids: Vec<u32> = std::iter::repeat_n(1000, 300).collect();
    let cases = [
        (json!({"input": "x", "dimensions": 64}), "dimensions"),
        (json!({"input": "x", "encoding_format": "int8"}), "encoding_format"),
        (json!({"input": []}), "input"),
        (json!({"input": [[]]}), "input"),
        (json!({"input": [[101, 99999]]}), "input"),
        (json!({"input": [long_ids]}), "input"),
        (json!({"input": "x", "temperature": 0.5}), "temperature"),
        (json!({"input": {"text": "x"}}), "input"),
    ];
    for (body, param) in cases {
        let (status, reply) = embed(body.clone()).await?;
        assert_eq!(status, 400, "{body} -> {reply}");
        assert_eq!(assert_error_shape(&reply)["param"], param, "{body} -> {reply}");
    }
    let (status, reply) = embed(json!({"model": "other", "input": "x"})).await?;
    assert_eq!(status, 404, "{reply}");
    Ok(())
}

#[tokio::test]
async fn an_embedding_model_refuses_to_generate_and_a_generating_one_to_embed() -> Result<()> {
    let (status, reply) =
        post_json(&client(), &server().url("/v1/completions"), &json!({"prompt": "Hello", "max_tokens": 4}))
            .await?;
    assert_eq!(status, 400, "{reply}");
    assert!(assert_error_shape(&reply)["message"].as_str().unwrap().contains("embedding model"), "{reply}");
    let (status, reply) =
        post_json(&client(), &shared().url("/v1/embeddings"), &json!({"input": "Hello"})).await?;
    assert_eq!(status, 400, "{reply}");
    assert_eq!(assert_error_shape(&reply)["param"], "model", "{reply}");
    Ok(())
}

#[tokio::test]
async fn embedding_requests_are_counted_in_the_metrics() -> Result<()> {
    let text = metrics_text(&client(), server()).await?;
    let before = metric(&text, "pagoda:request_success_total", "finished_reason=\"stop\"").unwrap_or(0.0);
    let (status, body) = embed(json!({"input": ["one", "two", "three"]})).await?;
    assert_eq!(status, 200, "{body}");
    let text = metrics_text(&client(), server()).await?;
    let after = metric(&text, "pagoda:request_success_total", "finished_reason=\"stop\"").unwrap_or(0.0);
    assert!(after >= before + 3.0, "{before} -> {after}");
    Ok(())
}

#[tokio::test]
async fn too_many_inputs_are_a_400_and_a_full_queue_a_429() -> Result<()> {
    let url = small_queue().url("/v1/embeddings");
    let (status, reply) = post_json(&client(), &url, &json!({"input": ["a", "b", "c", "d", "e"]})).await?;
    assert_eq!(status, 400, "{reply}");
    assert_eq!(assert_error_shape(&reply)["param"], "input", "{reply}");
    // Eight calls of four long inputs at once: the queue holds one call's inputs at a time.
    let long = "A long sentence about rivers, cities and the weather in spring. ".repeat(30);
    let body = json!({"input": [long, long, long, long]});
    let client = client();
    let calls = (0..8).map(|_| post_json(&client, &url, &body));
    let results = futures_util::future::join_all(calls).await;
    let statuses: Vec<u16> = results.into_iter().map(|r| r.map(|(s, _)| s)).collect::<Result<_>>()?;
    assert!(statuses.iter().all(|s| [200, 429].contains(s)), "{statuses:?}");
    assert!(statuses.contains(&200) && statuses.contains(&429), "{statuses:?}");
    Ok(())
}

/// SmolLM2 served with `--pooling last` both generates and embeds; its embedding of the golden
/// prompts is the numpy reference's final-normed last hidden state (scripts/golden.py).
#[tokio::test]
async fn a_generating_model_with_pooling_embeds_and_still_generates() -> Result<()> {
    static SERVER: OnceLock<TestServer> = OnceLock::new();
    let server = SERVER.get_or_init(|| TestServer::start(&["--pooling", "last", "--api-key", API_KEY]));
    let golden_path = model_dir().join("../../tests/fixtures/golden.json");
    let golden: Value = serde_json::from_str(&std::fs::read_to_string(golden_path)?)?;
    let cases = golden["pooling_cases"].as_array().unwrap();
    let inputs: Vec<Value> = cases.iter().map(|c| c["prompt_ids"].clone()).collect();
    let (status, body) =
        post_json(&client(), &server.url("/v1/embeddings"), &json!({"input": inputs})).await?;
    assert_eq!(status, 200, "{body}");
    for (i, case) in cases.iter().enumerate() {
        let got = floats(&body["data"][i]["embedding"]);
        assert_eq!(got.len(), 576);
        let c = cosine(&got, &floats(&case["last"]));
        assert!(c >= 0.9999, "{}: cosine {c}", case["name"]);
    }
    let (status, reply) = post_json(
        &client(),
        &server.url("/v1/completions"),
        &json!({"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0}),
    )
    .await?;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["usage"]["completion_tokens"], 4, "{reply}");
    Ok(())
}

/// tests/sdk/check_embeddings.py: the OpenAI SDK's default (base64) and float requests, batches,
/// token inputs, `dimensions` refused, the body against the SDK's own type.
#[tokio::test]
async fn openai_python_sdk_embeddings() -> Result<()> {
    crate::sdk::run_script("check_embeddings.py", &server().url("/v1"), &[]).await
}

//! `/v1/score` and `/v1/rerank` on a cross-encoder: the tiny random `BertForSequenceClassification`
//! of scripts/tiny_cross_encoder.py served from tests/fixtures/tiny/bert_cross_encoder/, its
//! scores through HTTP against transformers' (the sigmoid of the float64 logit, pairs cut at
//! the model's 64 positions as transformers cuts them), rerank sorted by them, and the requests
//! a cross-encoder cannot serve refused: embeddings (400 naming `model`) and `--pooling` at
//! start-up.

use std::path::PathBuf;
use std::sync::OnceLock;

use anyhow::Result;
use clap::Parser;
use pagoda_server::config::ServerConfig;
use pagoda_server::server::Server;
use serde_json::{json, Value};

use crate::harness::{assert_error_shape, client, post_json, Cli, TestServer};

fn model_dir() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from)
        .join("../../tests/fixtures/tiny/bert_cross_encoder")
}

fn server() -> &'static TestServer {
    static SERVER: OnceLock<TestServer> = OnceLock::new();
    SERVER.get_or_init(|| {
        TestServer::start_with_model(&model_dir().display().to_string(), &["--max-model-len", "64"])
    })
}

/// The reference's pairs: (query, document, score).
fn reference() -> Vec<(String, String, f64)> {
    let text = std::fs::read_to_string(model_dir().join("reference.json")).unwrap();
    let reference: Value = serde_json::from_str(&text).unwrap();
    let pairs = reference["pairs"].as_array().unwrap();
    let text = |v: &Value| v.as_str().unwrap().to_owned();
    pairs.iter().map(|p| (text(&p["query"]), text(&p["document"]), p["score"].as_f64().unwrap())).collect()
}

fn near(got: &Value, want: f64, what: &str) {
    let got = got.as_f64().unwrap_or_else(|| panic!("{what}: no score"));
    assert!((got - want).abs() < 2e-6, "{what}: {got} vs transformers' {want}");
}

#[tokio::test]
async fn cross_encoder_scores_are_transformers_scores() -> Result<()> {
    let pairs = reference();
    let url = server().url("/v1/score");
    // Pair by pair: every reference pair in one call.
    let text_1: Vec<&str> = pairs.iter().map(|p| p.0.as_str()).collect();
    let text_2: Vec<&str> = pairs.iter().map(|p| p.1.as_str()).collect();
    let (status, body) = post_json(&client(), &url, &json!({"text_1": text_1, "text_2": text_2})).await?;
    assert_eq!(status, 200, "{body}");
    let data = body["data"].as_array().unwrap();
    assert_eq!(data.len(), pairs.len());
    for (i, (d, pair)) in data.iter().zip(&pairs).enumerate() {
        assert_eq!(d["index"], i);
        near(&d["score"], pair.2, &format!("pair {i} {:?} / {:?}", pair.0, pair.1));
    }
    let tokens = body["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(tokens >= 3 * 64, "three pairs are cut at 64 tokens: {tokens}");
    // One query against many documents.
    let query = &pairs[0].0;
    let same: Vec<&(String, String, f64)> = pairs.iter().filter(|p| &p.0 == query).collect();
    let documents: Vec<&str> = same.iter().map(|p| p.1.as_str()).collect();
    let (status, body) = post_json(&client(), &url, &json!({"text_1": query, "text_2": documents})).await?;
    assert_eq!(status, 200, "{body}");
    for (d, pair) in body["data"].as_array().unwrap().iter().zip(&same) {
        near(&d["score"], pair.2, &pair.1);
    }
    Ok(())
}

#[tokio::test]
async fn cross_encoder_reranks_by_its_scores() -> Result<()> {
    let pairs = reference();
    let query = pairs[0].0.clone();
    let same: Vec<&(String, String, f64)> = pairs.iter().filter(|p| p.0 == query).collect();
    assert!(same.len() >= 3);
    let documents: Vec<&str> = same.iter().map(|p| p.1.as_str()).collect();
    let mut order: Vec<usize> = (0..same.len()).collect();
    order.sort_by(|&a, &b| same[b].2.total_cmp(&same[a].2));
    let body = json!({"query": query, "documents": documents, "top_n": same.len() - 1});
    let (status, reply) = post_json(&client(), &server().url("/v1/rerank"), &body).await?;
    assert_eq!(status, 200, "{reply}");
    let results = reply["results"].as_array().unwrap();
    assert_eq!(results.len(), same.len() - 1, "top_n: {reply}");
    for (result, &want) in results.iter().zip(&order) {
        assert_eq!(result["index"], want, "{reply}");
        assert_eq!(result["document"]["text"], documents[want], "{reply}");
        near(&result["relevance_score"], same[want].2, documents[want]);
    }
    Ok(())
}

#[tokio::test]
async fn a_cross_encoder_gives_no_embeddings() -> Result<()> {
    let (status, reply) =
        post_json(&client(), &server().url("/v1/embeddings"), &json!({"input": "paris"})).await?;
    assert_eq!(status, 400, "{reply}");
    let error = assert_error_shape(&reply);
    assert_eq!(error["param"], "model", "{reply}");
    assert!(error["message"].as_str().unwrap().contains("cross-encoder"), "{reply}");
    // Nor does it pool another way.
    let model = model_dir().display().to_string();
    let argv = ["pagoda", "--model", &model, "--port", "0", "--max-model-len", "64", "--pooling", "mean"];
    let config = ServerConfig::from_args(Cli::try_parse_from(argv)?.args)?;
    let err = Server::build(&config).await.err().expect("--pooling refused").to_string();
    assert!(err.contains("--pooling mean") && err.contains("cross-encoder"), "{err}");
    Ok(())
}

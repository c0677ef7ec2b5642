//! Details of the wire format that clients depend on: retrieving every listed model id (slashes
//! included) and `text_offset` in characters.

use anyhow::Result;
use pagoda_text::Tokenizer;
use serde_json::json;

use crate::harness::{assert_error_shape, model_path, post_json, TestServer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_listed_model_id_can_be_retrieved() -> Result<()> {
    let server =
        tokio::task::spawn_blocking(|| TestServer::start(&["--served-model-name", "org/smol-135m"])).await?;
    let c = reqwest::Client::new();
    let list: serde_json::Value = c.get(server.url("/v1/models")).send().await?.json().await?;
    let ids: Vec<&str> = list["data"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["smol", "org/smol-135m"]);
    for id in ids {
        let resp = c.get(server.url(&format!("/v1/models/{id}"))).send().await?;
        assert_eq!(resp.status(), 200, "{id}");
        let card: serde_json::Value = resp.json().await?;
        assert_eq!(card["id"], id);
        assert_eq!(card["object"], "model");
    }
    let resp = c.get(server.url("/v1/models/org/other")).send().await?;
    assert_eq!(resp.status(), 404);
    let body: serde_json::Value = resp.json().await?;
    assert_eq!(assert_error_shape(&body)["code"], "model_not_found");
    server.join()?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_offsets_count_characters() -> Result<()> {
    let tok = Tokenizer::from_gguf(model_path())?;
    // "é" is one token of two bytes: three of them are three characters, six bytes.
    let e_acute = tok.encode("é", false)?;
    assert_eq!(e_acute.len(), 1);
    let server = tokio::task::spawn_blocking(|| TestServer::start(&[])).await?;
    let c = reqwest::Client::new();
    let url = server.url("/v1/completions");
    let body = json!({"prompt": "Say:", "max_tokens": 3, "logprobs": 1, "temperature": 0,
                      "logit_bias": {e_acute[0].to_string(): 100}});
    let (status, json) = post_json(&c, &url, &body).await?;
    assert_eq!(status, 200, "{json}");
    let choice = &json["choices"][0];
    assert_eq!(choice["text"], "ééé");
    assert_eq!(choice["logprobs"]["text_offset"], json!([0, 1, 2]));

    server.join()?;
    Ok(())
}

//! LoRA adapters loaded and unloaded while serving (`--allow-runtime-lora-updating`), on the
//! tiny llama: a loaded adapter (PEFT's, or a GGUF) serves PEFT's text at once; loading twice, from outside
//! `--lora-dirs`, or from a missing directory is a 400; an adapter a request still uses is not
//! unloaded (400) until the request ends; all of it under a stream of other requests, none
//! lost. Without the flag the endpoints are 404s.

use std::sync::OnceLock;

use anyhow::Result;
use serde_json::{json, Value};

use crate::harness::{assert_error_shape, client, post_json, TestServer};
use crate::lora::tiny;

fn server() -> &'static TestServer {
    static SERVER: OnceLock<TestServer> = OnceLock::new();
    SERVER.get_or_init(|| {
        let a = format!("a={}", tiny("lora/a"));
        let dirs = tiny("lora");
        let flags = [
            "--max-model-len",
            "256",
            "--enable-lora",
            "--lora-modules",
            &a,
            "--max-loras",
            "2",
            "--max-cpu-loras",
            "3",
            "--allow-runtime-lora-updating",
            "--lora-dirs",
            &dirs,
        ];
        TestServer::start_with_model(&tiny("llama"), &flags)
    })
}

fn reference() -> Value {
    serde_json::from_str(&std::fs::read_to_string(tiny("lora/reference.json")).unwrap()).unwrap()
}

async fn post(path: &str, body: Value) -> Result<(u16, Value)> {
    post_json(&client(), &server().url(path), &body).await
}

/// The plain-text answer of a load or unload.
async fn update(path: &str, body: Value) -> Result<(u16, String)> {
    let resp = client().post(server().url(path)).json(&body).send().await?;
    Ok((resp.status().as_u16(), resp.text().await?))
}

async fn greedy_text(model: &str) -> Result<(u16, Value)> {
    let prompt = &reference()["prompts"]["long"];
    post(
        "/v1/completions",
        json!({"model": model, "prompt": prompt, "max_tokens": 16, "temperature": 0,
                                   "ignore_eos": true}),
    )
    .await
}

async fn expected_text(key: &str) -> Result<String> {
    let (_, text) = post("/detokenize", json!({"tokens": reference()[key]["long_greedy"]})).await?;
    Ok(text["prompt"].as_str().unwrap().to_owned())
}

#[tokio::test]
async fn adapters_load_serve_unload_and_reload_under_load() -> Result<()> {
    // Background traffic on the base model and on adapter a, through every update below.
    let traffic: Vec<_> = (0..6)
        .map(|i| {
            tokio::spawn(async move {
                let model = if i % 2 == 0 { "a" } else { "smol" };
                let prompt = json!({"model": model, "prompt": "hello", "max_tokens": 60, "ignore_eos": true});
                post("/v1/completions", prompt).await
            })
        })
        .collect();
    let load = json!({"lora_name": "b2", "lora_path": tiny("lora/b")});
    let (status, text) = update("/v1/load_lora_adapter", load.clone()).await?;
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("b2"), "{text}");
    let (status, reply) = greedy_text("b2").await?;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["choices"][0]["text"], expected_text("b").await?);

    // Refusals, each naming its field.
    let missing = tiny("lora/missing");
    let outside = tiny("llama");
    let cases = [
        (load.clone(), "lora_name"),
        (json!({"lora_name": "smol", "lora_path": tiny("lora/a")}), "lora_name"),
        (json!({"lora_name": "c", "lora_path": missing}), "lora_path"),
        (json!({"lora_name": "c", "lora_path": outside}), "lora_path"),
    ];
    for (body, param) in cases {
        let (status, reply) = post("/v1/load_lora_adapter", body.clone()).await?;
        assert_eq!(status, 400, "{body}: {reply}");
        assert_eq!(assert_error_shape(&reply)["param"], param, "{body}: {reply}");
    }

    // In use: a long request on b2 holds it.
    let mut long = client()
        .post(server().url("/v1/completions"))
        .json(&json!({"model": "b2", "prompt": "x", "max_tokens": 200, "ignore_eos": true, "stream": true}))
        .send()
        .await?;
    assert_eq!(long.status(), 200);
    let first = long.chunk().await?;
    assert!(first.is_some(), "the stream has begun");
    let (status, reply) = post("/v1/unload_lora_adapter", json!({"lora_name": "b2"})).await?;
    assert_eq!(status, 400, "{reply}");
    assert!(reply["error"]["message"].as_str().unwrap().contains("use it"), "{reply}");
    while long.chunk().await?.is_some() {}
    let wrong_id = json!({"lora_name": "b2", "lora_int_id": 99});
    let (status, reply) = post("/v1/unload_lora_adapter", wrong_id).await?;
    assert_eq!(status, 400, "{reply}");
    assert_eq!(assert_error_shape(&reply)["param"], "lora_int_id", "{reply}");
    let (status, text) = update("/v1/unload_lora_adapter", json!({"lora_name": "b2"})).await?;
    assert_eq!(status, 200, "{text}");
    assert_eq!(greedy_text("b2").await?.0, 404);
    let (status, reply) = post("/v1/unload_lora_adapter", json!({"lora_name": "b2"})).await?;
    assert_eq!(status, 404, "{reply}");

    // Back again, under its old name.
    assert_eq!(update("/v1/load_lora_adapter", load).await?.0, 200);
    let (status, reply) = greedy_text("b2").await?;
    assert_eq!((status, reply["choices"][0]["text"].clone()), (200, json!(expected_text("b").await?)));
    let list: Value = client().get(server().url("/v1/models")).send().await?.json().await?;
    let ids: Vec<&str> = list["data"].as_array().unwrap().iter().map(|c| c["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["smol", "a", "b2"]);

    // llama.cpp's GGUF conversion of adapter a serves a's text.
    let gguf = json!({"lora_name": "a-gguf", "lora_path": tiny("lora/a.gguf")});
    let (status, text) = update("/v1/load_lora_adapter", gguf).await?;
    assert_eq!(status, 200, "{text}");
    let (status, reply) = greedy_text("a-gguf").await?;
    assert_eq!((status, reply["choices"][0]["text"].clone()), (200, json!(expected_text("a").await?)));
    for task in traffic {
        let (status, reply) = task.await??;
        assert_eq!(status, 200, "{reply}");
        assert_eq!(reply["usage"]["completion_tokens"], 60);
    }
    Ok(())
}

#[tokio::test]
async fn without_the_flag_the_endpoints_are_off() -> Result<()> {
    let plain = crate::harness::shared();
    let body = json!({"lora_name": "x", "lora_path": tiny("lora/a")});
    let (status, reply) = post_json(&client(), &plain.url("/v1/load_lora_adapter"), &body).await?;
    assert_eq!(status, 404, "{reply}");
    assert!(reply["error"]["message"].as_str().unwrap().contains("--allow-runtime-lora-updating"));
    Ok(())
}

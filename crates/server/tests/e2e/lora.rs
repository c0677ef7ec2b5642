//! LoRA adapters through `pagoda serve`: the tiny llama served with the two PEFT adapters of
//! scripts/tiny_lora.py (`--enable-lora --lora-modules a=... b=...`). Requests naming an adapter
//! in `model` generate PEFT's greedy text for it, concurrently with the base model's (one mixed
//! batch), and under `--batch-invariant` the same bits in a mixed batch as alone; `/v1/models` lists the adapters under their parent; unknown names are 404s, adapters
//! on endpoints that do not generate 400s, `lora_requests_info` names the adapters in use, and
//! bad adapters stop the server at start-up.

use std::path::PathBuf;
use std::sync::OnceLock;

use anyhow::Result;
use clap::Parser;
use pagoda_server::config::ServerConfig;
use pagoda_server::server::Server;
use serde_json::{json, Value};

use crate::harness::{assert_error_shape, client, post_json, Cli, TestServer};

pub(crate) fn tiny(path: &str) -> String {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from)
        .join("../../tests/fixtures/tiny")
        .join(path)
        .display()
        .to_string()
}

fn server() -> &'static TestServer {
    static SERVER: OnceLock<TestServer> = OnceLock::new();
    SERVER.get_or_init(|| {
        let (a, b) = (format!("a={}", tiny("lora/a")), format!("b={}", tiny("lora/b")));
        let flags = ["--max-model-len", "256", "--enable-lora", "--lora-modules", &a, &b, "--max-loras", "2"];
        TestServer::start_with_model(&tiny("llama"), &[flags.as_slice(), &["--max-cpu-loras", "2"]].concat())
    })
}

fn reference() -> Value {
    serde_json::from_str(&std::fs::read_to_string(tiny("lora/reference.json")).unwrap()).unwrap()
}

async fn greedy(model: &str, prompt: &Value) -> Result<(u16, Value)> {
    let body =
        json!({"model": model, "prompt": prompt, "max_tokens": 16, "temperature": 0, "ignore_eos": true});
    post_json(&client(), &server().url("/v1/completions"), &body).await
}

#[tokio::test]
async fn each_adapter_generates_its_own_text_in_one_batch() -> Result<()> {
    let reference = reference();
    let prompt = &reference["prompts"]["long"];
    let (base, a, b) = tokio::join!(greedy("smol", prompt), greedy("a", prompt), greedy("b", prompt));
    for ((key, model), reply) in [("base", "smol"), ("a", "a"), ("b", "b")].into_iter().zip([base?, a?, b?]) {
        let (status, reply) = reply;
        assert_eq!(status, 200, "{model}: {reply}");
        assert_eq!(reply["model"], model);
        let ids = &reference[key]["long_greedy"];
        let (status, want) =
            post_json(&client(), &server().url("/detokenize"), &json!({"tokens": ids})).await?;
        assert_eq!(status, 200, "{want}");
        assert_eq!(reply["choices"][0]["text"], want["prompt"], "{model}");
        assert_eq!(reply["usage"]["completion_tokens"], 16);
    }
    // Chat picks the adapter the same way.
    let chat = |model: &str| {
        json!({"model": model, "messages": [{"role": "user", "content": "hi"}],
                                    "max_tokens": 8, "temperature": 0})
    };
    let url = server().url("/v1/chat/completions");
    let (s1, base) = post_json(&client(), &url, &chat("smol")).await?;
    let (s2, adapted) = post_json(&client(), &url, &chat("a")).await?;
    assert_eq!((s1, s2), (200, 200), "{base} {adapted}");
    assert_eq!(adapted["model"], "a");
    assert_ne!(base["choices"][0]["message"]["content"], adapted["choices"][0]["message"]["content"]);
    Ok(())
}

#[tokio::test]
async fn models_lists_adapters_and_names_are_checked() -> Result<()> {
    let list: Value = client().get(server().url("/v1/models")).send().await?.json().await?;
    let cards = list["data"].as_array().unwrap();
    let ids: Vec<&str> = cards.iter().map(|c| c["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["smol", "a", "b"], "{list}");
    assert!(cards[0]["parent"].is_null());
    for card in &cards[1..] {
        assert_eq!(card["parent"], "smol", "{card}");
        assert!(card["root"].as_str().unwrap().ends_with(&format!("lora/{}", card["id"].as_str().unwrap())));
    }
    let one: Value = client().get(server().url("/v1/models/b")).send().await?.json().await?;
    assert_eq!(one["parent"], "smol");
    let (status, reply) = greedy("c", &json!("x")).await?;
    assert_eq!(status, 404, "{reply}");
    let (status, reply) =
        post_json(&client(), &server().url("/v1/embeddings"), &json!({"model": "a", "input": "x"})).await?;
    assert_eq!(status, 400, "{reply}");
    assert_eq!(assert_error_shape(&reply)["param"], "model");
    Ok(())
}

#[tokio::test]
async fn metrics_report_the_adapters_in_use() -> Result<()> {
    let info = |text: &str| -> Option<String> {
        text.lines().find(|l| l.starts_with("pagoda:lora_requests_info{")).map(str::to_owned)
    };
    let body = json!({"model": "a", "prompt": "x", "max_tokens": 200, "ignore_eos": true, "stream": true});
    let mut long = client().post(server().url("/v1/completions")).json(&body).send().await?;
    assert_eq!(long.status(), 200);
    assert!(long.chunk().await?.is_some(), "the stream has begun");
    let text = client().get(server().url("/metrics")).send().await?.text().await?;
    let series = info(&text).unwrap_or_else(|| panic!("no lora_requests_info in\n{text}"));
    assert!(series.contains("max_lora=\"2\""), "{series}");
    let running = series.split("running_lora_adapters=\"").nth(1).unwrap().split('"').next().unwrap();
    assert!(running.split(',').any(|name| name == "a"), "{series}");
    let stamp: f64 = series.rsplit(' ').next().unwrap().parse()?;
    assert!(stamp > 1.7e9, "{series}");
    while long.chunk().await?.is_some() {}
    Ok(())
}

/// Under `--batch-invariant`, a request of either adapter or of the base model gets the same
/// bits (text and logprobs) served alone as in a batch of all three, where its rows share each
/// step (and, with the small token budget, prefill chunks) with the other adapters'.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_batches_are_bit_identical_to_each_request_alone() -> Result<()> {
    let (a, b) = (format!("a={}", tiny("lora/a")), format!("b={}", tiny("lora/b")));
    let flags = [
        "--batch-invariant",
        "--max-num-batched-tokens",
        "24",
        "--max-num-seqs",
        "8",
        "--no-enable-prefix-caching",
    ];
    let lora = ["--max-model-len", "256", "--enable-lora", "--lora-modules", &a, &b, "--max-loras", "2"];
    let invariant = TestServer::start_with_model(&tiny("llama"), &[flags.as_slice(), &lora].concat());
    let url = invariant.url("/v1/completions");
    let prompt = reference()["prompts"]["long"].clone();
    let bodies: Vec<Value> = ["smol", "a", "b", "a", "smol", "b"]
        .iter()
        .enumerate()
        .map(|(i, model)| {
            let mut body = json!({"model": model, "prompt": prompt, "max_tokens": 12 + i, "logprobs": 3,
                                  "ignore_eos": true, "temperature": 0});
            if i >= 3 {
                body["temperature"] = json!(0.8);
                body["seed"] = json!(7 + i);
            }
            body
        })
        .collect();
    let answer = |body: Value| {
        let url = url.clone();
        async move {
            let (status, reply) = post_json(&client(), &url, &body).await?;
            anyhow::ensure!(status == 200, "{reply}");
            anyhow::Ok(json!([reply["choices"][0]["text"], reply["choices"][0]["logprobs"]]))
        }
    };
    let mut alone = Vec::new();
    for body in &bodies {
        alone.push(answer(body.clone()).await?);
    }
    let together: Vec<_> = bodies.iter().map(|b| tokio::spawn(answer(b.clone()))).collect();
    for (i, (task, want)) in together.into_iter().zip(&alone).enumerate() {
        assert_eq!(&task.await??, want, "request {i} ({}): batched vs alone", bodies[i]["model"]);
    }
    assert_ne!(alone[0][0], alone[1][0], "the adapter changes the text");
    invariant.signal_stop();
    Ok(())
}

#[tokio::test]
async fn bad_adapters_stop_the_server_at_start_up() -> Result<()> {
    let model = tiny("llama");
    let build = |extra: &[&str]| {
        let mut argv = vec!["pagoda", "--model", &model, "--port", "0", "--max-model-len", "256"];
        argv.extend_from_slice(extra);
        let parsed = Cli::try_parse_from(argv).map_err(anyhow::Error::from);
        async move {
            let config = ServerConfig::from_args(parsed?.args)?;
            anyhow::Ok(Server::build(&config).await.err().map(|e| e.to_string()))
        }
    };
    let missing = build(&["--enable-lora", "--lora-modules", "x=/nonexistent/adapter"]).await?;
    assert!(
        missing.as_deref().is_some_and(|e| e.contains("x") && e.contains("adapter_config.json")),
        "{missing:?}"
    );
    let b = format!("b={}", tiny("lora/b"));
    let rank = build(&["--enable-lora", "--lora-modules", &b, "--max-lora-rank", "4"]).await?;
    assert!(rank.as_deref().is_some_and(|e| e.contains("--max-lora-rank")), "{rank:?}");
    let refused = ServerConfig::from_args(Cli::try_parse_from(["pagoda", "--lora-modules", &b])?.args);
    assert!(refused.unwrap_err().to_string().contains("--enable-lora"));
    Ok(())
}

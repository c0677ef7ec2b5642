//! `--rope-scaling`: the default model (8192 trained positions) served with YaRN at factor 4
//! answers a prompt longer than its trained context; a scaling that changes nothing (linear,
//! factor 1) gives the unscaled model's greedy tokens and logprobs bit for bit; bad values and
//! a context beyond the scaled positions are start-up errors naming what is wrong.

use std::time::Duration;

use anyhow::Result;
use serde_json::{json, Value};

use crate::harness::{post_json, startup_error, TestServer};

const YARN: &str = r#"{"rope_type":"yarn","factor":4.0,"original_max_position_embeddings":8192}"#;

/// About 9k tokens of numbered lines, then a question about them.
fn long_prompt() -> String {
    let mut text = String::from("Below is a numbered list of notes.\n");
    for i in 0..440 {
        text.push_str(&format!(
            "Note {i}: the shipment for store {} left on day {}.\n",
            i * 7 % 101,
            i % 30 + 1
        ));
    }
    text.push_str("Question: which store is named in note 3? Answer:");
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn yarn_serves_a_prompt_longer_than_the_trained_context() -> Result<()> {
    let server = TestServer::start(&[
        "--rope-scaling",
        YARN,
        "--max-model-len",
        "32768",
        "--kv-cache-memory",
        "800MiB",
    ]);
    let client = reqwest::Client::builder().timeout(Duration::from_secs(900)).build()?;
    let models: Value = client.get(server.url("/v1/models")).send().await?.json().await?;
    assert_eq!(models["data"][0]["max_model_len"], 32768, "{models}");
    let body = json!({"model": "smol", "prompt": long_prompt(), "max_tokens": 4, "temperature": 0});
    let (status, reply) = post_json(&client, &server.url("/v1/completions"), &body).await?;
    assert_eq!(status, 200, "{reply}");
    let prompt_tokens = reply["usage"]["prompt_tokens"].as_u64().unwrap_or(0);
    assert!((8193..12_000).contains(&prompt_tokens), "prompt of {prompt_tokens} tokens: {reply}");
    assert_eq!(reply["usage"]["completion_tokens"], 4, "{reply}");
    assert!(!reply["choices"][0]["text"].as_str().unwrap_or("").is_empty(), "{reply}");
    server.signal_stop();
    server.join()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn linear_factor_one_matches_the_unscaled_model_bit_for_bit() -> Result<()> {
    let body = json!({
        "model": "smol",
        "prompt": "The three primary colors are",
        "max_tokens": 12,
        "temperature": 0,
        "logprobs": 3,
    });
    let mut replies = Vec::new();
    for extra in [&[][..], &["--rope-scaling", r#"{"rope_type":"linear","factor":1.0}"#][..]] {
        let server = TestServer::start(extra);
        let (status, reply) =
            post_json(&reqwest::Client::new(), &server.url("/v1/completions"), &body).await?;
        assert_eq!(status, 200, "{reply}");
        server.signal_stop();
        server.join()?;
        replies.push(reply["choices"][0].clone());
    }
    assert_eq!(replies[0]["text"], replies[1]["text"]);
    assert_eq!(replies[0]["logprobs"], replies[1]["logprobs"]);
    assert!(
        replies[0]["logprobs"]["token_logprobs"].as_array().is_some_and(|l| l.len() == 12),
        "{}",
        replies[0]
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_rope_scaling_is_a_startup_error_naming_the_field() -> Result<()> {
    for (value, field) in [
        (r#"{"rope_type":"ntk","factor":4}"#, "rope_type"),
        (r#"{"rope_type":"yarn","factor":4,"beta_fast":0}"#, "beta_fast"),
        (r#"{"rope_type":"yarn","factor":4,"low_freq_factor":1}"#, "low_freq_factor"),
        (r#"{"rope_type":"yarn"}"#, "factor"),
        ("yarn", "rope_scaling"),
    ] {
        let e = startup_error(&["--rope-scaling", value]).await.expect_err("the flag is refused").to_string();
        assert!(e.contains("--rope-scaling") && e.contains(field), "{value}: {e}");
    }
    // The scaled model covers factor * original positions and no more.
    let e = startup_error(&["--rope-scaling", YARN, "--max-model-len", "32769"]).await?;
    assert!(e.contains("32769") && e.contains("context of 32768"), "{e}");
    // Without the flag the trained context is the limit, and the error points at the flag.
    let e = startup_error(&["--max-model-len", "32768"]).await?;
    assert!(e.contains("context of 8192") && e.contains("--rope-scaling"), "{e}");
    Ok(())
}

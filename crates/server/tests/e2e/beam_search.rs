//! vLLM's `use_beam_search` through `pagoda serve`, against scripts/golden_beam.py's search
//! over the float64 numpy model (tests/fixtures/beam-search.json): on completions (with
//! `best_of`, `length_penalty`, `logprobs`, whole and streamed) and on chat, each returned
//! choice is the reference hypothesis of its rank, its text, finish reason and summed logprobs;
//! fields beam search cannot honour are 400s naming them. The server's CPU plan lands the
//! summed logprobs within about 3e-3 of the float64 reference here (the reference keeps
//! candidates at least 6e-3 apart); crates/models/tests/beam_search.rs holds the f32 path to
//! 2e-3 and measures 2e-5. The server here is batch-invariant: on the shared one, a beam step
//! batched with other tests' prefills ran the bfloat16 prefill kernel and drifted by 2e-2.

use anyhow::Result;
use serde_json::{json, Value};

use std::sync::OnceLock;

use crate::harness::{assert_error_shape, client, post_json, read_sse, TestServer};

/// The same kernels at every step, so the sums do not depend on what else the server runs.
fn server() -> &'static TestServer {
    static SERVER: OnceLock<TestServer> = OnceLock::new();
    SERVER.get_or_init(|| TestServer::start(&["--batch-invariant", "--max-num-seqs", "64"]))
}

/// Summed logprobs of up to ten tokens within this of the reference.
const TOLERANCE: f64 = 5e-3;

fn fixture() -> Value {
    let path = std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")), std::path::PathBuf::from)
        .join("../../tests/fixtures/beam-search.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The text, finish reason and cumulative logprob of each reference hypothesis of `case`.
async fn expected(case: &Value, eos: u64) -> Result<Vec<(String, &'static str, f64)>> {
    let mut out = Vec::new();
    for h in case["hypotheses"].as_array().unwrap() {
        let mut ids: Vec<u64> =
            h["token_ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
        let ended = h["eos"].as_bool().unwrap();
        if ended {
            assert_eq!(ids.pop(), Some(eos));
        }
        let (status, text) =
            post_json(&client(), &server().url("/detokenize"), &json!({"tokens": ids})).await?;
        assert_eq!(status, 200, "{text}");
        let finish = if ended { "stop" } else { "length" };
        out.push((text["prompt"].as_str().unwrap().to_owned(), finish, h["cum_logprob"].as_f64().unwrap()));
    }
    Ok(out)
}

fn body(case: &Value) -> Value {
    let (width, n) = (case["width"].as_u64().unwrap(), case["n"].as_u64().unwrap());
    let mut body = json!({
        "prompt": case["prompt_ids"], "use_beam_search": true, "n": n,
        "max_tokens": case["max_tokens"], "length_penalty": case["length_penalty"], "logprobs": 0,
    });
    if width != n {
        body["best_of"] = json!(width);
    }
    body
}

#[tokio::test]
async fn completions_return_the_reference_beams() -> Result<()> {
    let fixture = fixture();
    let eos = fixture["eos_token_id"].as_u64().unwrap();
    let url = server().url("/v1/completions");
    for case in fixture["cases"].as_array().unwrap() {
        let name = format!("{} width {}", case["name"].as_str().unwrap(), case["width"]);
        let want = expected(case, eos).await?;
        let (status, reply) = post_json(&client(), &url, &body(case)).await?;
        assert_eq!(status, 200, "{name}: {reply}");
        let choices = reply["choices"].as_array().unwrap();
        assert_eq!(choices.len(), want.len(), "{name}: {reply}");
        for (i, (choice, (text, finish, cum))) in choices.iter().zip(&want).enumerate() {
            assert_eq!(choice["index"], i);
            assert_eq!(choice["text"], text.as_str(), "{name}: hypothesis {i}");
            assert_eq!(choice["finish_reason"], *finish, "{name}: hypothesis {i}");
            let logprobs = choice["logprobs"]["token_logprobs"].as_array().unwrap();
            let sum: f64 = logprobs.iter().map(|v| v.as_f64().unwrap()).sum();
            assert!((sum - cum).abs() < TOLERANCE, "{name}: hypothesis {i}: {sum} vs {cum}");
        }
        let completion: usize = case["hypotheses"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| h["token_ids"].as_array().unwrap().len())
            .sum();
        assert_eq!(reply["usage"]["completion_tokens"], completion, "{name}");
    }
    Ok(())
}

#[tokio::test]
async fn streamed_and_chat_beams_are_the_same() -> Result<()> {
    let fixture = fixture();
    let eos = fixture["eos_token_id"].as_u64().unwrap();
    let case = &fixture["cases"][0];
    assert_eq!(case["name"], "chat_capital_of_france");
    let want = expected(case, eos).await?;
    let mut streamed = body(case);
    streamed["stream"] = json!(true);
    let resp = client().post(server().url("/v1/completions")).json(&streamed).send().await?;
    assert_eq!(resp.status(), 200);
    let (events, done) = read_sse(resp).await?;
    assert!(done, "the stream ends with [DONE]");
    let mut texts = vec![String::new(); want.len()];
    for event in &events {
        for choice in event["choices"].as_array().unwrap() {
            texts[choice["index"].as_u64().unwrap() as usize] += choice["text"].as_str().unwrap();
        }
    }
    assert_eq!(texts, want.iter().map(|w| w.0.clone()).collect::<Vec<_>>());

    // The same prompt as a conversation: the golden prompt is its rendering.
    let chat = json!({
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "use_beam_search": true, "n": case["n"], "max_tokens": case["max_tokens"],
    });
    let (status, reply) = post_json(&client(), &server().url("/v1/chat/completions"), &chat).await?;
    assert_eq!(status, 200, "{reply}");
    let contents: Vec<&str> = reply["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["message"]["content"].as_str().unwrap())
        .collect();
    assert_eq!(contents, want.iter().map(|w| w.0.as_str()).collect::<Vec<_>>(), "{reply}");
    assert_eq!(reply["choices"][0]["finish_reason"], want[0].1);
    Ok(())
}

#[tokio::test]
async fn beam_search_refuses_what_it_cannot_honour() -> Result<()> {
    let url = server().url("/v1/completions");
    let beam = |extra: Value| {
        let mut body =
            json!({"prompt": "Once upon a time", "use_beam_search": true, "n": 2, "max_tokens": 4});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        body
    };
    let cases = [
        (beam(json!({"temperature": 0.7})), "temperature"),
        (beam(json!({"top_p": 0.5})), "top_p"),
        (beam(json!({"logprobs": 2})), "logprobs"),
        (beam(json!({"best_of": 1})), "best_of"),
        (beam(json!({"best_of": 100_000})), "best_of"),
        (beam(json!({"stop": ["\n"]})), "stop"),
        (beam(json!({"response_format": {"type": "json_object"}})), "response_format"),
        (beam(json!({"max_tokens": 1000, "n": 16})), "max_tokens"),
        (json!({"prompt": "x", "length_penalty": 0.5}), "length_penalty"),
        (json!({"prompt": "x", "best_of": 3, "n": 2}), "best_of"),
    ];
    for (body, param) in cases {
        let (status, reply) = post_json(&client(), &url, &body).await?;
        assert_eq!(status, 400, "{body}: {reply}");
        assert_eq!(assert_error_shape(&reply)["param"], param, "{body}: {reply}");
    }
    Ok(())
}

//! `pagoda serve --quantization fp8`: the default model's projections rounded to FP8 at load
//! (on the CPU, kept dense), served through the whole stack. Greedy answers start as the
//! unquantized server's do while their logprobs show the rounding; the flag is refused beside
//! `--batch-invariant`, and a quantization it does not know is refused with the ones it does.

use anyhow::Result;
use serde_json::{json, Value};

use crate::harness::{client, post_json, shared, startup_error, TestServer};

/// The greedy answer's tokens and their logprobs.
async fn answer(server: &TestServer, content: &str) -> Result<Vec<(String, f64)>> {
    let body = json!({"model": "smol", "messages": [{"role": "user", "content": content}],
                      "max_tokens": 8, "temperature": 0, "logprobs": true});
    let (status, reply) = post_json(&client(), &server.url("/v1/chat/completions"), &body).await?;
    anyhow::ensure!(status == 200, "{status}: {reply}");
    let tokens = reply["choices"][0]["logprobs"]["content"].as_array().cloned().unwrap_or_default();
    Ok(tokens
        .iter()
        .map(|t: &Value| (t["token"].as_str().unwrap_or_default().to_owned(), t["logprob"].as_f64().unwrap()))
        .collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fp8_weights_answer_as_the_model_does_with_their_own_logprobs() -> Result<()> {
    let fp8 = TestServer::start(&["--quantization", "fp8"]);
    let prompts = ["What is the capital of France?", "Name three colours.", "Say hello."];
    let (mut same_first, mut logprobs_differ) = (0, 0);
    for prompt in prompts {
        let (want, got) = (answer(shared(), prompt).await?, answer(&fp8, prompt).await?);
        anyhow::ensure!(want.len() == 8 && got.len() == 8, "{want:?} {got:?}");
        println!(
            "{prompt:?}: f32 {:?} / fp8 {:?}",
            want.iter().map(|t| &t.0).collect::<Vec<_>>(),
            got.iter().map(|t| &t.0).collect::<Vec<_>>()
        );
        if want[0].0 == got[0].0 {
            same_first += 1;
            logprobs_differ += usize::from((want[0].1 - got[0].1).abs() > 1e-6);
        }
    }
    // Every answer starts with the unquantized model's token, at another probability.
    assert_eq!(same_first, prompts.len());
    assert_eq!(logprobs_differ, prompts.len());
    fp8.signal_stop();
    fp8.join()
}

#[tokio::test]
async fn fp8_is_refused_where_it_has_no_kernels_and_unknown_schemes_are_named() -> Result<()> {
    // Both refused as the flags are read, before any model loads.
    let e = startup_error(&["--quantization", "fp8", "--batch-invariant"])
        .await
        .expect_err("refused")
        .to_string();
    assert!(e.contains("--quantization") && e.contains("--batch-invariant"), "{e}");
    let e = startup_error(&["--quantization", "awq"]).await.expect_err("clap refuses it").to_string();
    assert!(e.contains("awq") && e.contains("fp8"), "{e}");
    Ok(())
}

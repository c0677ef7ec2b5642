//! Prefill/decode disaggregation with the routers' own PD modes: a prefill instance
//! (`kv_producer`) and a decode instance (`kv_consumer`) behind vllm-router's
//! `--vllm-pd-disaggregation` (prefill first, its `kv_transfer_params` copied into the decode
//! request) and sglang-router's `--pd-disaggregation` (both at once, keyed by
//! `bootstrap_room`). Greedy output on the golden prompts must equal a single instance's, token
//! for token, with the prompt's KV really moved (the decode instance's received blocks and
//! prefix-cache hits). Then the faults: a prefill instance that cannot be reached, one that
//! never answers, and a hold that expired all end in a local recompute with the same output.
//! FP8 caches transfer with their scales.

use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use serde_json::{json, Value};

use crate::processes::{free_port, repo_root};
use crate::routers::{metric_sum, replica_metrics, Router, RouterKind};
use crate::stack::{Replica, SERVED_MODEL};

const MAX_TOKENS: usize = 24;

/// The golden chat conversations and token-id prompts, plus one long prompt of many blocks.
fn golden_requests() -> Result<Vec<(&'static str, Value)>> {
    let text = std::fs::read_to_string(repo_root().join("tests/fixtures/golden.json"))?;
    let golden: Value = serde_json::from_str(&text)?;
    let mut requests = Vec::new();
    for case in golden["chat_cases"].as_array().context("chat_cases")? {
        if case["add_generation_prompt"] == json!(true) {
            let body = json!({"model": SERVED_MODEL, "messages": case["messages"], "max_tokens": MAX_TOKENS,
                              "temperature": 0});
            requests.push(("/v1/chat/completions", body));
        }
    }
    for case in golden["logits_cases"].as_array().context("logits_cases")? {
        let body = json!({"model": SERVED_MODEL, "prompt": case["prompt_ids"], "max_tokens": MAX_TOKENS,
                          "temperature": 0});
        requests.push(("/v1/completions", body));
    }
    let long: String =
        (0..40).map(|i| format!("Fact {i}: the value of item {i} is {}. ", i * 37 % 101)).collect();
    let body = json!({"model": SERVED_MODEL, "prompt": format!("{long}\nSummary:"), "max_tokens": MAX_TOKENS,
                      "temperature": 0});
    requests.push(("/v1/completions", body));
    Ok(requests)
}

/// The text and token count of a non-streamed answer.
fn answer(body: &Value) -> (String, u64) {
    let choice = &body["choices"][0];
    let text = choice["message"]["content"].as_str().or(choice["text"].as_str()).unwrap_or_default();
    (text.to_owned(), body["usage"]["completion_tokens"].as_u64().unwrap_or(0))
}

async fn post(http: &reqwest::Client, url: &str, body: &Value) -> Result<Value> {
    let resp = http.post(url).json(body).send().await?;
    let status = resp.status();
    let text = resp.text().await?;
    ensure!(status.is_success(), "{url}: {status}: {text}");
    Ok(serde_json::from_str(&text)?)
}

/// The content of a streamed chat answer.
async fn streamed_chat(http: &reqwest::Client, url: &str, body: &Value) -> Result<String> {
    let mut body = body.clone();
    body["stream"] = json!(true);
    let resp = http.post(url).json(&body).send().await?;
    ensure!(resp.status().is_success(), "{url}: {}", resp.status());
    let text = resp.text().await?;
    if let Err(why) = crate::routers::whole_stream(&text) {
        bail!("the stream is not whole ({why}): {text}");
    }
    let mut content = String::new();
    for line in text.lines().filter_map(|l| l.strip_prefix("data: ")).filter(|l| *l != "[DONE]") {
        let chunk: Value = serde_json::from_str(line)?;
        content.push_str(chunk["choices"][0]["delta"]["content"].as_str().unwrap_or_default());
    }
    Ok(content)
}

/// Each request's prompt length, as the single instance counted it.
async fn prompt_lengths(
    http: &reqwest::Client,
    single: &Replica,
    requests: &[(&str, Value)],
) -> Result<Vec<u64>> {
    let mut lengths = Vec::new();
    for (path, body) in requests {
        let mut body = body.clone();
        body["max_tokens"] = json!(1);
        let answered = post(http, &single.url(path), &body).await?;
        lengths.push(answered["usage"]["prompt_tokens"].as_u64().context("prompt_tokens")?);
    }
    Ok(lengths)
}

fn as_strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

fn transfer_config(role: &str, extra: Value, port: Option<u16>) -> String {
    let mut config = json!({"kv_role": role, "kv_connector_extra_config": extra});
    if let Some(port) = port {
        config["kv_port"] = json!(port);
    }
    config.to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefill_decode_pair_answers_as_one_instance_behind_both_routers() -> Result<()> {
    let _turn = crate::SERVERS.lock().await;
    let dir = tempfile::Builder::new().prefix("pagoda-pd-").tempdir()?;
    let http = reqwest::Client::builder().timeout(Duration::from_secs(120)).build()?;
    let kv_port = free_port()?;
    let producer = transfer_config("kv_producer", json!({"hold_timeout_s": 8}), Some(kv_port));
    let consumer = transfer_config("kv_consumer", json!({"transfer_timeout_s": 60}), None);
    let impatient = transfer_config("kv_consumer", json!({"transfer_timeout_s": 1}), None);
    // One matmul plan for all (`auto` picks it by a start-up timing, which may differ between
    // instances started together, and the golden prompts have near-ties a different kernel's
    // rounding can resolve the other way).
    let plan = ["--cpu-gemm-dtype", "float32"];
    let with_transfer = |transfer: &str| -> Vec<String> {
        plan.iter().map(|s| s.to_string()).chain(["--kv-transfer-config".into(), transfer.into()]).collect()
    };
    let mut single = Replica::spawn("single", dir.path(), free_port()?, &plan)?;
    let mut prefill =
        Replica::spawn("prefill", dir.path(), free_port()?, &as_strs(&with_transfer(&producer)))?;
    let mut decode = Replica::spawn("decode", dir.path(), free_port()?, &as_strs(&with_transfer(&consumer)))?;
    let mut decode_1s =
        Replica::spawn("decode-1s", dir.path(), free_port()?, &as_strs(&with_transfer(&impatient)))?;
    for r in [&mut single, &mut prefill, &mut decode, &mut decode_1s] {
        r.wait_ready(&http).await?;
    }

    // sglang-router reads each instance's part from /server_info.
    let info: Value = http.get(prefill.url("/server_info")).send().await?.json().await?;
    ensure!(info["disaggregation_mode"] == json!("prefill"), "{info}");
    ensure!(info["disaggregation_bootstrap_port"] == json!(kv_port), "{info}");
    let info: Value = http.get(decode.url("/server_info")).send().await?.json().await?;
    ensure!(info["disaggregation_mode"] == json!("decode"), "{info}");

    let requests = golden_requests()?;
    let mut reference = Vec::new();
    for (path, body) in &requests {
        reference.push(answer(&post(&http, &single.url(path), body).await?));
    }
    ensure!(reference.iter().all(|(_, n)| *n > 0), "the single instance generated nothing: {reference:?}");

    for kind in [RouterKind::Vllm, RouterKind::Sglang] {
        // Each router starts on a cold decode cache: its hits can only come from transfers.
        let flushed = http.post(decode.url("/flush_cache")).send().await?;
        ensure!(flushed.status().is_success(), "flushing the decode instance: {}", flushed.status());
        let before = replica_metrics(&http, &decode).await?;
        let received_before =
            metric_sum(&before, "pagoda:kv_transfer_blocks_total", &["direction=\"received\""]);
        let hits_before = metric_sum(&before, "pagoda:prefix_cache_hits_total", &[]);
        let router = Router::start_pd(kind, &prefill.addr, kv_port, &decode.addr, dir.path()).await?;
        // sglang-router itself refuses a completions prompt of token ids (422): text only there.
        let served = |body: &Value| kind == RouterKind::Vllm || !body["prompt"].is_array();
        let mut sent = Vec::new();
        for ((path, body), want) in requests.iter().zip(&reference).filter(|((_, b), _)| served(b)) {
            sent.push((*path, body.clone()));
            let got = answer(&post(&http, &format!("{}{path}", router.url), body).await?);
            ensure!(&got == want, "{} {path}: PD answered {got:?}, one instance {want:?}", kind.name());
        }
        let (_, chat) = &requests[0];
        let streamed = streamed_chat(&http, &format!("{}/v1/chat/completions", router.url), chat).await?;
        ensure!(
            streamed == reference[0].0,
            "{} streamed {streamed:?}, one instance {:?}",
            kind.name(),
            reference[0].0
        );

        let after = replica_metrics(&http, &decode).await?;
        let received = metric_sum(&after, "pagoda:kv_transfer_blocks_total", &["direction=\"received\""])
            - received_before;
        let failures = metric_sum(&after, "pagoda:kv_transfer_failures_total", &[]);
        // Every whole block of every prompt but the last partial one (one golden prompt is
        // shorter than a block), plus the streamed chat's.
        let whole: f64 = prompt_lengths(&http, &single, &sent).await?.iter().map(|n| (n / 16) as f64).sum();
        ensure!(received >= whole, "{}: {received} blocks received, the prompts have {whole}", kind.name());
        let hits = metric_sum(&after, "pagoda:prefix_cache_hits_total", &[]) - hits_before;
        ensure!(
            hits >= whole * 16.0,
            "{}: only {hits} prompt tokens came from the imported blocks",
            kind.name()
        );
        ensure!(
            failures == 0.0,
            "{}: {failures} transfers failed\n{}",
            kind.name(),
            decode.process.log_tail(40)
        );
        println!(
            "{}: {} requests, {received} blocks received by the decode instance",
            kind.name(),
            sent.len() + 1
        );
        drop(router);
    }
    let sent = metric_sum(
        &replica_metrics(&http, &prefill).await?,
        "pagoda:kv_transfer_blocks_total",
        &["direction=\"sent\""],
    );
    ensure!(sent > 0.0, "the prefill instance sent nothing");

    // Faults, each against the decode instance directly, with the kv_transfer_params a router
    // would copy from a prefill's answer.
    let (path, body) = &requests[requests.len() - 1];
    let want = &reference[reference.len() - 1];
    let fetch_from = |port: u16, key: &str| {
        let mut body = body.clone();
        body["kv_transfer_params"] = json!({"do_remote_prefill": true, "do_remote_decode": false,
            "remote_host": "127.0.0.1", "remote_port": port, "remote_request_id": key, "remote_engine_id": "x"});
        body
    };
    let failures = |text: &str, reason: &str| {
        metric_sum(text, "pagoda:kv_transfer_failures_total", &[&format!("reason=\"{reason}\"")])
    };

    // Nothing listens there.
    let closed = free_port()?;
    let got = answer(&post(&http, &decode_1s.url(path), &fetch_from(closed, "k1")).await?);
    ensure!(&got == want, "after a refused connection: {got:?}, want {want:?}");
    ensure!(
        failures(&replica_metrics(&http, &decode_1s).await?, "connect") == 1.0,
        "connect failure not counted"
    );

    // A prefill instance that accepts and never answers: the 1 s transfer timeout, then a recompute.
    let silent = std::net::TcpListener::bind("127.0.0.1:0")?;
    let silent_port = silent.local_addr()?.port();
    let started = Instant::now();
    let got = answer(&post(&http, &decode_1s.url(path), &fetch_from(silent_port, "k2")).await?);
    ensure!(&got == want, "after a timeout: {got:?}, want {want:?}");
    ensure!(
        started.elapsed() < Duration::from_secs(30),
        "the timed-out transfer took {:?}",
        started.elapsed()
    );
    ensure!(failures(&replica_metrics(&http, &decode_1s).await?, "timeout") == 1.0, "timeout not counted");
    drop(silent);

    // A prefill whose hold nobody reads: its blocks are released after hold_timeout_s (8 s).
    let mut prefill_body = body.clone();
    prefill_body["kv_transfer_params"] = json!({"do_remote_decode": true, "do_remote_prefill": false,
        "remote_host": null, "remote_port": null, "remote_block_ids": null, "remote_engine_id": null});
    prefill_body["max_tokens"] = json!(1);
    let expired_before =
        metric_sum(&replica_metrics(&http, &prefill).await?, "pagoda:kv_transfer_expired_holds_total", &[]);
    let prefilled = post(&http, &prefill.url(path), &prefill_body).await?;
    let params = prefilled["kv_transfer_params"].clone();
    ensure!(
        params["do_remote_prefill"] == json!(true) && params["remote_port"] == json!(kv_port),
        "{prefilled}"
    );
    let held = metric_sum(&replica_metrics(&http, &prefill).await?, "pagoda:kv_transfer_held_blocks", &[]);
    ensure!(held > 0.0, "the prefill holds no blocks after answering");
    tokio::time::sleep(Duration::from_secs(10)).await;
    let metrics = replica_metrics(&http, &prefill).await?;
    ensure!(metric_sum(&metrics, "pagoda:kv_transfer_held_blocks", &[]) == 0.0, "held blocks not released");
    let expired = metric_sum(&metrics, "pagoda:kv_transfer_expired_holds_total", &[]) - expired_before;
    ensure!(expired == 1.0, "{expired} expiries counted, expected 1");
    let mut late = body.clone();
    late["kv_transfer_params"] = params;
    let got = answer(&post(&http, &decode_1s.url(path), &late).await?);
    ensure!(&got == want, "after an expired hold: {got:?}, want {want:?}");
    ensure!(
        failures(&replica_metrics(&http, &decode_1s).await?, "not_found") == 1.0,
        "not_found not counted"
    );

    // What an instance cannot honour is a 400 naming the field.
    let resp = http.post(single.url(path)).json(&fetch_from(kv_port, "k3")).send().await?;
    ensure!(resp.status() == 400, "a server without --kv-transfer-config answered {}", resp.status());
    let error: Value = resp.json().await?;
    ensure!(error["error"]["param"] == json!("kv_transfer_params"), "{error}");
    let resp = http.post(decode.url(path)).json(&prefill_body).send().await?;
    ensure!(resp.status() == 400, "a decode instance took a prefill: {}", resp.status());
    Ok(())
}

/// FP8 caches (`--kv-cache-dtype fp8`): the pages travel with their calibrated scales, so a
/// pair of FP8 instances answers as one FP8 instance does, with the prompts' blocks moved; a
/// decode instance of another cache dtype refuses them (the layouts differ) and recomputes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fp8_pages_travel_with_their_scales() -> Result<()> {
    let _turn = crate::SERVERS.lock().await;
    let dir = tempfile::Builder::new().prefix("pagoda-pd-fp8-").tempdir()?;
    let http = reqwest::Client::builder().timeout(Duration::from_secs(120)).build()?;
    let kv_port = free_port()?;
    let producer = transfer_config("kv_producer", json!({"hold_timeout_s": 8}), Some(kv_port));
    let consumer = transfer_config("kv_consumer", json!({"transfer_timeout_s": 60}), None);
    // One matmul plan for all (`auto` picks it by a start-up timing, which may differ between
    // instances).
    let fp8 = ["--kv-cache-dtype", "fp8", "--cpu-gemm-dtype", "float32"];
    let with_fp8 = |transfer: &str| -> Vec<String> {
        fp8.iter().map(|s| s.to_string()).chain(["--kv-transfer-config".into(), transfer.into()]).collect()
    };
    let (producer_args, consumer_args) = (with_fp8(&producer), with_fp8(&consumer));
    let mut single = Replica::spawn("single-fp8", dir.path(), free_port()?, &fp8)?;
    let mut prefill = Replica::spawn("prefill-fp8", dir.path(), free_port()?, &as_strs(&producer_args))?;
    let mut decode = Replica::spawn("decode-fp8", dir.path(), free_port()?, &as_strs(&consumer_args))?;
    let mut decode_f16 =
        Replica::spawn("decode-f16", dir.path(), free_port()?, &["--kv-transfer-config", &consumer])?;
    for r in [&mut single, &mut prefill, &mut decode, &mut decode_f16] {
        r.wait_ready(&http).await?;
    }
    let requests = golden_requests()?;
    let router = Router::start_pd(RouterKind::Vllm, &prefill.addr, kv_port, &decode.addr, dir.path()).await?;
    let mut sent = Vec::new();
    for (path, body) in &requests {
        // The reference computes as the decode instance does: the prompt's whole blocks come
        // from its prefix cache (filled by a first, one-token request), the rest in a step of
        // its own. Three mantissa bits make a one-step prefill's other rounding visible.
        let mut warm = body.clone();
        warm["max_tokens"] = json!(1);
        post(&http, &single.url(path), &warm).await?;
        let want = answer(&post(&http, &single.url(path), body).await?);
        let got = answer(&post(&http, &format!("{}{path}", router.url), body).await?);
        ensure!(got == want, "{path}: the FP8 pair answered {got:?}, one FP8 instance {want:?}");
        sent.push((*path, body.clone()));
    }
    let metrics = replica_metrics(&http, &decode).await?;
    let received = metric_sum(&metrics, "pagoda:kv_transfer_blocks_total", &["direction=\"received\""]);
    let whole: f64 = prompt_lengths(&http, &single, &sent).await?.iter().map(|n| (n / 16) as f64).sum();
    ensure!(received >= whole, "{received} blocks received, the prompts have {whole}");
    ensure!(metric_sum(&metrics, "pagoda:kv_transfer_failures_total", &[]) == 0.0, "a transfer failed");
    drop(router);

    // A prefill's FP8 hold fetched by an f16 decode instance: refused, then computed there.
    let (path, body) = &requests[requests.len() - 1];
    let mut prefill_body = body.clone();
    prefill_body["kv_transfer_params"] = json!({"do_remote_decode": true, "do_remote_prefill": false,
        "remote_host": null, "remote_port": null, "remote_block_ids": null, "remote_engine_id": null});
    prefill_body["max_tokens"] = json!(1);
    let prefilled = post(&http, &prefill.url(path), &prefill_body).await?;
    let mut fetch = body.clone();
    fetch["kv_transfer_params"] = prefilled["kv_transfer_params"].clone();
    let got = answer(&post(&http, &decode_f16.url(path), &fetch).await?);
    ensure!(got.1 > 0, "the f16 decode instance generated nothing");
    let refused = metric_sum(
        &replica_metrics(&http, &decode_f16).await?,
        "pagoda:kv_transfer_failures_total",
        &["reason=\"refused\""],
    );
    ensure!(refused == 1.0, "{refused} refusals counted, expected the layouts' one");
    Ok(())
}

/// What cannot take part stops the server at start-up with the reason, rather than failing
/// transfers later: Gemma 3's sliding-window layers, and a cache outside the prefix cache.
#[test]
fn instances_that_cannot_transfer_refuse_to_start() -> Result<()> {
    let _turn = crate::SERVERS.blocking_lock();
    let root = repo_root();
    let gemma = root.join("models/gemma-3-270m-q4_k_m.gguf");
    ensure!(gemma.exists(), "{} is missing: run `make model-gemma3`", gemma.display());
    let consumer = transfer_config("kv_consumer", json!({}), None);
    let cases: [(&std::path::Path, &[&str], &str); 2] = [
        (&gemma, &[], "sliding-window"),
        (&root.join(crate::stack::MODEL_FILE), &["--no-enable-prefix-caching"], "prefix cache"),
    ];
    for (model, extra, reason) in cases {
        let port = free_port()?.to_string();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_pagoda"))
            .args(["serve", "--model"])
            .arg(model)
            .args([
                "--host",
                "127.0.0.1",
                "--port",
                &port,
                "--max-model-len",
                "512",
                "--kv-cache-memory",
                "32MiB",
            ])
            .args(["--kv-transfer-config", &consumer])
            .args(extra)
            .output()?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        ensure!(!out.status.success(), "{} started with {extra:?}", model.display());
        ensure!(stderr.contains(reason) && stderr.contains("--kv-transfer-config"), "{reason}: {stderr}");
    }
    Ok(())
}

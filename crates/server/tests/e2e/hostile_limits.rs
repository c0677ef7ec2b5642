//! Limits found by trying to hurt the server (issue 63): memory counted in bytes, not entries
//! (stored responses, embedding inputs), `/health_generate` that cannot flood the engine or be
//! called without the key, `/server_info` behind the key, CORS only when asked for, and
//! `count_tokens` counting long prompts.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use futures_util::future::join_all;
use serde_json::{json, Value};

use crate::harness::{
    assert_error_shape, client, metric, metrics_text, post_json, shared, TestServer, API_KEY,
};
use crate::shutdown::{pagoda_serve, spawn_ready};

/// A `/proc/<pid>/status` value (`VmRSS`, `VmHWM`) of process `pid`, in bytes.
fn memory(pid: u32, field: &str) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status.lines().find(|l| l.starts_with(field)).with_context(|| format!("no {field}"))?;
    let kib: u64 = line.split_whitespace().nth(1).context("no value")?.parse()?;
    Ok(kib * 1024)
}

/// Runs `body` against a `pagoda serve` process started with `extra`, then kills it.
async fn with_process<F, Fut>(extra: &[&str], body: F) -> Result<()>
where
    F: FnOnce(u32, String) -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    let (mut child, addr, _log) = spawn_ready(pagoda_serve(extra))?;
    let result = body(child.id(), format!("http://{addr}")).await;
    let _ = child.kill();
    let _ = child.wait();
    result
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_responses_are_bounded_in_bytes_and_the_oldest_go() -> Result<()> {
    let extra = [
        "--kv-cache-memory",
        "64MiB",
        "--max-model-len",
        "512",
        "--max-request-body-bytes",
        "9MiB",
        "--stored-responses-memory",
        "32MiB",
        "--max-stored-response-bytes",
        "8MiB",
    ];
    with_process(&extra, |pid, base| async move {
        let c = reqwest::Client::builder().timeout(Duration::from_secs(300)).build()?;
        let url = format!("{base}/v1/responses");
        let ask = |user: String, store: bool| {
            json!({"input": "Hi", "max_output_tokens": 2, "temperature": 0, "user": user, "store": store})
        };
        let (status, warm) = post_json(&c, &url, &ask("warm".into(), true)).await?;
        assert_eq!(status, 200, "{warm}");
        let before = memory(pid, "VmRSS:")?;
        // 48 responses of 6 MB each: 288 MB if all were kept, against a budget of 32 MiB.
        let mut ids = Vec::new();
        for i in 0..48 {
            let user = format!("{i:02}{}", "u".repeat(6_000_000));
            let (status, body) = post_json(&c, &url, &ask(user, true)).await?;
            assert_eq!(status, 200, "{body}");
            ids.push(body["id"].as_str().context("no id")?.to_owned());
        }
        let grown = memory(pid, "VmRSS:")?.saturating_sub(before);
        println!("48 stored responses of 6 MB: RSS +{} MiB", grown >> 20);
        assert!(grown < 160 << 20, "RSS grew by {} MiB", grown >> 20);
        // The oldest went, in OpenAI's shape; the newest is whole.
        let resp = c.get(format!("{url}/{}", ids[0])).send().await?;
        assert_eq!(resp.status(), 404);
        let body: Value = resp.json().await?;
        assert!(assert_error_shape(&body)["message"].as_str().unwrap().contains(&ids[0]), "{body}");
        let last: Value = c.get(format!("{url}/{}", ids[47])).send().await?.json().await?;
        assert_eq!(last["user"].as_str().map(str::len), Some(6_000_002), "{}", last["id"]);

        // One response larger than a stored response may be: refused before generating,
        // naming the field; not stored, it is answered.
        let huge = "v".repeat(8_500_000);
        let (status, body) = post_json(&c, &url, &ask(huge.clone(), true)).await?;
        assert_eq!(status, 400, "{body}");
        let error = assert_error_shape(&body);
        assert_eq!(error["param"], "user", "{body}");
        assert!(error["message"].as_str().unwrap().contains("--max-stored-response-bytes"), "{body}");
        let (status, body) = post_json(&c, &url, &ask(huge, false)).await?;
        assert_eq!((status, &body["store"]), (200, &json!(false)), "{}", body["error"]);
        Ok(())
    })
    .await
}

/// `n` copies of `input` embedded at once; each answer's status and body, and how long it took.
async fn embed_all(
    c: &reqwest::Client,
    url: &str,
    input: &str,
    n: usize,
) -> Vec<Result<(u16, Value, Duration)>> {
    let body = serde_json::to_vec(&json!({"input": input})).unwrap();
    join_all((0..n).map(|_| {
        let body = body.clone();
        async move {
            let started = Instant::now();
            let resp = c.post(url).header("content-type", "application/json").body(body).send().await?;
            let status = resp.status().as_u16();
            Ok((status, resp.json().await?, started.elapsed()))
        }
    }))
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_embedding_inputs_are_cut_before_being_tokenized_whole() -> Result<()> {
    let extra = [
        "--pooling",
        "last",
        "--max-model-len",
        "64",
        "--kv-cache-memory",
        "64MiB",
        "--max-request-body-bytes",
        "9MiB",
    ];
    with_process(&extra, |pid, base| async move {
        let c = reqwest::Client::builder().timeout(Duration::from_secs(300)).build()?;
        let url = format!("{base}/v1/embeddings");
        let (status, body) = post_json(&c, &url, &json!({"input": "hello"})).await?;
        assert_eq!(status, 200, "{body}");
        let before = memory(pid, "VmHWM:")?;
        // 7 MB of ordinary words: about 1.5 M tokens, cut to 64 (a short context, so that the
        // time is the tokenizing, not the model).
        let text = "lorem ipsum dolor sit amet ".repeat(7_000_000 / 27);
        let (long, small) = tokio::join!(embed_all(&c, &url, &text, 4), async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            embed_all(&c, &url, "hello", 1).await
        });
        let mut vectors = Vec::new();
        for answer in long {
            let (status, body, took) = answer?;
            assert_eq!(status, 200, "{body}");
            assert_eq!(body["usage"]["prompt_tokens"], 64, "{}", body["usage"]);
            println!("a 7 MB input embedded in {took:?}");
            assert!(took < Duration::from_secs(2), "a 7 MB input took {took:?}");
            vectors.push(body["data"][0]["embedding"].clone());
        }
        let (status, _, took) = small.into_iter().next().context("no small answer")??;
        println!("a 5-byte input beside them in {took:?}");
        assert!(status == 200 && took < Duration::from_secs(2), "{status} after {took:?}");
        let grown = memory(pid, "VmHWM:")?.saturating_sub(before);
        println!("four 7 MB inputs at once: peak RSS +{} MiB", grown >> 20);
        assert!(grown < 256 << 20, "peak RSS grew by {} MiB", grown >> 20);
        // The cut keeps the same tokens as cutting the whole text: a prefix of 8 KB (also over
        // 64 tokens) embeds the same.
        let (status, prefix) = post_json(&c, &url, &json!({"input": &text[..8192]})).await?;
        assert_eq!(status, 200, "{prefix}");
        assert_eq!(prefix["data"][0]["embedding"], vectors[0]);
        Ok(())
    })
    .await
}

/// `n` GETs of `path` at once, without a key; their statuses.
async fn flood(server: &TestServer, path: &str, n: usize) -> Vec<u16> {
    let c = reqwest::Client::builder().timeout(Duration::from_secs(120)).build().unwrap();
    let url = server.url(path);
    let answers = join_all((0..n).map(|_| c.get(&url).send())).await;
    answers.into_iter().map(|a| a.map_or(0, |r| r.status().as_u16())).collect()
}

/// Ten short chats with the key, at once; their statuses.
async fn chats(server: &TestServer) -> Vec<u16> {
    let c = client();
    let url = server.url("/v1/chat/completions");
    let body =
        json!({"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 4, "temperature": 0});
    let answers = join_all((0..10).map(|_| c.post(&url).json(&body).send())).await;
    answers.into_iter().map(|a| a.map_or(0, |r| r.status().as_u16())).collect()
}

fn count(statuses: &[u16], status: u16) -> usize {
    statuses.iter().filter(|&&s| s == status).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_generate_and_server_info_need_the_key() -> Result<()> {
    let server =
        TestServer::start(&["--api-key", API_KEY, "--max-num-seqs", "8", "--max-waiting-requests", "32"]);
    let (probes, chatted) = tokio::join!(flood(&server, "/health_generate", 1500), chats(&server));
    assert_eq!(count(&probes, 401), probes.len(), "statuses: {:?}", &probes[..20]);
    assert_eq!(count(&chatted, 200), chatted.len(), "{chatted:?}");

    let anonymous = reqwest::Client::new();
    for path in ["/server_info", "/get_server_info", "/health_generate"] {
        let resp = anonymous.get(server.url(path)).send().await?;
        assert_eq!(resp.status(), 401, "{path}");
        let body: Value = resp.json().await?;
        assert_eq!(assert_error_shape(&body)["code"], "invalid_api_key");
        assert!(!body.to_string().contains("gguf"), "{body}");
        let resp = client().get(server.url(path)).send().await?;
        assert_eq!(resp.status(), 200, "{path}");
    }
    let info: Value = client().get(server.url("/server_info")).send().await?.json().await?;
    assert!(info["model_path"].as_str().is_some_and(|p| p.ends_with(".gguf")), "{info}");
    server.signal_stop();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_health_probes_shares_a_few_generations() -> Result<()> {
    let server = TestServer::start(&[
        "--api-key",
        API_KEY,
        "--health-generate-without-key",
        "--max-num-seqs",
        "8",
        "--max-waiting-requests",
        "32",
    ]);
    let c = client();
    let computed = |text: &str| metric(text, "pagoda:iteration_tokens_total_sum", "").unwrap_or(0.0);
    let before = computed(&metrics_text(&c, &server).await?);
    let probes = flood(&server, "/health_generate", 1500).await;
    assert_eq!(count(&probes, 200), probes.len(), "statuses: {:?}", &probes[..20]);
    // One probe is a token or two of prompt; 1,500 probes of their own would be thousands.
    let tokens = computed(&metrics_text(&c, &server).await?) - before;
    println!("1,500 unauthenticated probes computed {tokens} tokens");
    assert!(tokens <= 24.0, "the probes computed {tokens} tokens");

    let (probes, chatted) = tokio::join!(flood(&server, "/health_generate", 1500), chats(&server));
    assert_eq!(count(&probes, 200), probes.len(), "statuses: {:?}", &probes[..20]);
    assert_eq!(count(&chatted, 200), chatted.len(), "{chatted:?}");
    server.signal_stop();
    Ok(())
}

/// A browser's preflight for a POST from `origin` (moved here from errors.rs when CORS became
/// opt-in); the `Access-Control-Allow-Origin` it gets.
async fn preflight(server: &TestServer, origin: &str) -> Result<Option<String>> {
    let resp = reqwest::Client::new()
        .request(reqwest::Method::OPTIONS, server.url("/v1/chat/completions"))
        .header("origin", origin)
        .header("access-control-request-method", "POST")
        .header("access-control-request-headers", "authorization, content-type")
        .send()
        .await?;
    let allowed = resp.headers().get("access-control-allow-origin");
    let allowed = allowed.map(|v| v.to_str().unwrap_or_default().to_owned());
    // An allowed preflight is answered as such (2xx), with the methods and headers asked for.
    if allowed.is_some() {
        assert!(resp.status().is_success(), "{}", resp.status());
        let methods =
            resp.headers().get("access-control-allow-methods").map(|v| v.to_str().unwrap_or_default());
        assert!(methods.is_some_and(|m| m.contains("POST")), "{:?}", resp.headers());
        assert!(resp.headers().contains_key("access-control-allow-headers"), "{:?}", resp.headers());
    }
    Ok(allowed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cors_is_off_unless_origins_are_allowed() -> Result<()> {
    assert_eq!(preflight(shared(), "https://elsewhere.example").await?, None);
    let resp =
        client().get(shared().url("/v1/models")).header("origin", "https://elsewhere.example").send().await?;
    assert_eq!(resp.status(), 200);
    assert!(resp.headers().get("access-control-allow-origin").is_none(), "{:?}", resp.headers());

    let server = TestServer::start(&["--allowed-origins", r#"["https://a.example", "https://b.example"]"#]);
    assert_eq!(preflight(&server, "https://b.example").await?.as_deref(), Some("https://b.example"));
    assert_eq!(preflight(&server, "https://elsewhere.example").await?, None);
    server.signal_stop();
    let server = TestServer::start(&["--allowed-origins", "*"]);
    assert_eq!(preflight(&server, "https://elsewhere.example").await?.as_deref(), Some("*"));
    server.signal_stop();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn count_tokens_counts_prompts_longer_than_a_counting_piece() -> Result<()> {
    let c = client();
    let message = |sentences: usize, max_tokens: Option<u32>| {
        let text = "The quick brown fox jumps over the lazy dog. ".repeat(sentences);
        let mut body = json!({"model": "smol", "messages": [{"role": "user", "content": text}]});
        if let Some(m) = max_tokens {
            body["max_tokens"] = json!(m);
        }
        body
    };
    let url = shared().url("/v1/messages/count_tokens");
    let mut counts = Vec::new();
    // About 10, 20 and 40 KB: the last two longer than one 16 KiB counting piece.
    for sentences in [225, 450, 900] {
        let (status, counted) = post_json(&c, &url, &message(sentences, None)).await?;
        assert_eq!(status, 200, "{sentences} sentences: {counted}");
        counts.push(counted["input_tokens"].as_u64().context("no input_tokens")?);
    }
    // Every sentence is the same tokens: doubling the sentences adds twice as many.
    assert_eq!(counts[2] - counts[1], 2 * (counts[1] - counts[0]), "{counts:?}");

    // Past the context: counted all the same (as Anthropic counts), while /v1/messages refuses
    // it with the real limit, in Anthropic's shape.
    let info: Value = c.get(shared().url("/server_info")).send().await?.json().await?;
    let limit = info["max_model_len"].as_u64().context("no max_model_len")?;
    assert!(counts[1] > limit, "{counts:?} against {limit}");
    let (status, refused) = post_json(&c, &shared().url("/v1/messages"), &message(450, Some(1))).await?;
    assert_eq!(status, 400, "{refused}");
    assert_eq!(
        (refused["type"].as_str(), refused["error"]["type"].as_str()),
        (Some("error"), Some("invalid_request_error"))
    );
    let said = refused["error"]["message"].as_str().unwrap_or_default();
    assert!(said.contains(&format!("maximum context length is {limit} tokens")), "{refused}");
    Ok(())
}

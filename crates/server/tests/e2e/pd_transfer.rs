//! Prefill/decode disaggregation against producers that lie: a real decode-role `pagoda serve`
//! on 127.0.0.1, and fake producers written here that speak the transfer protocol with the
//! crate's own frames. A decode instance must fetch only from producers it trusts, keep
//! poisoned pages out of its prefix cache, allocate no more than the request's prompt needs,
//! and a prefill instance must answer real fetches however many connections sit silent.

use std::process::Child;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use pagoda_engine::KvPageLayout;
use pagoda_kv_transfer::protocol::{read_frame, write_frame, FetchRequest, FetchResponse, Status, VERSION};
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

use crate::harness::{assert_error_shape, metric, post_json};
use crate::shutdown::{pagoda_serve, spawn_ready};

/// A `pagoda serve` child, killed when dropped.
struct Serve {
    child: Child,
    addr: String,
}

impl Serve {
    fn start(kv_transfer_config: &Value) -> Result<Self> {
        let config = kv_transfer_config.to_string();
        let extra = ["--kv-cache-memory", "64MiB", "--max-model-len", "512", "--kv-transfer-config", &config];
        let (child, addr, _log) = spawn_ready(pagoda_serve(&extra))?;
        Ok(Self { child, addr })
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Resident memory now, in bytes.
    fn rss(&self) -> Result<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))?;
        let line = status.lines().find(|l| l.starts_with("VmRSS:")).context("no VmRSS")?;
        let kib: u64 = line.split_whitespace().nth(1).context("VmRSS value")?.parse()?;
        Ok(kib * 1024)
    }

    async fn metrics(&self, c: &reqwest::Client) -> Result<String> {
        Ok(c.get(self.url("/metrics")).send().await?.error_for_status()?.text().await?)
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn consumer() -> Value {
    json!({"kv_role": "kv_consumer", "kv_connector_extra_config": {"transfer_timeout_s": 5}})
}

/// What a fake producer answers every fetch with.
#[derive(Clone)]
enum Answer {
    NotFound,
    /// An `ok` answer for `token_ids` in `layout`, with `pages`; with `hold_last_byte`, all but
    /// the last byte is sent and the connection then stays open.
    Pages {
        layout: KvPageLayout,
        token_ids: Vec<u32>,
        pages: Arc<Vec<u8>>,
        hold_last_byte: bool,
    },
}

/// A fake producer on 127.0.0.1: `connections` counts fetches that reached it, `sent` those it
/// answered in full (all but the held byte).
struct FakeProducer {
    port: u16,
    connections: Arc<AtomicUsize>,
    sent: Arc<AtomicUsize>,
}

async fn fake_producer(answer: Answer) -> Result<FakeProducer> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    let (connections, sent) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (counted, done) = (Arc::clone(&connections), Arc::clone(&sent));
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
            let (answer, done) = (answer.clone(), Arc::clone(&done));
            tokio::spawn(async move {
                if serve_fetch(stream, &answer).await.is_ok() {
                    done.fetch_add(1, Ordering::SeqCst);
                }
            });
        }
    });
    Ok(FakeProducer { port, connections, sent })
}

async fn serve_fetch(mut stream: TcpStream, answer: &Answer) -> std::io::Result<()> {
    let _: FetchRequest = read_frame(&mut stream).await?;
    let failed = |status| FetchResponse::failed(status, "a fake producer");
    match answer {
        Answer::NotFound => write_frame(&mut stream, &failed(Status::NotFound)).await,
        Answer::Pages { layout, token_ids, pages, hold_last_byte } => {
            let response = FetchResponse {
                version: VERSION,
                status: Status::Ok,
                message: None,
                layout: Some(layout.into()),
                token_ids: token_ids.clone(),
                pages_len: pages.len() as u64,
            };
            write_frame(&mut stream, &response).await?;
            let end = pages.len() - usize::from(*hold_last_byte);
            stream.write_all(&pages[..end]).await?;
            if *hold_last_byte {
                stream.flush().await?;
                // Kept open (the reader waits for the last byte) after this fetch is counted.
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_secs(30)).await;
                    drop(stream);
                });
            }
            Ok(())
        }
    }
}

/// The decode instance's page layout (SmolLM2-135M: 30 layers, 3 KV heads of 64) and its
/// number of cache blocks, from /server_info.
async fn cache_layout(c: &reqwest::Client, decode: &Serve) -> Result<(KvPageLayout, usize)> {
    let info: Value = c.get(decode.url("/server_info")).send().await?.json().await?;
    let (dtype, element_bytes) = match info["kv_cache_dtype"].as_str() {
        Some("float32") => ("f32", 4),
        Some("bfloat16") => ("bf16", 2),
        Some("float16") => ("f16", 2),
        other => bail!("no fake pages for a {other:?} cache"),
    };
    let layout = KvPageLayout {
        dtype: dtype.into(),
        element_bytes,
        num_layers: 30,
        block_size: info["kv_block_size"].as_u64().context("kv_block_size")? as usize,
        num_kv_heads: 3,
        head_dim: 64,
        scales: Vec::new(),
    };
    Ok((layout, info["num_gpu_blocks"].as_u64().context("num_gpu_blocks")? as usize))
}

/// `layout`'s positive infinity, little-endian.
fn infinity(layout: &KvPageLayout) -> &'static [u8] {
    match layout.dtype.as_str() {
        "f32" => &[0x00, 0x00, 0x80, 0x7f],
        "bf16" => &[0x80, 0x7f],
        _ => &[0x00, 0x7c],
    }
}

/// The `kv_transfer_params` vllm-router copies from a prefill's answer into a decode request.
fn fetch_from(host: &str, port: u16, key: &str) -> Value {
    json!({"do_remote_prefill": true, "do_remote_decode": false, "remote_host": host,
           "remote_port": port, "remote_request_id": key, "remote_engine_id": "fake"})
}

fn client() -> Result<reqwest::Client> {
    Ok(reqwest::Client::builder().timeout(Duration::from_secs(120)).build()?)
}

fn text(body: &Value) -> &str {
    body["choices"][0]["text"].as_str().unwrap_or_default()
}

fn failures(metrics: &str, reason: &str) -> f64 {
    metric(metrics, "pagoda:kv_transfer_failures_total", &format!("reason=\"{reason}\"")).unwrap_or(0.0)
}

const PROMPT: &str = "The history of the lighthouse keepers on the northern coast is long and full of \
    storms, shipwrecks, quiet winters and small acts of courage. One keeper, in particular, wrote";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decode_instance_fetches_only_from_producers_it_trusts() -> Result<()> {
    let c = client()?;
    let decode = Serve::start(&consumer())?;
    let fake = fake_producer(Answer::NotFound).await?;
    let url = decode.url("/v1/completions");
    let body =
        |params: Value| json!({"prompt": "Hello there", "max_tokens": 2, "kv_transfer_params": params});
    // Hosts no config named: one that reaches this very machine (and the fake) by another
    // name, and one elsewhere.
    for host in ["0.0.0.0", "203.0.113.9"] {
        let started = Instant::now();
        let (status, answer) = post_json(&c, &url, &body(fetch_from(host, fake.port, "k"))).await?;
        ensure!(status == 400, "a fetch from {host} was taken: {status} {answer}");
        let error = assert_error_shape(&answer);
        ensure!(error["param"] == "kv_transfer_params.remote_host", "{answer}");
        ensure!(error["message"].as_str().unwrap_or_default().contains("allowed_producers"), "{answer}");
        ensure!(started.elapsed() < Duration::from_secs(2), "refusing {host} took {:?}", started.elapsed());
    }
    let sglang = json!({"prompt": "Hello there", "max_tokens": 2, "bootstrap_host": "0.0.0.0",
                        "bootstrap_port": fake.port, "bootstrap_room": 7});
    let (status, answer) = post_json(&c, &url, &sglang).await?;
    ensure!(status == 400 && answer["error"]["param"] == "bootstrap_host", "{status} {answer}");
    ensure!(fake.connections.load(Ordering::SeqCst) == 0, "the decode instance connected to the fake");
    // Nothing was tried, so the metrics tell nothing of those hosts.
    let metrics = decode.metrics(&c).await?;
    let counted: f64 = ["connect", "timeout", "not_found", "refused", "io", "protocol"]
        .iter()
        .map(|reason| failures(&metrics, reason))
        .sum();
    ensure!(counted == 0.0, "refused producers were counted as transfer failures");
    ensure!(!metrics.contains("0.0.0.0") && !metrics.contains("203.0.113.9"), "a host in the metrics");

    // A producer on this host's loopback is trusted by default (the documented one-host pair).
    let (status, answer) = post_json(&c, &url, &body(fetch_from("127.0.0.1", fake.port, "k"))).await?;
    ensure!(status == 200, "{status} {answer}");
    ensure!(fake.connections.load(Ordering::SeqCst) == 1, "the loopback producer was not asked");
    ensure!(failures(&decode.metrics(&c).await?, "not_found") == 1.0, "its not_found was not counted");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poisoned_pages_never_enter_the_prefix_cache() -> Result<()> {
    let c = client()?;
    let decode = Serve::start(&consumer())?;
    let (layout, _) = cache_layout(&c, &decode).await?;
    let (_, tokenized) = post_json(&c, &decode.url("/tokenize"), &json!({"prompt": PROMPT})).await?;
    let ids: Vec<u32> = serde_json::from_value(tokenized["tokens"].clone())?;
    let blocks = ids.len() / layout.block_size;
    ensure!(blocks >= 2, "the prompt has {} tokens, under two blocks", ids.len());
    let url = decode.url("/v1/completions");
    let plain = json!({"prompt": ids, "max_tokens": 16, "temperature": 0});
    let (status, reference) = post_json(&c, &url, &plain).await?;
    ensure!(status == 200 && !text(&reference).is_empty(), "{status} {reference}");
    let flushed = c.post(decode.url("/flush_cache")).send().await?;
    ensure!(flushed.status().is_success(), "flush: {}", flushed.status());

    // Every value of the prompt's whole blocks is +inf.
    let pages = infinity(&layout).repeat(blocks * layout.block_bytes() / layout.element_bytes);
    let token_ids = ids[..blocks * layout.block_size].to_vec();
    let answer = Answer::Pages { layout, token_ids, pages: Arc::new(pages), hold_last_byte: false };
    let fake = fake_producer(answer).await?;
    let mut pd = plain.clone();
    pd["kv_transfer_params"] = fetch_from("127.0.0.1", fake.port, "victim");
    let (status, got) = post_json(&c, &url, &pd).await?;
    ensure!(status == 200, "the request with poisoned pages: {status} {got}");
    ensure!(text(&got) == text(&reference), "with poisoned pages: {got}, alone: {reference}");
    ensure!(fake.sent.load(Ordering::SeqCst) == 1, "the fake did not serve its pages");
    // The next request for the same prompt, with no transfer, finds only good blocks.
    let (status, got) = post_json(&c, &url, &plain).await?;
    ensure!(status == 200, "the victim's next request: {status} {got}");
    ensure!(text(&got) == text(&reference), "after the poisoned fetch: {got}, before: {reference}");
    // Refused for their values (so the fake's layout was this cache's own).
    ensure!(failures(&decode.metrics(&c).await?, "invalid") == 1.0, "the refusal was not counted as invalid");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producer_announcing_the_whole_cache_costs_no_memory() -> Result<()> {
    let c = client()?;
    let decode = Serve::start(&consumer())?;
    let (layout, num_blocks) = cache_layout(&c, &decode).await?;
    let url = decode.url("/v1/completions");
    let (status, warm) = post_json(&c, &url, &json!({"prompt": PROMPT, "max_tokens": 2})).await?;
    ensure!(status == 200, "{warm}");
    // The whole cache's worth of pages, sent but for the last byte, by six producers at once.
    let pages = vec![0u8; num_blocks * layout.block_bytes()];
    let token_ids = vec![0; num_blocks * layout.block_size];
    let answer = Answer::Pages { layout, token_ids, pages: Arc::new(pages), hold_last_byte: true };
    let fake = fake_producer(answer).await?;
    let before = decode.rss()?;
    let requests: Vec<_> = (0..6)
        .map(|i| {
            let (c, url) = (c.clone(), url.clone());
            let mut body = json!({"prompt": PROMPT, "max_tokens": 2});
            body["kv_transfer_params"] = fetch_from("127.0.0.1", fake.port, &format!("k{i}"));
            tokio::spawn(async move { post_json(&c, &url, &body).await })
        })
        .collect();
    // Until every producer has sent its pages, or every request is answered without them.
    let started = Instant::now();
    while fake.sent.load(Ordering::SeqCst) < 6 && !requests.iter().all(|r| r.is_finished()) {
        ensure!(started.elapsed() < Duration::from_secs(60), "neither the pages nor the answers came");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let grown = decode.rss()?.saturating_sub(before);
    println!("6 fetches announcing {num_blocks} blocks: RSS +{} MiB", grown >> 20);
    ensure!(grown < 100 << 20, "RSS grew by {} MiB", grown >> 20);
    for request in requests {
        let (status, answer) = request.await??;
        ensure!(status == 200, "{status} {answer}");
    }
    ensure!(failures(&decode.metrics(&c).await?, "protocol") == 6.0, "the announcements were not refused");
    Ok(())
}

/// The vLLM flow by hand: the prefill, then the decode with the prefill's parameters; returns
/// how long the decode took.
async fn pd_request(c: &reqwest::Client, prefill: &Serve, decode: &Serve, prompt: &str) -> Result<Duration> {
    let body = json!({"prompt": prompt, "max_tokens": 4, "temperature": 0});
    let mut first = body.clone();
    first["max_tokens"] = json!(1);
    first["kv_transfer_params"] = json!({"do_remote_decode": true});
    let (status, prefilled) = post_json(c, &prefill.url("/v1/completions"), &first).await?;
    ensure!(status == 200, "prefill: {status} {prefilled}");
    let mut second = body;
    second["kv_transfer_params"] = prefilled["kv_transfer_params"].clone();
    let started = Instant::now();
    let (status, answer) = post_json(c, &decode.url("/v1/completions"), &second).await?;
    ensure!(status == 200, "decode: {status} {answer}");
    Ok(started.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_to_the_transfer_port_do_not_delay_real_transfers() -> Result<()> {
    let c = client()?;
    let kv_port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let prefill = Serve::start(&json!({"kv_role": "kv_producer", "kv_port": kv_port}))?;
    let decode = Serve::start(&consumer())?;
    let received = |metrics: &str| {
        metric(metrics, "pagoda:kv_transfer_blocks_total", "direction=\"received\"").unwrap_or(0.0)
    };
    let alone = pd_request(&c, &prefill, &decode, PROMPT).await?;
    let before = received(&decode.metrics(&c).await?);
    // As many connections as the listener answers at once, each sending nothing.
    let mut silent = Vec::new();
    for _ in 0..64 {
        silent.push(TcpStream::connect(("127.0.0.1", kv_port)).await?);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let other = format!("{PROMPT} Another keeper, much later, wrote");
    let behind_silence = pd_request(&c, &prefill, &decode, &other).await?;
    println!("a PD request alone: {alone:?}; behind 64 silent connections: {behind_silence:?}");
    ensure!(
        behind_silence < alone + Duration::from_secs(4),
        "behind silent connections the transfer took {behind_silence:?}, alone {alone:?}"
    );
    let after = received(&decode.metrics(&c).await?);
    ensure!(after > before, "the second prompt's KV was not transferred");
    drop(silent);
    Ok(())
}

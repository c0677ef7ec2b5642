//! The prefix cache's offload tiers (`--kv-offload host:SIZE disk:PATH:SIZE`): sixteen long
//! prompts that a 48-block pool cannot hold come back from the tiers on a second pass, with the
//! greedy answers of a server that recomputes them; a server restarted over the same disk tier
//! answers a repeated prompt far sooner than a cold one; and changed block files are refused
//! while the server still serves. Both servers run `--batch-invariant`, so a prompt's answer
//! does not depend on how much of it was computed in one step.
//!
//! One test, run alone in CI's order as the others (`cargo test --test e2e kv_offload::`): its
//! timings compare servers started one after another on the same machine.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use serde_json::{json, Value};

use crate::harness::{metric, metrics_text, SseReader, TestServer};

const PROMPTS: usize = 16;
const BLOCK_SIZE: f64 = 16.0;

/// 48 blocks of 16 tokens: three of the prompts (about 230 tokens each) at once.
fn flags(extra: &[&'static str]) -> Vec<&'static str> {
    let mut flags = vec![
        "--num-gpu-blocks-override",
        "48",
        "--max-model-len",
        "512",
        "--batch-invariant",
        "--max-num-seqs",
        "4",
    ];
    flags.extend_from_slice(extra);
    flags
}

/// Prompt `i`: a long text of its own, then a question.
fn prompt(i: usize) -> String {
    const WORDS: [&str; 24] = [
        "river", "stone", "lantern", "orchard", "copper", "meadow", "harbor", "violet", "thunder", "pepper",
        "canyon", "marble", "willow", "ember", "glacier", "saddle", "falcon", "cedar", "quartz", "lagoon",
        "tundra", "maple", "bronze", "comet",
    ];
    let mut state = (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let words: Vec<&str> = (0..200)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            WORDS[(state % WORDS.len() as u64) as usize]
        })
        .collect();
    format!("Record {i}: {}.\nQuestion: which word comes first in record {i}?\nAnswer:", words.join(" "))
}

fn http() -> Result<reqwest::Client> {
    Ok(reqwest::Client::builder().timeout(Duration::from_secs(300)).build()?)
}

/// Streams a greedy completion of `prompt`; returns the time to its first token, its text and
/// its prompt's length in tokens.
async fn ask(http: &reqwest::Client, server: &TestServer, prompt: &str) -> Result<(Duration, String, f64)> {
    let body = json!({
        "model": "smol", "prompt": prompt, "max_tokens": 8, "temperature": 0, "stream": true,
        "stream_options": {"include_usage": true},
    });
    let started = Instant::now();
    let resp = http.post(server.url("/v1/completions")).json(&body).send().await?;
    ensure!(resp.status() == 200, "completion answered {}", resp.status());
    let mut events = SseReader::new(resp);
    let (mut ttft, mut text, mut prompt_tokens) = (None, String::new(), 0.0);
    while let Some(data) = events.next_data().await? {
        if data == "[DONE]" {
            break;
        }
        let chunk: Value = serde_json::from_str(&data)?;
        if let Some(piece) = chunk["choices"][0]["text"].as_str() {
            ttft.get_or_insert_with(|| started.elapsed());
            text.push_str(piece);
        }
        if let Some(n) = chunk["usage"]["prompt_tokens"].as_f64() {
            prompt_tokens = n;
        }
    }
    ensure!(prompt_tokens > 0.0, "no usage chunk");
    Ok((ttft.context("no token came")?, text, prompt_tokens))
}

/// One pass over every prompt: answers, times to first token, prompt tokens in all.
async fn pass(http: &reqwest::Client, server: &TestServer) -> Result<(Vec<String>, Vec<Duration>, f64)> {
    let (mut answers, mut ttfts, mut tokens) = (Vec::new(), Vec::new(), 0.0);
    for i in 0..PROMPTS {
        let (ttft, text, n) = ask(http, server, &prompt(i)).await?;
        answers.push(text);
        ttfts.push(ttft);
        tokens += n;
    }
    Ok((answers, ttfts, tokens))
}

/// Tier blocks loaded instead of recomputed, from either medium.
async fn tier_hits(http: &reqwest::Client, server: &TestServer) -> Result<(f64, f64)> {
    let text = metrics_text(http, server).await?;
    let hits =
        |m: &str| metric(&text, "pagoda:kv_offload_blocks_total", &format!("event=\"hit\",medium=\"{m}\""));
    Ok((hits("CPU").unwrap_or(0.0), hits("DISK").unwrap_or(0.0)))
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

async fn stop(server: TestServer) -> Result<()> {
    tokio::task::spawn_blocking(move || server.join()).await?
}

fn block_files(dir: &Path) -> Result<Vec<std::path::PathBuf>> {
    let mut files = Vec::new();
    for sub in std::fs::read_dir(dir)? {
        for file in std::fs::read_dir(sub?.path())? {
            let path = file?.path();
            if path.extension().is_some_and(|e| e == "kvb") {
                files.push(path);
            }
        }
    }
    Ok(files)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offloaded_prefixes_come_back_from_host_memory_and_from_disk_after_a_restart() -> Result<()> {
    let http = http()?;
    let dir = tempfile::tempdir()?;
    let disk = format!("disk:{}:1GiB", dir.path().display());
    let disk: &'static str = Box::leak(disk.into_boxed_str());

    // No offload: the second pass recomputes every prompt the pool lost.
    let plain = TestServer::start(&flags(&[]));
    let (cold_answers, cold_ttfts, _) = pass(&http, &plain).await?;
    let (plain_answers, plain_ttfts, _) = pass(&http, &plain).await?;
    stop(plain).await?;
    ensure!(plain_answers == cold_answers, "recomputation is deterministic");

    // Host memory, then disk.
    let tiered = TestServer::start(&flags(&["--kv-offload", "host:256MiB", disk]));
    let (first_answers, _, _) = pass(&http, &tiered).await?;
    let before = tier_hits(&http, &tiered).await?;
    let (tier_answers, tier_ttfts, prompt_tokens) = pass(&http, &tiered).await?;
    let after = tier_hits(&http, &tiered).await?;
    stop(tiered).await?;
    ensure!(first_answers == cold_answers, "{first_answers:?} vs {cold_answers:?}");
    ensure!(
        tier_answers == plain_answers,
        "loaded KV answers as recomputed KV: {tier_answers:?} vs {plain_answers:?}"
    );
    let tier_tokens = (after.0 - before.0 + after.1 - before.1) * BLOCK_SIZE;
    let share = tier_tokens / prompt_tokens;
    let (plain_ttft, tier_ttft) = (median(plain_ttfts), median(tier_ttfts));
    eprintln!(
        "kv_offload: second pass, {tier_tokens} of {prompt_tokens} prompt tokens from the tiers ({share:.3}); \
         median TTFT {plain_ttft:?} recomputed, {tier_ttft:?} from the tiers"
    );
    ensure!(share >= 0.9, "only {share:.3} of the prompt tokens came from the tiers");
    ensure!(tier_ttft < plain_ttft, "loading ({tier_ttft:?}) is slower than recomputing ({plain_ttft:?})");

    // A restart over the same disk tier: the first prompt comes back from disk.
    let restarted = TestServer::start(&flags(&["--kv-offload", disk]));
    let (warm_ttft, warm_answer, warm_tokens) = ask(&http, &restarted, &prompt(0)).await?;
    let (_, disk_hits) = tier_hits(&http, &restarted).await?;
    stop(restarted).await?;
    let cold_ttft = cold_ttfts[0];
    let speedup = cold_ttft.as_secs_f64() / warm_ttft.as_secs_f64();
    eprintln!("kv_offload: first prompt after a start, TTFT {cold_ttft:?} cold, {warm_ttft:?} from a warm disk tier ({speedup:.1}x)");
    ensure!(warm_answer == cold_answers[0], "{warm_answer:?} vs {:?}", cold_answers[0]);
    // Every full block but one holding the last token (which is computed for its logits).
    let full_blocks = ((warm_tokens - 1.0) / BLOCK_SIZE).floor();
    ensure!(disk_hits >= full_blocks, "{disk_hits} of {full_blocks} blocks from disk");
    ensure!(speedup >= 3.0, "a warm restart is only {speedup:.1}x faster than a cold start");

    // Changed pages (one byte of each file) and a file cut short are refused (the short one
    // when the tier opens, a changed one when a prompt would load it: two prompts meet at
    // least one); the server recomputes and answers the same.
    let files = block_files(dir.path())?;
    ensure!(files.len() >= PROMPTS * 14, "{} block files", files.len());
    for file in &files {
        let mut bytes = std::fs::read(file)?;
        *bytes.last_mut().context("empty block file")? ^= 0x01;
        std::fs::write(file, bytes)?;
    }
    let len = std::fs::metadata(&files[0])?.len();
    std::fs::OpenOptions::new().write(true).open(&files[0])?.set_len(len / 2)?;
    let tampered = TestServer::start(&flags(&["--kv-offload", disk]));
    let mut answers = Vec::new();
    for i in 0..2 {
        answers.push(ask(&http, &tampered, &prompt(i)).await?.1);
    }
    let text = metrics_text(&http, &tampered).await?;
    stop(tampered).await?;
    let refused =
        metric(&text, "pagoda:kv_offload_blocks_total", "event=\"refused\",medium=\"DISK\"").unwrap_or(0.0);
    let hits =
        metric(&text, "pagoda:kv_offload_blocks_total", "event=\"hit\",medium=\"DISK\"").unwrap_or(0.0);
    ensure!(answers == cold_answers[..2], "{answers:?} vs {:?}", &cold_answers[..2]);
    ensure!(hits == 0.0, "{hits} changed blocks were loaded");
    ensure!(refused >= 2.0, "{refused} blocks refused");
    Ok(())
}

/// An FP8 cache (`--kv-cache-dtype fp8`): its pages and scales go to disk and come back after a
/// restart, the answer the same as a prefix-cache hit gives before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_fp8_cache_comes_back_from_disk_after_a_restart() -> Result<()> {
    let http = http()?;
    let dir = tempfile::tempdir()?;
    let disk: &'static str = Box::leak(format!("disk:{}:256MiB", dir.path().display()).into_boxed_str());
    let fp8 = ["--num-gpu-blocks-override", "48", "--max-model-len", "512", "--kv-cache-dtype", "fp8"];
    let with_disk = |extra: &[&'static str]| [&fp8[..], &["--kv-offload", disk], extra].concat();
    let first = TestServer::start(&with_disk(&[]));
    ask(&http, &first, &prompt(3)).await?;
    // The second ask hits the pool: the same KV a load from disk brings back.
    let (_, cached_answer, tokens) = ask(&http, &first, &prompt(3)).await?;
    stop(first).await?;
    let restarted = TestServer::start(&with_disk(&[]));
    let (_, answer, _) = ask(&http, &restarted, &prompt(3)).await?;
    let (_, disk_hits) = tier_hits(&http, &restarted).await?;
    stop(restarted).await?;
    ensure!(answer == cached_answer, "{answer:?} vs {cached_answer:?}");
    let full_blocks = ((tokens - 1.0) / BLOCK_SIZE).floor();
    ensure!(disk_hits >= full_blocks, "{disk_hits} of {full_blocks} blocks from disk");
    Ok(())
}

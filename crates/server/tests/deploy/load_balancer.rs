//! The stack end to end: a streaming request through nginx arrives token by token (not
//! buffered), requests spread over both replicas, Prometheus scrapes both replicas with TTFT
//! samples, and every dashboard query names exported metrics and runs in Prometheus with data.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use futures_util::StreamExt;
use serde_json::{json, Value};

use crate::dashboard;
use crate::processes::wait_for;
use crate::stack::{Stack, SERVED_MODEL};

/// Tokens each streamed answer must have (`ignore_eos`, so exactly this many).
const STREAM_TOKENS: usize = 24;

/// What a client saw of one streamed answer.
struct StreamTrace {
    /// Content deltas, in order.
    deltas: Vec<String>,
    /// How many network reads brought at least one content delta.
    reads_with_content: usize,
    /// From the first content delta's arrival to the last one's.
    spread: Duration,
    done: bool,
}

/// Streams one chat completion and records when each content delta arrived.
async fn stream_chat(http: &reqwest::Client, url: &str, prompt: &str) -> Result<StreamTrace> {
    let body = json!({
        "model": SERVED_MODEL,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": STREAM_TOKENS, "ignore_eos": true, "temperature": 0, "stream": true,
    });
    // As the OpenAI SDKs (httpx) do; the load balancer must not compress the stream.
    let resp = http.post(url).header("accept-encoding", "gzip, deflate").json(&body).send().await?;
    ensure!(resp.status() == 200, "status {}: {}", resp.status(), resp.text().await.unwrap_or_default());
    let content_type = resp.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default();
    ensure!(content_type.starts_with("text/event-stream"), "content-type {content_type:?}");
    ensure!(
        resp.headers().get("content-encoding").is_none(),
        "the stream came compressed: {:?}",
        resp.headers()
    );
    let mut body = resp.bytes_stream();
    let (mut buf, mut deltas, mut done) = (String::new(), Vec::new(), false);
    let (mut reads_with_content, mut first, mut last) = (0, None, None);
    while let Some(chunk) = body.next().await {
        let now = Instant::now();
        buf.push_str(std::str::from_utf8(&chunk?)?);
        let mut content_in_read = false;
        while let Some(end) = buf.find("\n\n") {
            let event: String = buf.drain(..end + 2).collect();
            let Some(data) = event.lines().find_map(|l| l.strip_prefix("data: ")) else { continue };
            if data == "[DONE]" {
                done = true;
                continue;
            }
            let chunk: Value = serde_json::from_str(data).with_context(|| format!("bad event {data}"))?;
            if let Some(text) = chunk["choices"][0]["delta"]["content"].as_str().filter(|t| !t.is_empty()) {
                deltas.push(text.to_owned());
                content_in_read = true;
                first.get_or_insert(now);
                last = Some(now);
            }
        }
        reads_with_content += usize::from(content_in_read);
    }
    let spread = match (first, last) {
        (Some(a), Some(b)) => b - a,
        _ => Duration::ZERO,
    };
    Ok(StreamTrace { deltas, reads_with_content, spread, done })
}

/// The sum of every sample of `metric` in /metrics text.
fn metric_sum(text: &str, metric: &str) -> f64 {
    text.lines()
        .filter(|l| l.split(['{', ' ']).next() == Some(metric))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn load_balanced_replicas_stream_spread_and_are_scraped() -> Result<()> {
    let _turn = crate::SERVERS.lock().await;
    let stack = Stack::start(2).await?;
    let http = reqwest::Client::builder().timeout(Duration::from_secs(120)).build()?;

    // Prometheus has scraped both replicas once before any request, so counters and
    // histograms have a zero sample to take rates from.
    let addrs: BTreeSet<String> = stack.replicas.iter().map(|r| r.addr.clone()).collect();
    wait_for("Prometheus to scrape both replicas", Duration::from_secs(60), || async {
        let up = stack.query(&http, r#"up{job="pagoda"} == 1"#).await?;
        let seen: BTreeSet<String> =
            up.iter().filter_map(|s| s["metric"]["instance"].as_str().map(str::to_owned)).collect();
        Ok(if seen == addrs { Ok(()) } else { Err(format!("targets up: {seen:?}")) })
    })
    .await?;

    // Two streams at once through nginx: least-connections sends the second to the other
    // replica, and each arrives as the tokens are made, not in one buffered lump.
    let chat_url = format!("{}/v1/chat/completions", stack.lb_url);
    let (a, b) = tokio::join!(
        stream_chat(&http, &chat_url, "Count from one to thirty in words."),
        stream_chat(&http, &chat_url, "Name as many colours as you can."),
    );
    for trace in [a?, b?] {
        ensure!(trace.done, "the stream did not end with [DONE]");
        ensure!(trace.deltas.len() >= STREAM_TOKENS / 2, "only {} content deltas", trace.deltas.len());
        // Passed straight through, each token comes in its own read (a slow client may see
        // two together). A proxy that buffers and compresses delivers a few large reads; nginx
        // with buffering and gzip both on delivers one, at the end.
        ensure!(
            trace.reads_with_content * 2 >= trace.deltas.len() && trace.reads_with_content >= 8,
            "{} deltas arrived in only {} reads: the load balancer buffers the stream",
            trace.deltas.len(),
            trace.reads_with_content
        );
        ensure!(trace.spread >= Duration::from_millis(20), "all deltas arrived within {:?}", trace.spread);
    }

    // Four plain requests one after another: with nothing in flight, nginx takes turns.
    let completions_url = format!("{}/v1/completions", stack.lb_url);
    for i in 0..4 {
        let body =
            json!({"model": SERVED_MODEL, "prompt": format!("Fact {i}:"), "max_tokens": 4, "temperature": 0});
        let resp = http.post(&completions_url).json(&body).send().await?;
        ensure!(resp.status() == 200, "completion {i}: status {}", resp.status());
        let answer: Value = resp.json().await?;
        ensure!(answer["usage"]["completion_tokens"] == 4, "completion {i}: {answer}");
    }
    const REQUESTS: f64 = 6.0;

    // Each replica served some of them, and between them all six.
    let mut served = HashMap::new();
    for replica in &stack.replicas {
        let text = http.get(replica.url("/metrics")).send().await?.error_for_status()?.text().await?;
        let n = metric_sum(&text, "pagoda:request_success_total");
        ensure!(
            n >= 1.0,
            "replica {} served no request; nginx log:\n{}",
            replica.addr,
            stack.nginx.log_text()
        );
        served.insert(replica.addr.clone(), n);
    }
    ensure!(served.values().sum::<f64>() == REQUESTS, "served {served:?}, sent {REQUESTS}");
    let access_log = stack.nginx.log_text();
    for addr in &addrs {
        ensure!(access_log.contains(&format!("upstream={addr} ")), "nginx never logged upstream {addr}");
    }

    // Prometheus: both targets up, and TTFT samples from each replica totalling the requests.
    let ttft = r#"sum by (instance) (pagoda:time_to_first_token_seconds_count{job="pagoda"})"#;
    wait_for("Prometheus to scrape every TTFT sample", Duration::from_secs(60), || async {
        let series = stack.query(&http, ttft).await?;
        let per_instance: HashMap<String, f64> = series
            .iter()
            .filter_map(|s| {
                Some((s["metric"]["instance"].as_str()?.to_owned(), s["value"][1].as_str()?.parse().ok()?))
            })
            .collect();
        Ok(if per_instance == served {
            Ok(())
        } else {
            Err(format!("Prometheus has {per_instance:?}, the replicas say {served:?}"))
        })
    })
    .await?;
    let targets: Value =
        http.get(format!("{}/api/v1/targets", stack.prometheus_url)).send().await?.json().await?;
    let active = targets["data"]["activeTargets"].as_array().context("no activeTargets")?;
    let up: BTreeSet<String> = active
        .iter()
        .filter(|t| t["labels"]["job"] == "pagoda" && t["health"] == "up")
        .filter_map(|t| t["labels"]["instance"].as_str().map(str::to_owned))
        .collect();
    ensure!(up == addrs, "targets up {up:?}, replicas {addrs:?}");

    check_dashboard_against(&stack, &http).await
}

/// Every dashboard query reads metrics a replica exports, and runs in Prometheus with a
/// non-empty answer once the traffic above has been scraped.
async fn check_dashboard_against(stack: &Stack, http: &reqwest::Client) -> Result<()> {
    let board = dashboard::load()?;
    let exported = dashboard::exported_names(
        &http.get(stack.replicas[0].url("/metrics")).send().await?.error_for_status()?.text().await?,
    );
    let queries = dashboard::queries(&board);
    for (title, expr) in &queries {
        for name in dashboard::metric_names(expr) {
            // `up` is Prometheus's own series for each target.
            ensure!(
                name == "up" || exported.contains(&name),
                "panel {title:?} reads {name}, which /metrics does not export"
            );
        }
    }
    // Each variable takes every value its own query finds, as Grafana's "All" would list them
    // (a label typo in a panel then selects nothing).
    let mut values = HashMap::new();
    for (name, selector, label) in dashboard::variables(&board)? {
        let found = stack.label_values(http, &label, &selector).await?;
        ensure!(!found.is_empty(), "variable {name}: label_values({selector}, {label}) is empty");
        values.insert(name, dashboard::regex_of(&found));
    }
    let promql: Vec<(String, String)> =
        queries.iter().map(|(t, e)| (t.clone(), dashboard::for_prometheus(e, &values, "1m"))).collect();
    // Prometheus parses every query (a syntax error fails here, at once).
    for (title, q) in &promql {
        stack.query(http, q).await.with_context(|| format!("panel {title:?}"))?;
    }
    // A rate needs two samples of a series inside its window; series that appear with the
    // first request (finish reasons, HTTP statuses) get their second one a scrape later.
    wait_for("every dashboard query to return data", Duration::from_secs(60), || async {
        let mut empty = Vec::new();
        for (title, q) in &promql {
            if stack.query(http, q).await?.is_empty() {
                empty.push(format!("{title}: {q}"));
            }
        }
        Ok(if empty.is_empty() { Ok(()) } else { Err(format!("no data yet for\n  {}", empty.join("\n  "))) })
    })
    .await?;
    // And the numbers are right: the "Replicas up" panel counts both replicas.
    let (_, replicas_up) =
        promql.iter().find(|(title, _)| title == "Replicas up").context("no \"Replicas up\" panel")?;
    let up = stack.query(http, replicas_up).await?;
    ensure!(up.len() == 1 && up[0]["value"][1] == "2", "{replicas_up} answers {up:?}, not 2");
    Ok(())
}

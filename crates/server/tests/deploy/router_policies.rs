//! Two replicas behind each router under round robin, cache-aware and power-of-two (and
//! vllm-router's `kv_aware`, on the replicas' KV events): every
//! request answered, every call the router made of a replica answered (no 404, no fallback),
//! and the replicas' prefix-hit rate and the wall time of each policy, printed for the notes.
//! The caches are flushed (`/flush_cache`) between policies so each starts cold.

use std::time::Duration;

use anyhow::{ensure, Result};

use crate::processes::free_port;
use crate::routers::{
    http_count, metric_sum, not_found_lines, replica_metrics, run_workload, Outcome, Router, RouterKind,
};
use crate::stack::Replica;

/// Odd, so that round robin's alternation lands a group's requests on both replicas in turn.
const GROUPS: usize = 7;
const PER_GROUP: usize = 4;

/// Each router's policies under test: both routers' round robin, cache-aware and power-of-two,
/// and vllm-router's `kv_aware`, which routes on the replicas' KV events.
fn policies(kind: RouterKind) -> &'static [&'static str] {
    match kind {
        RouterKind::Sglang => &["round_robin", "cache_aware", "power_of_two"],
        RouterKind::Vllm => &["round_robin", "cache_aware", "power_of_two", "kv_aware"],
    }
}

/// Prefix-cache counters summed over the replicas, and each replica's metrics text.
async fn counters(http: &reqwest::Client, replicas: &[Replica]) -> Result<(f64, f64, Vec<String>)> {
    let mut texts = Vec::new();
    for r in replicas {
        texts.push(replica_metrics(http, r).await?);
    }
    let sum = |name: &str| texts.iter().map(|t| metric_sum(t, name, &[])).sum::<f64>();
    Ok((sum("pagoda:prefix_cache_queries_total"), sum("pagoda:prefix_cache_hits_total"), texts))
}

async fn policies_behind(kind: RouterKind) -> Result<Vec<String>> {
    let dir = tempfile::Builder::new().prefix("pagoda-routers-").tempdir()?;
    let http = reqwest::Client::builder().timeout(Duration::from_secs(120)).build()?;
    let mut replicas = Vec::new();
    for i in 0..2 {
        let mut extra = vec!["--get-load-format".to_owned(), kind.load_format().to_owned()];
        if kind == RouterKind::Vllm {
            // Discovered by kv_aware through /kv_event_sources.
            let events = format!(
                r#"{{"enable_kv_cache_events": true, "endpoint": "tcp://*:{}", "topic": ""}}"#,
                free_port()?
            );
            extra.extend(["--kv-events-config".to_owned(), events]);
        }
        let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
        replicas.push(Replica::spawn(&format!("pagoda-{i}"), dir.path(), free_port()?, &extra)?);
    }
    for r in &mut replicas {
        r.wait_ready(&http).await?;
    }
    let workers: Vec<String> = replicas.iter().map(|r| r.addr.clone()).collect();
    let mut rows = Vec::new();
    let mut hit_rates = Vec::new();
    for &policy in policies(kind) {
        for r in &replicas {
            let resp = http.post(r.url("/flush_cache")).send().await?;
            ensure!(resp.status().is_success(), "flush on {}: {}", r.addr, resp.status());
        }
        let router = Router::start(kind, policy, &workers, dir.path()).await?;
        let (queries0, hits0, before) = counters(&http, &replicas).await?;
        let (outcomes, wall) = run_workload(&http, &router, GROUPS, PER_GROUP).await;
        let (queries1, hits1, after) = counters(&http, &replicas).await?;
        let failed: Vec<&Outcome> = outcomes.iter().filter(|o| **o != Outcome::Completed).collect();
        ensure!(failed.is_empty(), "{} {policy}: {failed:?}\n{}", kind.name(), router.process.log_tail(30));
        let sent = (GROUPS * PER_GROUP) as f64;
        for (i, (b, a)) in before.iter().zip(&after).enumerate() {
            let lost = not_found_lines(a);
            ensure!(lost.is_empty(), "{} {policy}: replica {i} answered 404: {lost:?}", kind.name());
            let delta =
                |handler: &str, status: u16| http_count(a, handler, status) - http_count(b, handler, status);
            // The calls each policy depends on were made and answered.
            match (kind, policy) {
                (RouterKind::Vllm, "cache_aware") => {
                    let rendered =
                        delta("/v1/chat/completions/render", 200) + delta("/v1/completions/render", 200);
                    ensure!(
                        rendered == sent,
                        "vllm-router cache_aware: replica {i} rendered {rendered} of {sent}"
                    );
                    ensure!(http_count(a, "/tokenize", 200) == 0.0, "vllm-router fell back to /tokenize");
                }
                (RouterKind::Vllm, "kv_aware") => {
                    ensure!(
                        http_count(a, "/kv_event_sources", 200) > 0.0,
                        "kv_aware never discovered replica {i}'s events"
                    );
                    ensure!(
                        metric_sum(a, "pagoda:kv_events_batches_total", &[]) > 0.0,
                        "replica {i} published nothing"
                    );
                }
                (_, "power_of_two") => {
                    ensure!(
                        http_count(a, "/get_load", 200) > 0.0,
                        "{}: replica {i} never polled",
                        kind.name()
                    );
                }
                _ => {}
            }
            if kind == RouterKind::Sglang {
                // Discovery: the model and server info, by their current names.
                for path in ["/server_info", "/model_info"] {
                    ensure!(
                        http_count(a, path, 200) > 0.0,
                        "sglang-router never called {path} on replica {i}"
                    );
                }
            }
        }
        let hit_rate = (hits1 - hits0) / (queries1 - queries0).max(1.0);
        hit_rates.push(hit_rate);
        rows.push(format!(
            "| {} | {policy} | {} | {hit_rate:.2} | {:.2} s |",
            kind.name(),
            outcomes.len(),
            wall.as_secs_f64()
        ));
        drop(router);
    }
    // Routing on the prefix keeps a group on the replica that holds it: about one miss per
    // group against round robin's two.
    for (i, policy) in policies(kind).iter().enumerate().filter(|(_, p)| p.ends_with("_aware")) {
        ensure!(
            hit_rates[i] > hit_rates[0] + 0.05,
            "{}: {policy}'s hit rate {:.2} is not above round robin's {:.2}",
            kind.name(),
            hit_rates[i],
            hit_rates[0]
        );
    }
    Ok(rows)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_routers_route_every_policy_without_a_404() -> Result<()> {
    let _turn = crate::SERVERS.lock().await;
    let mut rows = vec![
        "| router | policy | requests | prefix-hit rate | wall |".to_owned(),
        "|---|---|---|---|---|".to_owned(),
    ];
    for kind in [RouterKind::Sglang, RouterKind::Vllm] {
        rows.extend(policies_behind(kind).await?);
    }
    println!("{}", rows.join("\n"));
    Ok(())
}

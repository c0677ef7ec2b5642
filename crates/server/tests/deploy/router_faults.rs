//! A replica SIGKILLed under load behind vllm-router, then restarted: requests in flight on it
//! end with a clean failure at the client (or are retried by the router), nothing hangs, new
//! requests go to the survivor, and the restarted replica rejoins through `/ready` and gets
//! requests again. The counts are printed for the notes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{ensure, Result};
use serde_json::json;

use crate::processes::free_port;
use crate::routers::{http_count, replica_metrics, send, Outcome, Router, RouterKind};
use crate::stack::{Replica, SERVED_MODEL};

/// Every request's start time and outcome.
type Log = Arc<Mutex<Vec<(Instant, Outcome)>>>;

/// Clients sending one request after another until `stop`.
fn load(
    http: &reqwest::Client,
    url: &str,
    clients: usize,
    stop: &Arc<AtomicBool>,
    log: &Log,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..clients)
        .map(|c| {
            let (http, url, stop, log) = (http.clone(), url.to_owned(), Arc::clone(stop), Arc::clone(log));
            tokio::spawn(async move {
                let mut i = 0;
                while !stop.load(Ordering::SeqCst) {
                    let stream = (c + i) % 2 == 0;
                    let body = json!({"model": SERVED_MODEL, "prompt": format!("Client {c} story {i}:"),
                                      "max_tokens": 24, "ignore_eos": true, "stream": stream});
                    let started = Instant::now();
                    let outcome = send(&http, &format!("{url}/v1/completions"), &body).await;
                    log.lock().unwrap().push((started, outcome));
                    i += 1;
                }
            })
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_replica_fails_cleanly_and_rejoins() -> Result<()> {
    let _turn = crate::SERVERS.lock().await;
    let dir = tempfile::Builder::new().prefix("pagoda-faults-").tempdir()?;
    // Each request has a deadline: one that hangs fails the test.
    let http = reqwest::Client::builder().timeout(Duration::from_secs(60)).build()?;
    let ports = [free_port()?, free_port()?];
    let extra = ["--get-load-format", "vllm-router"];
    let mut replicas = Vec::new();
    for (i, port) in ports.iter().enumerate() {
        replicas.push(Replica::spawn(&format!("pagoda-{i}"), dir.path(), *port, &extra)?);
    }
    for r in &mut replicas {
        r.wait_ready(&http).await?;
    }
    let workers: Vec<String> = replicas.iter().map(|r| r.addr.clone()).collect();
    // Health checks on /ready, as deployments should run them: a replica rejoins when it takes
    // requests, not merely when its process answers. The failed sends at the kill open
    // vllm-router's circuit breaker; 15 s open instead of 60 keeps the wait for the rejoin
    // short, and the failed health checks keep the replica out until it is back regardless.
    let flags = ["--health-check-endpoint", "/ready", "--cb-timeout-duration-secs", "15"];
    let router = Router::start_with(RouterKind::Vllm, "round_robin", &workers, &flags, dir.path()).await?;

    let stop = Arc::new(AtomicBool::new(false));
    let log: Log = Arc::default();
    let clients = load(&http, &router.url, 4, &stop, &log);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let killed_at = Instant::now();
    replicas[1].process.kill_hard()?;
    // The router marks it unhealthy within a few health checks (one a second).
    tokio::time::sleep(Duration::from_secs(8)).await;
    let restarted_at = Instant::now();
    replicas[1] = Replica::spawn("pagoda-1-restarted", dir.path(), ports[1], &extra)?;
    replicas[1].wait_ready(&http).await?;
    // Rejoined: the router sends it requests again (its health check passes twice first).
    let rejoined =
        crate::processes::wait_for("the restarted replica to get requests", Duration::from_secs(60), || {
            let (http, replica) = (http.clone(), &replicas[1]);
            async move {
                let text = replica_metrics(&http, replica).await?;
                let served = http_count(&text, "/v1/completions", 200);
                // The router's checks reached /ready, beside the one wait_ready made.
                let checks = http_count(&text, "/ready", 200);
                Ok(if served >= 3.0 && checks >= 3.0 {
                    Ok(served)
                } else {
                    Err(format!("{served} served, /ready checked {checks} times"))
                })
            }
        })
        .await;
    stop.store(true, Ordering::SeqCst);
    for c in clients {
        c.await?;
    }
    let rejoined = rejoined?;

    let log = log.lock().unwrap().clone();
    let sent = log.len();
    let completed = log.iter().filter(|(_, o)| *o == Outcome::Completed).count();
    let failures: Vec<(f64, &Outcome)> = log
        .iter()
        .filter(|(_, o)| *o != Outcome::Completed)
        .map(|(t, o)| (t.saturating_duration_since(killed_at).as_secs_f64(), o))
        .collect();
    println!(
        "vllm-router round_robin, SIGKILL of 1 of 2 replicas: sent {sent}, completed {completed}, failed {} \
         (at {:?} s after the kill); restarted replica served {rejoined} after rejoining",
        failures.len(),
        failures.iter().map(|(t, _)| (t * 10.0).round() / 10.0).collect::<Vec<_>>()
    );
    for (after_kill, outcome) in &failures {
        println!("  {after_kill:.1} s after the kill: {outcome:?}");
    }
    // Nothing is lost: every request came back, completed or failed (a hang would have timed out).
    ensure!(sent == completed + failures.len());
    ensure!(sent > 20, "too little load: {sent}");
    // Failures only around the kill: in flight on the dead replica, or routed to it before the
    // router saw it go.
    for (after_kill, outcome) in &failures {
        ensure!(*after_kill < 5.0, "a failure {after_kill:.1} s after the kill: {outcome:?}");
    }
    // Requests sent once the router had noticed, until the restart, all went to the survivor.
    let survivor_only = log
        .iter()
        .filter(|(t, _)| *t > killed_at + Duration::from_secs(5) && *t < restarted_at)
        .collect::<Vec<_>>();
    ensure!(!survivor_only.is_empty(), "no requests while one replica was down");
    ensure!(survivor_only.iter().all(|(_, o)| *o == Outcome::Completed));
    drop(router);
    Ok(())
}

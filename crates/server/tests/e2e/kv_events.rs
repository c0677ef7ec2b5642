//! KV events through the real server: `--kv-events-config` with vLLM's JSON, read by
//! tests/sdk/check_kv_events.py as a vLLM consumer would (pyzmq, msgspec with vLLM's schema,
//! cbor2 for the hashes): contiguous batches, hashes equal to an independent sha256_cbor chain,
//! evictions, stored minus removed equal to what a flush drops, and replay. Also
//! `/kv_event_sources` as vllm-router's `kv_aware` discovery reads it, and the metrics.

use anyhow::Result;
use serde_json::Value;

use crate::harness::{metric, metrics_text, TestServer};

pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vllm_consumer_reads_every_event_and_replays_them() -> Result<()> {
    let (publish, replay) = (free_port(), free_port());
    let config = format!(
        r#"{{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:{publish}",
            "replay_endpoint": "tcp://*:{replay}", "topic": "kv@test@smol", "buffer_steps": 100000}}"#
    );
    // A cache of about 340 tokens: the checker's distinct prompts evict each other.
    let server = TestServer::start(&[
        "--kv-events-config",
        &config,
        "--kv-cache-memory",
        "16MiB",
        "--max-model-len",
        "320",
    ]);
    let c = reqwest::Client::new();
    let sources: Value = c.get(server.url("/kv_event_sources")).send().await?.json().await?;
    let source = &sources["0"];
    assert_eq!(source["endpoint"], format!("tcp://127.0.0.1:{publish}"), "{sources}");
    assert_eq!(source["replay_endpoint"], format!("tcp://127.0.0.1:{replay}"));
    assert_eq!((source["encoding"].as_str(), source["schema_version"].as_u64()), (Some("msgpack"), Some(1)));
    let block_size = c.get(server.url("/server_info")).send().await?.json::<Value>().await?["kv_block_size"]
        .as_u64()
        .unwrap()
        .to_string();
    crate::sdk::run_script(
        "check_kv_events.py",
        &server.url(""),
        &[
            "--endpoint",
            &format!("tcp://127.0.0.1:{publish}"),
            "--replay",
            &format!("tcp://127.0.0.1:{replay}"),
            "--topic",
            "kv@test@smol",
            "--block-size",
            &block_size,
        ],
    )
    .await?;
    let text = metrics_text(&c, &server).await?;
    assert!(metric(&text, "pagoda:kv_events_batches_total", "").unwrap_or(0.0) > 0.0);
    assert_eq!(metric(&text, "pagoda:kv_events_dropped_total", ""), Some(0.0));
    Ok(())
}

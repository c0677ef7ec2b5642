//! The KV-event sockets against peers that mean harm, through the real `pagoda serve` binary
//! (a child process: an abort must fail the test, not kill it). A peer completes ZMTP 3.0's
//! greeting and NULL handshake by hand, as a SUB on the PUB socket and as a DEALER on the
//! replay (ROUTER) socket, then announces a frame of 2^40 bytes, or sends all but the last
//! byte of a 64 MiB one: the server stays up, serves, publishes and replays, and holds none of
//! it. Also: a `*` endpoint binds `--host`'s address only, and `"publish_token_ids": false`
//! publishes the block hashes without the prompt's token ids. Events are read with libzmq (the
//! `zmq` crate), as a consumer would.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Child;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use serde_json::{json, Value};

use crate::harness::post_json;
use crate::kv_events::free_port;
use crate::shutdown::{pagoda_serve, spawn_ready};

const TOPIC: &str = "kv@hostile";

/// `pagoda serve` publishing on `tcp://*:{publish}` and replaying on `tcp://*:{replay}`, with
/// `extra_json` added to the KV-events config.
fn serve_with_events(publish: u16, replay: u16, extra_json: &str) -> Result<(Child, String)> {
    let config = format!(
        r#"{{"enable_kv_cache_events": true, "endpoint": "tcp://*:{publish}",
            "replay_endpoint": "tcp://*:{replay}", "topic": "{TOPIC}"{extra_json}}}"#
    );
    let extra = ["--kv-cache-memory", "32MiB", "--max-model-len", "512", "--kv-events-config", &config];
    let (child, addr, _log) = spawn_ready(pagoda_serve(&extra))?;
    Ok((child, addr))
}

fn ensure_alive(child: &mut Child, after: &str) -> Result<()> {
    if let Some(status) = child.try_wait()? {
        bail!("the server died after {after}: {status}");
    }
    Ok(())
}

/// Reads one ZMTP frame (or command) and returns its flags and body.
fn read_frame(stream: &mut TcpStream) -> Result<(u8, Vec<u8>)> {
    let mut flags = [0u8; 1];
    stream.read_exact(&mut flags)?;
    let len = if flags[0] & 0x02 != 0 {
        let mut len = [0u8; 8];
        stream.read_exact(&mut len)?;
        u64::from_be_bytes(len)
    } else {
        let mut len = [0u8; 1];
        stream.read_exact(&mut len)?;
        u64::from(len[0])
    };
    ensure!(len < 4096, "a handshake frame of {len} bytes");
    let mut body = vec![0u8; len as usize];
    stream.read_exact(&mut body)?;
    Ok((flags[0], body))
}

/// Connects to `port` on 127.0.0.1 and completes ZMTP 3.0's greeting and NULL handshake as a
/// `socket_type` peer; the server's READY has been read when this returns.
fn zmtp_peer(port: u16, socket_type: &str) -> Result<TcpStream> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    stream.set_write_timeout(Some(Duration::from_secs(10)))?;
    // Signature, version 3.0, mechanism NULL, as-server 0, filler.
    let mut greeting = [0u8; 64];
    greeting[0] = 0xff;
    greeting[9] = 0x7f;
    greeting[10] = 3;
    greeting[12..16].copy_from_slice(b"NULL");
    stream.write_all(&greeting)?;
    let mut theirs = [0u8; 64];
    stream.read_exact(&mut theirs)?;
    ensure!(theirs[0] == 0xff && theirs[9] == 0x7f && theirs[10] == 3, "not a ZMTP 3 greeting: {theirs:?}");
    let mut ready = b"\x05READY\x0bSocket-Type".to_vec();
    ready.extend_from_slice(&(socket_type.len() as u32).to_be_bytes());
    ready.extend_from_slice(socket_type.as_bytes());
    let mut command = vec![0x04, ready.len() as u8];
    command.extend(ready);
    stream.write_all(&command)?;
    let (flags, body) = read_frame(&mut stream)?;
    ensure!(flags & 0x04 != 0 && body.starts_with(b"\x05READY"), "no READY: {flags:#x} {body:?}");
    Ok(stream)
}

/// A final long frame's header announcing `len` bytes.
fn long_frame_header(len: u64) -> Vec<u8> {
    let mut header = vec![0x02];
    header.extend_from_slice(&len.to_be_bytes());
    header
}

/// Anonymous resident memory of process `pid` now, in bytes (where buffered frames would be;
/// the model's mapped pages are not).
fn rss_anon(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status.lines().find(|l| l.starts_with("RssAnon:")).context("no RssAnon")?;
    let kib: u64 = line.split_whitespace().nth(1).context("RssAnon value")?.parse()?;
    Ok(kib * 1024)
}

/// The array lengths that follow each msgpack string `key` in `payload`.
fn array_lens_after(payload: &[u8], key: &str) -> Vec<usize> {
    let mut needle = vec![0xa0 | key.len() as u8];
    needle.extend_from_slice(key.as_bytes());
    let mut lens = Vec::new();
    for at in 0..payload.len().saturating_sub(needle.len()) {
        if payload[at..].starts_with(&needle) {
            let rest = &payload[at + needle.len()..];
            lens.push(match rest {
                [b @ 0x90..=0x9f, ..] => usize::from(b & 0x0f),
                [0xdc, a, b, ..] => usize::from(u16::from_be_bytes([*a, *b])),
                [0xdd, a, b, c, d, ..] => u32::from_be_bytes([*a, *b, *c, *d]) as usize,
                _ => usize::MAX,
            });
        }
    }
    lens
}

/// A libzmq SUB socket on `port`, subscribed to [`TOPIC`] and given time to join.
fn subscriber(ctx: &zmq::Context, port: u16) -> Result<zmq::Socket> {
    let sub = ctx.socket(zmq::SUB)?;
    sub.set_rcvtimeo(15_000)?;
    sub.set_subscribe(TOPIC.as_bytes())?;
    sub.connect(&format!("tcp://127.0.0.1:{port}"))?;
    std::thread::sleep(Duration::from_millis(500));
    Ok(sub)
}

/// Asks the server for a completion of `prompt` (long enough to fill a KV block, so that it
/// stores some) and returns the payload of the first published batch with a `BlockStored`.
async fn complete_and_read_stored(addr: &str, sub: &zmq::Socket, prompt: &str) -> Result<Vec<u8>> {
    let c = reqwest::Client::builder().timeout(Duration::from_secs(120)).build()?;
    let (status, body) = post_json(
        &c,
        &format!("http://{addr}/v1/completions"),
        &json!({"prompt": prompt, "max_tokens": 4, "temperature": 0}),
    )
    .await?;
    ensure!(status == 200, "{status}: {body}");
    ensure!(!body["choices"][0]["text"].as_str().unwrap_or("").is_empty(), "{body}");
    loop {
        let frames = sub.recv_multipart(0).context("no KV event batch was published")?;
        let [topic, seq, payload] = frames.as_slice() else { bail!("{} frames", frames.len()) };
        ensure!(topic == TOPIC.as_bytes() && seq.len() == 8, "{topic:?} {seq:?}");
        if payload.windows(11).any(|w| w == b"BlockStored") {
            return Ok(payload.clone());
        }
    }
}

/// Replays from sequence number 0 over a libzmq DEALER and returns how many batches came.
fn replay_all(ctx: &zmq::Context, port: u16) -> Result<usize> {
    let dealer = ctx.socket(zmq::DEALER)?;
    dealer.set_rcvtimeo(15_000)?;
    dealer.connect(&format!("tcp://127.0.0.1:{port}"))?;
    dealer.send_multipart([&b""[..], &0u64.to_be_bytes()], 0)?;
    let mut batches = 0;
    loop {
        let frames = dealer.recv_multipart(0).context("the replay did not answer")?;
        match frames.as_slice() {
            [empty, _topic, seq, _payload] if empty.is_empty() && seq[..] == [0xff; 8] => return Ok(batches),
            [empty, topic, _seq, _payload] if empty.is_empty() && topic == TOPIC.as_bytes() => batches += 1,
            other => bail!("unexpected replay message: {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_announcing_a_terabyte_neither_aborts_nor_stops_the_server() -> Result<()> {
    let (publish, replay) = (free_port(), free_port());
    let (mut child, addr) = serve_with_events(publish, replay, "")?;
    let test = async {
        let mut peers = Vec::new();
        for (port, socket_type) in [(publish, "SUB"), (replay, "DEALER")] {
            let mut peer = zmtp_peer(port, socket_type)?;
            // The header alone, nothing after it.
            peer.write_all(&long_frame_header(1 << 40))?;
            peers.push(peer);
            tokio::time::sleep(Duration::from_millis(500)).await;
            ensure_alive(&mut child, &format!("a 2^40-byte frame header on the {socket_type} peer"))?;
        }
        let ctx = zmq::Context::new();
        let sub = subscriber(&ctx, publish)?;
        let payload = complete_and_read_stored(
            &addr,
            &sub,
            "Seven blue whales sang together under the pale winter moon, and the sailors on the \
             old wooden ship listened in silence until the morning light came over the grey sea.",
        )
        .await?;
        // By default the events carry the prompt's token ids, as vLLM's do.
        let token_ids = array_lens_after(&payload, "token_ids");
        ensure!(!token_ids.is_empty() && token_ids.iter().all(|&n| n > 0), "{token_ids:?}");
        ensure!(replay_all(&ctx, replay)? >= 1, "nothing was replayed");
        ensure_alive(&mut child, "serving")?;
        drop(peers);
        Ok(())
    };
    let result = test.await;
    with_child_result(&mut child, result)
}

/// Kills `child` and returns `result`, or the child's death when it died first.
fn with_child_result(child: &mut Child, result: Result<()>) -> Result<()> {
    let status = child.try_wait();
    let _ = child.kill();
    let _ = child.wait();
    match status {
        Ok(Some(status)) => bail!("the server died: {status} ({result:?})"),
        _ => result,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_64_mib_frame_is_refused_without_being_held() -> Result<()> {
    let (publish, replay) = (free_port(), free_port());
    let (mut child, addr) = serve_with_events(publish, replay, "")?;
    let test = async {
        let c = reqwest::Client::new();
        let (status, _) = post_json(
            &c,
            &format!("http://{addr}/v1/completions"),
            &json!({"prompt": "Hi", "max_tokens": 2}),
        )
        .await?;
        ensure!(status == 200);
        tokio::time::sleep(Duration::from_millis(300)).await;
        let before = rss_anon(child.id())?;
        let mut peers = Vec::new();
        for (port, socket_type) in [(publish, "SUB"), (replay, "DEALER")] {
            let mut peer = zmtp_peer(port, socket_type)?;
            peer.write_all(&long_frame_header(64 << 20))?;
            // All but the last byte: a server that buffers frames whole now holds 64 MiB and
            // waits for the rest. One that refuses the header has closed the connection, and
            // these writes fail.
            let chunk = vec![0x5a; 1 << 20];
            for i in 0..64 {
                let part = if i == 63 { &chunk[1..] } else { &chunk[..] };
                if peer.write_all(part).is_err() {
                    break;
                }
            }
            peers.push(peer);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        ensure_alive(&mut child, "64 MiB frames")?;
        let grown = rss_anon(child.id())?.saturating_sub(before);
        println!("two peers sent 64 MiB frames less a byte: anonymous RSS +{} KiB", grown >> 10);
        ensure!(grown < 32 << 20, "anonymous RSS grew by {} MiB", grown >> 20);
        drop(peers);
        let health = c.get(format!("http://{addr}/health")).send().await?;
        ensure!(health.status() == 200);
        Ok(())
    };
    let result = test.await;
    with_child_result(&mut child, result)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_star_endpoint_binds_the_servers_host_only() -> Result<()> {
    let (publish, replay) = (free_port(), free_port());
    let (mut child, addr) = serve_with_events(publish, replay, "")?;
    let test = async {
        let sources: Value = reqwest::get(format!("http://{addr}/kv_event_sources")).await?.json().await?;
        ensure!(sources["0"]["endpoint"] == format!("tcp://127.0.0.1:{publish}"), "{sources}");
        ensure!(sources["0"]["replay_endpoint"] == format!("tcp://127.0.0.1:{replay}"), "{sources}");
        // 127.0.0.2 is this machine too (all of 127/8 is loopback): a socket bound to every
        // address answers there, one bound to `--host 127.0.0.1` does not.
        for port in [publish, replay] {
            ensure!(TcpStream::connect(("127.0.0.1", port)).is_ok(), "{port} is not bound on 127.0.0.1");
            let other = TcpStream::connect_timeout(&([127, 0, 0, 2], port).into(), Duration::from_secs(2));
            ensure!(other.is_err(), "port {port} answers on 127.0.0.2");
        }
        Ok(())
    };
    let result = test.await;
    with_child_result(&mut child, result)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_leave_token_ids_out_when_told() -> Result<()> {
    let (publish, replay) = (free_port(), free_port());
    let (mut child, addr) = serve_with_events(publish, replay, r#", "publish_token_ids": false"#)?;
    let test = async {
        let ctx = zmq::Context::new();
        let sub = subscriber(&ctx, publish)?;
        let prompt = "The vault code is 4 8 1 5 1 6 2 3 4 2 and nobody else may read it, ever.";
        let payload = complete_and_read_stored(&addr, &sub, prompt).await?;
        // Still the block hashes, chained, but an empty token id list in every BlockStored.
        let hashes = array_lens_after(&payload, "block_hashes");
        ensure!(!hashes.is_empty() && hashes.iter().all(|&n| n > 0), "{hashes:?}");
        let token_ids = array_lens_after(&payload, "token_ids");
        ensure!(!token_ids.is_empty() && token_ids.iter().all(|&n| n == 0), "{token_ids:?}");
        Ok(())
    };
    let result = test.await;
    with_child_result(&mut child, result)
}

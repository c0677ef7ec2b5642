//! The publisher over real libzmq sockets on 127.0.0.1: the queue drops instead of waiting,
//! batches reach a SUB socket and a replay, token ids are left out when told, and a peer that
//! announces a frame of 2^40 bytes is cut off while the sockets go on working.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use super::*;

fn stored(id: u32) -> CacheEvent {
    let block = pagoda_engine::block_pool::CachedBlockRef { id, generation: 0 };
    CacheEvent::Stored {
        block,
        parent: None,
        token_ids: (100..116).collect(),
        lora: None,
        group: 0,
        images: Box::default(),
    }
}

fn config(publish_token_ids: bool) -> KvEventsConfig {
    KvEventsConfig {
        enable_kv_cache_events: true,
        endpoint: "tcp://*:0".into(),
        replay_endpoint: Some("tcp://*:0".into()),
        topic: "kv".into(),
        publish_token_ids,
        ..Default::default()
    }
}

fn start(config: &KvEventsConfig) -> KvEventPublisher {
    KvEventPublisher::start(config, "127.0.0.1", 16, vec![None], Arc::new(|_| None)).unwrap()
}

/// A SUB socket on `publisher`'s PUB socket, given time to join.
fn subscriber(ctx: &zmq::Context, publisher: &KvEventPublisher) -> zmq::Socket {
    let sub = ctx.socket(zmq::SUB).unwrap();
    sub.set_rcvtimeo(10_000).unwrap();
    sub.set_subscribe(b"kv").unwrap();
    sub.connect(&publisher.endpoints().publish).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    sub
}

/// The array lengths that follow each msgpack string `key` in `payload`.
fn array_lens_after(payload: &[u8], key: &str) -> Vec<usize> {
    let mut needle = vec![0xa0 | key.len() as u8];
    needle.extend_from_slice(key.as_bytes());
    (0..payload.len())
        .filter(|&at| payload[at..].starts_with(&needle))
        .map(|at| match payload[at + needle.len()..] {
            [b @ 0x90..=0x9f, ..] => usize::from(b & 0x0f),
            [0xdc, a, b, ..] => usize::from(u16::from_be_bytes([a, b])),
            _ => usize::MAX,
        })
        .collect()
}

#[test]
fn a_full_queue_drops_and_counts_instead_of_waiting() {
    let config = KvEventsConfig { max_queue_size: 1, ..config(true) };
    let endpoints = BoundEndpoints { publish: String::new(), replay: None };
    // No thread takes from this queue: the first step fills it, the next two are dropped.
    let (publisher, rx) = KvEventPublisher::queue(&config, endpoints);
    publisher.submit(vec![stored(1)]);
    publisher.submit(vec![stored(2), stored(3)]);
    publisher.submit(vec![stored(4)]);
    assert_eq!(publisher.stats().dropped_events.load(Ordering::Relaxed), 3);
    assert_eq!(rx.try_recv().unwrap(), vec![stored(1)]);
}

#[test]
fn batches_reach_a_subscriber_and_a_replay_with_or_without_token_ids() {
    for publish_token_ids in [true, false] {
        let publisher = start(&config(publish_token_ids));
        let ends = publisher.endpoints().clone();
        assert!(ends.publish.starts_with("tcp://127.0.0.1:"), "{ends:?}");
        let ctx = zmq::Context::new();
        let sub = subscriber(&ctx, &publisher);
        publisher.submit(vec![stored(1)]);
        let frames = sub.recv_multipart(0).unwrap();
        assert_eq!((frames.len(), &frames[0][..], &frames[1][..]), (3, &b"kv"[..], &0u64.to_be_bytes()[..]));
        assert_eq!(array_lens_after(&frames[2], "block_hashes"), vec![1]);
        let want = if publish_token_ids { 16 } else { 0 };
        assert_eq!(array_lens_after(&frames[2], "token_ids"), vec![want]);

        let dealer = ctx.socket(zmq::DEALER).unwrap();
        dealer.set_rcvtimeo(10_000).unwrap();
        dealer.connect(ends.replay.as_deref().unwrap()).unwrap();
        dealer.send_multipart([&b""[..], &0u64.to_be_bytes()[..]], 0).unwrap();
        let batch = dealer.recv_multipart(0).unwrap();
        assert_eq!(batch, [vec![], b"kv".to_vec(), 0u64.to_be_bytes().to_vec(), frames[2].clone()]);
        let end = dealer.recv_multipart(0).unwrap();
        assert_eq!(end, [vec![], vec![], END_SEQ.to_vec(), vec![]]);
    }
}

/// ZMTP 3.0's greeting and NULL handshake as a `socket_type` peer, by hand.
fn zmtp_peer(endpoint: &str, socket_type: &str) -> TcpStream {
    let mut stream = TcpStream::connect(endpoint.trim_start_matches("tcp://")).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut greeting = [0u8; 64];
    greeting[0] = 0xff;
    greeting[9] = 0x7f;
    greeting[10] = 3;
    greeting[12..16].copy_from_slice(b"NULL");
    stream.write_all(&greeting).unwrap();
    let mut theirs = [0u8; 64];
    stream.read_exact(&mut theirs).unwrap();
    let mut ready = b"\x05READY\x0bSocket-Type".to_vec();
    ready.extend_from_slice(&(socket_type.len() as u32).to_be_bytes());
    ready.extend_from_slice(socket_type.as_bytes());
    stream.write_all(&[0x04, ready.len() as u8]).unwrap();
    stream.write_all(&ready).unwrap();
    let mut head = [0u8; 2];
    stream.read_exact(&mut head).unwrap();
    let mut body = vec![0u8; usize::from(head[1])];
    stream.read_exact(&mut body).unwrap();
    assert!(head[0] == 0x04 && body.starts_with(b"\x05READY"), "{head:?} {body:?}");
    stream
}

#[test]
fn a_peer_announcing_a_huge_frame_is_cut_off_and_the_sockets_go_on() {
    let publisher = start(&config(true));
    let ends = publisher.endpoints().clone();
    for (endpoint, socket_type) in [(&ends.publish, "SUB"), (ends.replay.as_ref().unwrap(), "DEALER")] {
        let mut peer = zmtp_peer(endpoint, socket_type);
        let mut header = vec![0x02];
        header.extend_from_slice(&(1u64 << 40).to_be_bytes());
        peer.write_all(&header).unwrap();
        // libzmq closes the connection at the header: the read sees the end (or a reset).
        let mut rest = Vec::new();
        match peer.read_to_end(&mut rest) {
            Ok(_) => assert!(rest.is_empty(), "{rest:?}"),
            Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}"),
        }
    }
    let ctx = zmq::Context::new();
    let sub = subscriber(&ctx, &publisher);
    publisher.submit(vec![stored(1)]);
    assert_eq!(sub.recv_multipart(0).unwrap().len(), 3);
}

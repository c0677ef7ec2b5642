//! The ZMQ publisher, as vLLM's: each step's events, hashed, go out as one message on a PUB
//! socket, `[topic, sequence number (8 bytes, big-endian), msgpack batch]`, numbered from 0 with
//! no gaps; the last `buffer_steps` batches are kept, and a ROUTER socket replays them to a
//! subscriber that missed some: it sends `["", start (8 bytes)]` and gets `["", topic, seq,
//! batch]` for each kept batch from `start` on, then `["", "", ff×8, ""]`.
//!
//! The sockets are libzmq's (the `zmq` crate), each refusing any inbound frame over
//! [`MAX_INBOUND_FRAME`] bytes: a peer's frame header alone never makes the server reserve
//! what it announces. libzmq is synchronous, so each socket lives on a thread of its own: the
//! PUB socket on the one that hashes, encodes and sends, the ROUTER on one that answers
//! replays. The engine never waits on either: [`KvEventPublisher::submit`] queues a step's
//! events (at most `max_queue_size` steps) and drops them, counted, when the queue is full.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, PoisonError};

use pagoda_engine::{CacheEvent, LoraId};

use crate::block_hash::BlockHasher;
use crate::config::{Endpoint, KvEventsConfig};
use crate::hashes::{EventHashes, HashedEvent};
use crate::wire::encode_batch;

/// An adapter's name and path, by its id (they go into its blocks' hashes).
pub type AdapterNames = Arc<dyn Fn(LoraId) -> Option<(String, String)> + Send + Sync>;

/// The largest frame a peer may send either socket (libzmq's `ZMQ_MAXMSGSIZE`); a larger one
/// closes that peer's connection at its header. Peers send subscriptions (a topic prefix) and
/// replay requests (8 bytes).
pub const MAX_INBOUND_FRAME: i64 = 64 * 1024;

/// The end of a replay: sequence number -1.
const END_SEQ: [u8; 8] = [0xff; 8];

/// How often the replay thread looks up from its socket to see whether the publisher is gone.
const REPLAY_POLL_MS: i32 = 500;

#[derive(Debug, thiserror::Error)]
pub enum PublisherError {
    #[error("KV events: cannot {action} {endpoint}: {source}")]
    Socket { action: &'static str, endpoint: String, source: zmq::Error },
    #[error("KV events: cannot start the publishing thread: {0}")]
    Thread(#[from] std::io::Error),
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
}

/// Counters of what was published and dropped.
#[derive(Debug, Default)]
pub struct PublisherStats {
    /// Batches sent (one per step with events).
    pub batches: AtomicU64,
    /// Cache events dropped because the queue was full.
    pub dropped_events: AtomicU64,
}

/// Where the sockets are, once bound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BoundEndpoints {
    /// The PUB socket's address as bound (the real port for port 0), or the address it
    /// connects to.
    pub publish: String,
    pub replay: Option<String>,
}

/// The handle the engine's observer holds. Dropping it ends both threads.
pub struct KvEventPublisher {
    tx: SyncSender<Vec<CacheEvent>>,
    stats: Arc<PublisherStats>,
    endpoints: BoundEndpoints,
}

impl std::fmt::Debug for KvEventPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvEventPublisher").field("endpoints", &self.endpoints).finish_non_exhaustive()
    }
}

/// The kept batches, by sequence number, shared by the two threads.
type ReplayBuffer = Arc<Mutex<VecDeque<(u64, Arc<[u8]>)>>>;

/// What the publishing thread owns.
struct Publishing {
    rx: Receiver<Vec<CacheEvent>>,
    socket: zmq::Socket,
    topic: Vec<u8>,
    hashes: EventHashes,
    windows: Vec<Option<usize>>,
    adapters: AdapterNames,
    publish_token_ids: bool,
    buffer: ReplayBuffer,
    buffer_steps: usize,
    next_seq: u64,
    stats: Arc<PublisherStats>,
    /// Set when the publisher is dropped, for the replay thread.
    stopped: Arc<AtomicBool>,
}

/// What the replay thread owns.
struct Replaying {
    socket: zmq::Socket,
    topic: Vec<u8>,
    buffer: ReplayBuffer,
    stopped: Arc<AtomicBool>,
}

/// A socket of `kind` with the limits every one of ours has.
fn socket(ctx: &zmq::Context, kind: zmq::SocketType, endpoint: &str) -> Result<zmq::Socket, PublisherError> {
    let err = |source| PublisherError::Socket {
        action: "open a socket for",
        endpoint: endpoint.to_owned(),
        source,
    };
    let socket = ctx.socket(kind).map_err(err)?;
    socket.set_maxmsgsize(MAX_INBOUND_FRAME).map_err(err)?;
    // Nothing queued is worth waiting for at exit.
    socket.set_linger(0).map_err(err)?;
    // IPv6 for an IPv6 address only (a `--host` of `::1`, an endpoint of `[::]`), as vLLM
    // does: on, libzmq binds IPv4 addresses as IPv6-mapped ones and reports them so.
    socket.set_ipv6(endpoint.contains('[')).map_err(err)?;
    Ok(socket)
}

/// Binds `socket` to `addr` and returns the address bound (the real port for port 0).
fn bind(socket: &zmq::Socket, addr: &str) -> Result<String, PublisherError> {
    let err = |source| PublisherError::Socket { action: "bind", endpoint: addr.to_owned(), source };
    socket.bind(addr).map_err(err)?;
    Ok(match socket.get_last_endpoint().map_err(err)? {
        Ok(bound) => bound,
        Err(_) => addr.to_owned(),
    })
}

impl KvEventPublisher {
    /// Binds (or connects) the sockets and starts the threads that own them. `bind_host` (the
    /// server's `--host`) is where a `*` endpoint binds; `windows` gives each KV group's
    /// sliding window (`None`: full attention); the seed of the block hashes is
    /// `$PYTHONHASHSEED` when set, as vLLM's is.
    pub fn start(
        config: &KvEventsConfig,
        bind_host: &str,
        block_size: usize,
        windows: Vec<Option<usize>>,
        adapters: AdapterNames,
    ) -> Result<Self, PublisherError> {
        let seed =
            std::env::var("PYTHONHASHSEED").unwrap_or_else(|_| crate::block_hash::DEFAULT_SEED.to_owned());
        let ctx = zmq::Context::new();
        let (publisher, publish) = match config.publish_endpoint(bind_host)? {
            Endpoint::Bind(addr) => {
                let socket = socket(&ctx, zmq::PUB, &addr)?;
                let bound = bind(&socket, &addr)?;
                (socket, bound)
            }
            Endpoint::Connect(addr) => {
                let socket = socket(&ctx, zmq::PUB, &addr)?;
                socket.connect(&addr).map_err(|source| PublisherError::Socket {
                    action: "connect",
                    endpoint: addr.clone(),
                    source,
                })?;
                (socket, addr)
            }
        };
        let hwm = i32::try_from(config.hwm).unwrap_or(i32::MAX);
        publisher.set_sndhwm(hwm).map_err(|source| PublisherError::Socket {
            action: "set the high-water mark of",
            endpoint: publish.clone(),
            source,
        })?;
        let (replay, replay_addr) = match config.replay(bind_host)? {
            None => (None, None),
            Some(addr) => {
                let socket = socket(&ctx, zmq::ROUTER, &addr)?;
                let bound = bind(&socket, &addr)?;
                socket.set_rcvtimeo(REPLAY_POLL_MS).map_err(|source| PublisherError::Socket {
                    action: "set the receive timeout of",
                    endpoint: bound.clone(),
                    source,
                })?;
                (Some(socket), Some(bound))
            }
        };
        let (publisher_handle, rx) = Self::queue(config, BoundEndpoints { publish, replay: replay_addr });
        let topic = config.topic.clone().into_bytes();
        let buffer = ReplayBuffer::default();
        let stopped = Arc::new(AtomicBool::new(false));
        if let Some(socket) = replay {
            let replaying = Replaying {
                socket,
                topic: topic.clone(),
                buffer: Arc::clone(&buffer),
                stopped: Arc::clone(&stopped),
            };
            std::thread::Builder::new().name("kv-events-replay".into()).spawn(move || replaying.run())?;
        }
        let publishing = Publishing {
            rx,
            socket: publisher,
            topic,
            hashes: EventHashes::new(BlockHasher::new(&seed), block_size),
            windows,
            adapters,
            publish_token_ids: config.publish_token_ids,
            buffer,
            buffer_steps: config.buffer_steps,
            next_seq: 0,
            stats: Arc::clone(&publisher_handle.stats),
            stopped,
        };
        std::thread::Builder::new().name("kv-events".into()).spawn(move || publishing.run())?;
        Ok(publisher_handle)
    }

    /// The handle and the queue's other end, nothing started.
    fn queue(config: &KvEventsConfig, endpoints: BoundEndpoints) -> (Self, Receiver<Vec<CacheEvent>>) {
        let (tx, rx) = mpsc::sync_channel(config.max_queue_size.max(1));
        (Self { tx, stats: Arc::default(), endpoints }, rx)
    }

    /// Queues one step's events; never waits (a full queue drops them, counted).
    pub fn submit(&self, events: Vec<CacheEvent>) {
        match self.tx.try_send(events) {
            Ok(()) => {}
            Err(TrySendError::Full(events) | TrySendError::Disconnected(events)) => {
                self.stats.dropped_events.fetch_add(events.len() as u64, Ordering::Relaxed);
            }
        }
    }

    pub fn stats(&self) -> &PublisherStats {
        &self.stats
    }

    pub fn endpoints(&self) -> &BoundEndpoints {
        &self.endpoints
    }
}

impl Publishing {
    fn run(mut self) {
        while let Ok(events) = self.rx.recv() {
            self.publish(events);
        }
        self.stopped.store(true, Ordering::Relaxed);
    }

    fn publish(&mut self, events: Vec<CacheEvent>) {
        let adapters = Arc::clone(&self.adapters);
        let mut hashed = self.hashes.hash(events, &*adapters);
        if hashed.is_empty() {
            return;
        }
        if !self.publish_token_ids {
            for event in &mut hashed {
                if let HashedEvent::Stored { token_ids, .. } = event {
                    token_ids.clear();
                }
            }
        }
        let ts = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let payload: Arc<[u8]> = encode_batch(ts, &hashed, &self.windows).into();
        let seq = self.next_seq;
        self.next_seq += 1;
        // A PUB socket drops for subscribers past their high-water mark and never blocks;
        // nothing to do on error.
        let _ = self.socket.send_multipart([&self.topic[..], &seq.to_be_bytes()[..], &payload[..]], 0);
        self.stats.batches.fetch_add(1, Ordering::Relaxed);
        if self.buffer_steps > 0 {
            let mut buffer = self.buffer.lock().unwrap_or_else(PoisonError::into_inner);
            if buffer.len() == self.buffer_steps {
                buffer.pop_front();
            }
            buffer.push_back((seq, payload));
        }
    }
}

impl Replaying {
    fn run(self) {
        while !self.stopped.load(Ordering::Relaxed) {
            match self.socket.recv_multipart(0) {
                Ok(request) => self.replay(&request),
                Err(zmq::Error::EAGAIN | zmq::Error::EINTR) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "KV events: the replay socket failed; replay is off");
                    return;
                }
            }
        }
    }

    /// Answers `[identity, "", start]` with the kept batches from `start` on, then the end.
    /// Anything else is ignored.
    fn replay(&self, request: &[Vec<u8>]) {
        let [identity, _delimiter, start] = request else { return };
        let Ok(start) = <[u8; 8]>::try_from(start.as_slice()) else { return };
        let start = u64::from_be_bytes(start);
        let batches: Vec<(u64, Arc<[u8]>)> = {
            let buffer = self.buffer.lock().unwrap_or_else(PoisonError::into_inner);
            buffer.iter().filter(|(seq, _)| *seq >= start).cloned().collect()
        };
        // A ROUTER drops what a peer past its high-water mark cannot take, and never blocks.
        for (seq, payload) in &batches {
            let seq = seq.to_be_bytes();
            let frames: [&[u8]; 5] = [identity, b"", &self.topic, &seq, payload];
            if self.socket.send_multipart(frames, 0).is_err() {
                return;
            }
        }
        let end: [&[u8]; 5] = [identity, b"", b"", &END_SEQ, b""];
        let _ = self.socket.send_multipart(end, 0);
    }
}

#[cfg(test)]
mod tests;

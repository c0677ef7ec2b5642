//! The ZMQ publisher, as vLLM's: each step's events, hashed, go out as one message on a PUB
//! socket, `[topic, sequence number (8 bytes, big-endian), msgpack batch]`, numbered from 0 with
//! no gaps; the last `buffer_steps` batches are kept, and a ROUTER socket replays them to a
//! subscriber that missed some: it sends `["", start (8 bytes)]` and gets `["", topic, seq,
//! batch]` for each kept batch from `start` on, then `["", "", ff×8, ""]`.
//!
//! The engine never waits on it: [`KvEventPublisher::submit`] queues a step's events (at most
//! `max_queue_size` steps) and drops them, counted, when the queue is full. Hashing, encoding
//! and sending run on a task of their own.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use pagoda_engine::{CacheEvent, LoraId};
use tokio::sync::mpsc;
use zeromq::{PubSocket, RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

use crate::block_hash::BlockHasher;
use crate::config::{Endpoint, KvEventsConfig};
use crate::hashes::EventHashes;
use crate::wire::encode_batch;

/// An adapter's name and path, by its id (they go into its blocks' hashes).
pub type AdapterNames = Arc<dyn Fn(LoraId) -> Option<(String, String)> + Send + Sync>;

/// The end of a replay: sequence number -1.
const END_SEQ: [u8; 8] = [0xff; 8];

#[derive(Debug, thiserror::Error)]
pub enum PublisherError {
    #[error("KV events: cannot {action} {endpoint}: {source}")]
    Socket { action: &'static str, endpoint: String, source: zeromq::ZmqError },
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

/// The handle the engine's observer holds.
pub struct KvEventPublisher {
    tx: mpsc::Sender<Vec<CacheEvent>>,
    stats: Arc<PublisherStats>,
    endpoints: BoundEndpoints,
}

impl std::fmt::Debug for KvEventPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvEventPublisher").field("endpoints", &self.endpoints).finish_non_exhaustive()
    }
}

/// What the publishing task owns.
struct Task {
    rx: mpsc::Receiver<Vec<CacheEvent>>,
    publisher: PubSocket,
    replay: Option<RouterSocket>,
    topic: Bytes,
    hashes: EventHashes,
    windows: Vec<Option<usize>>,
    adapters: AdapterNames,
    buffer: VecDeque<(u64, Bytes)>,
    buffer_steps: usize,
    next_seq: u64,
    stats: Arc<PublisherStats>,
}

impl KvEventPublisher {
    /// Binds (or connects) the sockets and starts the publishing task on the current runtime.
    /// `windows` gives each KV group's sliding window (`None`: full attention); the seed of
    /// the block hashes is `$PYTHONHASHSEED` when set, as vLLM's is.
    pub async fn start(
        config: &KvEventsConfig,
        block_size: usize,
        windows: Vec<Option<usize>>,
        adapters: AdapterNames,
    ) -> Result<Self, PublisherError> {
        let seed =
            std::env::var("PYTHONHASHSEED").unwrap_or_else(|_| crate::block_hash::DEFAULT_SEED.to_owned());
        let mut publisher = PubSocket::new();
        let publish = match config.publish_endpoint()? {
            Endpoint::Bind(addr) => publisher
                .bind(&addr)
                .await
                .map_err(|source| PublisherError::Socket { action: "bind", endpoint: addr.clone(), source })?
                .to_string(),
            Endpoint::Connect(addr) => {
                publisher.connect(&addr).await.map_err(|source| PublisherError::Socket {
                    action: "connect",
                    endpoint: addr.clone(),
                    source,
                })?;
                addr
            }
        };
        let (replay, replay_addr) = match config.replay()? {
            None => (None, None),
            Some(addr) => {
                let mut socket = RouterSocket::new();
                let bound = socket.bind(&addr).await.map_err(|source| PublisherError::Socket {
                    action: "bind",
                    endpoint: addr.clone(),
                    source,
                })?;
                (Some(socket), Some(bound.to_string()))
            }
        };
        let (tx, rx) = mpsc::channel(config.max_queue_size.max(1));
        let stats = Arc::new(PublisherStats::default());
        let task = Task {
            rx,
            publisher,
            replay,
            topic: Bytes::from(config.topic.clone().into_bytes()),
            hashes: EventHashes::new(BlockHasher::new(&seed), block_size),
            windows,
            adapters,
            buffer: VecDeque::new(),
            buffer_steps: config.buffer_steps,
            next_seq: 0,
            stats: Arc::clone(&stats),
        };
        tokio::spawn(task.run());
        Ok(Self { tx, stats, endpoints: BoundEndpoints { publish, replay: replay_addr } })
    }

    /// Queues one step's events; never waits (a full queue drops them, counted).
    pub fn submit(&self, events: Vec<CacheEvent>) {
        if let Err(e) = self.tx.try_send(events) {
            let events = match e {
                mpsc::error::TrySendError::Full(events) | mpsc::error::TrySendError::Closed(events) => events,
            };
            self.stats.dropped_events.fetch_add(events.len() as u64, Ordering::Relaxed);
        }
    }

    pub fn stats(&self) -> &PublisherStats {
        &self.stats
    }

    pub fn endpoints(&self) -> &BoundEndpoints {
        &self.endpoints
    }
}

impl Task {
    async fn run(mut self) {
        loop {
            tokio::select! {
                events = self.rx.recv() => match events {
                    Some(events) => self.publish(events).await,
                    None => return,
                },
                request = recv_replay(&mut self.replay) => match request {
                    Ok(request) => self.replay(request).await,
                    Err(e) => {
                        tracing::warn!(error = %e, "KV events: the replay socket failed; replay is off");
                        self.replay = None;
                    }
                },
            }
        }
    }

    async fn publish(&mut self, events: Vec<CacheEvent>) {
        let adapters = Arc::clone(&self.adapters);
        let hashed = self.hashes.hash(events, &*adapters);
        if hashed.is_empty() {
            return;
        }
        let ts = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let payload = Bytes::from(encode_batch(ts, &hashed, &self.windows));
        let seq = self.next_seq;
        self.next_seq += 1;
        let frames = vec![self.topic.clone(), Bytes::copy_from_slice(&seq.to_be_bytes()), payload.clone()];
        if let Ok(message) = ZmqMessage::try_from(frames) {
            // A PUB socket drops for subscribers that cannot keep up; nothing to do on error.
            let _ = self.publisher.send(message).await;
        }
        self.stats.batches.fetch_add(1, Ordering::Relaxed);
        if self.buffer_steps > 0 {
            if self.buffer.len() == self.buffer_steps {
                self.buffer.pop_front();
            }
            self.buffer.push_back((seq, payload));
        }
    }

    /// Answers `[identity, "", start]` with the kept batches from `start` on, then the end.
    async fn replay(&mut self, request: ZmqMessage) {
        let frames = request.into_vec();
        let [identity, _delimiter, start] = frames.as_slice() else { return };
        let Ok(start) = <[u8; 8]>::try_from(start.as_ref()) else { return };
        let start = u64::from_be_bytes(start);
        let Some(socket) = self.replay.as_mut() else { return };
        for (seq, payload) in self.buffer.iter().filter(|(seq, _)| *seq >= start) {
            let frames = vec![
                identity.clone(),
                Bytes::new(),
                self.topic.clone(),
                Bytes::copy_from_slice(&seq.to_be_bytes()),
                payload.clone(),
            ];
            if let Ok(message) = ZmqMessage::try_from(frames) {
                if socket.send(message).await.is_err() {
                    return;
                }
            }
        }
        let end =
            vec![identity.clone(), Bytes::new(), Bytes::new(), Bytes::from_static(&END_SEQ), Bytes::new()];
        if let Ok(message) = ZmqMessage::try_from(end) {
            let _ = socket.send(message).await;
        }
    }
}

/// The next replay request, or never when there is no replay socket.
async fn recv_replay(socket: &mut Option<RouterSocket>) -> Result<ZmqMessage, zeromq::ZmqError> {
    match socket {
        Some(socket) => socket.recv().await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(id: u32) -> CacheEvent {
        let block = pagoda_engine::block_pool::CachedBlockRef { id, generation: 0 };
        CacheEvent::Stored { block, parent: None, token_ids: (0..16).collect(), lora: None, group: 0 }
    }

    #[test]
    fn a_full_queue_drops_and_counts_instead_of_waiting() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let config = KvEventsConfig {
                enable_kv_cache_events: true,
                endpoint: "tcp://*:0".into(),
                max_queue_size: 1,
                ..Default::default()
            };
            let publisher =
                KvEventPublisher::start(&config, 16, vec![None], Arc::new(|_| None)).await.unwrap();
            assert!(
                publisher.endpoints().publish.starts_with("tcp://0.0.0.0:"),
                "{:?}",
                publisher.endpoints()
            );
            // The publishing task cannot run between these calls (one thread, no await): the
            // first step's events fill the queue, the next two are dropped at once.
            publisher.submit(vec![stored(1)]);
            publisher.submit(vec![stored(2), stored(3)]);
            publisher.submit(vec![stored(4)]);
            assert_eq!(publisher.stats().dropped_events.load(Ordering::Relaxed), 3);
            // Once it runs, the queued step is published.
            for _ in 0..100 {
                if publisher.stats().batches.load(Ordering::Relaxed) == 1 {
                    return;
                }
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
            panic!("the queued step was not published");
        });
    }
}

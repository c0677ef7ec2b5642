//! The caller's side of the engine: [`EngineHandle`] (submit, abort, health, stats),
//! [`RequestStream`] (a request's [`TokenEvent`]s, for async and blocking callers),
//! [`Shutdown`] and [`EngineError`].

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, PoisonError, Weak};

use tokio::sync::mpsc::error::TryRecvError;
use tokio::sync::mpsc::{Receiver, Sender};

use pagoda_text::TokenDecoder;

use crate::config::{ConfigError, EngineConfig};
use crate::event::{FinishReason, TokenEvent};
use crate::output::RequestOutput;
use crate::request::{Request, RequestError, RequestId};
use crate::stats::{EngineStatsSnapshot, LiveStats};

/// Why the engine refused or could not serve a request.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EngineError {
    /// Too many sequences are waiting; try again later (HTTP 429/503).
    #[error("the server is overloaded: its queue of {max_waiting} waiting sequences is full")]
    Overloaded { max_waiting: usize },
    /// The requests ask for more sequences than the waiting queue can ever hold: retrying
    /// cannot help (HTTP 400).
    #[error("the request asks for {requested} sequences; at most {max_waiting} can wait at once")]
    NeverFits { requested: usize, max_waiting: usize },
    #[error(transparent)]
    InvalidRequest(#[from] RequestError),
    #[error("invalid engine configuration: {0}")]
    Config(#[from] ConfigError),
    #[error("the engine is shutting down")]
    ShuttingDown,
    /// The engine thread stopped (executor failure, or a bug); it accepts nothing more.
    #[error("the engine has stopped: {0}")]
    Dead(String),
    #[error("could not start the engine thread: {0}")]
    Spawn(String),
    /// The engine sleeps ([`crate::sleep`]); it serves again once woken (HTTP 503).
    #[error("the server is asleep (sleep mode); it serves again after POST /wake_up")]
    Asleep,
}

/// Why the prefix cache was not flushed: sequences are running or waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{running} running and {waiting} waiting sequences are in flight; the prefix cache is flushed only when the server is idle")]
pub struct FlushBusy {
    pub running: usize,
    pub waiting: usize,
}

/// Why the prefix cache was not flushed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FlushError {
    #[error(transparent)]
    Busy(#[from] FlushBusy),
    #[error(transparent)]
    Engine(#[from] EngineError),
}

pub(crate) enum Command {
    /// The requests of one call, added in one go: the next step sees all of them.
    Add(Vec<(Request, Sender<TokenEvent>)>),
    Abort(RequestId),
    /// Ends one sample now (the output stage found a stop string in its text).
    FinishSample {
        id: RequestId,
        index: usize,
        reason: FinishReason,
    },
    /// Installs a LoRA adapter, read and checked elsewhere, into the executor between steps.
    InstallLora {
        id: crate::executor::LoraId,
        adapter: crate::executor::PreparedLora,
        reply: tokio::sync::oneshot::Sender<Result<(), String>>,
    },
    /// Drops a LoRA adapter that no request uses.
    UnloadLora {
        id: crate::executor::LoraId,
        reply: tokio::sync::oneshot::Sender<Result<(), String>>,
    },
    /// Empties the prefix cache when no request is in flight.
    FlushPrefixCache {
        reply: tokio::sync::oneshot::Sender<Result<usize, FlushError>>,
    },
    /// Reads and releases the blocks held under a transfer key (`None`: nothing held there).
    ExportHeld {
        key: String,
        reply: tokio::sync::oneshot::Sender<Result<crate::kv_transfer::HeldExport, String>>,
    },
    /// Writes received pages into the prefix cache; answers the leading tokens now cached.
    ImportPrefix {
        prefix: crate::KvPrefix,
        lora: Option<crate::executor::LoraId>,
        reply: tokio::sync::oneshot::Sender<Result<usize, String>>,
    },
    /// Only wakes the loop (shutdown).
    Wake,
    /// Frees the executor's memory ([`crate::sleep`]).
    Sleep {
        level: crate::sleep::SleepLevel,
        /// How long the requests in flight may still run before they fail.
        drain: std::time::Duration,
        reply: tokio::sync::oneshot::Sender<Result<(), crate::sleep::SleepError>>,
    },
    WakeUp {
        reply: tokio::sync::oneshot::Sender<Result<(), crate::sleep::SleepError>>,
    },
}

/// State shared by the handles and the engine thread.
#[derive(Debug)]
pub(crate) struct Shared {
    pub config: EngineConfig,
    pub alive: AtomicBool,
    pub death: Mutex<Option<String>>,
    /// Requests submitted and not yet scheduled once (in the channel or waiting); what
    /// `max_waiting_requests` bounds.
    pub pending: AtomicUsize,
    pub stats: LiveStats,
    /// The executor's page shape for prefill/decode transfers, `None` when it has none.
    pub kv_page_layout: Option<crate::KvPageLayout>,
    /// The offload tiers' counters, when the engine has tiers ([`crate::kv_tier`]).
    pub kv_tier_stats: Option<Arc<crate::kv_tier::KvTierStats>>,
    /// The sleep level's number, 0 while awake ([`crate::sleep`]).
    pub asleep: AtomicU8,
    next_request_id: AtomicU64,
}

impl Shared {
    pub fn new(config: EngineConfig) -> Self {
        Self {
            config,
            alive: AtomicBool::new(true),
            death: Mutex::new(None),
            pending: AtomicUsize::new(0),
            stats: LiveStats::default(),
            kv_page_layout: None,
            kv_tier_stats: None,
            asleep: AtomicU8::new(0),
            next_request_id: AtomicU64::new(1),
        }
    }

    pub fn with_kv_page_layout(mut self, layout: Option<crate::KvPageLayout>) -> Self {
        self.kv_page_layout = layout;
        self
    }

    /// Marks the engine dead for `reason` (the first reason wins).
    pub fn kill(&self, reason: &str) {
        let mut death = self.death.lock().unwrap_or_else(PoisonError::into_inner);
        death.get_or_insert_with(|| reason.to_string());
        self.alive.store(false, Ordering::SeqCst);
    }

    pub(crate) fn death_reason(&self) -> String {
        let death = self.death.lock().unwrap_or_else(PoisonError::into_inner);
        death.clone().unwrap_or_else(|| "stopped".into())
    }
}

/// What the handles own; when the last handle goes, the command channel closes, which lets an
/// idle engine thread exit.
pub(crate) struct HandleInner {
    pub tx: mpsc::Sender<Command>,
    pub shared: Arc<Shared>,
    pub shutdown: Shutdown,
    /// What the streams' output stages detokenize with.
    pub decoder: Arc<dyn TokenDecoder>,
}

/// Submits requests to a running engine. Cheap to clone; usable from any thread.
#[derive(Clone)]
pub struct EngineHandle {
    pub(crate) inner: Arc<HandleInner>,
}

impl EngineHandle {
    /// Queues a request and returns the stream of its events. Validation errors, a full waiting
    /// queue and a stopped engine are reported here; anything later arrives as an event.
    pub fn submit(&self, request: Request) -> Result<RequestStream, EngineError> {
        let mut streams = self.submit_all(vec![request])?;
        Ok(streams.remove(0))
    }

    /// Queues several requests (the prompts of one call) all or none: each is validated and
    /// their samples are reserved in the waiting queue together, so the call is never admitted
    /// in part.
    pub fn submit_all(&self, requests: Vec<Request>) -> Result<Vec<RequestStream>, EngineError> {
        let shared = &self.inner.shared;
        if self.inner.shutdown.is_triggered() {
            return Err(EngineError::ShuttingDown);
        }
        self.health()?;
        if shared.asleep.load(Ordering::SeqCst) != 0 {
            return Err(EngineError::Asleep);
        }
        for request in &requests {
            request.validate(&shared.config)?;
        }
        let samples: usize = requests.iter().map(|r| r.n).sum();
        let max_waiting = shared.config.max_waiting_requests;
        if samples > max_waiting {
            return Err(EngineError::NeverFits { requested: samples, max_waiting });
        }
        let reserved = shared.pending.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |pending| {
            (pending + samples <= max_waiting).then_some(pending + samples)
        });
        if reserved.is_err() {
            return Err(EngineError::Overloaded { max_waiting });
        }
        let mut streams = Vec::with_capacity(requests.len());
        let mut adds = Vec::with_capacity(requests.len());
        for request in requests {
            let (tx, rx) = crate::outbox::request_channel();
            let output = RequestOutput::new(&request, Arc::clone(&self.inner.decoder));
            let engine = Arc::downgrade(&self.inner);
            streams.push(RequestStream { id: request.id, rx, output, engine, ended: false });
            adds.push((request, tx));
        }
        if self.inner.tx.send(Command::Add(adds)).is_err() {
            shared.pending.fetch_sub(samples, Ordering::SeqCst);
            return Err(EngineError::Dead(shared.death_reason()));
        }
        Ok(streams)
    }

    /// Installs `adapter` (read and checked by the caller, off the engine thread) as `id`,
    /// between two steps; `Err` says why not (the id is taken, or a stopped engine).
    pub async fn install_lora(
        &self,
        id: crate::executor::LoraId,
        adapter: crate::executor::PreparedLora,
    ) -> Result<(), String> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.lora_command(Command::InstallLora { id, adapter, reply }, answer).await
    }

    /// Drops adapter `id` when no request, running or waiting, uses it.
    pub async fn unload_lora(&self, id: crate::executor::LoraId) -> Result<(), String> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.lora_command(Command::UnloadLora { id, reply }, answer).await
    }

    async fn lora_command(
        &self,
        command: Command,
        answer: tokio::sync::oneshot::Receiver<Result<(), String>>,
    ) -> Result<(), String> {
        let dead = || self.inner.shared.death_reason();
        if self.inner.tx.send(command).is_err() {
            return Err(format!("the engine has stopped: {}", dead()));
        }
        answer.await.unwrap_or_else(|_| Err(format!("the engine has stopped: {}", dead())))
    }

    /// Empties the prefix cache between two steps, when no request is in flight; returns how
    /// many cached blocks it dropped.
    pub async fn flush_prefix_cache(&self) -> Result<usize, FlushError> {
        let dead = || EngineError::Dead(self.inner.shared.death_reason());
        self.health()?;
        let (reply, answer) = tokio::sync::oneshot::channel();
        if self.inner.tx.send(Command::FlushPrefixCache { reply }).is_err() {
            return Err(dead().into());
        }
        answer.await.unwrap_or_else(|_| Err(dead().into()))
    }

    /// Aborts a request; its stream ends with `FinishReason::Abort`. Unknown ids are ignored.
    /// (Dropping the request's stream has the same effect.)
    pub fn abort(&self, id: RequestId) {
        // A stopped engine has nothing to abort.
        let _ = self.inner.tx.send(Command::Abort(id));
    }

    pub fn is_alive(&self) -> bool {
        self.inner.shared.alive.load(Ordering::SeqCst)
    }

    /// `Ok` while the engine thread runs.
    pub fn health(&self) -> Result<(), EngineError> {
        if self.is_alive() {
            Ok(())
        } else {
            Err(EngineError::Dead(self.inner.shared.death_reason()))
        }
    }

    pub fn stats(&self) -> EngineStatsSnapshot {
        self.inner.shared.stats.snapshot()
    }

    /// The adapters of the running and waiting sequences, as of the last step.
    pub fn lora_activity(&self) -> crate::stats::LoraActivity {
        self.inner.shared.stats.lora_activity()
    }

    /// Requests submitted and not yet started.
    pub fn num_pending(&self) -> usize {
        self.inner.shared.pending.load(Ordering::SeqCst)
    }

    pub fn config(&self) -> &EngineConfig {
        &self.inner.shared.config
    }

    /// The executor's KV page shape for prefill/decode transfers; `None` when its cache cannot
    /// be transferred.
    pub fn kv_page_layout(&self) -> Option<&crate::KvPageLayout> {
        self.inner.shared.kv_page_layout.as_ref()
    }

    /// The prefix cache's offload tiers' counters, when it has tiers (`--kv-offload`).
    pub fn kv_tier_stats(&self) -> Option<&Arc<crate::kv_tier::KvTierStats>> {
        self.inner.shared.kv_tier_stats.as_ref()
    }

    /// A fresh request id, unique for this engine (for callers without ids of their own).
    pub fn next_request_id(&self) -> RequestId {
        self.inner.shared.next_request_id.fetch_add(1, Ordering::Relaxed)
    }

    /// The shutdown signal this engine obeys.
    pub fn shutdown(&self) -> &Shutdown {
        &self.inner.shutdown
    }
}

/// The events of one request, with their text. Every stream ends with an event for which
/// [`TokenEvent::is_last`] holds, then `None`. Dropping it aborts the request.
///
/// The request's output stage ([`RequestOutput`]) runs here, on the caller's side: the engine
/// sends token ids, and reading the stream detokenizes them and cuts samples at their stop
/// strings.
pub struct RequestStream {
    id: RequestId,
    rx: Receiver<TokenEvent>,
    output: RequestOutput,
    /// Where to send the end of a sample cut by a stop string (weak: a stream alone does not
    /// keep the engine's command channel open).
    engine: Weak<HandleInner>,
    /// The engine's channel has closed.
    ended: bool,
}

impl std::fmt::Debug for RequestStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestStream")
            .field("id", &self.id)
            .field("output", &self.output)
            .finish_non_exhaustive()
    }
}

impl RequestStream {
    pub fn request_id(&self) -> RequestId {
        self.id
    }

    /// Runs a raw event through the output stage; a sample cut by a stop string is ended in
    /// the engine.
    fn take(&mut self, raw: Option<TokenEvent>) {
        match raw {
            Some(event) => {
                if let Some(stop) = self.output.push(event) {
                    let command =
                        Command::FinishSample { id: self.id, index: stop.index, reason: stop.reason };
                    let sent = self.engine.upgrade().is_some_and(|inner| inner.tx.send(command).is_ok());
                    if !sent {
                        // No engine to end it: the held event goes out as it is.
                        self.output.release_held();
                    }
                }
            }
            None => {
                self.ended = true;
                self.output.release_held();
            }
        }
    }

    /// An event ready for the caller (`Some(Some(_))`), the stream's end (`Some(None)`), or
    /// nothing until the engine sends more (`None`).
    fn ready(&mut self) -> Option<Option<TokenEvent>> {
        match self.output.pop() {
            Some(event) => Some(Some(event)),
            None if self.ended => Some(None),
            None => None,
        }
    }

    /// Next event, from async code.
    pub async fn recv(&mut self) -> Option<TokenEvent> {
        loop {
            if let Some(next) = self.ready() {
                return next;
            }
            let raw = self.rx.recv().await;
            self.take(raw);
        }
    }

    /// Next event, from blocking code (not from inside an async runtime).
    pub fn blocking_recv(&mut self) -> Option<TokenEvent> {
        loop {
            if let Some(next) = self.ready() {
                return next;
            }
            let raw = self.rx.blocking_recv();
            self.take(raw);
        }
    }

    pub fn try_recv(&mut self) -> Result<TokenEvent, TryRecvError> {
        loop {
            if let Some(next) = self.ready() {
                return next.ok_or(TryRecvError::Disconnected);
            }
            match self.rx.try_recv() {
                Ok(event) => self.take(Some(event)),
                Err(TryRecvError::Disconnected) => self.take(None),
                Err(TryRecvError::Empty) => return Err(TryRecvError::Empty),
            }
        }
    }
}

type Waker = Box<dyn Fn() + Send + Sync>;

#[derive(Default)]
struct ShutdownInner {
    triggered: AtomicBool,
    wakers: Mutex<Vec<Waker>>,
}

/// Tells engines to stop: requests in flight end with `FinishReason::Abort`, new submissions
/// are refused, and the engine thread exits. Clone it to trigger from elsewhere (a signal
/// handler, a test).
#[derive(Clone, Default)]
pub struct Shutdown {
    inner: Arc<ShutdownInner>,
}

impl std::fmt::Debug for Shutdown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shutdown").field("triggered", &self.is_triggered()).finish()
    }
}

impl Shutdown {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn trigger(&self) {
        self.inner.triggered.store(true, Ordering::SeqCst);
        let wakers = self.inner.wakers.lock().unwrap_or_else(PoisonError::into_inner);
        for wake in wakers.iter() {
            wake();
        }
    }

    pub fn is_triggered(&self) -> bool {
        self.inner.triggered.load(Ordering::SeqCst)
    }

    /// Registers an engine to wake on trigger. Holds the handles weakly, so a forgotten shutdown
    /// does not keep an engine's command channel open.
    pub(crate) fn register(&self, handle: Weak<HandleInner>) {
        let wake: Waker = Box::new(move || {
            if let Some(inner) = handle.upgrade() {
                let _ = inner.tx.send(Command::Wake);
            }
        });
        self.inner.wakers.lock().unwrap_or_else(PoisonError::into_inner).push(wake);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decoder() -> Arc<dyn TokenDecoder> {
        Arc::new(crate::fake::FakeDecoder)
    }

    #[test]
    fn shutdown_wakes_registered_engines_and_ignores_dropped_ones() {
        let shutdown = Shutdown::new();
        let (tx, rx) = mpsc::channel();
        let shared = Arc::new(Shared::new(EngineConfig::new(16, 128, 2048)));
        let inner = Arc::new(HandleInner { tx, shared, shutdown: shutdown.clone(), decoder: decoder() });
        shutdown.register(Arc::downgrade(&inner));
        let (gone_tx, _gone_rx) = mpsc::channel();
        let gone = Arc::new(HandleInner {
            tx: gone_tx,
            shared: Arc::new(Shared::new(EngineConfig::new(16, 128, 2048))),
            shutdown: shutdown.clone(),
            decoder: decoder(),
        });
        shutdown.register(Arc::downgrade(&gone));
        drop(gone);
        assert!(!shutdown.is_triggered());
        shutdown.trigger();
        assert!(shutdown.is_triggered());
        assert!(matches!(rx.try_recv(), Ok(Command::Wake)));
    }

    #[test]
    fn first_death_reason_wins() {
        let shared = Shared::new(EngineConfig::new(16, 128, 2048));
        assert_eq!(shared.death_reason(), "stopped");
        shared.kill("device lost");
        shared.kill("later");
        assert!(!shared.alive.load(Ordering::SeqCst));
        assert_eq!(shared.death_reason(), "device lost");
    }
}

//! `pagoda-kv-transfer`: moving a prompt's KV pages from a prefill instance to a decode
//! instance (prefill/decode disaggregation), as vLLM's disaggregated serving and SGLang's
//! bootstrap flow ask of their workers.
//!
//! - [`config`]: `--kv-transfer-config` (vLLM's `KVTransferConfig` JSON) and the instance's
//!   role (producer, consumer or both).
//! - [`directive`]: what a request asks (`kv_transfer_params`, or SGLang's `bootstrap_*`
//!   fields): hold the prompt's KV for a decode instance, or fetch it from a prefill instance;
//!   and the parameters a prefill answers with.
//! - [`protocol`]: the frames of one transfer over a byte stream.
//! - [`tcp`]: the producer's listener and the consumer's client over plain TCP.
//!
//! The server sees a transport only through [`KvConnector`] (consumer side) and [`KvSource`]
//! (what a producer's listener serves), so an RDMA or NIXL transport can replace [`tcp`]
//! without touching the engine or the request flow. The engine holds, reads and imports pages
//! ([`pagoda_engine::kv_transfer`]); this crate never sees a tensor.

pub mod config;
pub mod directive;
pub mod protocol;
pub mod tcp;

use std::future::Future;
use std::pin::Pin;
use std::time::Instant;

pub use config::{KvRole, KvTransferConfig};
pub use directive::{Directive, TransferSource};
pub use pagoda_engine::{HeldExport, KvPageLayout, KvPrefix};

/// A boxed future, so that the transport traits can be used as trait objects.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Why a transfer did not deliver a prefix. Every case ends the same way for the request: the
/// decode instance computes the prompt itself.
#[derive(Debug, thiserror::Error)]
pub enum TransferError {
    #[error("could not reach the prefill instance at {addr}: {source}")]
    Connect { addr: String, source: std::io::Error },
    #[error("the transfer timed out")]
    Timeout,
    #[error("the prefill instance holds nothing under key {key:?}: {reason}")]
    NotFound { key: String, reason: String },
    #[error("the prefill instance refused: {0}")]
    Refused(String),
    #[error("transfer I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("bad transfer frame: {0}")]
    Protocol(String),
}

impl TransferError {
    /// A short label for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            TransferError::Connect { .. } => "connect",
            TransferError::Timeout => "timeout",
            TransferError::NotFound { .. } => "not_found",
            TransferError::Refused(_) => "refused",
            TransferError::Io(_) => "io",
            TransferError::Protocol(_) => "protocol",
        }
    }
}

/// What a decode instance asks for, and what it can take: pages of its own model and layout,
/// at most `max_blocks` of them (the request's prompt's whole blocks: no producer can rightly
/// send more). A transport checks the answer against these before it allocates anything for
/// the pages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchSpec {
    pub source: TransferSource,
    /// The model both instances must serve (compared by the producer).
    pub model: String,
    pub layout: KvPageLayout,
    pub max_blocks: usize,
}

/// The consumer's side of a transport: fetches the prefix a producer holds for
/// `spec.source`, waiting for it (the prefill may still be running) until `deadline`.
pub trait KvConnector: Send + Sync {
    fn fetch<'a>(
        &'a self,
        spec: &'a FetchSpec,
        deadline: Instant,
    ) -> BoxFuture<'a, Result<KvPrefix, TransferError>>;
}

/// What a producer's transport serves: the prefix held under a key, taken (and released) by
/// the read, or whether it may still come.
pub trait KvSource: Send + Sync + 'static {
    fn take<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<HeldExport, String>>;

    /// The model this instance serves; a fetch for another is refused without taking anything.
    fn model(&self) -> &str;
}

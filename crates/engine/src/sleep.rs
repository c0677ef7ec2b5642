//! Sleep mode (vLLM's `/sleep`, `/wake_up`, `/is_sleeping`): the engine gives back the memory
//! of its KV cache (level 1), or of its weights too (level 2), between requests, so that another
//! process can use the accelerator or the host's memory, and takes it again on wake.
//!
//! Going to sleep first refuses new requests and lets those in flight finish, up to a drain
//! timeout, then fails whatever still runs, empties the prefix cache (the pages it names are gone; its removal is reported
//! as cache events) and asks the executor to free its memory
//! ([`ModelExecutor::sleep`](crate::ModelExecutor::sleep)). While asleep every submission is
//! refused with [`EngineError::Asleep`](crate::EngineError::Asleep) and no step runs.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::handle::{Command, EngineError, EngineHandle};

/// How deeply the engine sleeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SleepLevel {
    /// The KV cache is freed; the weights stay (on the host, for a device that moves them).
    Cache = 1,
    /// The KV cache and the weights are freed; the weights are loaded again on wake.
    Weights = 2,
}

impl SleepLevel {
    /// The level numbered as vLLM's `?level=` (1 or 2).
    pub fn from_number(level: u8) -> Option<Self> {
        match level {
            1 => Some(Self::Cache),
            2 => Some(Self::Weights),
            _ => None,
        }
    }

    pub fn number(self) -> u8 {
        self as u8
    }
}

/// Why the engine did not go to sleep or did not wake up.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SleepError {
    /// This model or configuration cannot sleep at this level (a client's mistake to ask).
    #[error("{0}")]
    Unsupported(String),
    /// Freeing or taking back the memory failed; the engine stays as it was.
    #[error("{0}")]
    Failed(String),
    #[error(transparent)]
    Engine(#[from] EngineError),
}

/// A sleep waiting for the requests in flight to finish.
pub(crate) struct PendingSleep {
    pub level: SleepLevel,
    /// When what still runs is failed.
    pub deadline: Instant,
    pub reply: tokio::sync::oneshot::Sender<Result<(), SleepError>>,
}

/// The state word shared with the handles: 0 awake, else the level's number.
pub(crate) fn state_of(level: Option<SleepLevel>) -> u8 {
    level.map_or(0, SleepLevel::number)
}

impl EngineHandle {
    /// Puts the engine to sleep at `level` once nothing is in flight, or after `drain` failing
    /// whatever still is; from the call on, new requests are refused. Asleep already: nothing
    /// changes (as vLLM).
    pub async fn sleep(&self, level: SleepLevel, drain: Duration) -> Result<(), SleepError> {
        self.ask(|reply| Command::Sleep { level, drain, reply }).await
    }

    /// Wakes the engine (its memory taken back, at level 2 its weights loaded again); awake
    /// already: nothing to do.
    pub async fn wake_up(&self) -> Result<(), SleepError> {
        self.ask(|reply| Command::WakeUp { reply }).await
    }

    /// The level the engine sleeps at, `None` while awake.
    pub fn sleep_level(&self) -> Option<SleepLevel> {
        SleepLevel::from_number(self.inner.shared.asleep.load(Ordering::SeqCst))
    }

    async fn ask(
        &self,
        command: impl FnOnce(tokio::sync::oneshot::Sender<Result<(), SleepError>>) -> Command,
    ) -> Result<(), SleepError> {
        let dead = || SleepError::Engine(EngineError::Dead(self.inner.shared.death_reason()));
        self.health()?;
        let (reply, answer) = tokio::sync::oneshot::channel();
        if self.inner.tx.send(command(reply)).is_err() {
            return Err(dead());
        }
        answer.await.unwrap_or_else(|_| Err(dead()))
    }
}

//! Background responses (`background: true`): the generation runs in a detached task that owns
//! the engine's event stream, so no HTTP connection holds it; a client that disconnects stops
//! only its own reading. The task turns the engine's events into the typed stream events (the
//! same [`Responder`] as a foreground stream) and appends them to the response's [`Run`]: its
//! event log, buffered in memory so that a late reader replays it (`GET
//! /v1/responses/{id}?stream=true&starting_after=N`) and a live reader follows it, and its
//! response object, which a poll (`GET /v1/responses/{id}`) reads with the output so far.
//!
//! A run is admitted into the response store before it is submitted and keeps its place until
//! it ends (see [`super::store`] for the bounds). Cancelling marks it `cancelled` at once and
//! wakes the task, which drops the engine stream: the engine aborts the request and frees its
//! KV blocks. When it ends, by itself or cancelled, the run becomes a finished stored response
//! that keeps its event log for replay.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use axum::response::sse::Event;
use futures_util::stream::{self, BoxStream, Stream, StreamExt};
use serde_json::json;
use tokio::sync::{watch, Notify};

use super::stream::{Responder, SeqEvent, Step};
use super::wire::ResponseObject;
use crate::error::ApiError;
use crate::state::{AppState, SharedState};

/// One buffered event: its sequence number, type, and its JSON as sent.
#[derive(Debug, Clone)]
struct Logged {
    sequence: u64,
    name: &'static str,
    data: Arc<str>,
}

struct Inner {
    /// Until the run ends.
    responder: Option<Responder>,
    log: VecDeque<Logged>,
    /// Bytes of the buffered events' JSON.
    log_bytes: usize,
    /// The sequence number the next event will have.
    next: u64,
}

impl Inner {
    /// The sequence number of the oldest buffered event (`next` when none is).
    fn first(&self) -> u64 {
        self.log.front().map_or(self.next, |e| e.sequence)
    }

    /// Drops the oldest events until the log takes at most `bytes`, keeping the newest one.
    fn trim(&mut self, bytes: usize) {
        while self.log_bytes > bytes && self.log.len() > 1 {
            if let Some(e) = self.log.pop_front() {
                self.log_bytes -= e.data.len();
            }
        }
    }
}

/// A background response: its state while it runs and its event log. See the module docs.
pub struct Run {
    id: String,
    inner: Mutex<Inner>,
    /// Bumped after every change, for readers following the log.
    changed: watch::Sender<u64>,
    /// Wakes the task to stop generating.
    cancel: Notify,
}

impl std::fmt::Debug for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Run").field("id", &self.id).finish_non_exhaustive()
    }
}

impl Run {
    /// A run of the (queued) `responder`'s response, with its opening events logged.
    pub fn new(id: String, mut responder: Responder) -> Arc<Self> {
        let opening = responder.opening();
        let run = Arc::new(Run {
            id,
            inner: Mutex::new(Inner {
                responder: Some(responder),
                log: VecDeque::new(),
                log_bytes: 0,
                next: 0,
            }),
            changed: watch::channel(0).0,
            cancel: Notify::new(),
        });
        run.append(&mut run.lock(), opening);
        run
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic mid-update leaves at worst a half-appended batch of events, still in order.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Appends events to the log (without the store's accounting; see [`Run::account`]).
    fn append(&self, inner: &mut Inner, events: Vec<SeqEvent>) {
        for e in events {
            let data: Arc<str> = serde_json::to_string(&e.data).unwrap_or_default().into();
            inner.log_bytes += data.len();
            inner.next = e.sequence + 1;
            inner.log.push_back(Logged { sequence: e.sequence, name: e.name, data });
        }
    }

    /// Accounts the log's bytes to the store, dropping the oldest events past what it allows.
    fn account(&self, state: &AppState, inner: &mut Inner) {
        let allowed = state.responses.account(&self.id, inner.log_bytes);
        inner.trim(allowed);
    }

    fn notify(&self) {
        self.changed.send_modify(|v| *v += 1);
    }

    /// The response object with its output so far; `None` once the run has ended (it is then
    /// a finished stored response).
    pub fn snapshot(&self) -> Option<ResponseObject> {
        self.lock().responder.as_ref().map(Responder::snapshot)
    }

    /// One step of the task: an engine event (or the server's own step, see [`Step`]), or
    /// `None` when the steps ended. Returns whether the run has ended.
    fn advance(self: &Arc<Self>, state: &AppState, event: Option<Step>) -> bool {
        let mut inner = self.lock();
        let Some(responder) = inner.responder.as_mut() else { return true };
        let events = match event {
            Some(e) => responder.on_step(state, e),
            None => responder.on_end(state.prompts.tokenizer()),
        };
        let done = responder.done();
        self.append(&mut inner, events);
        if done {
            self.end(state, &mut inner);
        } else {
            self.account(state, &mut inner);
        }
        drop(inner);
        self.notify();
        done
    }

    /// The run has ended: its response becomes a finished stored response. The caller notifies.
    fn end(self: &Arc<Self>, state: &AppState, inner: &mut Inner) -> Option<ResponseObject> {
        let response = inner.responder.take()?.snapshot();
        match state.responses.finish(response.clone(), Arc::clone(self), inner.log_bytes) {
            Some(log_room) => inner.trim(log_room),
            None => tracing::warn!(
                id = %self.id,
                "background response not kept: its output makes it larger than --max-stored-response-bytes"
            ),
        }
        Some(response)
    }

    /// Cancels the run: it ends `cancelled` with its output so far, and the task stops,
    /// aborting the engine request. `None` when it had already ended.
    pub fn cancel(self: &Arc<Self>, state: &AppState) -> Option<ResponseObject> {
        let mut inner = self.lock();
        inner.responder.as_mut()?.cancel();
        let response = self.end(state, &mut inner);
        drop(inner);
        self.cancel.notify_one();
        self.notify();
        response
    }

    /// The events after `starting_after` (all of them without it), then, while the run goes
    /// on, each new one as it comes; the stream ends when the run has.
    pub fn follow(
        self: Arc<Self>,
        starting_after: Option<u64>,
    ) -> Result<impl Stream<Item = Event>, ApiError> {
        let start = {
            let inner = self.lock();
            let start = starting_after.map_or(0, |n| n + 1);
            if start > inner.next {
                return Err(ApiError::invalid(
                    "starting_after",
                    format!(
                        "starting_after {} is past the last event of response '{}' (sequence_number {})",
                        start - 1,
                        self.id,
                        inner.next.saturating_sub(1)
                    ),
                ));
            }
            if start < inner.first() {
                return Err(ApiError::invalid(
                    if starting_after.is_some() { "starting_after" } else { "stream" },
                    format!(
                        "the events of response '{}' before sequence_number {} are no longer buffered \
                         (a response buffers at most --max-stored-response-bytes of events): \
                         give starting_after {} or later",
                        self.id,
                        inner.first(),
                        inner.first().saturating_sub(1)
                    ),
                ));
            }
            start
        };
        let rx = self.changed.subscribe();
        Ok(stream::unfold((self, Some(start), rx), |(run, cursor, mut rx)| async move {
            let cursor = cursor?;
            loop {
                rx.borrow_and_update();
                let (batch, ended, first) = {
                    let inner = run.lock();
                    let batch: Vec<Logged> = inner.log.iter().filter(|e| e.sequence >= cursor).cloned().collect();
                    (batch, inner.responder.is_none(), inner.first())
                };
                if cursor < first {
                    // This reader fell behind the buffer's bound: what it missed is gone.
                    let message = format!(
                        "this reader fell behind: the events before sequence_number {first} are no longer buffered"
                    );
                    let data = json!({"type": "error", "code": "events_dropped", "message": message, "param": null});
                    let event = Event::default().event("error").data(data.to_string());
                    return Some((vec![event], (run, None, rx)));
                }
                if let Some(last) = batch.last() {
                    let next = last.sequence + 1;
                    let events = batch.iter().map(|e| Event::default().event(e.name).data(&*e.data)).collect();
                    return Some((events, (run, Some(next), rx)));
                }
                if ended || rx.changed().await.is_err() {
                    return None;
                }
            }
        })
        .flat_map(stream::iter))
    }
}

/// Starts the detached task that drives `run` with the engine's `events` (and, for MCP tools,
/// the server's own steps between generations).
pub fn spawn(state: SharedState, run: Arc<Run>, mut events: BoxStream<'static, Step>) {
    tokio::spawn(async move {
        loop {
            let event = tokio::select! {
                biased;
                // Dropping `events` on the way out aborts the engine request.
                () = run.cancel.notified() => return,
                event = events.next() => event,
            };
            if run.advance(&state, event) {
                return;
            }
        }
    });
}

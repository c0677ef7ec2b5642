//! Delivery of one request's events to a caller that may read slowly. The channel to the caller
//! is bounded; the engine thread never blocks on it. When it is full, the events that did not
//! fit wait here, merged per sample (token ids, text and logprobs concatenated), so a reader
//! that falls behind costs memory in proportion to its output, not to its number of events,
//! and the reader gets everything, in order per sample, once it catches up.

use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::mpsc::{channel, Receiver, Sender};

use crate::event::TokenEvent;

/// Events one request's channel holds before they wait (merged) in its [`Outbox`].
pub(crate) const CHANNEL_EVENTS: usize = 64;

/// A bounded channel to a request's caller.
pub(crate) fn request_channel() -> (Sender<TokenEvent>, Receiver<TokenEvent>) {
    channel(CHANNEL_EVENTS)
}

#[derive(Debug)]
pub(crate) struct Outbox {
    tx: Sender<TokenEvent>,
    /// Events the channel had no room for, at most one per sample plus the request's last.
    waiting: Vec<TokenEvent>,
    /// The request's last event has been handed to the outbox.
    ended: bool,
}

impl Outbox {
    pub fn new(tx: Sender<TokenEvent>) -> Self {
        Self { tx, waiting: Vec::new(), ended: false }
    }

    /// Whether the caller went away.
    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }

    /// Whether everything, the last event included, has reached the channel.
    pub fn is_done(&self) -> bool {
        self.ended && self.waiting.is_empty()
    }

    /// Whether the request's last event has been handed over (it may still wait).
    pub fn has_ended(&self) -> bool {
        self.ended
    }

    /// Whether events wait for room in the channel.
    pub fn has_waiting(&self) -> bool {
        !self.waiting.is_empty()
    }

    /// Sends `event`, or keeps it (merged with what waits) when the channel is full.
    pub fn send(&mut self, event: TokenEvent) {
        self.ended |= event.is_last();
        let event = if self.waiting.is_empty() {
            match self.tx.try_send(event) {
                Ok(()) | Err(TrySendError::Closed(_)) => return,
                Err(TrySendError::Full(event)) => event,
            }
        } else {
            event
        };
        // The request's last event stays last; others join their sample's waiting event.
        if !event.is_last() {
            if let Some(w) = self.waiting.iter_mut().rev().find(|w| w.index == event.index && !w.is_last()) {
                merge(w, event);
                return;
            }
        }
        self.waiting.push(event);
    }

    /// Moves waiting events into the channel while it has room.
    pub fn flush(&mut self) {
        while !self.waiting.is_empty() {
            let event = self.waiting.remove(0);
            match self.tx.try_send(event) {
                Ok(()) => {}
                Err(TrySendError::Full(event)) => {
                    self.waiting.insert(0, event);
                    return;
                }
                Err(TrySendError::Closed(_)) => {
                    self.waiting.clear();
                    return;
                }
            }
        }
    }
}

/// Appends `later` (of the same sample) to `into`.
fn merge(into: &mut TokenEvent, later: TokenEvent) {
    into.token_ids.extend(later.token_ids);
    into.text.push_str(&later.text);
    match (&mut into.logprobs, later.logprobs) {
        (Some(a), Some(b)) => a.extend(b),
        (a @ None, Some(b)) => *a = Some(b),
        _ => {}
    }
    if later.finished.is_some() {
        into.finished = later.finished;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{FinishReason, Usage};

    fn token(index: usize, id: u32) -> TokenEvent {
        let mut e = TokenEvent::finish(index, FinishReason::Length);
        e.finished = None;
        e.token_ids = vec![id];
        e.text = format!("<{id}>");
        e
    }

    #[test]
    fn a_slow_reader_gets_every_token_in_order_with_bounded_events() {
        let (tx, mut rx) = request_channel();
        let mut outbox = Outbox::new(tx);
        for id in 0..1000 {
            outbox.send(token(id as usize % 2, id));
        }
        let mut last = TokenEvent::finish(1, FinishReason::Length);
        last.usage = Some(Usage::default());
        outbox.send(last);
        // One merged event per sample plus the last one wait; the channel holds the rest.
        assert_eq!(outbox.waiting.len(), 3);
        assert!(!outbox.is_done());
        let mut got: [Vec<u32>; 2] = [Vec::new(), Vec::new()];
        let mut saw_last = false;
        while !saw_last {
            while let Ok(e) = rx.try_recv() {
                assert!(!saw_last, "an event after the last one");
                got[e.index].extend(&e.token_ids);
                saw_last = e.is_last();
            }
            outbox.flush();
        }
        assert!(outbox.is_done());
        assert_eq!(got[0], (0..1000).step_by(2).collect::<Vec<u32>>());
        assert_eq!(got[1], (1..1000).step_by(2).collect::<Vec<u32>>());
    }

    #[test]
    fn a_closed_reader_drops_what_waits() {
        let (tx, rx) = request_channel();
        let mut outbox = Outbox::new(tx);
        for id in 0..100 {
            outbox.send(token(0, id));
        }
        drop(rx);
        assert!(outbox.is_closed());
        outbox.flush();
        assert!(!outbox.has_waiting());
    }
}

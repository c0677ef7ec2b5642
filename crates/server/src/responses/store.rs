//! Stored responses, for `GET` / `DELETE /v1/responses/{id}`, `input_items` and
//! `previous_response_id`. A bounded in-memory map that evicts the least recently used: at most
//! `--max-stored-responses` entries and `--stored-responses-memory` bytes in all (an entry's
//! bytes are its JSON's length, which is what its strings and values hold), so a few huge
//! entries cannot hold gigabytes while the count is small. Each entry holds its own input items
//! and its response, and names its predecessor, so a conversation's history is the chain of its
//! entries and an entry costs what its own turn costs, not the whole conversation.
//!
//! Background responses ([`super::background`]) take their place when they are admitted and
//! keep it while they run: an unfinished one is never evicted (the least recently used
//! *finished* entries go first), and when unfinished ones hold every place a new one is a 429.
//! Their buffered stream events count toward the bytes while they run and after (a finished
//! background response keeps its events for replay), each response's at most the per-entry
//! limit: past it, or past what the budget leaves, its oldest events are dropped.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use lru::LruCache;
use serde::Serialize;
use serde_json::Value;

use super::background::Run;
use super::wire::ResponseObject;
use crate::error::ApiError;

/// One stored turn.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredResponse {
    pub response: ResponseObject,
    /// This request's input items, as normalized (each with an `id`).
    pub input_items: Vec<Value>,
}

impl StoredResponse {
    /// What the entry holds, in bytes: the length of its JSON.
    pub fn bytes(&self) -> usize {
        json_len(&self.response) + json_len(&self.input_items)
    }
}

/// The length of `value`'s JSON, counted without building it.
pub fn json_len<T: Serialize + ?Sized>(value: &T) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // Serializing a `Value` or a derived struct into a writer that never fails cannot fail.
    let _ = serde_json::to_writer(&mut count, value);
    count.0
}

/// Default of `--stored-responses-memory`.
pub const DEFAULT_STORE_BYTES: usize = 256 << 20;
/// Default of `--max-stored-response-bytes`.
pub const DEFAULT_ENTRY_BYTES: usize = 4 << 20;

/// A finished entry: the stored turn, and a background response's event log (for replay).
#[derive(Debug)]
struct Slot {
    entry: StoredResponse,
    run: Option<Arc<Run>>,
    bytes: usize,
}

/// An unfinished background response: never evicted, and counted with its events' bytes.
#[derive(Debug)]
struct LiveSlot {
    /// Set once submitted.
    run: Option<Arc<Run>>,
    input_items: Vec<Value>,
    bytes: usize,
}

/// The entries and their bytes in all.
#[derive(Debug)]
struct Entries {
    /// Finished entries, least recently used first out.
    map: LruCache<String, Slot>,
    live: HashMap<String, LiveSlot>,
    bytes: usize,
}

impl Entries {
    /// Evicts finished entries, least recently used first, until one more entry of `bytes`
    /// fits the count and the budget; false when it cannot (what is left is unfinished).
    fn make_room(&mut self, capacity: usize, budget: usize, bytes: usize) -> bool {
        while self.map.len() + self.live.len() >= capacity || self.bytes + bytes > budget {
            let Some((_, evicted)) = self.map.pop_lru() else { return false };
            self.bytes -= evicted.bytes;
        }
        true
    }
}

/// What an id names.
#[derive(Debug, Clone)]
pub enum Found {
    /// A finished response, and its event log when it ran in the background.
    Done(Box<StoredResponse>, Option<Arc<Run>>),
    /// A background response still queued or running.
    Live(Arc<Run>),
}

/// See the module docs.
#[derive(Debug)]
pub struct ResponseStore {
    entries: Option<Mutex<Entries>>,
    /// Most entries, finished and unfinished.
    capacity: usize,
    /// Most bytes all entries may hold together.
    budget_bytes: usize,
    /// Most bytes one entry may hold.
    entry_bytes: usize,
}

impl ResponseStore {
    /// A store of at most `capacity` responses (and the default byte limits); 0 stores nothing
    /// (`store: true` is then refused).
    pub fn new(capacity: usize) -> Self {
        Self {
            entries: (capacity > 0)
                .then(|| Mutex::new(Entries { map: LruCache::unbounded(), live: HashMap::new(), bytes: 0 })),
            capacity,
            budget_bytes: DEFAULT_STORE_BYTES,
            entry_bytes: DEFAULT_ENTRY_BYTES,
        }
    }

    /// The store holding at most `budget_bytes` in all and `entry_bytes` per entry (at most
    /// the budget); a budget of 0 stores nothing.
    pub fn with_byte_limits(mut self, budget_bytes: usize, entry_bytes: usize) -> Self {
        if budget_bytes == 0 {
            self.entries = None;
        }
        self.budget_bytes = budget_bytes;
        self.entry_bytes = entry_bytes.min(budget_bytes);
        self
    }

    /// Most bytes one stored response may hold.
    pub fn entry_bytes(&self) -> usize {
        self.entry_bytes
    }

    fn lock(&self) -> Option<std::sync::MutexGuard<'_, Entries>> {
        // A poisoned lock only means another request panicked mid-update of a map entry,
        // which leaves the map itself consistent.
        self.entries.as_ref().map(|m| m.lock().unwrap_or_else(|e| e.into_inner()))
    }

    pub fn enabled(&self) -> bool {
        self.entries.is_some()
    }

    /// Stores `entry`, evicting the least recently used finished entries until the count and
    /// the bytes fit. Returns false, storing nothing, for an entry over the per-entry limit
    /// (the request's own fields were checked before generation, so only a long output gets
    /// here) or when every place is held by an unfinished background response.
    pub fn insert(&self, entry: StoredResponse) -> bool {
        self.insert_slot(entry, None, 0)
    }

    fn insert_slot(&self, entry: StoredResponse, run: Option<Arc<Run>>, log_bytes: usize) -> bool {
        let Some(mut entries) = self.lock() else { return false };
        self.insert_locked(&mut entries, entry, run, log_bytes)
    }

    fn insert_locked(
        &self,
        entries: &mut Entries,
        entry: StoredResponse,
        run: Option<Arc<Run>>,
        log_bytes: usize,
    ) -> bool {
        let bytes = entry.bytes() + log_bytes;
        if bytes > self.entry_bytes {
            return false;
        }
        let id = entry.response.id.clone();
        if let Some(old) = entries.map.pop(&id) {
            entries.bytes -= old.bytes;
        }
        if !entries.make_room(self.capacity, self.budget_bytes, bytes) {
            return false;
        }
        entries.map.push(id, Slot { entry, run, bytes });
        entries.bytes += bytes;
        true
    }

    /// Admits a background response before it is submitted: it takes a place (evicting the
    /// least recently used finished entry if need be) that it keeps until it finishes. A 429
    /// when every place, or the whole budget, is held by unfinished background responses.
    pub fn admit(&self, id: &str, input_items: Vec<Value>) -> Result<(), ApiError> {
        let Some(mut entries) = self.lock() else {
            return Err(ApiError::invalid("store", "this server stores no responses"));
        };
        let bytes = json_len(&input_items);
        if !entries.make_room(self.capacity, self.budget_bytes, bytes) {
            return Err(ApiError::QueueFull(format!(
                "{} unfinished background responses hold the response store (--max-stored-responses {}, \
                 --stored-responses-memory {} bytes)",
                entries.live.len(),
                self.capacity,
                self.budget_bytes
            )));
        }
        entries.bytes += bytes;
        entries.live.insert(id.to_owned(), LiveSlot { run: None, input_items, bytes });
        Ok(())
    }

    /// Attaches the run of an admitted background response, once it is submitted.
    pub fn attach(&self, run: &Arc<Run>) {
        if let Some(slot) = self.lock().as_mut().and_then(|e| e.live.get_mut(run.id())) {
            slot.run = Some(Arc::clone(run));
        }
    }

    /// Accounts `log_bytes` of buffered events to the live response `id`, evicting finished
    /// entries to make room; returns how many bytes its events may take (at most the
    /// per-entry limit, less when unfinished responses hold the rest of the budget): the
    /// response drops its oldest events down to that.
    pub fn account(&self, id: &str, log_bytes: usize) -> usize {
        let Some(mut entries) = self.lock() else { return 0 };
        let entries = &mut *entries;
        let Some(slot) = entries.live.get_mut(id) else { return 0 };
        let input = json_len(&slot.input_items);
        entries.bytes -= slot.bytes;
        let mut want = (input + log_bytes).min(self.entry_bytes);
        while entries.bytes + want > self.budget_bytes {
            let Some((_, evicted)) = entries.map.pop_lru() else { break };
            entries.bytes -= evicted.bytes;
        }
        want = want.min(self.budget_bytes.saturating_sub(entries.bytes));
        slot.bytes = want;
        entries.bytes += want;
        want.saturating_sub(input)
    }

    /// A background response has finished (or was cancelled): it becomes a finished entry
    /// with the input items it was admitted with, and its event log. Returns how many bytes
    /// the log may keep (the response drops its oldest events down to that), or `None` when
    /// the response itself is over the per-entry limit and is not kept.
    pub fn finish(&self, response: ResponseObject, run: Arc<Run>, log_bytes: usize) -> Option<usize> {
        let mut entries = self.lock()?;
        // Under one lock, so that no new admission takes the place it leaves.
        let input_items = match entries.live.remove(&response.id) {
            Some(slot) => {
                entries.bytes -= slot.bytes;
                slot.input_items
            }
            None => Vec::new(),
        };
        let entry = StoredResponse { response, input_items };
        let log_room = self.entry_bytes.checked_sub(entry.bytes())?;
        let log_bytes = log_bytes.min(log_room);
        self.insert_locked(&mut entries, entry, Some(run), log_bytes).then_some(log_bytes)
    }

    /// Takes back the place of a background response that was never submitted.
    pub fn abandon(&self, id: &str) {
        if let Some(mut entries) = self.lock() {
            if let Some(slot) = entries.live.remove(id) {
                entries.bytes -= slot.bytes;
            }
        }
    }

    /// What `id` names, finished (marked as recently used) or running.
    pub fn find(&self, id: &str) -> Option<Found> {
        let mut entries = self.lock()?;
        if let Some(slot) = entries.live.get(id) {
            // Between admission and submission its id is not yet known to any client.
            return slot.run.clone().map(Found::Live);
        }
        entries.map.get(id).map(|slot| Found::Done(Box::new(slot.entry.clone()), slot.run.clone()))
    }

    /// The finished entry of `id` (marked as recently used).
    pub fn get(&self, id: &str) -> Option<StoredResponse> {
        self.lock()?.map.get(id).map(|slot| slot.entry.clone())
    }

    /// The input items of `id`, finished or running.
    pub fn input_items(&self, id: &str) -> Option<Vec<Value>> {
        let mut entries = self.lock()?;
        if let Some(slot) = entries.live.get(id) {
            return Some(slot.input_items.clone());
        }
        entries.map.get(id).map(|slot| slot.entry.input_items.clone())
    }

    /// Removes a finished entry.
    pub fn remove(&self, id: &str) -> Option<StoredResponse> {
        let mut entries = self.lock()?;
        let slot = entries.map.pop(id)?;
        entries.bytes -= slot.bytes;
        Some(slot.entry)
    }

    /// Entries, finished and unfinished.
    pub fn len(&self) -> usize {
        self.lock().map_or(0, |e| e.map.len() + e.live.len())
    }

    /// Bytes the entries hold in all.
    pub fn bytes(&self) -> usize {
        self.lock().map_or(0, |e| e.bytes)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The items of the conversation up to and including response `id`: every turn's input
    /// items followed by its output, oldest first.
    pub fn history(&self, id: &str) -> Result<Vec<Value>, ApiError> {
        let mut turns = Vec::new();
        let mut next = Some(id.to_owned());
        while let Some(current) = next {
            let entry = match self.find(&current) {
                Some(Found::Done(entry, _)) => *entry,
                Some(Found::Live(_)) => {
                    return Err(ApiError::invalid(
                        "previous_response_id",
                        format!("Response '{current}' is still in progress: wait until it finishes (poll GET /v1/responses/{current})."),
                    ))
                }
                None => {
                    return Err(ApiError::ResponseNotFound {
                        message: if current == id {
                            format!("Previous response with id '{id}' not found.")
                        } else {
                            format!(
                                "Response '{current}', an earlier turn of previous response '{id}', is no longer stored."
                            )
                        },
                        param: Some("previous_response_id"),
                    })
                }
            };
            next = entry.response.previous_response_id.clone();
            turns.push(entry);
        }
        Ok(turns.into_iter().rev().flat_map(|t| t.input_items.into_iter().chain(t.response.output)).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat_output::ChoiceSplit;
    use crate::responses::reply::OutputEvents;
    use crate::responses::stream::Responder;
    use serde_json::json;

    fn entry(id: &str, previous: Option<&str>) -> StoredResponse {
        let response: ResponseObject = serde_json::from_value(json!({
            "id": id, "object": "response", "created_at": 0, "status": "completed", "error": null,
            "incomplete_details": null, "instructions": null, "max_output_tokens": null, "model": "m",
            "output": [{"type": "message", "id": format!("out-{id}")}], "parallel_tool_calls": true,
            "previous_response_id": previous, "reasoning": {}, "store": true, "temperature": 1.0,
            "text": {}, "tool_choice": "auto", "tools": [], "top_p": 1.0, "truncation": "disabled",
            "usage": null, "user": null, "metadata": {}
        }))
        .unwrap();
        StoredResponse { response, input_items: vec![json!({"id": format!("in-{id}")})] }
    }

    #[test]
    fn chains_are_walked_oldest_first_and_eviction_is_lru() {
        let store = ResponseStore::new(2);
        store.insert(entry("a", None));
        store.insert(entry("b", Some("a")));
        let ids: Vec<String> =
            store.history("b").unwrap().iter().map(|v| v["id"].as_str().unwrap().to_owned()).collect();
        assert_eq!(ids, ["in-a", "out-a", "in-b", "out-b"]);
        // `a` was used last by the walk, so `b` goes when `c` comes.
        assert!(store.get("a").is_some());
        store.insert(entry("c", Some("b")));
        assert_eq!(store.len(), 2);
        assert!(store.get("b").is_none());
        let err = store.history("c").unwrap_err();
        assert_eq!(err.status(), axum::http::StatusCode::NOT_FOUND);
        assert!(err.to_string().contains("no longer stored"), "{err}");
        assert!(store.remove("a").is_some());
        assert!(store.history("a").is_err());
        let off = ResponseStore::new(0);
        off.insert(entry("x", None));
        assert!(!off.enabled() && off.get("x").is_none());
    }

    #[test]
    fn bytes_are_bounded_in_all_and_per_entry() {
        let size = entry("a", None).bytes();
        let store = ResponseStore::new(100).with_byte_limits(2 * size + size / 2, size);
        for id in ["a", "b", "c"] {
            assert!(store.insert(entry(id, None)));
        }
        // Two fit in the budget: the oldest went, and the count says so.
        assert_eq!((store.len(), store.bytes()), (2, 2 * size));
        assert!(store.get("a").is_none() && store.get("c").is_some());
        let mut big = entry("d", None);
        big.input_items.push(serde_json::json!("x".repeat(size)));
        assert!(!store.insert(big));
        assert!(store.get("d").is_none());
        assert!(store.remove("c").is_some());
        assert_eq!(store.bytes(), size);
        assert!(!ResponseStore::new(8).with_byte_limits(0, 0).enabled());
    }

    fn run(id: &str) -> Arc<Run> {
        let response = entry(id, None).response;
        let responder = Responder::new(response, ChoiceSplit::default(), OutputEvents::default());
        Run::new(id.to_owned(), responder)
    }

    #[test]
    fn unfinished_background_responses_are_never_evicted() {
        let store = ResponseStore::new(2);
        assert!(store.insert(entry("a", None)));
        store.admit("bg1", vec![]).unwrap();
        store.admit("bg2", vec![]).unwrap();
        // The finished entry made room; the unfinished ones stay, and refuse a third.
        assert!(store.get("a").is_none());
        assert_eq!(
            store.admit("bg3", vec![]).unwrap_err().status(),
            axum::http::StatusCode::TOO_MANY_REQUESTS
        );
        assert!(!store.insert(entry("b", None)));
        let bg1 = run("bg1");
        store.attach(&bg1);
        assert!(matches!(store.find("bg1"), Some(Found::Live(_))));
        assert!(store.history("bg1").unwrap_err().to_string().contains("still in progress"));
        // Once finished it is an entry like any other: kept, then the first to go.
        assert_eq!(store.finish(entry("bg1", None).response, bg1, 10), Some(10));
        assert!(matches!(store.find("bg1"), Some(Found::Done(_, Some(_)))));
        store.admit("bg3", vec![]).unwrap();
        assert!(store.find("bg1").is_none());
        store.abandon("bg3");
        assert_eq!(store.len(), 1);
    }

    #[test]
    fn buffered_events_count_toward_the_budget() {
        let size = entry("a", None).bytes();
        let store = ResponseStore::new(10).with_byte_limits(2 * size + size / 2, size);
        assert!(store.insert(entry("a", None)) && store.insert(entry("b", None)));
        store.admit("bg", vec![]).unwrap();
        // More than one entry may hold: capped at the per-entry limit, and the least recently
        // used finished entry went to make room.
        let input = json_len(&Vec::<Value>::new());
        assert_eq!(store.account("bg", 2 * size), size - input);
        assert_eq!(store.bytes(), 2 * size);
        assert!(store.get("a").is_none() && store.get("b").is_some());
        assert_eq!(store.account("bg", 10), 10);
        assert_eq!(store.bytes(), size + input + 10);
    }
}

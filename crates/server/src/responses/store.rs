//! Stored responses, for `GET` / `DELETE /v1/responses/{id}`, `input_items` and
//! `previous_response_id`. A bounded in-memory map that evicts the least recently used: at most
//! `--max-stored-responses` entries and `--stored-responses-memory` bytes in all (an entry's
//! bytes are its JSON's length, which is what its strings and values hold), so a few huge
//! entries cannot hold gigabytes while the count is small. Each entry holds its own input items
//! and its response, and names its predecessor, so a conversation's history is the chain of its
//! entries and an entry costs what its own turn costs, not the whole conversation.

use std::num::NonZeroUsize;
use std::sync::Mutex;

use lru::LruCache;
use serde::Serialize;
use serde_json::Value;

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

/// The entries and their bytes in all.
#[derive(Debug)]
struct Entries {
    map: LruCache<String, (StoredResponse, usize)>,
    bytes: usize,
}

/// See the module docs.
#[derive(Debug)]
pub struct ResponseStore {
    entries: Option<Mutex<Entries>>,
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
            entries: NonZeroUsize::new(capacity)
                .map(|c| Mutex::new(Entries { map: LruCache::new(c), bytes: 0 })),
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

    /// Stores `entry`, evicting the least recently used until the count and the bytes fit.
    /// Returns false, storing nothing, for an entry over the per-entry limit (the request's
    /// own fields were checked before generation, so only a long output gets here).
    pub fn insert(&self, entry: StoredResponse) -> bool {
        let Some(mut entries) = self.lock() else { return false };
        let bytes = entry.bytes();
        if bytes > self.entry_bytes {
            return false;
        }
        let id = entry.response.id.clone();
        if let Some((_, old)) = entries.map.pop(&id) {
            entries.bytes -= old;
        }
        while entries.bytes + bytes > self.budget_bytes {
            let Some((_, (_, evicted))) = entries.map.pop_lru() else { break };
            entries.bytes -= evicted;
        }
        if let Some((_, (_, evicted))) = entries.map.push(id, (entry, bytes)) {
            entries.bytes -= evicted;
        }
        entries.bytes += bytes;
        true
    }

    /// The entry of `id` (marked as recently used).
    pub fn get(&self, id: &str) -> Option<StoredResponse> {
        self.lock()?.map.get(id).map(|(entry, _)| entry.clone())
    }

    pub fn remove(&self, id: &str) -> Option<StoredResponse> {
        let mut entries = self.lock()?;
        let (entry, bytes) = entries.map.pop(id)?;
        entries.bytes -= bytes;
        Some(entry)
    }

    pub fn len(&self) -> usize {
        self.lock().map_or(0, |e| e.map.len())
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
            let entry = self.get(&current).ok_or_else(|| ApiError::ResponseNotFound {
                message: if current == id {
                    format!("Previous response with id '{id}' not found.")
                } else {
                    format!(
                        "Response '{current}', an earlier turn of previous response '{id}', is no longer stored."
                    )
                },
                param: Some("previous_response_id"),
            })?;
            next = entry.response.previous_response_id.clone();
            turns.push(entry);
        }
        Ok(turns.into_iter().rev().flat_map(|t| t.input_items.into_iter().chain(t.response.output)).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
}

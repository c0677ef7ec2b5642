//! Stored responses, for `GET` / `DELETE /v1/responses/{id}`, `input_items` and
//! `previous_response_id`. A bounded in-memory map (`--max-stored-responses` entries) that
//! evicts the least recently used; each entry holds its own input items and its response, and
//! names its predecessor, so a conversation's history is the chain of its entries and an entry
//! costs what its own turn costs, not the whole conversation.

use std::num::NonZeroUsize;
use std::sync::Mutex;

use lru::LruCache;
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

/// See the module docs.
#[derive(Debug)]
pub struct ResponseStore {
    entries: Option<Mutex<LruCache<String, StoredResponse>>>,
}

impl ResponseStore {
    /// A store of at most `capacity` responses; 0 stores nothing (`store: true` is then refused).
    pub fn new(capacity: usize) -> Self {
        Self { entries: NonZeroUsize::new(capacity).map(|c| Mutex::new(LruCache::new(c))) }
    }

    fn lock(&self) -> Option<std::sync::MutexGuard<'_, LruCache<String, StoredResponse>>> {
        // A poisoned lock only means another request panicked mid-update of a map entry,
        // which leaves the map itself consistent.
        self.entries.as_ref().map(|m| m.lock().unwrap_or_else(|e| e.into_inner()))
    }

    pub fn enabled(&self) -> bool {
        self.entries.is_some()
    }

    pub fn insert(&self, entry: StoredResponse) {
        if let Some(mut map) = self.lock() {
            map.put(entry.response.id.clone(), entry);
        }
    }

    /// The entry of `id` (marked as recently used).
    pub fn get(&self, id: &str) -> Option<StoredResponse> {
        self.lock()?.get(id).cloned()
    }

    pub fn remove(&self, id: &str) -> Option<StoredResponse> {
        self.lock()?.pop(id)
    }

    pub fn len(&self) -> usize {
        self.lock().map_or(0, |m| m.len())
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
}

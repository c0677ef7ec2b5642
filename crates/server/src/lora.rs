//! The LoRA adapters this server serves, by name: a request picks one by naming it in `model`,
//! and `/v1/models` lists each with the base model as its `parent`.

use std::path::PathBuf;

use pagoda_engine::LoraId;

/// One served adapter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServedAdapter {
    pub name: String,
    /// The engine's id of its weights.
    pub id: LoraId,
    /// The directory it was loaded from.
    pub path: PathBuf,
}

/// The adapters served, in the order they were loaded.
#[derive(Debug, Clone, Default)]
pub struct ServedAdapters {
    adapters: Vec<ServedAdapter>,
}

impl ServedAdapters {
    pub fn new(loaded: Vec<(String, LoraId, PathBuf)>) -> Self {
        let adapters = loaded.into_iter().map(|(name, id, path)| ServedAdapter { name, id, path }).collect();
        Self { adapters }
    }

    pub fn get(&self, name: &str) -> Option<&ServedAdapter> {
        self.adapters.iter().find(|a| a.name == name)
    }

    pub fn list(&self) -> &[ServedAdapter] {
        &self.adapters
    }
}

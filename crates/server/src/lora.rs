//! The LoRA adapters this server serves, by name: a request picks one by naming it in `model`,
//! `/v1/models` lists each with the base model as its `parent`, and with run-time updates on,
//! `/v1/load_lora_adapter` and `/v1/unload_lora_adapter` change the set while serving. A name
//! appears only once its adapter is loaded, and goes only once the engine has dropped it.
//!
//! A run-time load reads and checks the adapter's files on a blocking thread, confined to
//! `--lora-dirs` (symlinks resolved) and to regular files of bounded size; the engine thread only
//! installs the adapter once it is ready, so a slow or hostile file never stalls generation. A
//! load whose client goes away leaves nothing behind: its read is dropped, or its install undone.
//! Error messages name files by their role, never by path.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use pagoda_engine::{EngineHandle, LoraId};
use pagoda_runtime::{AdapterError, AdapterReader, Confinement, LoraSettings};

use crate::error::ApiError;

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
#[derive(Debug)]
pub struct ServedAdapters {
    adapters: RwLock<Vec<ServedAdapter>>,
    settings: Option<LoraSettings>,
    /// Reads run-time loads; `None` when LoRA is off.
    reader: Option<Arc<AdapterReader>>,
    /// Serializes loads and unloads, so that a name is checked and taken by one at a time; holds
    /// the next id, which no load ever reuses.
    updating: tokio::sync::Mutex<LoraId>,
    /// One adapter read at a time: a read runs to its end even when its client has gone, and the
    /// next load waits for it, so abandoned loads cannot pile up reads.
    reading: Arc<tokio::sync::Semaphore>,
}

/// LoRA off.
impl Default for ServedAdapters {
    fn default() -> Self {
        Self::new(Vec::new(), None, None)
    }
}

impl ServedAdapters {
    /// The start-up adapters (`loaded`, with their ids) under `settings` (`None`: LoRA off), and
    /// what reads run-time loads.
    pub fn new(
        loaded: Vec<(String, LoraId, PathBuf)>,
        settings: Option<LoraSettings>,
        reader: Option<Arc<AdapterReader>>,
    ) -> Self {
        let next_id = loaded.iter().map(|(_, id, _)| *id).max().unwrap_or(0) + 1;
        let adapters = loaded.into_iter().map(|(name, id, path)| ServedAdapter { name, id, path }).collect();
        Self {
            adapters: RwLock::new(adapters),
            settings,
            reader,
            updating: tokio::sync::Mutex::new(next_id),
            reading: Arc::new(tokio::sync::Semaphore::new(1)),
        }
    }

    pub fn get(&self, name: &str) -> Option<ServedAdapter> {
        self.read().iter().find(|a| a.name == name).cloned()
    }

    pub fn list(&self) -> Vec<ServedAdapter> {
        self.read().clone()
    }

    /// `--max-loras`, when LoRA is on.
    pub fn max_loras(&self) -> Option<usize> {
        self.settings.as_ref().map(|s| s.max_loras)
    }

    /// The names of the adapters `ids`, in that order (an id just unloaded has none).
    pub fn names(&self, ids: &[LoraId]) -> Vec<String> {
        let adapters = self.read();
        ids.iter().filter_map(|id| adapters.iter().find(|a| a.id == *id).map(|a| a.name.clone())).collect()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Vec<ServedAdapter>> {
        self.adapters.read().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Vec<ServedAdapter>> {
        self.adapters.write().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The settings, when run-time updates are on.
    fn updatable(&self) -> Result<&LoraSettings, ApiError> {
        match &self.settings {
            Some(s) if s.allow_runtime_updating => Ok(s),
            _ => Err(ApiError::EndpointOff(
                "run-time LoRA updates are off: start the server with --enable-lora \
                 --allow-runtime-lora-updating"
                    .into(),
            )),
        }
    }

    /// Loads the adapter in `path` under `name`; `model_names` are the base model's names,
    /// which no adapter may take. Dropping the future (the client left) leaves no adapter.
    pub async fn load(
        &self,
        engine: &EngineHandle,
        name: &str,
        path: &str,
        model_names: &[String],
    ) -> Result<(), ApiError> {
        let settings = self.updatable()?;
        let mut next_id = self.updating.lock().await;
        if name.is_empty() || model_names.iter().any(|n| n == name) {
            return Err(ApiError::invalid("lora_name", format!("{name:?} cannot name an adapter")));
        }
        if self.get(name).is_some() {
            return Err(ApiError::invalid("lora_name", format!("the adapter {name:?} is already loaded")));
        }
        if self.read().len() >= settings.max_cpu_loras {
            return Err(ApiError::invalid(
                "lora_name",
                format!("{} adapters are loaded, the most --max-cpu-loras allows", settings.max_cpu_loras),
            ));
        }
        let reader = self.reader.clone().ok_or_else(|| ApiError::invalid("lora_path", "LoRA is off"))?;
        let permit = Arc::clone(&self.reading).acquire_owned().await;
        let (roots, max_rank, path) =
            (settings.allowed_dirs.clone(), settings.max_lora_rank, PathBuf::from(path));
        let read = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            let confine = Confinement::new(&roots);
            let dir = confine.resolve(&path, "lora_path")?;
            let adapter = reader.read(&dir, max_rank, &confine)?;
            Ok::<_, AdapterError>((dir, adapter))
        });
        let (dir, adapter) = read
            .await
            .map_err(|_| ApiError::invalid("lora_path", "the adapter could not be read"))?
            .map_err(|e| ApiError::invalid("lora_path", e.to_string()))?;
        let id = *next_id;
        // Taken before the engine sees it: an install cut short never leaves an id to reuse.
        *next_id += 1;
        let mut undo = UninstallOnDrop { engine: Some(engine.clone()), id };
        let installed = engine.install_lora(id, adapter).await;
        undo.engine = None;
        installed.map_err(|message| ApiError::invalid("lora_path", message))?;
        self.write().push(ServedAdapter { name: name.to_owned(), id, path: dir });
        Ok(())
    }

    /// Unloads adapter `name` once no request uses it (else a 400 saying how many do).
    /// `int_id`, vLLM's id, when given must be the adapter's.
    pub async fn unload(
        &self,
        engine: &EngineHandle,
        name: &str,
        int_id: Option<u64>,
    ) -> Result<(), ApiError> {
        self.updatable()?;
        let _updating = self.updating.lock().await;
        let adapter = self.get(name).ok_or_else(|| ApiError::ModelNotFound(name.to_owned()))?;
        if let Some(given) = int_id.filter(|&given| given != adapter.id as u64) {
            return Err(ApiError::invalid(
                "lora_int_id",
                format!("the adapter {name:?} has id {}, not {given}", adapter.id),
            ));
        }
        engine.unload_lora(adapter.id).await.map_err(|message| {
            ApiError::invalid("lora_name", format!("the adapter {name:?} cannot be unloaded now: {message}"))
        })?;
        self.write().retain(|a| a.name != name);
        Ok(())
    }
}

/// Unloads adapter `id` when dropped armed: a load whose future is dropped while the engine
/// installs the adapter takes it out again (the engine runs commands in order).
struct UninstallOnDrop {
    engine: Option<EngineHandle>,
    id: LoraId,
}

impl Drop for UninstallOnDrop {
    fn drop(&mut self) {
        let (Some(engine), Ok(runtime)) = (self.engine.take(), tokio::runtime::Handle::try_current()) else {
            return;
        };
        let id = self.id;
        runtime.spawn(async move {
            let _ = engine.unload_lora(id).await;
        });
    }
}

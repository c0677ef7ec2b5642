//! OpenAI's Batch API (`/v1/files`, `/v1/batches`) under `--batch-dir`: uploaded JSONL files of
//! requests run through the same router online requests use (called in-process, no HTTP
//! loopback), a bounded number at a time and at the lowest priority when the server schedules by
//! priority, their answers written to output and error files. State lives on disk
//! ([`store`]), so a restarted server resumes the batches it had not finished.

pub mod handlers;
pub mod offline;
pub mod runner;
pub mod store;
pub mod wire;

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use axum::routing::{any, get, post};
use axum::Router;

use self::store::{Store, StoreError};
use self::wire::{BatchObject, BatchStatus};
use crate::error::ApiError;
use crate::state::SharedState;

/// The largest accepted upload: OpenAI's own limit for batch input files.
pub const MAX_FILE_BYTES: usize = 200 << 20;
/// The priority of a batch's requests when the server schedules by priority (`lower first`): after
/// every online request that leaves `priority` at its default of 0.
pub const BATCH_PRIORITY: i64 = i32::MAX as i64;

/// The Batch API's shared state: the store, the in-process router the lines run through, and the
/// batches with their cancel flags.
pub struct BatchService {
    store: Store,
    router: Router,
    /// `Some` when the server schedules by priority: the `priority` batch lines get.
    priority: Option<i64>,
    max_in_flight: usize,
    batches: Mutex<HashMap<String, BatchObject>>,
    cancels: Mutex<HashMap<String, Arc<AtomicBool>>>,
}

impl BatchService {
    /// Opens `dir` and resumes every unfinished batch found there. `router`: the API without the
    /// key check (each batch was authorized when it was created).
    pub fn start(
        dir: &Path,
        router: Router,
        priority_scheduling: bool,
        max_in_flight: usize,
    ) -> Result<Arc<Self>, StoreError> {
        let store = Store::open(dir)?;
        let found = store.batches()?;
        let service = Arc::new(Self {
            store,
            router,
            priority: priority_scheduling.then_some(BATCH_PRIORITY),
            max_in_flight: max_in_flight.max(1),
            batches: Mutex::new(found.iter().map(|b| (b.id.clone(), b.clone())).collect()),
            cancels: Mutex::default(),
        });
        for batch in found.into_iter().filter(|b| !b.status.is_final()) {
            tracing::info!(batch = %batch.id, status = ?batch.status, "resuming batch");
            service.spawn(&batch.id);
        }
        Ok(service)
    }

    /// Runs batch `id` in the background.
    fn spawn(self: &Arc<Self>, id: &str) {
        let cancel = Arc::new(AtomicBool::new(false));
        self.cancels.lock().unwrap_or_else(|p| p.into_inner()).insert(id.to_owned(), Arc::clone(&cancel));
        let service = Arc::clone(self);
        let id = id.to_owned();
        tokio::spawn(async move {
            if let Err(e) = runner::run(&service, &id, &cancel).await {
                tracing::error!(batch = %id, "batch failed: {e}");
                let _ = service.update(&id, |b| {
                    b.status = BatchStatus::Failed;
                    b.failed_at = Some(wire::now());
                    b.errors = Some(wire::BatchErrors {
                        object: "list".into(),
                        data: vec![wire::BatchError {
                            code: "server_error".into(),
                            message: e.to_string(),
                            param: None,
                            line: None,
                        }],
                    });
                });
            }
        });
    }

    pub fn batch(&self, id: &str) -> Option<BatchObject> {
        self.batches.lock().unwrap_or_else(|p| p.into_inner()).get(id).cloned()
    }

    /// Changes batch `id` in memory and on disk; returns the new object.
    pub fn update(&self, id: &str, change: impl FnOnce(&mut BatchObject)) -> Result<BatchObject, StoreError> {
        let mut batches = self.batches.lock().unwrap_or_else(|p| p.into_inner());
        let Some(batch) = batches.get_mut(id) else {
            return Err(StoreError::Io {
                path: self.store.batch_path(id),
                source: std::io::Error::from(std::io::ErrorKind::NotFound),
            });
        };
        let mut next = batch.clone();
        change(&mut next);
        self.store.put_batch(&next)?;
        *batch = next.clone();
        Ok(next)
    }

    /// Changes batch `id` in memory only (progress counts: the partial files on disk hold them).
    fn update_in_memory(&self, id: &str, change: impl FnOnce(&mut BatchObject)) {
        if let Some(b) = self.batches.lock().unwrap_or_else(|p| p.into_inner()).get_mut(id) {
            change(b);
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        ApiError::Internal(format!("batch store: {e}"))
    }
}

async fn off() -> ApiError {
    ApiError::EndpointOff("The Files and Batch APIs are off: start the server with --batch-dir DIR.".into())
}

/// The Files and Batch routes; with no service, every one answers 404 saying how to turn them on.
pub fn routes(service: Option<Arc<BatchService>>) -> Router<SharedState> {
    const PATHS: [&str; 6] = [
        "/v1/files",
        "/v1/files/{id}",
        "/v1/files/{id}/content",
        "/v1/batches",
        "/v1/batches/{id}",
        "/v1/batches/{id}/cancel",
    ];
    let Some(service) = service else {
        return PATHS.iter().fold(Router::new(), |r, p| r.route(p, any(off)));
    };
    Router::new()
        .route(PATHS[0], post(handlers::upload).get(handlers::list_files))
        .route(PATHS[1], get(handlers::retrieve_file).delete(handlers::delete_file))
        .route(PATHS[2], get(handlers::file_content))
        .route(PATHS[3], post(handlers::create_batch).get(handlers::list_batches))
        .route(PATHS[4], get(handlers::retrieve_batch))
        .route(PATHS[5], post(handlers::cancel_batch))
        .with_state(service)
}

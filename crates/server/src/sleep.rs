//! Sleep mode over HTTP, as vLLM's: `POST /sleep?level=1|2` (default 1), `POST /wake_up`,
//! `GET /is_sleeping` (`{"is_sleeping": bool}`), served only with `--enable-sleep-mode`
//! (otherwise 404 like any unknown route): one call takes the server out of service, so it is
//! an operator's switch, behind the API key like the other worker controls, never on by default.
//!
//! Going to sleep first stops admitting (new generation and embedding requests get 503 with
//! `retry-after`, in the API's own error shape); the engine lets the requests in flight finish,
//! up to [`DRAIN_TIMEOUT`], then frees its memory ([`pagoda_engine::sleep`]); what still runs
//! at that bound fails with an error event. While
//! asleep `/ready` answers 503 with the reason, `/health` stays 200, and the
//! `engine_sleep_state` gauge holds the level (0 awake).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{Query, Request, State};
use axum::middleware::{from_fn_with_state, Next};
use axum::response::Response;
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use pagoda_engine::{SleepError, SleepLevel};
use serde::Serialize;

use crate::error::ApiError;
use crate::state::SharedState;

/// How long `/sleep` waits for the requests in flight before failing them.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// The routes whose requests run the model: refused while the server sleeps or drains for it.
const GATED: [&str; 9] = [
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/score",
    "/v1/rerank",
    "/rerank",
    "/v2/rerank",
    "/v1/responses",
    "/v1/messages",
];

/// The server's side of sleep mode: one sleep or wake-up at a time, and whether admission is
/// closed for a sleep that is draining.
#[derive(Debug, Default)]
pub struct SleepControl {
    turn: tokio::sync::Mutex<()>,
    draining: AtomicBool,
}

/// `/sleep`, `/wake_up` and `/is_sleeping`.
#[derive(Debug, Clone, Serialize)]
pub struct SleepState {
    pub is_sleeping: bool,
    /// The level slept at; absent while awake.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub level: Option<u8>,
}

fn state_of(state: &SharedState) -> SleepState {
    let level = state.engine.sleep_level();
    SleepState { is_sleeping: level.is_some(), level: level.map(SleepLevel::number) }
}

/// The error new requests get while the server sleeps (or drains for it).
fn asleep_error() -> ApiError {
    ApiError::EngineUnavailable("the server is asleep (sleep mode); retry after it is woken".into())
}

/// Adds the sleep routes to `worker` and the admission gate to the API routers.
pub fn mount(
    state: &SharedState,
    api: Router<SharedState>,
    anthropic: Router<SharedState>,
    worker: Router<SharedState>,
) -> (Router<SharedState>, Router<SharedState>, Router<SharedState>) {
    let control = Arc::new(SleepControl::default());
    let gate = from_fn_with_state((state.clone(), Arc::clone(&control)), refuse_while_asleep);
    let worker = worker
        .route("/sleep", post(sleep))
        .route("/wake_up", post(wake_up))
        .route("/is_sleeping", get(is_sleeping))
        .route_layer(Extension(control));
    (api.route_layer(gate.clone()), anthropic.route_layer(gate), worker)
}

/// 503 with `retry-after` for the model-running routes while asleep or draining.
async fn refuse_while_asleep(
    State((state, control)): State<(SharedState, Arc<SleepControl>)>,
    req: Request,
    next: Next,
) -> Response {
    let closed = control.draining.load(Ordering::SeqCst) || state.engine.sleep_level().is_some();
    if closed && GATED.contains(&req.uri().path()) {
        return crate::layers::reject_unread(req, asleep_error()).await;
    }
    next.run(req).await
}

/// `?level=` as vLLM takes it: 1 or 2, 1 when absent.
fn parse_level(query: &std::collections::HashMap<String, String>) -> Result<SleepLevel, ApiError> {
    let Some(raw) = query.get("level") else { return Ok(SleepLevel::Cache) };
    raw.trim()
        .parse::<u8>()
        .ok()
        .and_then(SleepLevel::from_number)
        .ok_or_else(|| ApiError::invalid("level", format!("level must be 1 or 2, got {raw:?}")))
}

fn sleep_error(e: SleepError) -> ApiError {
    match e {
        SleepError::Unsupported(why) => ApiError::invalid("level", why),
        SleepError::Failed(why) => ApiError::Internal(why),
        SleepError::Engine(e) => e.into(),
    }
}

/// Puts the server to sleep: admission closes, the requests in flight get up to
/// [`DRAIN_TIMEOUT`] to finish, then the engine frees its memory.
pub async fn sleep(
    State(state): State<SharedState>,
    Extension(control): Extension<Arc<SleepControl>>,
    Query(query): Query<std::collections::HashMap<String, String>>,
) -> Result<Json<SleepState>, ApiError> {
    let level = parse_level(&query)?;
    let _turn = control.turn.lock().await;
    if state.engine.sleep_level().is_some() {
        return Ok(Json(state_of(&state)));
    }
    control.draining.store(true, Ordering::SeqCst);
    let slept = state.engine.sleep(level, DRAIN_TIMEOUT).await.map_err(sleep_error);
    control.draining.store(false, Ordering::SeqCst);
    slept?;
    release_freed_memory();
    state.metrics.record_sleep_level(level.number());
    tracing::info!(level = level.number(), "the server went to sleep");
    Ok(Json(state_of(&state)))
}

/// Hands the pages the allocator keeps after a free back to the OS, so that the freed cache
/// and weights leave the process's resident memory (glibc keeps freed heap pages otherwise).
fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks the allocator's own free lists; no pointer is passed.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Wakes the server: the cache allocated again, at level 2 the weights loaded again.
pub async fn wake_up(
    State(state): State<SharedState>,
    Extension(control): Extension<Arc<SleepControl>>,
) -> Result<Json<SleepState>, ApiError> {
    let _turn = control.turn.lock().await;
    let started = Instant::now();
    state.engine.wake_up().await.map_err(sleep_error)?;
    state.metrics.record_sleep_level(0);
    tracing::info!(seconds = started.elapsed().as_secs_f64(), "the server woke up");
    Ok(Json(state_of(&state)))
}

/// `{"is_sleeping": bool}` (and the level while asleep).
pub async fn is_sleeping(State(state): State<SharedState>) -> Json<SleepState> {
    Json(state_of(&state))
}

/// `/ready`'s answer while asleep: the reason, for the operator.
pub fn not_ready(state: &SharedState) -> Option<ApiError> {
    state.engine.sleep_level().map(|level| {
        ApiError::EngineUnavailable(format!("the server is asleep (sleep mode, level {})", level.number()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(pairs: &[(&str, &str)]) -> std::collections::HashMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn level_defaults_to_one_and_takes_only_one_or_two() {
        assert_eq!(parse_level(&query(&[])).unwrap(), SleepLevel::Cache);
        assert_eq!(parse_level(&query(&[("level", "1")])).unwrap(), SleepLevel::Cache);
        assert_eq!(parse_level(&query(&[("level", "2")])).unwrap(), SleepLevel::Weights);
        for bad in ["0", "3", "-1", "", "one", "1.5", "256"] {
            let err = parse_level(&query(&[("level", bad)])).unwrap_err();
            assert_eq!(err.status(), axum::http::StatusCode::BAD_REQUEST, "{bad}");
            assert_eq!(err.param(), Some("level"));
        }
    }

    #[test]
    fn unsupported_sleep_is_the_clients_mistake_a_failed_one_the_servers() {
        let unsupported = sleep_error(SleepError::Unsupported("no".into()));
        assert_eq!(unsupported.status(), axum::http::StatusCode::BAD_REQUEST);
        let failed = sleep_error(SleepError::Failed("oom".into()));
        assert_eq!(failed.status(), axum::http::StatusCode::INTERNAL_SERVER_ERROR);
        let asleep = ApiError::from(pagoda_engine::EngineError::Asleep);
        assert_eq!(asleep.status(), axum::http::StatusCode::SERVICE_UNAVAILABLE);
    }
}

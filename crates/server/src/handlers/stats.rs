//! `GET /stats`: the live dashboard's numbers as JSON ([`crate::live_stats`]): the metrics since
//! start-up, and the plotted points of the last minutes after `?since=` (milliseconds since the
//! Unix epoch), so a page that polls fetches only what is new.

use std::time::SystemTime;

use axum::extract::{RawQuery, State};
use axum::Json;

use crate::error::ApiError;
use crate::live_stats::{self, StatsResponse, HISTORY_LEN, SAMPLE_INTERVAL, WINDOW};
use crate::state::SharedState;

fn since(query: Option<&str>) -> Result<u64, ApiError> {
    let mut since = 0;
    for pair in query.unwrap_or_default().split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        match key {
            "since" => {
                since = value.parse().map_err(|_| {
                    ApiError::invalid(
                        "since",
                        "since must be a whole number of milliseconds since the Unix epoch",
                    )
                })?
            }
            other => return Err(ApiError::invalid(other, format!("Unknown query parameter `{other}`."))),
        }
    }
    Ok(since)
}

/// The dashboard's numbers.
#[utoipa::path(get, path = "/stats", tag = "ops",
    params(("since" = Option<u64>, Query, description = "Only samples taken after this time (ms since the Unix epoch)")),
    responses((status = 200, description = "Totals since start-up and the recent samples (see docs/dashboard.md)"),
              (status = 400, body = crate::openai::ErrorResponse)))]
pub async fn stats(
    State(state): State<SharedState>,
    RawQuery(query): RawQuery,
) -> Result<Json<StatsResponse>, ApiError> {
    let since = since(query.as_deref())?;
    state.refresh_engine_metrics();
    let interval = SAMPLE_INTERVAL.as_secs_f64();
    Ok(Json(StatsResponse {
        model: state.model.served_names[0].clone(),
        now: live_stats::unix_ms(SystemTime::now()),
        interval_s: interval,
        window_s: interval * WINDOW as f64,
        history_s: interval * HISTORY_LEN as f64,
        speculative_decoding: state.engine.config().speculative.is_some(),
        totals: live_stats::totals(&state.metrics.live_totals()),
        samples: state.stats.points_since(since),
    }))
}

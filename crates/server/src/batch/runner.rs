//! Runs one batch: counts its input lines, sends each through the server's own router
//! in-process (a bounded number at a time), appends each answer to the batch's output or error
//! lines, and finally turns those into files. A resumed batch first reads the lines it already
//! answered (their ids carry the line number) and runs only the others.

use std::collections::HashSet;
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use futures_util::StreamExt;
use serde_json::Value;
use tower::ServiceExt;

use super::store::StoreError;
use super::wire::{self, BatchStatus, InputLine, LineError, LineResponse, OutputLine};
use super::BatchService;

/// The largest answer one line may produce (an embeddings answer of many inputs is the biggest).
const MAX_ANSWER_BYTES: usize = 64 << 20;
/// How long a line waits before it asks a busy (429) or unavailable (503) server again.
const BUSY_RETRY: std::time::Duration = std::time::Duration::from_secs(1);

/// The id of line `index` of `batch`: the line number is its last `_`-separated field.
fn line_id(batch: &str, index: usize) -> String {
    format!("batch_req_{}_{index}", batch.trim_start_matches("batch_"))
}

pub(crate) fn line_index(id: &str) -> Option<usize> {
    id.rsplit_once('_')?.1.parse().ok()
}

/// Reads the lines a partial file holds, cutting off a last line a crash left half-written.
fn read_partial(path: &Path) -> Result<Vec<OutputLine>, StoreError> {
    let io = |source| StoreError::Io { path: path.to_owned(), source };
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io(e)),
    };
    let complete = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    if complete < bytes.len() {
        let f = std::fs::OpenOptions::new().write(true).open(path).map_err(io)?;
        f.set_len(complete as u64).map_err(io)?;
    }
    Ok(bytes[..complete]
        .split(|&b| b == b'\n')
        .filter_map(|l| serde_json::from_slice::<OutputLine>(l).ok())
        .collect())
}

fn append(path: &Path, line: &OutputLine) -> Result<(), StoreError> {
    let io = |source| StoreError::Io { path: path.to_owned(), source };
    let mut json =
        serde_json::to_vec(line).map_err(|source| StoreError::Json { path: path.to_owned(), source })?;
    json.push(b'\n');
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path).map_err(io)?;
    f.write_all(&json).map_err(io)
}

fn malformed(id: String, custom_id: Option<String>, code: &str, message: String) -> OutputLine {
    OutputLine { id, custom_id, response: None, error: Some(LineError { code: code.into(), message }) }
}

/// A line checked and ready to send: its `custom_id` and its JSON body.
struct Ready {
    custom_id: String,
    body: String,
}

/// Checks one input line against the batch's endpoint; a malformed line becomes its error line.
fn prepare(service: &BatchService, endpoint: &str, id: &str, raw: &str) -> Result<Ready, Box<OutputLine>> {
    let fail = |custom_id: Option<String>, code: &str, message: String| {
        Box::new(malformed(id.to_owned(), custom_id, code, message))
    };
    let line: InputLine = serde_json::from_str(raw).map_err(|e| {
        let custom_id = serde_json::from_str::<Value>(raw)
            .ok()
            .and_then(|v| v.get("custom_id").and_then(Value::as_str).map(str::to_owned));
        let message = format!("the line is not a batch request ({{custom_id, method, url, body}}): {e}");
        fail(custom_id, "invalid_request", message)
    })?;
    let custom = Some(line.custom_id.clone());
    if line.method != "POST" {
        return Err(fail(custom, "invalid_method", format!("method must be POST, not {:?}", line.method)));
    }
    if line.url != endpoint {
        let message = format!("url {:?} differs from the batch's endpoint {endpoint:?}", line.url);
        return Err(fail(custom, "invalid_url", message));
    }
    let Value::Object(mut body) = line.body else {
        return Err(fail(custom, "invalid_request", "body must be a JSON object".into()));
    };
    if body.get("stream").and_then(Value::as_bool) == Some(true) {
        return Err(fail(custom, "invalid_request", "a batch request cannot stream".into()));
    }
    if let Some(priority) = service.priority {
        body.entry("priority").or_insert(priority.into());
    }
    Ok(Ready { custom_id: line.custom_id, body: Value::Object(body).to_string() })
}

/// Runs one input line through the router: `Ok` lines go to the output file, `Err` ones to the
/// error file; `None` when it was not answered (cancelled while the server was busy).
async fn run_line(
    service: &BatchService,
    cancel: &AtomicBool,
    endpoint: &str,
    id: String,
    raw: &str,
) -> Option<Result<OutputLine, OutputLine>> {
    let ready = match prepare(service, endpoint, &id, raw) {
        Ok(r) => r,
        Err(line) => return Some(Err(*line)),
    };
    let response = loop {
        let request = Request::post(endpoint)
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(ready.body.clone()));
        let request = match request {
            Ok(r) => r,
            Err(e) => return Some(Err(malformed(id, Some(ready.custom_id), "invalid_url", e.to_string()))),
        };
        let Ok(response) = service.router.clone().oneshot(request).await;
        // A full queue, a sleeping or draining server: the line waits (a restart resumes it).
        if !matches!(response.status(), StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE) {
            break response;
        }
        if cancel.load(Ordering::SeqCst) {
            return None;
        }
        tokio::time::sleep(BUSY_RETRY).await;
    };
    let status_code = response.status().as_u16();
    let request_id = response
        .headers()
        .get(crate::layers::X_REQUEST_ID.clone())
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let custom_id = Some(ready.custom_id);
    let body = match axum::body::to_bytes(response.into_body(), MAX_ANSWER_BYTES).await {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into())),
        Err(e) => {
            let message = format!("reading the answer failed: {e}");
            return Some(Err(malformed(id, custom_id, "server_error", message)));
        }
    };
    let out = OutputLine {
        id,
        custom_id,
        response: Some(LineResponse { status_code, request_id, body }),
        error: None,
    };
    Some(if (200..300).contains(&status_code) { Ok(out) } else { Err(out) })
}

/// Runs batch `id` to its end (`completed`, or `cancelled` once `cancel` is set).
pub async fn run(service: &Arc<BatchService>, id: &str, cancel: &Arc<AtomicBool>) -> Result<(), StoreError> {
    let Some(batch) = service.batch(id) else { return Ok(()) };
    if batch.status == BatchStatus::Cancelling {
        cancel.store(true, Ordering::SeqCst);
    }
    let input_path = service.store.file_content_path(&batch.input_file_id);
    let input = match tokio::fs::read_to_string(&input_path).await {
        Ok(text) => text,
        Err(e) => {
            service.update(id, |b| {
                b.status = BatchStatus::Failed;
                b.failed_at = Some(wire::now());
                b.errors = Some(wire::BatchErrors {
                    object: "list".into(),
                    data: vec![wire::BatchError {
                        code: "invalid_file".into(),
                        message: format!("the input file {} cannot be read: {e}", batch.input_file_id),
                        param: Some("input_file_id".into()),
                        line: None,
                    }],
                });
            })?;
            return Ok(());
        }
    };
    let lines: Vec<(usize, &str)> = input.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()).collect();
    let output_path = service.store.partial_path(id, "output");
    let errors_path = service.store.partial_path(id, "errors");
    let (done_ok, done_err) = (read_partial(&output_path)?, read_partial(&errors_path)?);
    let done: HashSet<usize> = done_ok.iter().chain(&done_err).filter_map(|l| line_index(&l.id)).collect();
    let now = wire::now();
    service.update(id, |b| {
        if b.status == BatchStatus::Validating {
            b.status = BatchStatus::InProgress;
            b.in_progress_at = Some(now);
        }
        b.request_counts = wire::RequestCounts {
            total: lines.len() as u64,
            completed: done_ok.len() as u64,
            failed: done_err.len() as u64,
        };
    })?;
    let todo: Vec<(usize, String)> =
        lines.into_iter().filter(|(i, _)| !done.contains(i)).map(|(i, l)| (i, l.to_owned())).collect();
    let mut answers = futures_util::stream::iter(todo)
        .map(|(index, raw)| {
            let (service, cancel) = (Arc::clone(service), Arc::clone(cancel));
            let (endpoint, line_id) = (batch.endpoint.clone(), line_id(id, index));
            async move {
                // Checked as the line would start: a cancel stops every line not yet started.
                if cancel.load(Ordering::SeqCst) {
                    return None;
                }
                run_line(&service, &cancel, &endpoint, line_id, &raw).await
            }
        })
        .buffer_unordered(service.max_in_flight);
    while let Some(answer) = answers.next().await {
        match answer {
            Some(Ok(line)) => {
                append(&output_path, &line)?;
                service.update_in_memory(id, |b| b.request_counts.completed += 1);
            }
            Some(Err(line)) => {
                append(&errors_path, &line)?;
                service.update_in_memory(id, |b| b.request_counts.failed += 1);
            }
            None => {}
        }
    }
    finalize(service, id, cancel.load(Ordering::SeqCst))
}

/// Turns the partial lines into the batch's output and error files and ends the batch.
fn finalize(service: &BatchService, id: &str, cancelled: bool) -> Result<(), StoreError> {
    service.update(id, |b| {
        if b.status != BatchStatus::Cancelling {
            b.status = BatchStatus::Finalizing;
            b.finalizing_at = Some(wire::now());
        }
    })?;
    let mut file_ids = [None, None];
    for (slot, kind) in file_ids.iter_mut().zip(["output", "errors"]) {
        let path = service.store.partial_path(id, kind);
        if std::fs::metadata(&path).is_ok_and(|m| m.len() > 0) {
            let file = service.store.adopt_file(&path, &format!("{id}_{kind}.jsonl"), "batch_output")?;
            *slot = Some(file.id);
        }
    }
    let [output, errors] = file_ids;
    let now = wire::now();
    service.update(id, |b| {
        b.output_file_id = output.or(b.output_file_id.take());
        b.error_file_id = errors.or(b.error_file_id.take());
        if cancelled || b.status == BatchStatus::Cancelling {
            b.status = BatchStatus::Cancelled;
            b.cancelled_at = Some(now);
        } else {
            b.status = BatchStatus::Completed;
            b.completed_at = Some(now);
        }
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_ids_carry_their_line_number() {
        assert_eq!(line_index(&line_id("batch_abc", 17)), Some(17));
        assert_eq!(line_index("batch_req_abc"), None);
    }

    #[test]
    fn a_half_written_last_line_is_cut_off() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.jsonl");
        let line = OutputLine {
            id: line_id("batch_a", 0),
            custom_id: Some("c".into()),
            response: None,
            error: None,
        };
        append(&path, &line).unwrap();
        let mut f = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(b"{\"id\":\"batch_req_a_1\",").unwrap();
        assert_eq!(read_partial(&path).unwrap(), vec![line]);
        assert!(std::fs::read(&path).unwrap().ends_with(b"}\n"));
    }
}

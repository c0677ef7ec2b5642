//! `pagoda run-batch -i in.jsonl -o out.jsonl [serve flags]`, as vLLM's `run_batch`: a batch
//! file answered by the same engine and Batch API as `pagoda serve`, without a client. The
//! server is built as for serving (on a free port of 127.0.0.1, its Batch API under a scratch
//! directory); the input goes through its own `/v1/files` and `/v1/batches` routes in-process,
//! one batch per endpoint the lines name (so a file may mix chat, completions and embeddings),
//! and the answers are written in input order, errors beside the answers as vLLM writes them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use axum::Router;
use serde_json::{json, Value};
use tower::ServiceExt;

use super::wire::{OutputLine, ENDPOINTS};

/// How often the batches' progress is read.
const POLL: Duration = Duration::from_millis(200);

#[derive(Debug, thiserror::Error)]
pub enum OfflineError {
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("cannot write {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
    #[error("{0} holds no request lines")]
    Empty(PathBuf),
    #[error("{route} answered {status}: {body}")]
    Api { route: String, status: StatusCode, body: String },
    #[error("batch {id} ended {status}: {errors}")]
    Failed { id: String, status: String, errors: String },
}

/// The lines of `input` grouped by the endpoint they name (`url`), each keeping its index in the
/// file; lines naming no known endpoint (or not JSON) go with the first endpoint's group, whose
/// batch then answers them with their error line.
fn group_by_endpoint(input: &str) -> BTreeMap<&'static str, Vec<(usize, &str)>> {
    let mut groups: BTreeMap<&'static str, Vec<(usize, &str)>> = BTreeMap::new();
    for (index, line) in input.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let url = serde_json::from_str::<Value>(line).ok().and_then(|v| v["url"].as_str().map(str::to_owned));
        let endpoint =
            ENDPOINTS.iter().find(|e| url.as_deref() == Some(**e)).copied().unwrap_or(ENDPOINTS[0]);
        groups.entry(endpoint).or_default().push((index, line));
    }
    groups
}

/// Sends one in-process request through the server's router; the body of a 200.
async fn send(
    router: &Router,
    api_key: Option<&str>,
    mut request: Request<Body>,
) -> Result<String, OfflineError> {
    let route = format!("{} {}", request.method(), request.uri());
    if let Some(key) = api_key {
        let value = format!("Bearer {key}").parse().expect("an API key is a valid header value");
        request.headers_mut().insert(header::AUTHORIZATION, value);
    }
    let response = router.clone().oneshot(request).await.unwrap_or_else(|never| match never {});
    let status = response.status();
    let body = match axum::body::to_bytes(response.into_body(), usize::MAX).await {
        Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
        Err(e) => e.to_string(),
    };
    if status != StatusCode::OK {
        return Err(OfflineError::Api { route, status, body });
    }
    Ok(body)
}

/// [`send`], the answer parsed as JSON.
async fn call(router: &Router, api_key: Option<&str>, request: Request<Body>) -> Result<Value, OfflineError> {
    let route = format!("{} {}", request.method(), request.uri());
    let body = send(router, api_key, request).await?;
    serde_json::from_str(&body).map_err(|e| OfflineError::Api {
        route,
        status: StatusCode::OK,
        body: format!("{e}: {body}"),
    })
}

fn get(uri: &str) -> Request<Body> {
    Request::get(uri).body(Body::empty()).expect("a valid request")
}

/// Uploads `lines` and starts their batch against `endpoint`; returns the batch's id.
async fn start_batch(
    router: &Router,
    api_key: Option<&str>,
    endpoint: &str,
    lines: &[(usize, &str)],
) -> Result<String, OfflineError> {
    let boundary = format!("pagoda-run-batch-{}", uuid::Uuid::new_v4().simple());
    let mut body = format!(
        "--{boundary}\r\ncontent-disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n--{boundary}\r\n\
         content-disposition: form-data; name=\"file\"; filename=\"input.jsonl\"\r\n\
         content-type: application/jsonl\r\n\r\n"
    );
    for (_, line) in lines {
        body.push_str(line);
        body.push('\n');
    }
    body.push_str(&format!("\r\n--{boundary}--\r\n"));
    let upload = Request::post("/v1/files")
        .header(header::CONTENT_TYPE, format!("multipart/form-data; boundary={boundary}"))
        .body(Body::from(body))
        .expect("a valid request");
    let file = call(router, api_key, upload).await?;
    let create = json!({"input_file_id": file["id"], "endpoint": endpoint, "completion_window": "24h"});
    let request = Request::post("/v1/batches")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(create.to_string()))
        .expect("a valid request");
    let batch = call(router, api_key, request).await?;
    Ok(batch["id"].as_str().unwrap_or_default().to_owned())
}

/// Waits for batch `id` to end; its output and error lines, each with its index in the batch's
/// input.
async fn finish_batch(
    router: &Router,
    api_key: Option<&str>,
    id: &str,
) -> Result<Vec<(usize, OutputLine)>, OfflineError> {
    let uri = format!("/v1/batches/{id}");
    let batch = loop {
        let batch = call(router, api_key, get(&uri)).await?;
        match batch["status"].as_str().unwrap_or_default() {
            "completed" => break batch,
            status @ ("failed" | "cancelled" | "expired") => {
                return Err(OfflineError::Failed {
                    id: id.to_owned(),
                    status: status.to_owned(),
                    errors: batch["errors"].to_string(),
                })
            }
            _ => tokio::time::sleep(POLL).await,
        }
    };
    let mut lines = Vec::new();
    for file in ["output_file_id", "error_file_id"] {
        if let Some(file_id) = batch[file].as_str() {
            let text = send(router, api_key, get(&format!("/v1/files/{file_id}/content"))).await?;
            for line in text.lines().filter_map(|l| serde_json::from_str::<OutputLine>(l).ok()) {
                if let Some(index) = super::runner::line_index(&line.id) {
                    lines.push((index, line));
                }
            }
        }
    }
    Ok(lines)
}

/// Answers every line of `input` through `router` (the server's API) and writes the answers to
/// `output` in input order. Returns how many lines were answered with an error.
pub async fn run(
    router: &Router,
    api_key: Option<&str>,
    input: &Path,
    output: &Path,
) -> Result<usize, OfflineError> {
    let text = std::fs::read_to_string(input)
        .map_err(|source| OfflineError::Read { path: input.to_owned(), source })?;
    let groups = group_by_endpoint(&text);
    if groups.is_empty() {
        return Err(OfflineError::Empty(input.to_owned()));
    }
    let mut started = Vec::new();
    for (endpoint, lines) in &groups {
        let id = start_batch(router, api_key, endpoint, lines).await?;
        tracing::info!(batch = %id, endpoint, lines = lines.len(), "running");
        started.push((id, lines));
    }
    let mut answers: Vec<(usize, OutputLine)> = Vec::new();
    for (id, lines) in started {
        // The batch's n-th line is the group's n-th, whose index in the file is kept.
        for (n, line) in finish_batch(router, api_key, &id).await? {
            if let Some((index, _)) = lines.get(n) {
                answers.push((*index, line));
            }
        }
    }
    answers.sort_by_key(|(index, _)| *index);
    let failed = answers
        .iter()
        .filter(|(_, l)| l.error.is_some() || l.response.as_ref().is_some_and(|r| r.status_code != 200))
        .count();
    let mut out = String::new();
    for (_, line) in &answers {
        out.push_str(&serde_json::to_string(line).expect("an output line serializes"));
        out.push('\n');
    }
    std::fs::write(output, out).map_err(|source| OfflineError::Write { path: output.to_owned(), source })?;
    Ok(failed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_grouped_by_endpoint_keeping_their_index() {
        let input = [
            r#"{"custom_id":"a","url":"/v1/embeddings"}"#,
            r#"{"custom_id":"b","url":"/v1/chat/completions"}"#,
            "",
            "not json",
            r#"{"custom_id":"c","url":"/v1/embeddings"}"#,
            r#"{"custom_id":"d","url":"/v2/unknown"}"#,
        ]
        .join("\n");
        let groups = group_by_endpoint(&input);
        let indices = |e: &str| groups[e].iter().map(|(i, _)| *i).collect::<Vec<_>>();
        assert_eq!(indices("/v1/embeddings"), [0, 4]);
        assert_eq!(indices("/v1/chat/completions"), [1, 3, 5]);
        assert!(!groups.contains_key("/v1/completions"));
    }
}

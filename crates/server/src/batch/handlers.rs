//! The Files and Batch endpoints: upload, retrieve, download and delete a file; create, retrieve,
//! list and cancel a batch. Bad input is a 4xx in OpenAI's error shape; a missing id is a 404.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::StreamExt;
use serde_json::{json, Value};

use super::store::new_id;
use super::wire::{self, BatchObject, BatchStatus, CreateBatch, FileObject, ListObject, RequestCounts};
use super::{BatchService, MAX_FILE_BYTES};
use crate::error::ApiError;
use crate::extract::PathParam;

/// The most lines an input file may hold (OpenAI's limit).
pub const MAX_LINES: usize = 50_000;
/// Room for the multipart framing and the `purpose` field around the file itself.
const FRAMING_BYTES: usize = 64 << 10;

/// Reads a body of at most `limit` bytes; a longer one is a 413.
async fn read_limited(body: Body, limit: usize) -> Result<Vec<u8>, ApiError> {
    let mut out = Vec::new();
    let mut stream = body.into_data_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| ApiError::invalid("file", format!("reading the body failed: {e}")))?;
        if out.len() + chunk.len() > limit {
            return Err(ApiError::PayloadTooLarge { limit });
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// A multipart error as the API answers it: a part or the whole body over its limit is a 413,
/// anything else malformed a 400 naming `file`.
fn multipart_error(e: multer::Error) -> ApiError {
    match e {
        multer::Error::StreamSizeExceeded { .. } | multer::Error::FieldSizeExceeded { .. } => {
            ApiError::PayloadTooLarge { limit: MAX_FILE_BYTES }
        }
        other => ApiError::invalid("file", format!("malformed multipart/form-data body: {other}")),
    }
}

fn not_found(kind: &str, id: &str) -> ApiError {
    ApiError::ResponseNotFound { message: format!("No {kind} found with id '{id}'."), param: Some("id") }
}

/// `POST /v1/files`: a multipart upload of `purpose` (`batch`) and `file` (JSONL).
pub async fn upload(
    State(service): State<Arc<BatchService>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<FileObject>, ApiError> {
    let content_type = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or_default();
    let boundary = multer::parse_boundary(content_type)
        .map_err(|_| ApiError::invalid("file", "expected a multipart/form-data body with a boundary"))?;
    let limits = multer::SizeLimit::new()
        .whole_stream((MAX_FILE_BYTES + FRAMING_BYTES) as u64)
        .per_field(MAX_FILE_BYTES as u64);
    let mut form = multer::Multipart::with_constraints(
        body.into_data_stream(),
        boundary,
        multer::Constraints::new().size_limit(limits),
    );
    let (mut purpose, mut file) = (None, None);
    while let Some(field) = form.next_field().await.map_err(multipart_error)? {
        match field.name().map(str::to_owned).as_deref() {
            Some("purpose") => purpose = Some(field.text().await.map_err(multipart_error)?),
            Some("file") => {
                let filename = field.file_name().map(str::to_owned);
                file = Some((filename, field.bytes().await.map_err(multipart_error)?));
            }
            Some(other) => {
                return Err(ApiError::invalid(
                    other,
                    format!("unknown field {other:?}: a batch file upload takes purpose and file"),
                ))
            }
            None => return Err(ApiError::invalid("file", "a multipart part has no name")),
        }
    }
    match purpose.as_deref() {
        Some("batch") => {}
        None => return Err(ApiError::invalid("purpose", "purpose is required (\"batch\")")),
        Some(other) => {
            return Err(ApiError::invalid(
                "purpose",
                format!(
                "this server stores files for the Batch API only: purpose must be \"batch\", not {other:?}"
            ),
            ))
        }
    }
    let (filename, data) = file.ok_or_else(|| ApiError::invalid("file", "file is required"))?;
    let text =
        std::str::from_utf8(&data).map_err(|_| ApiError::invalid("file", "the file is not UTF-8 text"))?;
    let lines = text.lines().filter(|l| !l.trim().is_empty()).count();
    if lines == 0 {
        return Err(ApiError::invalid("file", "the file holds no JSONL lines"));
    }
    if lines > MAX_LINES {
        return Err(ApiError::invalid(
            "file",
            format!("the file holds {lines} lines; at most {MAX_LINES} are allowed"),
        ));
    }
    let filename = filename.unwrap_or_else(|| "upload.jsonl".into());
    Ok(Json(service.store.create_file(&filename, "batch", &data)?))
}

pub async fn list_files(
    State(service): State<Arc<BatchService>>,
) -> Result<Json<ListObject<FileObject>>, ApiError> {
    Ok(Json(ListObject::new(service.store.files()?, |f| &f.id)))
}

pub async fn retrieve_file(
    State(service): State<Arc<BatchService>>,
    PathParam(id): PathParam,
) -> Result<Json<FileObject>, ApiError> {
    service.store.file(&id)?.map(Json).ok_or_else(|| not_found("file", &id))
}

pub async fn file_content(
    State(service): State<Arc<BatchService>>,
    PathParam(id): PathParam,
) -> Result<Response, ApiError> {
    if service.store.file(&id)?.is_none() {
        return Err(not_found("file", &id));
    }
    let path = service.store.file_content_path(&id);
    let bytes =
        tokio::fs::read(&path).await.map_err(|e| ApiError::Internal(format!("{}: {e}", path.display())))?;
    Ok(([(header::CONTENT_TYPE, "application/jsonl")], bytes).into_response())
}

pub async fn delete_file(
    State(service): State<Arc<BatchService>>,
    PathParam(id): PathParam,
) -> Result<Json<Value>, ApiError> {
    let in_use = service
        .batches
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .values()
        .any(|b| !b.status.is_final() && b.input_file_id == id);
    if in_use {
        return Err(ApiError::Conflict(format!("file '{id}' is the input of a batch still running")));
    }
    if !service.store.delete_file(&id)? {
        return Err(not_found("file", &id));
    }
    Ok(Json(json!({"id": id, "object": "file", "deleted": true})))
}

/// `POST /v1/batches`.
pub async fn create_batch(
    State(service): State<Arc<BatchService>>,
    body: Body,
) -> Result<Json<BatchObject>, ApiError> {
    let bytes = read_limited(body, FRAMING_BYTES).await?;
    let req: CreateBatch = serde_json::from_slice(&bytes).map_err(|e| {
        if e.is_syntax() || e.is_eof() {
            ApiError::MalformedJson(e.to_string())
        } else {
            ApiError::InvalidParam(crate::error::InvalidParam { param: None, message: e.to_string() })
        }
    })?;
    if !wire::ENDPOINTS.contains(&req.endpoint.as_str()) {
        return Err(ApiError::invalid(
            "endpoint",
            format!("endpoint must be one of {}, not {:?}", wire::ENDPOINTS.join(", "), req.endpoint),
        ));
    }
    if req.completion_window != "24h" {
        return Err(ApiError::invalid("completion_window", "completion_window must be \"24h\""));
    }
    match service.store.file(&req.input_file_id)? {
        Some(f) if f.purpose == "batch" => {}
        Some(_) => {
            return Err(ApiError::invalid("input_file_id", "the input file's purpose is not \"batch\""))
        }
        None => {
            return Err(ApiError::invalid(
                "input_file_id",
                format!("no file found with id '{}'", req.input_file_id),
            ))
        }
    }
    let created_at = wire::now();
    let batch = BatchObject {
        id: new_id("batch_"),
        object: "batch".into(),
        endpoint: req.endpoint,
        errors: None,
        input_file_id: req.input_file_id,
        completion_window: req.completion_window,
        status: BatchStatus::Validating,
        output_file_id: None,
        error_file_id: None,
        created_at,
        in_progress_at: None,
        expires_at: Some(created_at + 24 * 3600),
        finalizing_at: None,
        completed_at: None,
        failed_at: None,
        expired_at: None,
        cancelling_at: None,
        cancelled_at: None,
        request_counts: RequestCounts::default(),
        metadata: req.metadata,
    };
    service.store.put_batch(&batch)?;
    service.batches.lock().unwrap_or_else(|p| p.into_inner()).insert(batch.id.clone(), batch.clone());
    service.spawn(&batch.id);
    Ok(Json(batch))
}

pub async fn retrieve_batch(
    State(service): State<Arc<BatchService>>,
    PathParam(id): PathParam,
) -> Result<Json<BatchObject>, ApiError> {
    service.batch(&id).map(Json).ok_or_else(|| not_found("batch", &id))
}

/// `GET /v1/batches`: newest first.
pub async fn list_batches(State(service): State<Arc<BatchService>>) -> Json<ListObject<BatchObject>> {
    let mut all: Vec<BatchObject> =
        service.batches.lock().unwrap_or_else(|p| p.into_inner()).values().cloned().collect();
    all.sort_by(|a, b| b.created_at.cmp(&a.created_at).then_with(|| a.id.cmp(&b.id)));
    Json(ListObject::new(all, |b| &b.id))
}

/// `POST /v1/batches/{id}/cancel`: no new line starts; those in flight finish and the batch ends
/// `cancelled` with the answers it has.
pub async fn cancel_batch(
    State(service): State<Arc<BatchService>>,
    PathParam(id): PathParam,
) -> Result<Json<BatchObject>, ApiError> {
    let batch = service.batch(&id).ok_or_else(|| not_found("batch", &id))?;
    if batch.status.is_final() || batch.status == BatchStatus::Cancelling {
        return Ok(Json(batch));
    }
    let batch = service.update(&id, |b| {
        b.status = BatchStatus::Cancelling;
        b.cancelling_at = Some(wire::now());
    })?;
    if let Some(flag) = service.cancels.lock().unwrap_or_else(|p| p.into_inner()).get(&id) {
        flag.store(true, Ordering::SeqCst);
    }
    Ok(Json(batch))
}

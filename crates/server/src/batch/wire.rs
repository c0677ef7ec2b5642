//! The Batch API's JSON shapes as OpenAI defines them: the File object, the Batch object (also
//! what a batch's state file on disk holds), an input line, and the output and error file lines.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The endpoints a batch may target.
pub const ENDPOINTS: [&str; 3] = ["/v1/chat/completions", "/v1/completions", "/v1/embeddings"];

/// OpenAI's File object (`purpose` is `batch` for uploads, `batch_output` for results).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FileObject {
    pub id: String,
    pub object: String,
    pub bytes: u64,
    pub created_at: u64,
    pub filename: String,
    pub purpose: String,
    pub status: String,
}

/// A batch's lifecycle, in OpenAI's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BatchStatus {
    Validating,
    InProgress,
    Finalizing,
    Completed,
    Failed,
    Cancelling,
    Cancelled,
}

impl BatchStatus {
    /// A batch in this state has nothing left to run.
    pub fn is_final(self) -> bool {
        matches!(self, BatchStatus::Completed | BatchStatus::Failed | BatchStatus::Cancelled)
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct RequestCounts {
    pub total: u64,
    pub completed: u64,
    pub failed: u64,
}

/// One entry of a failed batch's `errors.data`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BatchError {
    pub code: String,
    pub message: String,
    pub param: Option<String>,
    pub line: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BatchErrors {
    pub object: String,
    pub data: Vec<BatchError>,
}

/// OpenAI's Batch object.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BatchObject {
    pub id: String,
    pub object: String,
    pub endpoint: String,
    pub errors: Option<BatchErrors>,
    pub input_file_id: String,
    pub completion_window: String,
    pub status: BatchStatus,
    pub output_file_id: Option<String>,
    pub error_file_id: Option<String>,
    pub created_at: u64,
    pub in_progress_at: Option<u64>,
    pub expires_at: Option<u64>,
    pub finalizing_at: Option<u64>,
    pub completed_at: Option<u64>,
    pub failed_at: Option<u64>,
    pub expired_at: Option<u64>,
    pub cancelling_at: Option<u64>,
    pub cancelled_at: Option<u64>,
    pub request_counts: RequestCounts,
    pub metadata: Option<Value>,
}

/// `POST /v1/batches`'s body.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateBatch {
    pub input_file_id: String,
    pub endpoint: String,
    pub completion_window: String,
    #[serde(default)]
    pub metadata: Option<Value>,
}

/// One line of an input file.
#[derive(Debug, Clone, Deserialize)]
pub struct InputLine {
    pub custom_id: String,
    pub method: String,
    pub url: String,
    pub body: Value,
}

/// `response` of an output (or error) line: what the endpoint answered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LineResponse {
    pub status_code: u16,
    pub request_id: String,
    pub body: Value,
}

/// `error` of a line that never reached an endpoint (it was malformed).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LineError {
    pub code: String,
    pub message: String,
}

/// One line of an output or error file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutputLine {
    pub id: String,
    pub custom_id: Option<String>,
    pub response: Option<LineResponse>,
    pub error: Option<LineError>,
}

/// A list answer (`GET /v1/batches`, `GET /v1/files`).
#[derive(Debug, Clone, Serialize)]
pub struct ListObject<T> {
    pub object: &'static str,
    pub data: Vec<T>,
    pub first_id: Option<String>,
    pub last_id: Option<String>,
    pub has_more: bool,
}

impl<T> ListObject<T> {
    pub fn new(data: Vec<T>, id: impl Fn(&T) -> &str) -> Self {
        let first_id = data.first().map(|t| id(t).to_owned());
        let last_id = data.last().map(|t| id(t).to_owned());
        Self { object: "list", data, first_id, last_id, has_more: false }
    }
}

/// Seconds since the Unix epoch.
pub fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

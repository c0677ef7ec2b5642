//! `POST /v1/responses` wire types. Input items, tools and formats stay JSON values here and are
//! read item by item in [`super::request`], so that each wrong item is refused with a sentence
//! naming it (a built-in tool, an image, an output without its call).

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

/// A Responses request. Unknown top-level fields are refused (see [`crate::openai::fields`]).
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
pub struct ResponsesRequest {
    /// The served model name; may be omitted when the server serves one model.
    #[serde(default, deserialize_with = "crate::openai::common::optional_string")]
    pub model: Option<String>,
    /// A string (one user message) or a list of items: `message` (roles user, assistant,
    /// system, developer; `input_text` / `output_text` parts), `function_call`,
    /// `function_call_output` and `reasoning`.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub input: Option<Value>,
    /// A system message put first; not carried over by `previous_response_id`.
    #[serde(default, deserialize_with = "crate::openai::common::optional_string")]
    pub instructions: Option<String>,
    /// Absent: whatever the context allows.
    #[serde(default)]
    pub max_output_tokens: Option<u32>,
    /// [0, 2]. Default 1.
    #[serde(default)]
    pub temperature: Option<f32>,
    /// (0, 1]. Default 1.
    #[serde(default)]
    pub top_p: Option<f32>,
    #[serde(default)]
    pub stream: Option<bool>,
    /// Up to 16 string pairs, stored and returned with the response.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Value>,
    /// Accepted and returned.
    #[serde(default, deserialize_with = "crate::openai::common::optional_string")]
    pub user: Option<String>,
    /// `function` tools: `{"type": "function", "name", "description", "parameters", "strict"}`.
    #[serde(default)]
    #[schema(value_type = Option<Vec<Object>>)]
    pub tools: Option<Value>,
    /// `auto`, `required`, `none` or `{"type": "function", "name"}`.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub tool_choice: Option<Value>,
    /// Default true.
    #[serde(default)]
    pub parallel_tool_calls: Option<bool>,
    /// `{"format": {"type": "text" | "json_object" | "json_schema", ...}}`.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub text: Option<Value>,
    /// `{"effort": ...}`: a reasoning model thinks unless the effort is `none` (needs the
    /// server's `--reasoning-parser`).
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub reasoning: Option<Value>,
    /// Keep the response for retrieval and `previous_response_id`. Default true.
    #[serde(default)]
    pub store: Option<bool>,
    /// Run the response in the background: the request is answered at once (status `queued`),
    /// the generation goes on whatever happens to the connection, and the response is polled
    /// with `GET /v1/responses/{id}`, its events replayed with `?stream=true&starting_after=N`,
    /// and cancelled with `POST /v1/responses/{id}/cancel`. Needs `store` (the default).
    #[serde(default)]
    pub background: Option<bool>,
    /// Continue the conversation of a stored response.
    #[serde(default, deserialize_with = "crate::openai::common::optional_string")]
    pub previous_response_id: Option<String>,
    /// Extra output: `reasoning.encrypted_content` (the reasoning text, for clients that keep
    /// no server state).
    #[serde(default)]
    pub include: Option<Vec<String>>,
    /// `disabled` (default: too long a conversation is a 400) or `auto` (the oldest items are
    /// dropped until it fits).
    #[serde(default, deserialize_with = "crate::openai::common::optional_string")]
    pub truncation: Option<String>,
}

/// `{"object": "list", "data": [...]}` of a response's input items.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct InputItemList {
    /// Always `list`.
    pub object: String,
    #[schema(value_type = Vec<Object>)]
    pub data: Vec<Value>,
    pub first_id: Option<String>,
    pub last_id: Option<String>,
    pub has_more: bool,
}

/// The answer to a deletion.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct DeletedResponse {
    pub id: String,
    /// Always `response`.
    pub object: String,
    pub deleted: bool,
}

/// The `response` object. Output items are `message`, `function_call` and `reasoning`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ResponseObject {
    /// `resp_...`.
    pub id: String,
    /// Always `response`.
    pub object: String,
    pub created_at: u64,
    /// `queued` (a background response not yet started), `in_progress`, `completed`,
    /// `incomplete`, `failed` or `cancelled` (a cancelled background response).
    pub status: String,
    /// Whether it runs (or ran) in the background.
    #[serde(default)]
    pub background: bool,
    #[schema(value_type = Option<Object>)]
    pub error: Option<Value>,
    /// `{"reason": "max_output_tokens"}` when incomplete.
    #[schema(value_type = Option<Object>)]
    pub incomplete_details: Option<Value>,
    pub instructions: Option<String>,
    pub max_output_tokens: Option<u32>,
    pub model: String,
    #[schema(value_type = Vec<Object>)]
    pub output: Vec<Value>,
    pub parallel_tool_calls: bool,
    pub previous_response_id: Option<String>,
    #[schema(value_type = Object)]
    pub reasoning: Value,
    pub store: bool,
    pub temperature: f32,
    #[schema(value_type = Object)]
    pub text: Value,
    #[schema(value_type = Object)]
    pub tool_choice: Value,
    #[schema(value_type = Vec<Object>)]
    pub tools: Vec<Value>,
    pub top_p: f32,
    pub truncation: String,
    pub usage: Option<ResponseUsage>,
    pub user: Option<String>,
    #[schema(value_type = Object)]
    pub metadata: Value,
}

/// Token counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ResponseUsage {
    pub input_tokens: usize,
    pub input_tokens_details: InputTokensDetails,
    pub output_tokens: usize,
    pub output_tokens_details: OutputTokensDetails,
    pub total_tokens: usize,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct InputTokensDetails {
    /// Prompt tokens read from the prefix cache.
    pub cached_tokens: usize,
    /// Prompt tokens written to a cache on request; the prefix cache here fills itself, so 0.
    pub cache_write_tokens: usize,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct OutputTokensDetails {
    /// Tokens of the reasoning text.
    pub reasoning_tokens: usize,
}

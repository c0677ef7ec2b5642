//! `POST /v1/messages` and `POST /v1/messages/count_tokens` wire types. Content blocks, tools and
//! the tool choice stay JSON values here and are read block by block in [`super::request`], so
//! that each wrong block is refused with a sentence naming it (an `image` block, a `tool_result`
//! without its call) rather than serde's list of variants.

use serde::de::{Deserializer, Error as _};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

/// A string that must be present as a string (`null` and numbers are refused).
fn string<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    match Value::deserialize(d)? {
        Value::String(s) => Ok(s),
        other => Err(D::Error::custom(format!("must be a string, got {other}"))),
    }
}

/// A Messages request. Unknown top-level fields are refused (see [`crate::openai::fields`]).
#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct MessagesRequest {
    /// The served model name.
    #[serde(deserialize_with = "string")]
    pub model: String,
    /// The most tokens to generate.
    pub max_tokens: u32,
    /// Alternating `user` and `assistant` turns; content is a string or a list of `text`,
    /// `tool_use`, `tool_result`, `thinking` and `redacted_thinking` blocks. A last `assistant`
    /// turn is continued.
    #[schema(value_type = Vec<Object>)]
    pub messages: Vec<Value>,
    /// A string or a list of `text` blocks.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub system: Option<Value>,
    #[serde(default)]
    pub stop_sequences: Option<Vec<String>>,
    /// [0, 1]. Default 1.
    #[serde(default)]
    pub temperature: Option<f32>,
    /// (0, 1].
    #[serde(default)]
    pub top_p: Option<f32>,
    /// Only sample from the `top_k` most likely tokens.
    #[serde(default)]
    pub top_k: Option<u32>,
    #[serde(default)]
    pub stream: Option<bool>,
    /// `{"user_id": ...}`; kept for nothing but accepted.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Value>,
    /// `[{"name", "description", "input_schema"}]`.
    #[serde(default)]
    #[schema(value_type = Option<Vec<Object>>)]
    pub tools: Option<Value>,
    /// `{"type": "auto" | "any" | "tool" | "none", "name", "disable_parallel_tool_use"}`.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub tool_choice: Option<Value>,
    /// `{"type": "enabled", "budget_tokens": N}` (needs the server's `--reasoning-parser`; the
    /// reasoning is closed once N tokens are spent),
    /// `{"type": "adaptive"}` (the template's default) or `{"type": "disabled"}`; `display:
    /// "omitted"` returns thinking blocks without their text.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub thinking: Option<Value>,
    /// `auto` or `standard_only`: this server has one tier, so both are the same.
    #[serde(default)]
    pub service_tier: Option<String>,
    /// `{"effort": "low" | "medium" | "high", "format": {"type": "json_schema", "schema"}}`:
    /// the effort as the template's `reasoning_effort` (other than `high`, the default, it needs
    /// `--reasoning-parser`), the format as a grammar the answer must match.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub output_config: Option<Value>,
    /// `{"edits": [{"type": "clear_thinking_20251015"}]}`: earlier turns' thinking is always
    /// left out of the prompt here, so that edit is what the server does anyway; others are
    /// refused.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub context_management: Option<Value>,
}

/// A `count_tokens` request: a Messages request without the generation settings.
#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct CountTokensRequest {
    #[serde(deserialize_with = "string")]
    pub model: String,
    #[schema(value_type = Vec<Object>)]
    pub messages: Vec<Value>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub system: Option<Value>,
    #[serde(default)]
    #[schema(value_type = Option<Vec<Object>>)]
    pub tools: Option<Value>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub tool_choice: Option<Value>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub thinking: Option<Value>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub output_config: Option<Value>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub context_management: Option<Value>,
}

/// `{"input_tokens": N}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CountTokensResponse {
    pub input_tokens: usize,
}

/// One block of the answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ResponseBlock {
    Text {
        text: String,
    },
    /// The model's reasoning. `signature` is a digest of the text, which the server does not
    /// check when the block comes back in history.
    Thinking {
        thinking: String,
        signature: String,
    },
    ToolUse {
        /// `toolu_...`.
        id: String,
        name: String,
        /// The arguments, a JSON object.
        #[schema(value_type = Object)]
        input: Value,
    },
}

/// Token counts. `input_tokens` excludes the prompt tokens read from the prefix cache, which
/// `cache_read_input_tokens` counts (Anthropic's convention).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct MessagesUsage {
    pub input_tokens: usize,
    pub output_tokens: usize,
    pub cache_creation_input_tokens: usize,
    pub cache_read_input_tokens: usize,
}

impl MessagesUsage {
    pub fn new(prompt_tokens: usize, cached_tokens: usize, output_tokens: usize) -> Self {
        let cached = cached_tokens.min(prompt_tokens);
        Self {
            input_tokens: prompt_tokens - cached,
            output_tokens,
            cache_creation_input_tokens: 0,
            cache_read_input_tokens: cached,
        }
    }
}

/// The answer: `type: "message"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct MessagesResponse {
    /// `msg_...`.
    pub id: String,
    /// Always `message`.
    pub r#type: String,
    /// Always `assistant`.
    pub role: String,
    pub model: String,
    pub content: Vec<ResponseBlock>,
    /// `end_turn`, `max_tokens`, `stop_sequence` or `tool_use`.
    pub stop_reason: Option<String>,
    /// The stop sequence that ended the answer.
    pub stop_sequence: Option<String>,
    pub usage: MessagesUsage,
}

/// Anthropic's error body: `{"type": "error", "error": {"type", "message"}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct AnthropicErrorResponse {
    /// Always `error`.
    pub r#type: String,
    pub error: AnthropicErrorDetail,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct AnthropicErrorDetail {
    /// `invalid_request_error`, `authentication_error`, `not_found_error`, `request_too_large`,
    /// `rate_limit_error`, `api_error` or `overloaded_error`.
    pub r#type: String,
    pub message: String,
}

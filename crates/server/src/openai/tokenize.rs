//! `POST /tokenize` and `POST /detokenize` wire types (vLLM's shapes).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::chat::ChatMessage;

/// Either `prompt` (raw text) or `messages` (rendered with the chat template first).
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
pub struct TokenizeRequest {
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub prompt: Option<String>,
    #[serde(default)]
    pub messages: Option<Vec<ChatMessage>>,
    /// With `messages`: end the rendered prompt with the assistant turn's opening. Default true.
    #[serde(default)]
    pub add_generation_prompt: Option<bool>,
    /// Add the tokenizer's special tokens (e.g. BOS). Default: true for `prompt`, false for
    /// `messages` (the template already has them).
    #[serde(default)]
    pub add_special_tokens: Option<bool>,
    /// With `messages`: continue the last (assistant) message, as in chat completions.
    #[serde(default)]
    pub continue_final_message: Option<bool>,
    /// With `messages`: extra variables for the chat template.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub chat_template_kwargs: Option<serde_json::Map<String, serde_json::Value>>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TokenizeResponse {
    pub count: usize,
    pub max_model_len: usize,
    pub tokens: Vec<u32>,
}

#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
pub struct DetokenizeRequest {
    #[serde(default)]
    pub model: Option<String>,
    pub tokens: Vec<u32>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct DetokenizeResponse {
    pub prompt: String,
}

//! `GET /v1/models`, `GET /version` and `GET /health` wire types.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// `GET /v1/models`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ModelList {
    /// Always `list`.
    pub object: String,
    pub data: Vec<ModelCard>,
}

/// One served model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ModelCard {
    pub id: String,
    /// Always `model`.
    pub object: String,
    pub created: u64,
    pub owned_by: String,
    /// What `--model` pointed at (an adapter's: its directory).
    pub root: String,
    /// A LoRA adapter's base model; null for the model itself.
    pub parent: Option<String>,
    /// Longest prompt plus completion, in tokens.
    pub max_model_len: usize,
    /// The model's architecture, as its weights name it (`llama`, `qwen2`, `gemma3`, ...).
    pub architecture: String,
    /// Positions the model was trained for; `max_model_len` is what this server allows.
    pub context_length: usize,
}

/// `GET /version`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct VersionResponse {
    pub version: String,
}

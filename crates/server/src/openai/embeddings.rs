//! `POST /v1/embeddings` wire types (OpenAI's shape).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::completions::Prompt;

#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
pub struct EmbeddingRequest {
    #[serde(default)]
    pub model: Option<String>,
    /// A string, an array of strings, an array of token ids, or an array of arrays of token
    /// ids; one embedding each. Text is cut to the model's input limit (its
    /// `max_seq_length`, as sentence-transformers cuts it); token ids beyond it are a 400.
    #[schema(value_type = Object)]
    pub input: Prompt,
    /// `float` (the default) or `base64` (little-endian float32 values).
    #[serde(default)]
    pub encoding_format: Option<String>,
    /// Fewer dimensions (Matryoshka truncation, then normalization), for models trained for it.
    #[serde(default)]
    pub dimensions: Option<usize>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct EmbeddingResponse {
    pub object: String,
    pub data: Vec<EmbeddingData>,
    pub model: String,
    pub usage: EmbeddingUsage,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct EmbeddingData {
    pub object: String,
    pub index: usize,
    pub embedding: EmbeddingValues,
}

/// The values as numbers, or as base64 of their little-endian float32 bytes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum EmbeddingValues {
    Float(Vec<f32>),
    Base64(String),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct EmbeddingUsage {
    pub prompt_tokens: usize,
    pub total_tokens: usize,
}

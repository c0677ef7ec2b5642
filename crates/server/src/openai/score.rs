//! `POST /v1/score` (vLLM's) and `POST /v1/rerank`, `/rerank`, `/v2/rerank` (the Jina and Cohere
//! shape) wire types.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// One text or several.
#[derive(Debug, Clone, PartialEq, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum TextOrTexts {
    One(String),
    Many(Vec<String>),
}

impl TextOrTexts {
    pub fn into_vec(self) -> Vec<String> {
        match self {
            TextOrTexts::One(text) => vec![text],
            TextOrTexts::Many(texts) => texts,
        }
    }
}

/// Pairs to score: `text_1` against each `text_2` (one to many), or pair by pair (two lists of
/// the same length).
#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct ScoreRequest {
    #[serde(default)]
    pub model: Option<String>,
    #[schema(value_type = Object)]
    pub text_1: TextOrTexts,
    #[schema(value_type = Object)]
    pub text_2: TextOrTexts,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ScoreResponse {
    pub id: String,
    pub object: String,
    pub created: u64,
    pub model: String,
    pub data: Vec<ScoreData>,
    pub usage: ScoreUsage,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ScoreData {
    pub index: usize,
    pub object: String,
    pub score: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ScoreUsage {
    pub prompt_tokens: usize,
    pub total_tokens: usize,
}

/// The documents ranked by their relevance to the query.
#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct RerankRequest {
    #[serde(default)]
    pub model: Option<String>,
    pub query: String,
    pub documents: Vec<String>,
    /// Keep only the best this many (all when absent or 0).
    #[serde(default)]
    pub top_n: Option<usize>,
    /// Include each document's text in its result. Default true.
    #[serde(default)]
    pub return_documents: Option<bool>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RerankResponse {
    pub id: String,
    pub model: String,
    pub usage: RerankUsage,
    /// Most relevant first.
    pub results: Vec<RerankResult>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RerankResult {
    /// The document's position in the request.
    pub index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub document: Option<RerankDocument>,
    pub relevance_score: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RerankDocument {
    pub text: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RerankUsage {
    pub total_tokens: usize,
}

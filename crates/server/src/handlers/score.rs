//! `POST /v1/score` and `POST /v1/rerank` (also `/rerank`, `/v2/rerank`): relevance of text
//! pairs. An embedding model scores a pair by the cosine similarity of its texts' embeddings
//! (each distinct text of a call embedded once); a cross-encoder reads each pair whole and
//! scores it with its classifier head. Either way a call is one submission (one admission
//! group).

use std::collections::HashMap;
use std::time::Instant;

use axum::extract::State;
use axum::{Extension, Json};

use super::response_id;
use crate::embeddings::{embed, tokenize, tokenize_pairs, EmbeddingModel, PoolInput};
use crate::error::ApiError;
use crate::extract::JsonBody;
use crate::layers::Arrival;
use crate::openai::{
    unix_now, ErrorResponse, PromptInput, RerankDocument, RerankRequest, RerankResponse, RerankResult,
    RerankUsage, ScoreData, ScoreRequest, ScoreResponse, ScoreUsage,
};
use crate::state::{AppState, SharedState};

/// The embeddings of `texts` (each embedded once however often it appears) and the tokens
/// embedded.
async fn embed_texts(
    state: &AppState,
    texts: &[&str],
    param: &'static str,
    arrival: Instant,
) -> Result<(Vec<Vec<f32>>, usize), ApiError> {
    let mut distinct: Vec<&str> = Vec::new();
    let mut seen: HashMap<&str, usize> = HashMap::new();
    let slots: Vec<usize> = texts
        .iter()
        .map(|&t| {
            *seen.entry(t).or_insert_with(|| {
                distinct.push(t);
                distinct.len() - 1
            })
        })
        .collect();
    let inputs = distinct.iter().map(|t| PromptInput::Text((*t).to_owned())).collect();
    let ids = tokenize(state, inputs, state.limits.max_model_len, param).await?;
    let tokens = slots.iter().map(|&i| ids[i].len()).sum();
    let vectors = embed(state, ids.into_iter().map(PoolInput::single).collect(), arrival, param).await?;
    Ok((slots.into_iter().map(|i| vectors[i].clone()).collect(), tokens))
}

/// The relevance score of each `(first, second)` pair and the tokens read: a cross-encoder's
/// score of the pair, or the cosine similarity of the two texts' embeddings.
async fn pair_scores(
    state: &AppState,
    scorer: EmbeddingModel,
    pairs: &[(&str, &str)],
    param: &'static str,
    arrival: Instant,
) -> Result<(Vec<f64>, usize), ApiError> {
    if scorer.pooling.cross_encoder {
        let owned = pairs.iter().map(|&(a, b)| (a.to_owned(), b.to_owned())).collect();
        let inputs = tokenize_pairs(state, owned, state.limits.max_model_len, param).await?;
        let tokens = inputs.iter().map(|input| input.ids.len()).sum();
        let scores = embed(state, inputs, arrival, param).await?;
        return Ok((scores.iter().map(|s| f64::from(s[0])).collect(), tokens));
    }
    let texts: Vec<&str> = pairs.iter().map(|p| p.0).chain(pairs.iter().map(|p| p.1)).collect();
    let (vectors, tokens) = embed_texts(state, &texts, param, arrival).await?;
    let n = pairs.len();
    Ok(((0..n).map(|i| cosine(&vectors[i], &vectors[n + i])).collect(), tokens))
}

/// The cosine similarity of two embeddings (0 when either is all zeros).
pub fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(&x, &y)| f64::from(x) * f64::from(y)).sum();
    let norm = |v: &[f32]| v.iter().map(|&x| f64::from(x) * f64::from(x)).sum::<f64>().sqrt();
    let denominator = norm(a) * norm(b);
    if denominator == 0.0 {
        0.0
    } else {
        dot / denominator
    }
}

/// vLLM's score API: one score per pair.
#[utoipa::path(post, path = "/v1/score", tag = "vllm", request_body = ScoreRequest,
    responses((status = 200, body = ScoreResponse), (status = 400, body = ErrorResponse),
              (status = 404, body = ErrorResponse), (status = 429, body = ErrorResponse)),
    security((), ("api_key" = [])))]
pub async fn score(
    State(state): State<SharedState>,
    arrival: Option<Extension<Arrival>>,
    JsonBody(req): JsonBody<ScoreRequest>,
) -> Result<Json<ScoreResponse>, ApiError> {
    let arrival = arrival.map_or_else(Instant::now, |a| a.0 .0);
    let model = state.resolve_base_model(req.model.as_deref())?;
    let scorer = EmbeddingModel::served(&state, &model, "scores")?;
    let (left, right) = (req.text_1.into_vec(), req.text_2.into_vec());
    if left.is_empty() || right.is_empty() {
        let param = if left.is_empty() { "text_1" } else { "text_2" };
        return Err(ApiError::invalid(param, format!("{param} must not be empty")));
    }
    if left.len() != 1 && left.len() != right.len() {
        return Err(ApiError::invalid(
            "text_2",
            format!(
                "text_1 has {} texts and text_2 {}: give one text_1 for many text_2, or as many of each",
                left.len(),
                right.len()
            ),
        ));
    }
    let pairs: Vec<(&str, &str)> = (0..right.len())
        .map(|i| (left[if left.len() == 1 { 0 } else { i }].as_str(), right[i].as_str()))
        .collect();
    let (scores, tokens) = pair_scores(&state, scorer, &pairs, "text_1", arrival).await?;
    let data = scores
        .into_iter()
        .enumerate()
        .map(|(index, score)| ScoreData { index, object: "score".into(), score })
        .collect();
    Ok(Json(ScoreResponse {
        id: response_id("score"),
        object: "list".into(),
        created: unix_now(),
        model,
        data,
        usage: ScoreUsage { prompt_tokens: tokens, total_tokens: tokens },
    }))
}

/// The Jina/Cohere rerank API: the documents sorted by relevance to the query.
#[utoipa::path(post, path = "/v1/rerank", tag = "vllm", request_body = RerankRequest,
    responses((status = 200, body = RerankResponse), (status = 400, body = ErrorResponse),
              (status = 404, body = ErrorResponse), (status = 429, body = ErrorResponse)),
    security((), ("api_key" = [])))]
pub async fn rerank(
    State(state): State<SharedState>,
    arrival: Option<Extension<Arrival>>,
    JsonBody(req): JsonBody<RerankRequest>,
) -> Result<Json<RerankResponse>, ApiError> {
    let arrival = arrival.map_or_else(Instant::now, |a| a.0 .0);
    let model = state.resolve_base_model(req.model.as_deref())?;
    let scorer = EmbeddingModel::served(&state, &model, "scores")?;
    if req.documents.is_empty() {
        return Err(ApiError::invalid("documents", "documents must not be empty"));
    }
    let pairs: Vec<(&str, &str)> = req.documents.iter().map(|d| (req.query.as_str(), d.as_str())).collect();
    let (scores, tokens) = pair_scores(&state, scorer, &pairs, "documents", arrival).await?;
    let mut results: Vec<RerankResult> = req
        .documents
        .iter()
        .zip(scores)
        .enumerate()
        .map(|(index, (text, relevance_score))| RerankResult {
            index,
            document: (req.return_documents != Some(false)).then(|| RerankDocument { text: text.clone() }),
            relevance_score,
        })
        .collect();
    // Most relevant first; equal scores keep the documents' order.
    results.sort_by(|a, b| b.relevance_score.total_cmp(&a.relevance_score));
    if let Some(n) = req.top_n.filter(|&n| n > 0) {
        results.truncate(n);
    }
    Ok(Json(RerankResponse {
        id: response_id("rerank"),
        model,
        usage: RerankUsage { total_tokens: tokens },
        results,
    }))
}

#[cfg(test)]
mod tests {
    use super::cosine;

    #[test]
    fn cosine_of_vectors() {
        assert!((cosine(&[1.0, 0.0], &[1.0, 0.0]) - 1.0).abs() < 1e-12);
        assert!(cosine(&[1.0, 0.0], &[0.0, 2.0]).abs() < 1e-12);
        assert!((cosine(&[1.0, 1.0], &[-2.0, -2.0]) + 1.0).abs() < 1e-12);
        assert_eq!(cosine(&[0.0, 0.0], &[1.0, 0.0]), 0.0);
    }
}

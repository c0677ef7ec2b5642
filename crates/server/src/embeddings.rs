//! The embedding path: inputs tokenized (text cut to the model's input limit), one pooling
//! request per input submitted to the engine as one admission group (the same scheduler,
//! admission, 429s and metrics as generation), their pooled vectors collected in input order
//! and shaped for the wire (`dimensions`, `encoding_format`). A cross-encoder's inputs are text
//! pairs, each pooled into its one score.

use std::time::Instant;

use base64::Engine as _;
use futures_util::future::try_join_all;
use pagoda_engine::{EngineError, FinishReason, Request, RequestStream};
use pagoda_runtime::Pooling;

use crate::error::ApiError;
use crate::openai::{EmbeddingValues, PromptInput};
use crate::state::AppState;
use crate::submit::failure;
use crate::tracker::RequestTracker;

/// What the server knows of the embedding model it serves.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EmbeddingModel {
    /// Length of its embeddings.
    pub dimensions: usize,
    pub pooling: Pooling,
}

impl EmbeddingModel {
    /// The embedding model `state` serves, or a 400 naming `model` (`what` the request asked
    /// of it) for a model that only generates.
    pub fn served(state: &AppState, model: &str, what: &str) -> Result<Self, ApiError> {
        state.embedding.ok_or_else(|| {
            ApiError::invalid(
                "model",
                format!(
                    "{model} generates text and serves no embeddings, so no {what}; serve an embedding \
                     model, or start the server with --pooling last (or mean) to embed with this one"
                ),
            )
        })
    }

    /// The embedding model `state` serves, for `/v1/embeddings`: a cross-encoder scores pairs
    /// and embeds nothing, so it is a 400 naming `model` as a generating model is.
    pub fn embedder(state: &AppState, model: &str) -> Result<Self, ApiError> {
        let served = Self::served(state, model, "embeddings")?;
        if served.pooling.cross_encoder {
            return Err(ApiError::invalid(
                "model",
                format!(
                    "{model} is a cross-encoder: it scores text pairs (/v1/score, /v1/rerank) and \
                     gives no embeddings"
                ),
            ));
        }
        Ok(served)
    }

    /// The length `dimensions` asks the embeddings to be cut to, if any: only a model trained
    /// for it may be cut; asking a plain model for its own length changes nothing.
    pub fn cut(&self, dimensions: Option<usize>) -> Result<Option<usize>, ApiError> {
        let Some(wanted) = dimensions.filter(|&d| d != self.dimensions) else { return Ok(None) };
        if !self.pooling.matryoshka {
            return Err(ApiError::invalid(
                "dimensions",
                format!(
                    "this model was not trained for Matryoshka truncation; its embeddings have {} dimensions",
                    self.dimensions
                ),
            ));
        }
        if wanted == 0 || wanted > self.dimensions {
            return Err(ApiError::invalid(
                "dimensions",
                format!("dimensions must be between 1 and {}", self.dimensions),
            ));
        }
        Ok(Some(wanted))
    }

    /// The embedding cut to `dimensions` (then normalized again, when the model normalizes),
    /// as [`Self::cut`] allows.
    pub fn shape(&self, mut values: Vec<f32>, dimensions: Option<usize>) -> Result<Vec<f32>, ApiError> {
        let Some(wanted) = self.cut(dimensions)? else { return Ok(values) };
        values.truncate(wanted);
        if self.pooling.normalize {
            pagoda_runtime::normalize(&mut values);
        }
        Ok(values)
    }
}

/// The wire form of one embedding.
pub fn encode_values(values: Vec<f32>, base64: bool) -> EmbeddingValues {
    if !base64 {
        return EmbeddingValues::Float(values);
    }
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    EmbeddingValues::Base64(base64::engine::general_purpose::STANDARD.encode(bytes))
}

/// One input to pool: its token ids and, for a text pair, where the second text starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolInput {
    pub ids: Vec<u32>,
    pub second_segment: Option<usize>,
}

impl PoolInput {
    pub fn single(ids: Vec<u32>) -> Self {
        Self { ids, second_segment: None }
    }
}

/// Token ids of each text pair with the tokenizer's pair template, cut to `max_len` tokens
/// longest text first (see `Tokenizer::encode_pair_truncated`). Errors name `param`.
pub async fn tokenize_pairs(
    state: &AppState,
    pairs: Vec<(String, String)>,
    max_len: usize,
    param: &'static str,
) -> Result<Vec<PoolInput>, ApiError> {
    let tokenizer = state.prompts.tokenizer().clone();
    state
        .prompts
        .blocking(move || {
            pairs
                .iter()
                .map(|(first, second)| {
                    let (ids, second_segment) = tokenizer
                        .encode_pair_truncated(first, second, max_len)
                        .map_err(|e| ApiError::invalid(param, e.to_string()))?;
                    Ok(PoolInput { ids, second_segment })
                })
                .collect()
        })
        .await?
}

/// Token ids of each input: text cut to `max_len` tokens (special tokens included; only a prefix
/// of a long text is tokenized, see `Tokenizer::encode_truncated_bounded`), token ids
/// checked against the vocabulary and taken as they are. Errors name `param`.
pub async fn tokenize(
    state: &AppState,
    inputs: Vec<PromptInput>,
    max_len: usize,
    param: &'static str,
) -> Result<Vec<Vec<u32>>, ApiError> {
    if inputs.is_empty() {
        return Err(ApiError::invalid(param, format!("{param} must not be empty")));
    }
    let vocab_size = state.prompts.vocab_size();
    let tokenizer = state.prompts.tokenizer().clone();
    state
        .prompts
        .blocking(move || {
            inputs
                .into_iter()
                .map(|input| match input {
                    PromptInput::Text(text) => tokenizer
                        .encode_truncated_bounded(&text, max_len)
                        .map(|(ids, _)| ids)
                        .map_err(|e| ApiError::invalid(param, e.to_string())),
                    PromptInput::Tokens(ids) if ids.is_empty() => {
                        Err(ApiError::invalid(param, "an input must contain at least one token"))
                    }
                    PromptInput::Tokens(ids) => match ids.iter().find(|&&t| t as usize >= vocab_size) {
                        Some(bad) => Err(ApiError::invalid(
                            param,
                            format!("token id {bad} is outside the vocabulary (size {vocab_size})"),
                        )),
                        None => Ok(ids),
                    },
                })
                .collect()
        })
        .await?
}

/// Pools every input (an embedding each, or a cross-encoder's score); the vectors come back
/// in input order. A failed input fails the call
/// (dropping the other streams aborts their requests). Too many inputs is a 400 naming `param`.
pub async fn embed(
    state: &AppState,
    inputs: Vec<PoolInput>,
    arrival: Instant,
    param: &'static str,
) -> Result<Vec<Vec<f32>>, ApiError> {
    let group = state.engine.next_request_id();
    let lengths: Vec<usize> = inputs.iter().map(|input| input.ids.len()).collect();
    let requests: Vec<Request> = inputs
        .into_iter()
        .map(|PoolInput { ids, second_segment }| {
            let id = state.engine.next_request_id();
            let request = match second_segment {
                Some(start) => Request::pooling_pair(id, ids, start),
                None => Request::pooling(id, ids),
            };
            request.with_group(group).with_arrival(arrival)
        })
        .collect();
    let streams = state.engine.submit_all(requests).map_err(|e| match e {
        // One input, one sequence: the inputs, not `n`, are too many.
        e @ EngineError::NeverFits { .. } => ApiError::invalid(param, e.to_string()),
        e => e.into(),
    })?;
    let pending = streams.into_iter().zip(lengths).map(|(stream, len)| {
        let tracker = RequestTracker::new(state.metrics.clone(), arrival, len, 1);
        pooled(state, stream, tracker)
    });
    try_join_all(pending).await
}

/// The embedding one pooling request's stream ends with.
async fn pooled(
    state: &AppState,
    mut stream: RequestStream,
    mut tracker: RequestTracker,
) -> Result<Vec<f32>, ApiError> {
    let mut pooled = None;
    while let Some(event) = stream.recv().await {
        tracker.observe(&event);
        if let Some(reason) = &event.finished {
            if let Some(err) = failure(state, reason) {
                return Err(err);
            }
            if *reason == FinishReason::Abort {
                return Err(ApiError::ShuttingDown);
            }
        }
        pooled = pooled.or(event.pooled);
    }
    pooled.ok_or_else(|| {
        ApiError::Internal("the engine ended an embedding request without its embedding".into())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use pagoda_runtime::PoolingKind;

    fn model(matryoshka: bool) -> EmbeddingModel {
        let pooling = Pooling {
            kind: PoolingKind::Mean,
            normalize: true,
            max_input_tokens: None,
            matryoshka,
            cross_encoder: false,
        };
        EmbeddingModel { dimensions: 4, pooling }
    }

    #[test]
    fn dimensions_truncate_and_renormalize_only_where_the_model_allows() {
        let v = vec![0.5, 0.5, 0.5, 0.5];
        assert_eq!(model(false).shape(v.clone(), None).unwrap(), v);
        assert_eq!(model(false).shape(v.clone(), Some(4)).unwrap(), v);
        let refused = model(false).shape(v.clone(), Some(2)).unwrap_err().to_string();
        assert!(refused.contains("Matryoshka"), "{refused}");
        let cut = model(true).shape(v.clone(), Some(2)).unwrap();
        assert!((cut[0] - std::f32::consts::FRAC_1_SQRT_2).abs() < 1e-6 && cut.len() == 2);
        assert!(model(true).shape(v.clone(), Some(0)).is_err());
        assert!(model(true).shape(v, Some(5)).is_err());
    }

    #[test]
    fn base64_is_the_little_endian_float32_bytes() {
        let EmbeddingValues::Base64(text) = encode_values(vec![1.0, -2.5], true) else { panic!("base64") };
        let bytes = base64::engine::general_purpose::STANDARD.decode(text).unwrap();
        assert_eq!(bytes, [1.0f32.to_le_bytes(), (-2.5f32).to_le_bytes()].concat());
        assert_eq!(encode_values(vec![1.0], false), EmbeddingValues::Float(vec![1.0]));
    }
}

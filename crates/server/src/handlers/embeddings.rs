//! `POST /v1/embeddings`: OpenAI's embeddings API, served by an embedding model.

use std::time::Instant;

use axum::extract::State;
use axum::{Extension, Json};

use crate::embeddings::{embed, encode_values, tokenize, EmbeddingModel, PoolInput};
use crate::error::ApiError;
use crate::extract::JsonBody;
use crate::layers::Arrival;
use crate::openai::{EmbeddingData, EmbeddingRequest, EmbeddingResponse, EmbeddingUsage, ErrorResponse};
use crate::state::SharedState;

/// One embedding per input, in input order.
#[utoipa::path(post, path = "/v1/embeddings", tag = "openai", request_body = EmbeddingRequest,
    responses((status = 200, body = EmbeddingResponse),
              (status = 400, description = "A bad parameter, or a model that does not embed", body = ErrorResponse),
              (status = 404, body = ErrorResponse),
              (status = 429, description = "The waiting queue is full", body = ErrorResponse)),
    security((), ("api_key" = [])))]
pub async fn embeddings(
    State(state): State<SharedState>,
    arrival: Option<Extension<Arrival>>,
    JsonBody(req): JsonBody<EmbeddingRequest>,
) -> Result<Json<EmbeddingResponse>, ApiError> {
    let arrival = arrival.map_or_else(Instant::now, |a| a.0 .0);
    let model = state.resolve_base_model(req.model.as_deref())?;
    let embedder = EmbeddingModel::embedder(&state, &model)?;
    let base64 = match req.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(ApiError::invalid(
                "encoding_format",
                format!("encoding_format must be \"float\" or \"base64\", not {other:?}"),
            ))
        }
    };
    // Checked before any work: a refused `dimensions` refuses the whole call.
    embedder.cut(req.dimensions)?;
    let inputs = tokenize(&state, req.input.into_inputs(), state.limits.max_model_len, "input").await?;
    let prompt_tokens = inputs.iter().map(Vec::len).sum();
    let inputs = inputs.into_iter().map(PoolInput::single).collect();
    let vectors = embed(&state, inputs, arrival, "input").await?;
    let data = vectors
        .into_iter()
        .enumerate()
        .map(|(index, values)| {
            let values = embedder.shape(values, req.dimensions)?;
            Ok(EmbeddingData { object: "embedding".into(), index, embedding: encode_values(values, base64) })
        })
        .collect::<Result<_, ApiError>>()?;
    Ok(Json(EmbeddingResponse {
        object: "list".into(),
        data,
        model,
        usage: EmbeddingUsage { prompt_tokens, total_tokens: prompt_tokens },
    }))
}

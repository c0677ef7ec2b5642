//! The prologue every generating endpoint (chat, completions, messages, responses) shares, as
//! one extractor: the parsed body, when the request arrived, and the served model (or LoRA
//! adapter) its `model` names. Written once so that a fix to the order (body errors before an
//! unknown model) or to arrival times reaches every API.

use std::time::Instant;

use axum::extract::{FromRequest, Request};
use serde::de::DeserializeOwned;

use crate::anthropic::wire::MessagesRequest;
use crate::error::ApiError;
use crate::extract::JsonBody;
use crate::layers::Arrival;
use crate::openai::fields::KnownFields;
use crate::openai::{ChatCompletionRequest, CompletionRequest, ErrorResponse};
use crate::responses::wire::ResponsesRequest;
use crate::state::SharedState;

/// A request body that names the model to run.
pub trait NamesModel {
    /// The `model` field; `None` where the API lets it be omitted.
    fn requested_model(&self) -> Option<&str>;
}

impl NamesModel for ChatCompletionRequest {
    fn requested_model(&self) -> Option<&str> {
        self.model.as_deref()
    }
}

impl NamesModel for CompletionRequest {
    fn requested_model(&self) -> Option<&str> {
        self.model.as_deref()
    }
}

impl NamesModel for ResponsesRequest {
    fn requested_model(&self) -> Option<&str> {
        self.model.as_deref()
    }
}

impl NamesModel for MessagesRequest {
    fn requested_model(&self) -> Option<&str> {
        Some(&self.model)
    }
}

/// A generation request as its handler starts from it.
#[derive(Debug)]
pub struct Generation<T> {
    pub req: T,
    /// When the request reached the server (TTFT counts from here); now, where no layer said.
    pub arrival: Instant,
    /// The name to answer with.
    pub model: String,
    /// The adapter `model` picked, if it named one.
    pub lora: Option<pagoda_engine::LoraId>,
}

impl<T> FromRequest<SharedState> for Generation<T>
where
    T: DeserializeOwned + KnownFields + NamesModel + Send,
{
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &SharedState) -> Result<Self, ApiError> {
        let arrived = request.extensions().get::<Arrival>().map(|a| a.0);
        let JsonBody(req) = JsonBody::<T>::from_request(request, state).await?;
        let arrival = arrived.unwrap_or_else(Instant::now);
        let (model, lora) = state.resolve_model(req.requested_model())?;
        Ok(Self { req, arrival, model, lora })
    }
}

/// The errors chat and completions document (OpenAI's error shape), listed once for both.
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)] // only its derive is used, by the handlers' OpenAPI annotations
pub enum GenerationErrors {
    /// Malformed JSON, a bad parameter, or a prompt too long
    #[response(status = 400)]
    BadRequest(ErrorResponse),
    /// Missing or wrong API key
    #[response(status = 401)]
    Unauthorized(ErrorResponse),
    /// Unknown model
    #[response(status = 404)]
    NotFound(ErrorResponse),
    /// Body over the limit
    #[response(status = 413)]
    TooLarge(ErrorResponse),
    /// The waiting queue is full
    #[response(status = 429)]
    QueueFull(ErrorResponse),
    /// The engine is not available
    #[response(status = 503)]
    Unavailable(ErrorResponse),
}

//! `POST /v1/responses` with `mcp` tools: the response is driven by
//! [`crate::responses::mcp::run`] (tool listings, the server's own tool calls, several
//! generations) and answered like any response: whole, streamed, or in the background.

use std::sync::Arc;
use std::time::Instant;

use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::StreamExt;
use serde_json::Value;

use super::responses::{keep, stream_response, Admission};
use crate::error::ApiError;
use crate::responses::background::{self, Run};
use crate::responses::mcp::run::{start, Started};
use crate::responses::reply::OutputEvents;
use crate::responses::stream::Responder;
use crate::responses::wire::{ResponseObject, ResponsesRequest};
use crate::sse;
use crate::state::SharedState;

/// A checked request with `mcp` tools, over its conversation's items.
pub struct McpCreate<'a> {
    pub req: &'a ResponsesRequest,
    pub items: Vec<Value>,
    pub first_new: usize,
    pub lora: Option<pagoda_engine::LoraId>,
    pub arrival: Instant,
    pub store: bool,
}

impl McpCreate<'_> {
    /// Answers with `response` (its skeleton), storing it with `input_items` when asked.
    pub async fn respond(
        self,
        state: &SharedState,
        response: ResponseObject,
        input_items: Vec<Value>,
    ) -> Result<Response, ApiError> {
        let encrypted = self.req.include.iter().flatten().any(|i| i == "reasoning.encrypted_content");
        let stream = self.req.stream.unwrap_or(false);
        let background = self.req.background.unwrap_or(false);
        let id = response.id.clone();
        if background {
            state.responses.admit(&id, input_items.clone())?;
        }
        // Gives a background response's place back if starting fails or the client leaves.
        let admission = background.then_some(Admission { state, id: &id });
        let Started { steps, split, namespaces, held } =
            start(state, self.req, self.items, self.first_new, self.lora, self.arrival).await?;
        std::mem::forget(admission);
        let outputs = OutputEvents::new(encrypted, namespaces).holding(held);
        if background {
            let queued = response.clone();
            let run = Run::new(id, Responder::new(response, split, outputs));
            state.responses.attach(&run);
            background::spawn(Arc::clone(state), Arc::clone(&run), steps);
            if stream {
                return Ok(sse::response(run.follow(None)?.map(Ok)));
            }
            return Ok(Json(queued).into_response());
        }
        let mut responder = Responder::new(response, split, outputs);
        if stream {
            let stored = self.store.then_some(input_items);
            return Ok(stream_response(Arc::clone(state), responder, stored, steps));
        }
        let mut steps = steps;
        while let Some(step) = steps.next().await {
            responder.on_step(state, step);
            if responder.done() {
                break;
            }
        }
        if !responder.done() {
            responder.on_end(state.prompts.tokenizer());
        }
        // A later generation that could not run leaves the response `failed`, with its error
        // and the output so far, as OpenAI answers a failed response (not stored, as a failed
        // stream is not).
        let response = responder.snapshot();
        if self.store && response.status != "failed" {
            keep(state, &response, input_items);
        }
        Ok(Json(response).into_response())
    }
}

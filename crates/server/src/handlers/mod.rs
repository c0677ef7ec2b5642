//! The route handlers, one file per API family. Each parses its wire type, validates it,
//! talks to the engine through [`crate::submit`], and answers with wire types or an
//! [`crate::error::ApiError`].

pub mod chat;
pub mod completions;
pub mod embeddings;
pub mod generation;
pub mod info;
pub mod lora;
pub mod messages;
pub mod render;
pub mod responses;
pub mod responses_mcp;
pub mod score;
pub mod stats;
pub mod tokenize;
pub mod worker;

use crate::openai::{FinishReason, StopReason};

/// The wire finish and stop reasons of an engine finish reason.
pub fn finish_reason(reason: &pagoda_engine::FinishReason) -> (FinishReason, Option<StopReason>) {
    use pagoda_engine::{FinishReason as F, StopReason as S};
    match reason {
        F::Stop(S::Eos(_) | S::GrammarComplete | S::Pooled) => (FinishReason::Stop, None),
        F::Stop(S::StopTokenId(id)) => (FinishReason::Stop, Some(StopReason::Token(*id))),
        F::Stop(S::StopString(s)) => (FinishReason::Stop, Some(StopReason::Text(s.clone()))),
        F::Length => (FinishReason::Length, None),
        F::Abort | F::Error(_) | F::Rejected(_) => (FinishReason::Abort, None),
    }
}

/// A fresh response id such as `chatcmpl-3f2a...`.
pub fn response_id(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

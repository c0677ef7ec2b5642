//! `pagoda-server`: the HTTP face of Pagoda. An axum app speaking OpenAI's API (chat and
//! completions, streaming over SSE), vLLM's extensions (`/tokenize`, `/detokenize`, extra
//! sampling parameters) and vLLM's Prometheus metrics, in front of a `pagoda-engine` engine.
//!
//! Wire types ([`openai`]) end in the handlers: requests are validated ([`validate`]) and
//! tokenized ([`prompt`]) into engine requests ([`submit`]), and every failure is an
//! [`error::ApiError`], mapped to a status and the OpenAI error body in one place.

pub mod anthropic;
pub mod app;
pub mod auth;
pub mod batch;
pub mod cache_metrics;
pub mod chat_output;
pub mod config;
pub mod config_doc;
pub mod conversation;
pub mod disaggregation;
pub mod embeddings;
pub mod error;
pub mod extract;
pub mod flag_values;
pub mod generate;
pub mod grammars;
pub mod handlers;
pub mod layers;
pub mod listen;
pub mod live_stats;
pub mod logprobs;
pub mod lora;
pub mod media;
pub mod metrics;
pub mod openai;
pub mod openapi;
pub mod prompt;
pub mod reasoning_budget;
pub mod responses;
pub mod server;
pub mod sleep;
pub mod sse;
pub mod state;
pub mod structured;
pub mod submit;
pub mod tools;
pub mod traces;
pub mod tracker;
pub mod validate;
pub mod web_ui;

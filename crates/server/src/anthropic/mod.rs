//! Anthropic's Messages API as a translation at the HTTP edge: [`wire`] holds its request and
//! response types, [`request`] turns a request into a [`crate::conversation::ChatTurn`] (the same
//! template, tools, grammars and engine as chat completions), [`reply`] turns the engine's output
//! into Anthropic's message and stream events, and [`error`] renders every [`crate::error::ApiError`]
//! in Anthropic's error shape on these routes.

pub mod error;
pub mod reply;
pub mod request;
pub mod wire;

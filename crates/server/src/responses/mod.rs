//! OpenAI's Responses API as a translation at the HTTP edge: [`wire`] holds its types,
//! [`request`] turns input items, tools, `text.format` and `reasoning` into a
//! [`crate::conversation::ChatTurn`] (the same template, tools, grammars and engine as chat
//! completions), [`reply`] turns the engine's output into output items and the typed stream
//! events, and [`store`] keeps responses for `previous_response_id`, retrieval and deletion.

pub mod reply;
pub mod request;
pub mod store;
pub mod wire;

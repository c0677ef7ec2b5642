//! OpenAI's Responses API as a translation at the HTTP edge: [`wire`] holds its types,
//! [`request`] turns input items, tools, `text.format` and `reasoning` into a
//! [`crate::conversation::ChatTurn`] (the same template, tools, grammars and engine as chat
//! completions), [`reply`] turns the engine's output into output items and the typed stream
//! events, [`stream`] keeps a response up to date event by event, [`background`] runs
//! `background: true` responses detached from their connection, and [`store`] keeps responses
//! for `previous_response_id`, retrieval, replay and deletion. [`mcp`] serves `mcp` tools: the
//! server calls the MCP servers itself between generations.

pub mod background;
pub mod mcp;
pub mod reply;
pub mod request;
pub mod store;
pub mod stream;
pub mod wire;

//! End-to-end tests: the real `pagoda serve` with the real model
//! (models/SmolLM2-135M-Instruct.Q4_1.gguf; run `make model` first — the tests fail without
//! it), spoken to over HTTP with a real client.

mod api;
mod errors;
mod failure;
mod harness;
mod hub;
mod load;
mod shutdown;

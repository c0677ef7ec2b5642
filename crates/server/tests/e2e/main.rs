//! End-to-end tests: the real `pagoda serve` with the real model
//! (models/SmolLM2-135M-Instruct.Q4_1.gguf; run `make model` first — the tests fail without
//! it), spoken to over HTTP with a real client.

mod api;
mod background;
mod batch_invariant;
mod beam_search;
mod connections;
mod cpu_isa;
mod cross_encoder;
mod embeddings;
mod errors;
mod failure;
mod fp8;
mod fuzz;
mod gemma3;
mod gguf_crafted;
mod harness;
mod hosted_tools;
mod hostile;
mod hostile_limits;
mod hub;
mod kv_events;
mod kv_events_hostile;
mod load;
mod lora;
mod lora_dtype;
mod lora_hostile;
mod lora_runtime;
mod messages;
mod metric_labels;
mod pd_transfer;
mod priority;
mod prompt_logprobs;
mod reasoning;
mod responses;
mod score;
mod sdk;
mod second_signal;
mod shutdown;
mod speculative;
mod structured;
mod structured_depth;
mod tools;
mod web_ui;
mod wire_details;
mod worker_api;

//! `pagoda-bench`: Pagoda's load generator and benchmarks.
//!
//! - `pagoda-bench serve` ([`serve`]) streams a dataset's requests to any OpenAI-compatible
//!   server on a Poisson or all-at-once schedule and reports throughput and the TTFT, TPOT, ITL
//!   and end-to-end latency distributions ([`metrics`], [`report`]); `--report FILE.html` and
//!   `pagoda-bench report` draw them, and saved runs beside them, in one HTML page
//!   ([`html_report`]).
//! - `pagoda-bench-offline` (its own package, `benches/offline`) runs the engine in-process,
//!   without HTTP, and reports through [`metrics`] and [`report`] too. Only it links the model
//!   code: this crate is an HTTP client.
//! - Datasets ([`dataset`], [`words`]): random, sharegpt-like, prefix-repetition, or a JSONL file.
//! - `serve --json-schema` ([`structured`]): requests ask for JSON schemas and their answers are
//!   validated.
//! - `benches/scheduler.rs` is a criterion bench of the scheduler; `benches/structured.rs` times
//!   grammar compiles and token masks.

pub mod cli;
pub mod client;
pub mod dataset;
mod embedding_reply;
pub mod html_report;
pub mod metrics;
pub mod report;
pub mod run;
pub mod serve;
pub mod sse;
pub mod structured;
pub mod words;

//! `pagoda-models`: candle model code for the Llama family, weight loading (GGUF, Hugging Face
//! safetensors, dummy), the paged KV cache, and the model runner that executes one scheduled
//! batch per engine step and samples from its logits.

pub mod config;
pub mod embedding;
pub mod error;
pub mod kv_cache;
pub mod linear;
pub mod llama;
pub mod loader;
pub mod runner;
pub mod weights;

pub use config::LlamaConfig;
pub use error::{ModelError, Result};
pub use kv_cache::KvCache;
pub use llama::{ForwardInput, Llama};
pub use loader::{load_model, LoadFormat, LoadOptions, LoadedModel, AUTO_DEQUANTIZE_MAX_BYTES};
pub use pagoda_ops::PanelPrecision;
pub use runner::ModelRunner;

//! `pagoda-models`: candle model code (the Llama family, Qwen3, mixtures of experts, Gemma 2 and 3, one file per architecture
//! over shared attention, embedding and linear layers; BERT encoders with their pooling, for embeddings;
//! the Idefics3 / SmolVLM vision-language model over a SigLIP encoder), weight loading (GGUF, Hugging Face
//! safetensors, dummy), the paged KV cache, and the model runner that executes one scheduled
//! batch per engine step and samples from its logits.

pub(crate) mod attention;
pub mod bert;
mod bert_cpu;
mod block_copy;
pub mod classifier;
pub mod config;
mod config_gguf;
mod config_hf;
mod config_rope;
mod decode_graphs;
pub mod device_sampling;
pub mod drafter;
pub mod embedding;
pub mod encoder_cache;
pub mod error;
pub mod gemma;
pub mod gguf_check;
pub mod idefics3;
pub mod kernel_plan;
pub mod kv_cache;
pub mod kv_calibration;
pub mod kv_layout;
pub mod kv_sizing;
pub mod linear;
pub mod linear_fp8;
pub mod llama;
pub mod loader;
pub mod lora;
mod lora_files;
pub mod lora_open;
pub mod model;
mod moe;
pub mod multimodal;
pub mod pooling;
pub mod runner;
pub mod siglip;
mod step_images;
pub mod weights;

pub use config::{ModelConfig, MoeConfig};
pub use config_rope::{RopeOverrideError, RopeScalingOverride};
pub use drafter::DraftModel;
pub use error::{ModelError, Result};
pub use kernel_plan::{CpuGemmDtype, CpuKernel, KernelPlan, KernelRequest, ResolvedPlan};
pub use kv_cache::KvCache;
pub use kv_calibration::calibrate_kv_scales;
pub use kv_layout::KvLayout;
pub use linear_fp8::WeightQuantization;
pub use loader::{
    load_model, resolve_kernel_plan, LoadFormat, LoadOptions, LoadedModel, AUTO_DEQUANTIZE_MAX_BYTES,
};
pub use model::{ForwardInput, Model};
pub use pagoda_ops::PanelPrecision;
pub use pooling::{Pooling, PoolingKind};
pub use runner::ModelRunner;

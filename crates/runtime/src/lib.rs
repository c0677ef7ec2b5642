//! `pagoda-runtime`: from flags to a running engine. It owns the model's and engine's flags and
//! their defaults ([`engine_args`], [`flags`]), finds the model on disk or in the Hugging Face
//! cache ([`hub`]), resolves the kernel plan ([`plan`]), loads the model and tokenizer, sizes the
//! KV cache and starts the engine thread ([`load`]). `pagoda serve`, `pagoda generate` and
//! `pagoda-bench-offline` all start through it; the HTTP server then speaks only to the engine's
//! handle and the tokenizer.

mod draft;
pub mod engine_args;
pub mod flags;
mod fp8_kv;
pub mod hub;
pub mod kv_offload;
pub mod load;
pub mod lora_args;
pub mod options;
pub mod plan;
pub mod sleep;
pub mod speculative_config;
pub mod vision;

pub use engine_args::{ArgsError, EngineArgs, EngineSettings, DEFAULT_MODEL};
pub use flags::{ByteSize, DeviceArg, DtypeArg, KvCacheDtypeArg};
pub use load::{LoadedRuntime, Runtime, RuntimeError, StartupTimes};
pub use lora_args::{LoraArgs, LoraSettings};
pub use options::{OptionsError, RuntimeOptions};
pub use pagoda_models::lora::AdapterReader;
pub use pagoda_models::lora_open::{AdapterError, Confinement};
/// An embedding model's pooling, as [`Runtime::pooling`] gives it.
pub use pagoda_models::pooling::normalize;
pub use pagoda_models::{CpuGemmDtype, LoadFormat, Pooling, PoolingKind, WeightQuantization};
pub use plan::{dtype_name, resolve_plan, RuntimePlan};
pub use vision::{VisionConfigError, VisionProcessor, VisionSpec};

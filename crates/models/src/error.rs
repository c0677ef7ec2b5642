//! Errors of model loading and execution, each naming the file or tensor it is about.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a readable GGUF file: {message}")]
    Gguf { path: PathBuf, message: String },
    #[error("{path}: unsupported architecture `{architecture}` (supported: llama, mistral, qwen2, smollm)")]
    UnsupportedArchitecture { path: PathBuf, architecture: String },
    #[error("{path}: unsupported dtype {dtype} for tensor `{tensor}`")]
    UnsupportedDtype { path: PathBuf, tensor: String, dtype: String },
    #[error("{path}: missing tensor `{tensor}`")]
    MissingTensor { path: PathBuf, tensor: String },
    #[error("{path}: tensor `{tensor}` has shape {actual:?}, expected {expected:?}")]
    TensorShape { path: PathBuf, tensor: String, expected: Vec<usize>, actual: Vec<usize> },
    #[error("{path}: {source}")]
    Adapter {
        path: PathBuf,
        #[source]
        source: Box<crate::lora_open::AdapterError>,
    },
    #[error("{path}: invalid model config: {message}")]
    Config { path: PathBuf, message: String },
    /// Image inputs that do not fit the model (pixel shape, placeholder count).
    #[error("invalid image input: {0}")]
    ImageInput(String),
    #[error("invalid option: {0}")]
    InvalidOption(String),
    #[error("cannot start the CPU thread pool: {0}")]
    ThreadPool(#[from] rayon::ThreadPoolBuildError),
    #[error("tensor operation failed: {0}")]
    Candle(#[from] candle_core::Error),
    #[error("CUDA graph: {0}")]
    Graph(String),
}

pub type Result<T> = std::result::Result<T, ModelError>;

//! Where weights come from: GGUF files, Hugging Face safetensors directories, or random dummy
//! weights. The model asks for tensors by their GGUF names (`blk.3.attn_q.weight`); each source
//! maps those to its own naming.

mod dummy;
mod gguf;
mod safetensors;

use std::path::Path;

use candle_core::Tensor;

pub use dummy::DummyWeights;
pub use gguf::GgufWeights;
pub use safetensors::SafetensorsWeights;

use crate::error::Result;
use crate::linear::Linear;

/// A store of named weights that the model builder reads from.
pub trait WeightSource {
    /// File or directory the weights come from, for error messages.
    fn path(&self) -> &Path;
    fn contains(&self, name: &str) -> bool;
    /// A dense tensor of the given shape, in the model's compute dtype (dequantized if needed).
    fn dense(&mut self, name: &str, shape: &[usize]) -> Result<Tensor>;
    /// Whether [`WeightSource::linear`] would keep `name` quantized rather than dense.
    fn keeps_quantized(&self, _name: &str) -> bool {
        false
    }
    /// A `[out, in]` projection, kept quantized when the source and options allow it.
    fn linear(&mut self, name: &str, out_dim: usize, in_dim: usize, bias: Option<&str>) -> Result<Linear>;
}

/// Fails with a clear error when a tensor's shape differs from what the config implies.
pub(crate) fn check_shape(path: &Path, name: &str, expected: &[usize], actual: &[usize]) -> Result<()> {
    if expected == actual {
        Ok(())
    } else {
        Err(crate::error::ModelError::TensorShape {
            path: path.to_path_buf(),
            tensor: name.to_string(),
            expected: expected.to_vec(),
            actual: actual.to_vec(),
        })
    }
}

//! Random weights of a given shape, for benchmarking models whose real weights are not at hand.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};

use super::WeightSource;
use crate::error::Result;
use crate::linear::{Linear, LinearWeight};

pub struct DummyWeights {
    config_path: PathBuf,
    device: Device,
    dtype: DType,
}

impl DummyWeights {
    pub fn new(config_path: &Path, device: &Device, dtype: DType) -> Self {
        Self { config_path: config_path.to_path_buf(), device: device.clone(), dtype }
    }

    fn random(&self, shape: &[usize]) -> Result<Tensor> {
        // Small weights keep activations finite through many layers; values are irrelevant
        // to speed, only shapes and dtypes matter.
        Ok(Tensor::randn(0f32, 0.02, shape, &self.device)?.to_dtype(self.dtype)?)
    }
}

impl WeightSource for DummyWeights {
    fn path(&self) -> &Path {
        &self.config_path
    }

    fn device(&self) -> &Device {
        &self.device
    }

    fn contains(&self, name: &str) -> bool {
        // Untied lm head, separate Q/K/V, no biases, no rope frequency table.
        !name.ends_with(".bias") && !name.contains("attn_qkv") && name != "rope_freqs.weight"
    }

    fn dense(&mut self, name: &str, shape: &[usize]) -> Result<Tensor> {
        if name.contains("norm") {
            return Ok(Tensor::ones(shape, self.dtype, &self.device)?);
        }
        self.random(shape)
    }

    fn linear(&mut self, _name: &str, out_dim: usize, in_dim: usize, _bias: Option<&str>) -> Result<Linear> {
        Ok(Linear::new(LinearWeight::Dense(self.random(&[out_dim, in_dim])?), None))
    }

    fn experts(&mut self, name: &str, num_experts: usize, rows: usize, cols: usize) -> Result<Vec<Linear>> {
        (0..num_experts).map(|_| self.linear(name, rows, cols, None)).collect()
    }
}

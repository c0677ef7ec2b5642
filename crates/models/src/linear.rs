//! A linear layer over either quantized (GGUF) or dense weights, `y = x W^T (+ b)`.

use candle_core::quantized::QMatMul;
use candle_core::{Module, Tensor};

use crate::error::Result;

#[derive(Debug, Clone)]
pub enum LinearWeight {
    /// Quantized blocks multiplied by candle's quantized matmul.
    Quantized(QMatMul),
    /// A dense `[out, in]` matrix.
    Dense(Tensor),
}

#[derive(Debug, Clone)]
pub struct Linear {
    weight: LinearWeight,
    bias: Option<Tensor>,
}

impl Linear {
    pub fn new(weight: LinearWeight, bias: Option<Tensor>) -> Self {
        Self { weight, bias }
    }

    /// `x`: `[tokens, in]` -> `[tokens, out]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = match &self.weight {
            LinearWeight::Quantized(q) => q.forward(x)?,
            LinearWeight::Dense(w) => x.matmul(&w.t()?)?,
        };
        Ok(match &self.bias {
            Some(b) => y.broadcast_add(b)?,
            None => y,
        })
    }

    pub fn is_quantized(&self) -> bool {
        matches!(self.weight, LinearWeight::Quantized(QMatMul::QTensor(_)))
    }
}

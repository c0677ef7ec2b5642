//! The forward pass of a BERT encoder with f32 weights on the CPU, on plain buffers: the four
//! matmuls of each layer on weights packed once into f32 panels (`pagoda_ops::panel_matmul`,
//! query, key and value as one `[3 hidden, hidden]` weight), and between them the fused passes
//! of `pagoda_ops::encoder_cpu` and `gelu` (attention with the QKV biases folded in; bias,
//! residual and LayerNorm in one pass; bias and the exact erf GELU in one pass).
//!
//! candle's version of the same layer runs about twenty ops, each a parallel loop of its own
//! with its thread wake-ups, and repacks every weight per call in its GEMM; for one short input
//! (the one-request-at-a-time case) those overheads were half the step. Here a layer is four
//! matmuls and four passes, each one rayon region on the runner's pool. The panels hold the
//! exact f32 weights, so the embeddings match candle's and the float64 reference as before.

use std::sync::Arc;

use candle_core::{DType, Device, Storage, Tensor};
use pagoda_ops::{
    add_bias_gelu_erf, add_layer_norm, encoder_attention, panel_matmul, EncoderAttentionShape,
    PanelPrecision, PanelWeight,
};

use crate::error::{ModelError, Result};

/// A LayerNorm's parameters.
#[derive(Debug, Clone)]
pub(crate) struct CpuNorm {
    pub gamma: Vec<f32>,
    pub beta: Vec<f32>,
    pub eps: f32,
}

impl CpuNorm {
    pub fn new(weight: &Tensor, bias: &Tensor, eps: f64) -> Result<Self> {
        Ok(Self { gamma: weight.to_vec1()?, beta: bias.to_vec1()?, eps: eps as f32 })
    }
}

/// One layer's weights, packed.
#[derive(Debug, Clone)]
pub(crate) struct CpuLayer {
    qkv: Arc<PanelWeight>,
    qkv_bias: Vec<f32>,
    attention_output: Arc<PanelWeight>,
    attention_output_bias: Vec<f32>,
    attention_norm: CpuNorm,
    intermediate: Arc<PanelWeight>,
    intermediate_bias: Vec<f32>,
    output: Arc<PanelWeight>,
    output_bias: Vec<f32>,
    output_norm: CpuNorm,
}

/// A projection's `[out, in]` weight and `[out]` bias as loaded.
pub(crate) struct Dense {
    pub weight: Tensor,
    pub bias: Tensor,
}

/// A layer's tensors as loaded, in the order of the forward pass.
pub(crate) struct LayerTensors<'a> {
    pub query: &'a Dense,
    pub key: &'a Dense,
    pub value: &'a Dense,
    pub attention_output: &'a Dense,
    pub attention_norm: CpuNorm,
    pub intermediate: &'a Dense,
    pub output: &'a Dense,
    pub output_norm: CpuNorm,
}

impl CpuLayer {
    pub fn pack(t: &LayerTensors<'_>) -> Result<Self> {
        let qkv_parts = [t.query, t.key, t.value];
        let mut qkv_rows = Vec::new();
        let mut qkv_bias = Vec::new();
        let mut cols = 0;
        for part in qkv_parts {
            cols = part.weight.dim(1)?;
            qkv_rows.extend(part.weight.flatten_all()?.to_vec1::<f32>()?);
            qkv_bias.extend(part.bias.to_vec1::<f32>()?);
        }
        let qkv = PanelWeight::from_rows(qkv_bias.len(), cols, &qkv_rows, PanelPrecision::F32);
        let pack = |d: &Dense| -> Result<(Arc<PanelWeight>, Vec<f32>)> {
            let (rows, cols) = d.weight.dims2()?;
            let values = d.weight.flatten_all()?.to_vec1::<f32>()?;
            let panels = PanelWeight::from_rows(rows, cols, &values, PanelPrecision::F32);
            Ok((Arc::new(panels), d.bias.to_vec1()?))
        };
        let (attention_output, attention_output_bias) = pack(t.attention_output)?;
        let (intermediate, intermediate_bias) = pack(t.intermediate)?;
        let (output, output_bias) = pack(t.output)?;
        Ok(Self {
            qkv: Arc::new(qkv),
            qkv_bias,
            attention_output,
            attention_output_bias,
            attention_norm: t.attention_norm.clone(),
            intermediate,
            intermediate_bias,
            output,
            output_bias,
            output_norm: t.output_norm.clone(),
        })
    }
}

/// The embedding tables (`[rows, hidden]` f32 tensors on the CPU) and their LayerNorm.
pub(crate) struct CpuEmbeddings<'a> {
    pub words: &'a Tensor,
    pub positions: &'a Tensor,
    pub token_types: &'a Tensor,
    pub norm: &'a CpuNorm,
}

/// The encoder's layers on the CPU.
#[derive(Debug, Clone)]
pub(crate) struct CpuEncoder {
    pub layers: Vec<CpuLayer>,
    pub heads: usize,
    pub head_dim: usize,
}

impl CpuEncoder {
    /// The last layer's hidden states, `[tokens, hidden]` f32, for valid ids (checked by the
    /// caller); `bounds` as in [`crate::bert::Bert::encode`].
    pub fn encode(
        &self,
        embeddings: &CpuEmbeddings<'_>,
        ids: &[u32],
        token_types: &[u32],
        positions: &[u32],
        bounds: &[usize],
    ) -> Result<Tensor> {
        let hidden = self.heads * self.head_dim;
        let tokens = ids.len();
        let words = gather(embeddings.words, ids, hidden)?;
        let mut places = gather(embeddings.positions, positions, hidden)?;
        let types = gather(embeddings.token_types, token_types, hidden)?;
        for (p, t) in places.iter_mut().zip(&types) {
            *p += t;
        }
        let norm = embeddings.norm;
        let zeros = vec![0f32; hidden];
        let mut x = add_layer_norm(&words, &zeros, &places, &norm.gamma, &norm.beta, norm.eps);
        let shape = EncoderAttentionShape {
            heads: self.heads,
            head_dim: self.head_dim,
            scale: 1.0 / (self.head_dim as f32).sqrt(),
        };
        for layer in &self.layers {
            x = self.layer(layer, x, bounds, shape)?;
        }
        Ok(Tensor::from_vec(x, (tokens, hidden), &Device::Cpu)?)
    }

    fn layer(
        &self,
        l: &CpuLayer,
        x: Vec<f32>,
        bounds: &[usize],
        shape: EncoderAttentionShape,
    ) -> Result<Vec<f32>> {
        let hidden = self.heads * self.head_dim;
        let x = rows(x, hidden)?;
        let qkv = panel_matmul(&x, &l.qkv)?;
        let context = with_f32(&qkv, |qkv| encoder_attention(qkv, &l.qkv_bias, bounds, shape))?;
        let projected = panel_matmul(&rows(context, hidden)?, &l.attention_output)?;
        let norm = &l.attention_norm;
        let attended = with_f32(&projected, |y| {
            with_f32(&x, |x| {
                add_layer_norm(y, &l.attention_output_bias, x, &norm.gamma, &norm.beta, norm.eps)
            })
        })??;
        let attended = rows(attended, hidden)?;
        let inner = panel_matmul(&attended, &l.intermediate)?;
        let inner = with_f32(&inner, |v| add_bias_gelu_erf(v, &l.intermediate_bias))?;
        let out = panel_matmul(&rows(inner, l.intermediate_bias.len())?, &l.output)?;
        let norm = &l.output_norm;
        with_f32(&out, |y| {
            with_f32(&attended, |a| add_layer_norm(y, &l.output_bias, a, &norm.gamma, &norm.beta, norm.eps))
        })?
    }
}

/// `values` as a `[rows, width]` CPU tensor (the buffer moves in; no copy).
fn rows(values: Vec<f32>, width: usize) -> Result<Tensor> {
    let n = values.len() / width;
    Ok(Tensor::from_vec(values, (n, width), &Device::Cpu)?)
}

/// `f` of a contiguous f32 CPU tensor's values, read in place.
fn with_f32<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> R) -> Result<R> {
    let not_f32 =
        || ModelError::InvalidOption(format!("expected a contiguous f32 CPU tensor, got {:?}", t.dtype()));
    if t.dtype() != DType::F32 {
        return Err(not_f32());
    }
    let (storage, layout) = t.storage_and_layout();
    let Storage::Cpu(cpu) = &*storage else { return Err(not_f32()) };
    let Some((start, end)) = layout.contiguous_offsets() else { return Err(not_f32()) };
    Ok(f(&cpu.as_slice::<f32>()?[start..end]))
}

/// Rows `ids` of the `[rows, width]` table.
fn gather(table: &Tensor, ids: &[u32], width: usize) -> Result<Vec<f32>> {
    let rows = table.dim(0)?;
    with_f32(table, |t| {
        let mut out = Vec::with_capacity(ids.len() * width);
        for &id in ids {
            let id = id as usize;
            if id >= rows {
                return Err(ModelError::InvalidOption(format!("row {id} is outside a table of {rows}")));
            }
            out.extend_from_slice(&t[id * width..(id + 1) * width]);
        }
        Ok(out)
    })?
}

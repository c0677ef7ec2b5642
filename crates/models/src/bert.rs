//! BERT encoders (all-MiniLM and the other sentence-transformers BERTs): token, position and
//! token-type embeddings, then post-norm layers of bidirectional self-attention and a GELU
//! MLP, each closed by LayerNorm. An encoder keeps no KV between steps: each step attends
//! within each of its sequences' own tokens, all of which it computes, so the paged cache is
//! not read or written (see [`crate::KvCache::accounting_only`]). Its output is pooled hidden
//! states, never logits; a cross-encoder's is the score its classifier head gives a text pair
//! ([`crate::classifier`]), the pair's second text marked by token type 1.
//!
//! With f32 weights on the CPU the layers run as [`crate::bert_cpu`]'s own pass (panel matmuls
//! and fused kernels, the same values); elsewhere (CUDA, half precision) as candle ops.

use std::path::Path;

use candle_core::{DType, Tensor, D};
use serde::Deserialize;

use crate::bert_cpu::{CpuEmbeddings, CpuEncoder, CpuLayer, CpuNorm, Dense, LayerTensors};
use crate::classifier::SequenceClassifier;
use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::linear::Linear;
use crate::pooling::{Pooling, PoolingKind};
use crate::weights::WeightSource;

/// What a BERT `config.json` says beyond [`ModelConfig`].
#[derive(Debug, Deserialize)]
struct BertExtras {
    #[serde(default = "default_eps")]
    layer_norm_eps: f64,
    #[serde(default = "default_type_vocab")]
    type_vocab_size: usize,
    #[serde(default = "default_act")]
    hidden_act: String,
    #[serde(default = "default_position_type")]
    position_embedding_type: String,
}

fn default_eps() -> f64 {
    1e-12
}
fn default_type_vocab() -> usize {
    2
}
fn default_act() -> String {
    "gelu".into()
}
fn default_position_type() -> String {
    "absolute".into()
}

/// LayerNorm over the last dimension, with weight and bias.
#[derive(Debug, Clone)]
struct LayerNorm {
    weight: Tensor,
    bias: Tensor,
    eps: f64,
}

impl LayerNorm {
    fn load(source: &mut dyn WeightSource, name: &str, size: usize, eps: f64) -> Result<Self> {
        Ok(Self {
            weight: source.dense(&format!("{name}.weight"), &[size])?,
            bias: source.dense(&format!("{name}.bias"), &[size])?,
            eps,
        })
    }

    fn cpu(&self) -> Result<CpuNorm> {
        CpuNorm::new(&self.weight, &self.bias, self.eps)
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mean = x.mean_keepdim(D::Minus1)?;
        let centered = x.broadcast_sub(&mean)?;
        let variance = centered.sqr()?.mean_keepdim(D::Minus1)?;
        let normed = centered.broadcast_div(&(variance + self.eps)?.sqrt()?)?;
        Ok(normed.broadcast_mul(&self.weight)?.broadcast_add(&self.bias)?)
    }
}

#[derive(Debug, Clone)]
struct BertLayer {
    query: Linear,
    key: Linear,
    value: Linear,
    attention_output: Linear,
    attention_norm: LayerNorm,
    intermediate: Linear,
    output: Linear,
    output_norm: LayerNorm,
}

/// The layers, as candle ops (CUDA, half precision) or packed for the CPU's own pass
/// ([`crate::bert_cpu`], f32 weights on the CPU).
enum Layers {
    Candle(Vec<BertLayer>),
    Cpu { encoder: CpuEncoder, embeddings_norm: CpuNorm },
}

pub struct Bert {
    config: ModelConfig,
    pooling: Pooling,
    word_embeddings: Tensor,
    position_embeddings: Tensor,
    token_type_embeddings: Tensor,
    embeddings_norm: LayerNorm,
    layers: Layers,
    /// A cross-encoder's head; `None` for an embedding model.
    classifier: Option<SequenceClassifier>,
}

impl Bert {
    pub fn load(source: &mut dyn WeightSource, config: ModelConfig) -> Result<Self> {
        let dir = source.path().to_path_buf();
        let extras = read_extras(&dir)?;
        let bad = |message: String| ModelError::Config { path: dir.join("config.json"), message };
        if extras.hidden_act != "gelu" {
            return Err(bad(format!("hidden_act `{}` is not supported (gelu is)", extras.hidden_act)));
        }
        if extras.position_embedding_type != "absolute" {
            return Err(bad(format!(
                "position_embedding_type `{}` is not supported (absolute is)",
                extras.position_embedding_type
            )));
        }
        // A checkpoint saved from a task model (BertForSequenceClassification) nests the encoder.
        let prefix = if source.contains("bert.embeddings.word_embeddings.weight") { "bert." } else { "" };
        let (h, eps) = (config.hidden_size, extras.layer_norm_eps);
        let mut dense = |name: &str, shape: &[usize]| source.dense(&format!("{prefix}{name}"), shape);
        let word_embeddings = dense("embeddings.word_embeddings.weight", &[config.vocab_size, h])?;
        let position_embeddings =
            dense("embeddings.position_embeddings.weight", &[config.max_position_embeddings, h])?;
        let token_type_embeddings =
            dense("embeddings.token_type_embeddings.weight", &[extras.type_vocab_size, h])?;
        let embeddings_norm = LayerNorm::load(source, &format!("{prefix}embeddings.LayerNorm"), h, eps)?;
        let cpu = word_embeddings.device().is_cpu() && word_embeddings.dtype() == DType::F32;
        // Each layer is packed for the CPU's own pass (or wrapped as candle ops) as it loads, so
        // only one layer's loaded tensors are held beside the packed ones.
        let (mut cpu_layers, mut candle_layers) = (Vec::new(), Vec::new());
        let plan = source.kernel_plan();
        let linear = |d: Dense| Linear::dense(d.weight, Some(d.bias), plan);
        for i in 0..config.num_layers {
            let name = |part: &str| format!("{prefix}encoder.layer.{i}.{part}");
            let mut dense = |part: &str, out_dim: usize, in_dim: usize| -> Result<Dense> {
                let weight = source.dense(&name(&format!("{part}.weight")), &[out_dim, in_dim])?;
                let bias = source.dense(&name(&format!("{part}.bias")), &[out_dim])?;
                Ok(Dense { weight, bias })
            };
            let inter = config.intermediate_size;
            let (query, key, value) = (
                dense("attention.self.query", h, h)?,
                dense("attention.self.key", h, h)?,
                dense("attention.self.value", h, h)?,
            );
            let attention_output = dense("attention.output.dense", h, h)?;
            let intermediate = dense("intermediate.dense", inter, h)?;
            let output = dense("output.dense", h, inter)?;
            let attention_norm = LayerNorm::load(source, &name("attention.output.LayerNorm"), h, eps)?;
            let output_norm = LayerNorm::load(source, &name("output.LayerNorm"), h, eps)?;
            if cpu {
                cpu_layers.push(CpuLayer::pack(&LayerTensors {
                    query: &query,
                    key: &key,
                    value: &value,
                    attention_output: &attention_output,
                    attention_norm: attention_norm.cpu()?,
                    intermediate: &intermediate,
                    output: &output,
                    output_norm: output_norm.cpu()?,
                })?);
            } else {
                candle_layers.push(BertLayer {
                    query: linear(query)?,
                    key: linear(key)?,
                    value: linear(value)?,
                    attention_output: linear(attention_output)?,
                    attention_norm,
                    intermediate: linear(intermediate)?,
                    output: linear(output)?,
                    output_norm,
                });
            }
        }
        let layers = if cpu {
            let encoder =
                CpuEncoder { layers: cpu_layers, heads: config.num_heads, head_dim: config.head_dim };
            Layers::Cpu { encoder, embeddings_norm: embeddings_norm.cpu()? }
        } else {
            Layers::Candle(candle_layers)
        };
        let pooling = Pooling::of_dir(&dir, PoolingKind::Cls)?;
        let classifier = SequenceClassifier::load(source, &dir, h)?;
        Ok(Self {
            config,
            pooling,
            word_embeddings,
            position_embeddings,
            token_type_embeddings,
            embeddings_norm,
            layers,
            classifier,
        })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    pub fn pooling(&self) -> &Pooling {
        &self.pooling
    }

    /// Each input's pooled vector: its embedding, or a cross-encoder's score (one value).
    /// The arguments are [`Self::encode`]'s.
    pub fn pooled(
        &self,
        pooling: &Pooling,
        input_ids: &Tensor,
        token_types: &Tensor,
        positions: &Tensor,
        bounds: &[usize],
    ) -> Result<Vec<Vec<f32>>> {
        let hidden = self.encode(input_ids, token_types, positions, bounds)?;
        let Some(head) = &self.classifier else { return pooling.pool(&hidden, bounds) };
        let starts: Vec<u32> = bounds[..bounds.len() - 1].iter().map(|&b| b as u32).collect();
        let starts = Tensor::from_vec(starts, bounds.len() - 1, hidden.device())?;
        let scores = head.scores(&hidden.index_select(&starts, 0)?)?;
        Ok(scores.into_iter().map(|s| vec![s]).collect())
    }

    /// The last layer's hidden states, `[tokens, hidden]`: `input_ids`, `token_types` (0 or 1,
    /// a pair's first or second text) and `positions` (u32 `[tokens]`) hold the sequences one
    /// after another, `bounds[i]..bounds[i + 1]` the tokens of sequence `i`, each a whole input
    /// (attention stays inside it).
    pub fn encode(
        &self,
        input_ids: &Tensor,
        token_types: &Tensor,
        positions: &Tensor,
        bounds: &[usize],
    ) -> Result<Tensor> {
        let ids = input_ids.to_vec1::<u32>()?;
        if let Some(&bad) = ids.iter().find(|&&id| id as usize >= self.config.vocab_size) {
            return Err(ModelError::InvalidOption(format!(
                "token id {bad} is outside the vocabulary of {}",
                self.config.vocab_size
            )));
        }
        let type_vocab = self.token_type_embeddings.dim(0)?;
        let types = token_types.to_vec1::<u32>()?;
        if types.iter().any(|&t| t as usize >= type_vocab) {
            return Err(ModelError::InvalidOption(format!(
                "this model has {type_vocab} token type(s), so it takes no text pairs"
            )));
        }
        let layers = match &self.layers {
            Layers::Candle(layers) => layers,
            Layers::Cpu { encoder, embeddings_norm } => {
                let embeddings = CpuEmbeddings {
                    words: &self.word_embeddings,
                    positions: &self.position_embeddings,
                    token_types: &self.token_type_embeddings,
                    norm: embeddings_norm,
                };
                let positions = positions.to_vec1::<u32>()?;
                return encoder.encode(&embeddings, &ids, &types, &positions, bounds);
            }
        };
        let words = self.word_embeddings.index_select(input_ids, 0)?;
        let places = self.position_embeddings.index_select(positions, 0)?;
        let types = self.token_type_embeddings.index_select(token_types, 0)?;
        let mut x = self.embeddings_norm.forward(&((words + places)? + types)?)?;
        for layer in layers {
            x = self.layer_forward(layer, &x, bounds)?;
        }
        Ok(x)
    }

    fn layer_forward(&self, layer: &BertLayer, x: &Tensor, bounds: &[usize]) -> Result<Tensor> {
        let (q, k, v) = (layer.query.forward(x)?, layer.key.forward(x)?, layer.value.forward(x)?);
        let context = self.attention(&q, &k, &v, bounds)?;
        let attended = layer.attention_norm.forward(&(layer.attention_output.forward(&context)? + x)?)?;
        let inner = layer.intermediate.forward(&attended)?.gelu_erf()?;
        layer.output_norm.forward(&(layer.output.forward(&inner)? + attended)?)
    }

    /// Bidirectional attention of each sequence's tokens over its own tokens.
    fn attention(&self, q: &Tensor, k: &Tensor, v: &Tensor, bounds: &[usize]) -> Result<Tensor> {
        let (heads, head_dim) = (self.config.num_heads, self.config.head_dim);
        let scale = 1.0 / (head_dim as f64).sqrt();
        let split = |t: &Tensor, start: usize, len: usize| -> Result<Tensor> {
            Ok(t.narrow(0, start, len)?.reshape((len, heads, head_dim))?.transpose(0, 1)?.contiguous()?)
        };
        let outputs = bounds
            .windows(2)
            .map(|w| {
                let (start, len) = (w[0], w[1] - w[0]);
                let (q, k, v) = (split(q, start, len)?, split(k, start, len)?, split(v, start, len)?);
                let scores = (q.matmul(&k.transpose(1, 2)?)? * scale)?;
                let max = scores.max_keepdim(D::Minus1)?;
                let weights = scores.broadcast_sub(&max)?.exp()?;
                let weights = weights.broadcast_div(&weights.sum_keepdim(D::Minus1)?)?;
                Ok(weights.matmul(&v)?.transpose(0, 1)?.reshape((len, heads * head_dim))?)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Tensor::cat(&outputs, 0)?)
    }
}

fn read_extras(dir: &Path) -> Result<BertExtras> {
    let path = dir.join("config.json");
    let text =
        std::fs::read_to_string(&path).map_err(|source| ModelError::Io { path: path.clone(), source })?;
    serde_json::from_str(&text).map_err(|e| ModelError::Config { path, message: e.to_string() })
}

//! The Llama-family transformer (Llama 2/3, SmolLM, Mistral, Qwen2) over a flattened, mixed
//! batch and a paged KV cache. Attention goes through `pagoda-ops`, so the same code runs the CPU
//! reference ops and, on a GPU, our CUDA kernels.

use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use pagoda_ops::AttentionMetadata;

use crate::config::LlamaConfig;
use crate::embedding::Embedding;
use crate::error::Result;
use crate::kv_cache::KvCache;
use crate::linear::{Linear, LinearWeight, StackedLinear};
use crate::weights::{load_linear, load_stacked, WeightSource};

struct Layer {
    attn_norm: Tensor,
    /// Q, K and V projections.
    qkv_proj: StackedLinear,
    o_proj: Linear,
    ffn_norm: Tensor,
    /// Gate and up projections.
    gate_up_proj: StackedLinear,
    down_proj: Linear,
}

/// One step's flattened inputs, built by the model runner.
pub struct ForwardInput<'a> {
    /// u32 `[num_tokens]`.
    pub input_ids: &'a Tensor,
    /// u32 `[num_tokens]`.
    pub positions: &'a Tensor,
    pub attention: &'a AttentionMetadata,
    /// u32 `[num_rows]`: the token rows whose logits are wanted.
    pub logits_rows: &'a Tensor,
}

pub struct Llama {
    config: LlamaConfig,
    embed_tokens: Embedding,
    layers: Vec<Layer>,
    final_norm: Tensor,
    lm_head: Linear,
    cos: Tensor,
    sin: Tensor,
    softmax_scale: f32,
    dtype: DType,
}

impl Llama {
    pub fn load(
        source: &mut dyn WeightSource,
        config: LlamaConfig,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let c = &config;
        let (h, q, kv, ffn) = (c.hidden_size, c.q_size(), c.kv_size(), c.intermediate_size);
        let tied = c.tie_word_embeddings || !source.contains("output.weight");
        // A tied table in a format the block matmul reads serves as lm head (blocks for small
        // steps, panels for large ones) and as embedding (rows dequantized from the blocks).
        let tied_head = if tied && !source.keeps_quantized("token_embd.weight") {
            let precision = source.panel_precision();
            source.blocks("token_embd.weight", c.vocab_size, h)?.map(|b| Linear::packed(b, precision))
        } else {
            None
        };
        let embed_tokens = match tied_head.as_ref().and_then(Linear::blocks) {
            Some(blocks) => Embedding::Blocks(Arc::clone(blocks)),
            None => Embedding::Dense(source.dense("token_embd.weight", &[c.vocab_size, h])?),
        };
        let mut layers = Vec::with_capacity(c.num_layers);
        for i in 0..c.num_layers {
            let name = |part: &str| format!("blk.{i}.{part}.weight");
            let bias = |part: &str| c.attention_bias.then(|| format!("blk.{i}.{part}.bias"));
            let (q_name, k_name, v_name) = (name("attn_q"), name("attn_k"), name("attn_v"));
            let (q_bias, k_bias, v_bias) = (bias("attn_q"), bias("attn_k"), bias("attn_v"));
            let qkv = [
                (q_name.as_str(), q, q_bias.as_deref()),
                (k_name.as_str(), kv, k_bias.as_deref()),
                (v_name.as_str(), kv, v_bias.as_deref()),
            ];
            let (gate_name, up_name) = (name("ffn_gate"), name("ffn_up"));
            let gate_up = [(gate_name.as_str(), ffn, None), (up_name.as_str(), ffn, None)];
            layers.push(Layer {
                attn_norm: source.dense(&name("attn_norm"), &[h])?,
                qkv_proj: load_stacked(source, &qkv, h)?,
                o_proj: load_linear(source, &name("attn_output"), h, q, None)?,
                ffn_norm: source.dense(&name("ffn_norm"), &[h])?,
                gate_up_proj: load_stacked(source, &gate_up, h)?,
                down_proj: load_linear(source, &name("ffn_down"), h, ffn, None)?,
            });
        }
        let final_norm = source.dense("output_norm.weight", &[h])?;
        let lm_head = match tied_head {
            Some(head) => head,
            None if !tied => load_linear(source, "output.weight", c.vocab_size, h, None)?,
            // Tied, quantized: the lm head multiplies the quantized table directly.
            None if source.keeps_quantized("token_embd.weight") => {
                source.linear("token_embd.weight", c.vocab_size, h, None)?
            }
            // Tied, dense: share the embedding tensor rather than load a second copy.
            None => match &embed_tokens {
                Embedding::Dense(table) => Linear::new(LinearWeight::Dense(table.clone()), None),
                Embedding::Blocks(blocks) => Linear::packed((**blocks).clone(), source.panel_precision()),
            },
        };
        let (cos, sin) = rotary_tables(c, device)?;
        Ok(Self {
            softmax_scale: 1.0 / (c.head_dim as f32).sqrt(),
            config,
            embed_tokens,
            layers,
            final_norm,
            lm_head,
            cos,
            sin,
            dtype,
        })
    }

    pub fn config(&self) -> &LlamaConfig {
        &self.config
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Runs every layer over the batch, writing its K/V into `cache`, and returns f32 logits
    /// `[num_rows, vocab]` for the requested rows only.
    pub fn forward(&self, input: &ForwardInput<'_>, cache: &KvCache) -> Result<Tensor> {
        let c = &self.config;
        let num_tokens = input.input_ids.dim(0)?;
        let mut hidden = self.embed_tokens.forward(input.input_ids)?;
        let mut residual: Option<Tensor> = None;
        for (i, layer) in self.layers.iter().enumerate() {
            let normed = match &residual {
                None => {
                    residual = Some(hidden.clone());
                    pagoda_ops::rms_norm(&hidden, &layer.attn_norm, c.rms_norm_eps)?
                }
                Some(r) => {
                    let (normed, sum) =
                        pagoda_ops::add_rms_norm(&hidden, r, &layer.attn_norm, c.rms_norm_eps)?;
                    residual = Some(sum);
                    normed
                }
            };
            let heads = [c.num_heads, c.num_kv_heads, c.num_kv_heads];
            let [q, k, v]: [Tensor; 3] = layer
                .qkv_proj
                .forward_heads(&normed, &heads, c.head_dim)?
                .try_into()
                .expect("three projections");
            let (q, k) =
                pagoda_ops::rotary_embedding(&q, &k, input.positions, &self.cos, &self.sin, c.rope_style)?;
            let (k_cache, v_cache) = cache.layer(i);
            // A cache stored narrower than the activations (f16 for an f32 model) takes the new
            // rows rounded; attention reads any cache dtype.
            let (k, v) = match k_cache.dtype() {
                dt if dt == k.dtype() => (k, v),
                dt => (k.to_dtype(dt)?, v.to_dtype(dt)?),
            };
            pagoda_ops::reshape_and_cache(&k, &v, k_cache, v_cache, &input.attention.slot_mapping)?;
            let attn =
                pagoda_ops::paged_attention(&q, k_cache, v_cache, input.attention, self.softmax_scale)?;
            hidden = layer.o_proj.forward(&attn.reshape((num_tokens, c.q_size()))?)?;

            let r = residual.as_ref().expect("set by the first layer");
            let (normed, sum) = pagoda_ops::add_rms_norm(&hidden, r, &layer.ffn_norm, c.rms_norm_eps)?;
            residual = Some(sum);
            let [gate, up]: [Tensor; 2] =
                layer.gate_up_proj.forward(&normed)?.try_into().expect("two projections");
            hidden = layer.down_proj.forward(&pagoda_ops::silu_and_mul(&gate, &up)?)?;
        }
        let r = residual.as_ref().expect("models have at least one layer");
        let (normed, _) = pagoda_ops::add_rms_norm(&hidden, r, &self.final_norm, c.rms_norm_eps)?;
        let rows = normed.index_select(input.logits_rows, 0)?;
        Ok(self.lm_head.forward(&rows)?.to_dtype(DType::F32)?)
    }

    /// Whether the projections run as quantized matmuls.
    pub fn is_quantized(&self) -> bool {
        self.layers.first().is_some_and(|l| l.qkv_proj.is_quantized())
    }
}

/// cos/sin tables for every position the model supports, with the GGUF's frequency factors.
fn rotary_tables(c: &LlamaConfig, device: &Device) -> Result<(Tensor, Tensor)> {
    let mut inv_freq = pagoda_ops::rotary_inv_freq(c.rope_theta, c.head_dim, c.rope_scaling)?;
    if let Some(factors) = &c.rope_freq_factors {
        if factors.len() != inv_freq.len() {
            return Err(crate::error::ModelError::InvalidOption(format!(
                "rope_freqs has {} entries, expected {}",
                factors.len(),
                inv_freq.len()
            )));
        }
        inv_freq.iter_mut().zip(factors).for_each(|(f, k)| *f /= *k as f64);
    }
    Ok(pagoda_ops::rotary_tables_from_inv_freq(&inv_freq, c.max_position_embeddings, device)?)
}

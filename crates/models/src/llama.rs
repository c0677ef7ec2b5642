//! The Llama-family block (Llama 2/3, SmolLM, Mistral, Qwen2, Qwen3, Phi-3, and with routed
//! experts Mixtral and Qwen3-MoE): pre-norm attention (QK-normed for Qwen3) and a SiLU gated MLP
//! or a mixture of them, each added to the residual stream.

use candle_core::{DType, Device, Tensor};

use crate::attention::{Attention, Rope};
use crate::config::ModelConfig;
use crate::embedding::{load_embedding_and_head, Embedding};
use crate::error::Result;
use crate::kv_cache::KvCache;
use crate::linear::{Linear, StackedLinear};
use crate::lora::{LoraBatch, LoraModule};
use crate::model::{join_residual, ForwardInput};
use crate::moe::MoeMlp;
use crate::weights::{load_linear, load_stacked, WeightSource};

struct Layer {
    attn_norm: Tensor,
    attention: Attention,
    ffn_norm: Tensor,
    mlp: Mlp,
}

enum Mlp {
    Dense {
        /// Gate and up projections.
        gate_up_proj: StackedLinear,
        down_proj: Linear,
    },
    Experts(MoeMlp),
}

impl Mlp {
    fn load(source: &mut dyn WeightSource, c: &ModelConfig, i: usize) -> Result<Self> {
        if let Some(moe) = c.moe {
            return Ok(Mlp::Experts(MoeMlp::load(source, c, moe, i)?));
        }
        let (h, ffn) = (c.hidden_size, c.intermediate_size);
        let name = |part: &str| format!("blk.{i}.{part}.weight");
        let (gate_name, up_name) = (name("ffn_gate"), name("ffn_up"));
        let gate_up = [(gate_name.as_str(), ffn, None), (up_name.as_str(), ffn, None)];
        // Phi-3 has no gate matrix: its `ffn_up` holds gate and up, in that order.
        let gate_up_proj = if source.contains(&gate_name) {
            load_stacked(source, &gate_up, h)?
        } else {
            StackedLinear::fused(load_linear(source, &up_name, 2 * ffn, h, None)?, vec![ffn, ffn])
        };
        Ok(Mlp::Dense { gate_up_proj, down_proj: load_linear(source, &name("ffn_down"), h, ffn, None)? })
    }

    /// `x` `[tokens, hidden]` (normed) -> `[tokens, hidden]`, with the rows' LoRA deltas of
    /// layer `layer` when `lora` has any.
    fn forward(&self, x: &Tensor, lora: Option<&LoraBatch>, layer: usize) -> Result<Tensor> {
        match self {
            Mlp::Dense { gate_up_proj, down_proj } => {
                let [gate, up]: [Tensor; 2] = gate_up_proj.forward(x)?.try_into().expect("two projections");
                let Some(lora) = lora else {
                    return down_proj.forward(&pagoda_ops::silu_and_mul(&gate, &up)?);
                };
                let [gate, up] =
                    lora.apply_parts(layer, [LoraModule::Gate, LoraModule::Up], x, [gate, up])?;
                let inner = pagoda_ops::silu_and_mul(&gate, &up)?;
                lora.apply(layer, LoraModule::Down, &inner, down_proj.forward(&inner)?)
            }
            Mlp::Experts(moe) => moe.forward(x),
        }
    }
}

pub struct Llama {
    config: ModelConfig,
    embed_tokens: Embedding,
    layers: Vec<Layer>,
    final_norm: Tensor,
    lm_head: Linear,
    rope: Rope,
    /// Rope of the windowed layers, when their base differs (none in this family so far).
    local_rope: Option<Rope>,
}

impl Llama {
    pub fn load(source: &mut dyn WeightSource, config: ModelConfig, device: &Device) -> Result<Self> {
        let c = &config;
        let h = c.hidden_size;
        let (embed_tokens, lm_head) = load_embedding_and_head(source, c)?;
        let mut layers = Vec::with_capacity(c.num_layers);
        for i in 0..c.num_layers {
            let name = |part: &str| format!("blk.{i}.{part}.weight");
            layers.push(Layer {
                attn_norm: source.dense(&name("attn_norm"), &[h])?,
                attention: Attention::load(source, c, i)?,
                ffn_norm: source.dense(&name("ffn_norm"), &[h])?,
                mlp: Mlp::load(source, c, i)?,
            });
        }
        let final_norm = source.dense("output_norm.weight", &[h])?;
        let local_rope = match c.rope_local_theta {
            Some(theta) => Some(Rope::new(c, theta, Default::default(), device)?),
            None => None,
        };
        Ok(Self {
            rope: Rope::global(c, device)?,
            local_rope,
            config,
            embed_tokens,
            layers,
            final_norm,
            lm_head,
        })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// Runs every layer over the batch, writing its K/V into `cache`, and returns f32 logits
    /// `[num_rows, vocab]` for the requested rows only.
    pub fn forward(&self, input: &ForwardInput<'_>, cache: &KvCache) -> Result<Tensor> {
        Ok(self.forward_parts(input, cache)?.0)
    }

    /// [`Self::forward`], with the final-normed hidden states of `input.hidden_rows` too.
    pub fn forward_parts(
        &self,
        input: &ForwardInput<'_>,
        cache: &KvCache,
    ) -> Result<(Tensor, Option<Tensor>)> {
        self.forward_embedded(self.embed(input.input_ids)?, input, cache)
    }

    /// The token embeddings of u32 `ids` `[tokens]`: `[tokens, hidden]`.
    pub fn embed(&self, ids: &Tensor) -> Result<Tensor> {
        self.embed_tokens.forward(ids)
    }

    /// [`Self::forward_parts`] from input embeddings `[tokens, hidden]` (one row per token of
    /// `input`) instead of looking `input.input_ids` up: a vision-language model's, whose image
    /// placeholders carry the vision encoder's features.
    pub fn forward_embedded(
        &self,
        mut hidden: Tensor,
        input: &ForwardInput<'_>,
        cache: &KvCache,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let c = &self.config;
        let mut residual: Option<Tensor> = None;
        for (i, layer) in self.layers.iter().enumerate().take(input.num_layers.unwrap_or(usize::MAX)) {
            let normed = join_residual(&hidden, &mut residual, &layer.attn_norm, c.rms_norm_eps)?;
            let rope = match (&self.local_rope, c.layer_window(i)) {
                (Some(local), Some(_)) => local,
                _ => &self.rope,
            };
            hidden = layer.attention.forward(&normed, rope, input, cache, i)?;

            let r = residual.as_ref().expect("set by the first layer");
            let (normed, sum) = pagoda_ops::add_rms_norm(&hidden, r, &layer.ffn_norm, c.rms_norm_eps)?;
            residual = Some(sum);
            hidden = layer.mlp.forward(&normed, input.lora, i)?;
        }
        let head = |rows: &Tensor| Ok(self.lm_head.forward(rows)?.to_dtype(DType::F32)?);
        crate::model::final_outputs(&hidden, residual.as_ref(), &self.final_norm, c, input, head)
    }

    /// Whether the projections run as quantized matmuls.
    pub fn is_quantized(&self) -> bool {
        self.layers.first().is_some_and(|l| l.attention.is_quantized())
    }
}

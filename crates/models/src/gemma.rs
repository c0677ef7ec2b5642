//! The Gemma 2 and Gemma 3 block: embeddings scaled by √hidden, RMSNorm before and after both
//! attention and the MLP, a GELU(tanh) gated MLP, local (sliding-window) and global layers.
//! Gemma 3 adds QK-norm and gives its five local layers per global one their own rope base (10k,
//! against 1M, scaled for long contexts); Gemma 2 alternates local and global layers and
//! soft-caps attention scores and the final logits instead.
//!
//! GGUF files store Gemma's norm weights as `1 + w` (llama.cpp's converter adds the one that
//! Hugging Face's `Gemma3RMSNorm` adds at run time), so the shared RMSNorm op applies them as
//! they are.

use candle_core::{DType, Device, Tensor};

use crate::attention::{Attention, Rope};
use crate::config::ModelConfig;
use crate::embedding::{load_embedding_and_head, Embedding};
use crate::error::Result;
use crate::kv_cache::KvCache;
use crate::linear::{Linear, StackedLinear};
use crate::lora::LoraModule;
use crate::model::{join_residual, ForwardInput};
use crate::weights::{load_linear, load_stacked, WeightSource};

struct Layer {
    attn_norm: Tensor,
    attention: Attention,
    post_attn_norm: Tensor,
    ffn_norm: Tensor,
    /// Gate and up projections.
    gate_up_proj: StackedLinear,
    down_proj: Linear,
    post_ffn_norm: Tensor,
}

pub struct Gemma {
    config: ModelConfig,
    embed_tokens: Embedding,
    /// √hidden, rounded to f32 as Hugging Face rounds it to the activations' dtype.
    embed_scale: f64,
    layers: Vec<Layer>,
    final_norm: Tensor,
    lm_head: Linear,
    global_rope: Rope,
    local_rope: Rope,
}

impl Gemma {
    pub fn load(source: &mut dyn WeightSource, config: ModelConfig, device: &Device) -> Result<Self> {
        let c = &config;
        let (h, ffn) = (c.hidden_size, c.intermediate_size);
        let (embed_tokens, lm_head) = load_embedding_and_head(source, c)?;
        let mut layers = Vec::with_capacity(c.num_layers);
        for i in 0..c.num_layers {
            let name = |part: &str| format!("blk.{i}.{part}.weight");
            let (gate_name, up_name) = (name("ffn_gate"), name("ffn_up"));
            let gate_up = [(gate_name.as_str(), ffn, None), (up_name.as_str(), ffn, None)];
            layers.push(Layer {
                attn_norm: source.dense(&name("attn_norm"), &[h])?,
                attention: Attention::load(source, c, i)?,
                post_attn_norm: source.dense(&name("post_attention_norm"), &[h])?,
                ffn_norm: source.dense(&name("ffn_norm"), &[h])?,
                gate_up_proj: load_stacked(source, &gate_up, h)?,
                down_proj: load_linear(source, &name("ffn_down"), h, ffn, None)?,
                post_ffn_norm: source.dense(&name("post_ffw_norm"), &[h])?,
            });
        }
        let final_norm = source.dense("output_norm.weight", &[h])?;
        let local_theta = c.rope_local_theta.unwrap_or(c.rope_theta);
        Ok(Self {
            embed_scale: (h as f32).sqrt() as f64,
            global_rope: Rope::global(c, device)?,
            local_rope: Rope::new(c, local_theta, Default::default(), device)?,
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
        let c = &self.config;
        let eps = c.rms_norm_eps;
        let mut hidden = self.embed_tokens.forward(input.input_ids)?.affine(self.embed_scale, 0.0)?;
        let mut residual: Option<Tensor> = None;
        for (i, layer) in self.layers.iter().enumerate().take(input.num_layers.unwrap_or(usize::MAX)) {
            let normed = join_residual(&hidden, &mut residual, &layer.attn_norm, eps)?;
            let rope = if c.layer_window(i).is_some() { &self.local_rope } else { &self.global_rope };
            let attn = layer.attention.forward(&normed, rope, input, cache, i)?;
            let attn = pagoda_ops::rms_norm(&attn, &layer.post_attn_norm, eps)?;

            let r = residual.as_ref().expect("set by the first layer");
            let (normed, sum) = pagoda_ops::add_rms_norm(&attn, r, &layer.ffn_norm, eps)?;
            residual = Some(sum);
            let [gate, up]: [Tensor; 2] =
                layer.gate_up_proj.forward(&normed)?.try_into().expect("two projections");
            // Gate and up share their input: one LoRA op for both (one parallel loop on the CPU).
            let (gate, up) = match input.lora {
                None => (gate, up),
                Some(lora) => {
                    let [gate, up] =
                        lora.apply_parts(i, [LoraModule::Gate, LoraModule::Up], &normed, [gate, up])?;
                    (gate, up)
                }
            };
            // The fused op on the CPU (candle's GELU goes through libm's tanh per element).
            let activated = if gate.device().is_cpu() {
                pagoda_ops::gelu_tanh_and_mul(&gate, &up)?
            } else {
                (gate.gelu()? * up)?
            };
            let mlp = layer.down_proj.forward(&activated)?;
            let mlp = match input.lora {
                None => mlp,
                Some(lora) => lora.apply(i, LoraModule::Down, &activated, mlp)?,
            };
            hidden = pagoda_ops::rms_norm(&mlp, &layer.post_ffn_norm, eps)?;
        }
        let head = |rows: &Tensor| {
            let logits = self.lm_head.forward(rows)?.to_dtype(DType::F32)?;
            Ok(match c.final_logit_softcapping {
                Some(cap) => ((logits / cap as f64)?.tanh()? * cap as f64)?,
                None => logits,
            })
        };
        crate::model::final_outputs(&hidden, residual.as_ref(), &self.final_norm, c, input, head)
    }

    /// Whether the projections run as quantized matmuls.
    pub fn is_quantized(&self) -> bool {
        self.layers.first().is_some_and(|l| l.attention.is_quantized())
    }
}

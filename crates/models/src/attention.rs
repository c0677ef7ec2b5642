//! The attention block every architecture shares: fused Q/K/V projection, optional per-head
//! QK-norm, rotary embedding, the write of the new K/V into the paged cache, paged attention
//! (causal, or inside a sliding window) and the output projection. Also the rotary tables.

use candle_core::{DType, Device, Tensor};
use pagoda_ops::{AttentionParams, RopeScaling, RotaryStyle};

use crate::config::{LongRope, ModelConfig};
use crate::error::{ModelError, Result};
use crate::kv_cache::KvCache;
use crate::linear::{Linear, StackedLinear};
use crate::lora::LoraModule;
use crate::model::ForwardInput;
use crate::weights::{load_linear, load_stacked, WeightSource};

/// cos/sin tables for every position the model supports, and how heads pair their elements.
pub(crate) struct Rope {
    cos: Tensor,
    sin: Tensor,
    style: RotaryStyle,
}

impl Rope {
    /// Tables for base `theta` and `scaling`, with the GGUF's per-frequency divisors if any, and
    /// cos/sin times the scaling's attention factor (YaRN's; 1 otherwise).
    pub(crate) fn new(c: &ModelConfig, theta: f32, scaling: RopeScaling, device: &Device) -> Result<Self> {
        let mut inv_freq = pagoda_ops::rotary_inv_freq(theta, c.head_dim, scaling)?;
        if let Some(factors) = &c.rope_freq_factors {
            if factors.len() != inv_freq.len() {
                return Err(ModelError::InvalidOption(format!(
                    "rope_freqs has {} entries, expected {}",
                    factors.len(),
                    inv_freq.len()
                )));
            }
            inv_freq.iter_mut().zip(factors).for_each(|(f, k)| *f /= *k as f64);
        }
        let scale = scaling.attention_factor() as f64;
        let (cos, sin) =
            pagoda_ops::rotary_tables_scaled(&inv_freq, c.max_position_embeddings, scale, device)?;
        Ok(Self { cos, sin, style: c.rope_style })
    }

    /// The model's global rope: `rope_theta` with its scaling, or LongRoPE.
    pub(crate) fn global(c: &ModelConfig, device: &Device) -> Result<Self> {
        match &c.long_rope {
            None => Self::new(c, c.rope_theta, c.rope_scaling, device),
            Some(long) => Self::long_rope(c, long, device),
        }
    }

    /// Positions below the original context rotate by the short factors' frequencies, later ones
    /// by the long factors' (see [`LongRope`]); both tables scaled by the attention factor.
    fn long_rope(c: &ModelConfig, long: &LongRope, device: &Device) -> Result<Self> {
        let base = pagoda_ops::rotary_inv_freq(c.rope_theta, c.head_dim, RopeScaling::None)?;
        let table = |factors: &[f32]| -> Result<(Tensor, Tensor)> {
            if factors.len() != base.len() {
                return Err(ModelError::InvalidOption(format!(
                    "LongRoPE has {} factors, expected {}",
                    factors.len(),
                    base.len()
                )));
            }
            let inv_freq: Vec<f64> = base.iter().zip(factors).map(|(f, k)| f / *k as f64).collect();
            Ok(pagoda_ops::rotary_tables_from_inv_freq(&inv_freq, c.max_position_embeddings, device)?)
        };
        let (short_cos, short_sin) = table(&long.short_factors)?;
        let (long_cos, long_sin) = table(&long.long_factors)?;
        let split = long.original_max_position_embeddings.min(c.max_position_embeddings);
        let rest = c.max_position_embeddings - split;
        let join = |short: &Tensor, long_: &Tensor| -> Result<Tensor> {
            let joined = Tensor::cat(&[short.narrow(0, 0, split)?, long_.narrow(0, split, rest)?], 0)?;
            Ok((joined * long.attention_factor as f64)?)
        };
        Ok(Self { cos: join(&short_cos, &long_cos)?, sin: join(&short_sin, &long_sin)?, style: c.rope_style })
    }
}

pub(crate) struct Attention {
    /// Q, K and V projections.
    qkv_proj: StackedLinear,
    o_proj: Linear,
    /// RMSNorm weights over `head_dim` applied to each q and k head before rope (Gemma 3, Qwen3).
    qk_norm: Option<(Tensor, Tensor)>,
    params: AttentionParams,
    num_heads: usize,
    num_kv_heads: usize,
    head_dim: usize,
    eps: f32,
}

impl Attention {
    /// Layer `i`'s attention weights (`blk.{i}.attn_*`), with QK-norm weights when the model
    /// has them.
    pub(crate) fn load(source: &mut dyn WeightSource, c: &ModelConfig, i: usize) -> Result<Self> {
        let (h, q, kv) = (c.hidden_size, c.q_size(), c.kv_size());
        let name = |part: &str| format!("blk.{i}.{part}.weight");
        let bias = |part: &str| c.attention_bias.then(|| format!("blk.{i}.{part}.bias"));
        let (q_name, k_name, v_name) = (name("attn_q"), name("attn_k"), name("attn_v"));
        let (q_bias, k_bias, v_bias) = (bias("attn_q"), bias("attn_k"), bias("attn_v"));
        let qkv = [
            (q_name.as_str(), q, q_bias.as_deref()),
            (k_name.as_str(), kv, k_bias.as_deref()),
            (v_name.as_str(), kv, v_bias.as_deref()),
        ];
        // Phi-3 stores Q, K and V as one fused matrix.
        let fused = name("attn_qkv");
        let qkv_proj = if source.contains(&fused) {
            StackedLinear::fused(load_linear(source, &fused, q + 2 * kv, h, None)?, vec![q, kv, kv])
        } else {
            load_stacked(source, &qkv, h)?
        };
        let qk_norm = match c.qk_norm {
            true => Some((
                source.dense(&name("attn_q_norm"), &[c.head_dim])?,
                source.dense(&name("attn_k_norm"), &[c.head_dim])?,
            )),
            false => None,
        };
        Ok(Self {
            qkv_proj,
            o_proj: load_linear(source, &name("attn_output"), h, q, None)?,
            qk_norm,
            params: AttentionParams {
                softmax_scale: c.softmax_scale(),
                window: c.layer_window(i),
                logit_softcap: c.attn_logit_softcapping,
                batch_invariant: source.kernel_plan().batch_invariant,
                kv_scales: pagoda_ops::KvScales::UNIT,
            },
            num_heads: c.num_heads,
            num_kv_heads: c.num_kv_heads,
            head_dim: c.head_dim,
            eps: c.rms_norm_eps,
        })
    }

    pub(crate) fn is_quantized(&self) -> bool {
        self.qkv_proj.is_quantized()
    }

    /// `x` `[tokens, hidden]` (normed) -> `[tokens, hidden]`, writing the new K/V into layer
    /// `layer` of `cache`.
    pub(crate) fn forward(
        &self,
        x: &Tensor,
        rope: &Rope,
        input: &ForwardInput<'_>,
        cache: &KvCache,
        layer: usize,
    ) -> Result<Tensor> {
        let num_tokens = x.dim(0)?;
        let heads = [self.num_heads, self.num_kv_heads, self.num_kv_heads];
        let [q, k, v]: [Tensor; 3] =
            self.qkv_proj.forward_heads(x, &heads, self.head_dim)?.try_into().expect("three projections");
        let (q, k, v) = match input.lora {
            None => (q, k, v),
            Some(lora) => {
                let [q, k, v] =
                    lora.apply_parts(layer, [LoraModule::Q, LoraModule::K, LoraModule::V], x, [q, k, v])?;
                (q, k, v)
            }
        };
        let (q, k) = match &self.qk_norm {
            None => (q, k),
            // Views of the stacked projection: rows of one head are contiguous, heads are not.
            Some((q_norm, k_norm)) => (
                pagoda_ops::rms_norm(&q.contiguous()?, q_norm, self.eps)?,
                pagoda_ops::rms_norm(&k.contiguous()?, k_norm, self.eps)?,
            ),
        };
        let (q, k) = pagoda_ops::rotary_embedding(&q, &k, input.positions, &rope.cos, &rope.sin, rope.style)?;
        let (k_cache, v_cache) = cache.layer(layer);
        let meta = &input.attention[cache.group_of(layer)];
        // A cache stored narrower than the activations (f16 for an f32 model) takes the new
        // rows rounded: by the CPU op as it copies them, on other devices first. An FP8 cache
        // takes any float rows, encoded by the op. Attention reads any cache dtype.
        let (k, v) = match k_cache.dtype() {
            dt if dt == k.dtype()
                || dt == DType::F8E4M3
                || (k.device().is_cpu() && k.dtype() == DType::F32) =>
            {
                (k, v)
            }
            dt => (k.to_dtype(dt)?, v.to_dtype(dt)?),
        };
        let kv_scales = cache.scales(layer);
        pagoda_ops::reshape_and_cache_scaled(&k, &v, k_cache, v_cache, &meta.slot_mapping, kv_scales)?;
        let params = AttentionParams { kv_scales, ..self.params };
        let attn = pagoda_ops::paged_attention_with(&q, k_cache, v_cache, meta, params)?;
        let attn = attn.reshape((num_tokens, self.num_heads * self.head_dim))?;
        let out = self.o_proj.forward(&attn)?;
        match input.lora {
            None => Ok(out),
            Some(lora) => lora.apply(layer, LoraModule::O, &attn, out),
        }
    }
}

//! The shape of a model (Llama family, Qwen3 and its MoE, Mixtral, Gemma 2 and 3), read from GGUF
//! metadata (`config_gguf`) or a Hugging Face `config.json` (`config_hf`).

use std::path::Path;

use pagoda_ops::{RopeScaling, RotaryStyle};

use crate::error::{ModelError, Result};

/// Everything a forward pass needs to know about the model's shape.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// Our name for the architecture, llama.cpp's GGUF name (`llama`, `qwen3moe`, `gemma3`, ...).
    pub architecture: String,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f32,
    pub rope_theta: f32,
    pub rope_scaling: RopeScaling,
    /// Per-frequency divisors from the GGUF (`rope_freqs.weight`): llama.cpp's form of Llama 3
    /// scaling, applied on top of `rope_scaling`.
    pub rope_freq_factors: Option<Vec<f32>>,
    pub rope_style: RotaryStyle,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    /// Q/K/V projections carry a bias (Qwen2).
    pub attention_bias: bool,
    /// RMSNorm over each q and k head before rope (Qwen3, Gemma 3).
    pub qk_norm: bool,
    /// Local attention span of the layers that use one (Mistral, Gemma's local layers).
    pub sliding_window: Option<usize>,
    /// Which layers attend only inside `sliding_window`; `num_layers` entries.
    pub sliding_layers: Vec<bool>,
    /// Rope base of the windowed layers when it differs from `rope_theta` (Gemma 3: 10k local,
    /// 1M global). The windowed layers' rope is never scaled.
    pub rope_local_theta: Option<f32>,
    /// Attention scores are scaled by `query_pre_attn_scalar^-1/2` rather than `head_dim^-1/2`
    /// (Gemma).
    pub query_pre_attn_scalar: Option<f32>,
    /// Attention scores become `cap * tanh(score / cap)` (Gemma 2).
    pub attn_logit_softcapping: Option<f32>,
    /// Logits become `cap * tanh(logit / cap)` (Gemma 2).
    pub final_logit_softcapping: Option<f32>,
    /// The MLP is a mixture of experts (Mixtral, Qwen3-MoE).
    pub moe: Option<MoeConfig>,
    /// Phi-3's LongRoPE: per-frequency divisors for short and long contexts.
    pub long_rope: Option<LongRope>,
}

/// Phi-3's LongRoPE. Hugging Face switches a whole sequence to the long factors once it grows
/// past `original_max_position_embeddings`, recomputing nothing already cached; with a paged
/// cache the only consistent rule is per position: positions below the original context use
/// the short factors (Hugging Face's result for every sequence that short), later ones the long
/// factors. cos and sin are both scaled by `attention_factor`.
#[derive(Debug, Clone, PartialEq)]
pub struct LongRope {
    pub short_factors: Vec<f32>,
    pub long_factors: Vec<f32>,
    pub original_max_position_embeddings: usize,
    pub attention_factor: f32,
}

impl LongRope {
    /// Hugging Face's default attention factor: `sqrt(1 + ln(s) / ln(original))` for the context
    /// extension `s = max / original` (1 when not extended).
    pub fn default_attention_factor(max_positions: usize, original: usize) -> f32 {
        let scale = max_positions as f64 / original as f64;
        if scale <= 1.0 {
            1.0
        } else {
            (1.0 + scale.ln() / (original as f64).ln()).sqrt() as f32
        }
    }
}

/// A routed mixture-of-experts MLP: each token goes through its `experts_per_token` best experts
/// (softmax over the router's logits), weighted by their router probabilities.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MoeConfig {
    pub num_experts: usize,
    pub experts_per_token: usize,
    /// Width of each expert's gated MLP.
    pub expert_intermediate_size: usize,
    /// Whether the chosen experts' probabilities are renormalized to sum to one (Mixtral always;
    /// Qwen3-MoE's `norm_topk_prob`).
    pub normalize_top_k: bool,
}

/// Architectures we run, by their GGUF names.
pub(crate) const SUPPORTED: &[&str] = &[
    "llama", "mistral", "mixtral", "qwen2", "smollm", "qwen3", "qwen3moe", "phi3", "gemma2", "gemma3", "bert",
];

/// Gemma 3 makes every sixth layer global and the others local; Gemma 2 alternates.
pub(crate) const GEMMA3_SLIDING_PATTERN: usize = 6;
pub(crate) const GEMMA2_SLIDING_PATTERN: usize = 2;
/// Gemma 3's local rope base; llama.cpp's GGUFs do not store it.
pub(crate) const GEMMA3_LOCAL_ROPE_THETA: f32 = 10_000.0;

/// Whether each of `num_layers` layers is windowed when all but every `pattern`-th one are.
pub(crate) fn sliding_pattern(num_layers: usize, pattern: usize) -> Vec<bool> {
    (0..num_layers).map(|i| pattern == 0 || (i + 1) % pattern != 0).collect()
}

/// Gemma's attention scale: `head_dim`, except for the 27B models (62 layers for Gemma 3, 46 for
/// Gemma 2), which scale by `hidden / heads` (llama.cpp's rule; the HF configs say the same).
pub(crate) fn gemma_query_scalar(
    num_layers: usize,
    hidden_size: usize,
    num_heads: usize,
    head_dim: usize,
) -> f32 {
    match num_layers {
        46 | 62 => (hidden_size / num_heads) as f32,
        _ => head_dim as f32,
    }
}

pub(crate) fn check_architecture(path: &Path, architecture: &str) -> Result<()> {
    if SUPPORTED.contains(&architecture) {
        Ok(())
    } else {
        Err(ModelError::UnsupportedArchitecture {
            path: path.to_path_buf(),
            architecture: architecture.to_string(),
        })
    }
}

impl ModelConfig {
    pub(crate) fn validated(self, path: &Path) -> Result<Self> {
        let problem = if self.num_layers == 0 {
            Some("the model has no layers".to_string())
        } else if self.vocab_size == 0 || self.hidden_size == 0 || self.intermediate_size == 0 {
            Some("vocab, hidden and intermediate sizes must be positive".to_string())
        } else if self.head_dim == 0 || !self.head_dim.is_multiple_of(2) {
            Some(format!("head_dim {} must be even and positive", self.head_dim))
        } else if self.moe.is_some_and(|m| {
            m.num_experts == 0 || m.experts_per_token == 0 || m.experts_per_token > m.num_experts
        }) {
            Some(format!("cannot route to {:?}", self.moe))
        } else if self.sliding_layers.len() != self.num_layers {
            Some(format!("{} layer kinds for {} layers", self.sliding_layers.len(), self.num_layers))
        } else {
            None
        };
        match problem {
            Some(message) => Err(ModelError::Config { path: path.to_path_buf(), message }),
            None => Ok(self),
        }
    }

    /// The window layer `layer` attends inside, if any.
    pub fn layer_window(&self, layer: usize) -> Option<usize> {
        self.sliding_window.filter(|_| self.sliding_layers.get(layer).copied().unwrap_or(false))
    }

    /// `softmax_scale` of the attention scores.
    pub fn softmax_scale(&self) -> f32 {
        1.0 / self.query_pre_attn_scalar.unwrap_or(self.head_dim as f32).sqrt()
    }

    pub fn q_size(&self) -> usize {
        self.num_heads * self.head_dim
    }

    pub fn kv_size(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }

    /// Bytes of K plus V for one token across all layers, at `dtype_size` bytes per element.
    pub fn kv_bytes_per_token(&self, dtype_size: usize) -> usize {
        2 * self.num_layers * self.kv_size() * dtype_size
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_llama31_style_config() {
        let text = r#"{"model_type":"llama","vocab_size":128256,"hidden_size":4096,"intermediate_size":14336,
            "num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":8,"rms_norm_eps":1e-5,
            "rope_theta":500000.0,"max_position_embeddings":131072,
            "rope_scaling":{"factor":8.0,"low_freq_factor":1.0,"high_freq_factor":4.0,
            "original_max_position_embeddings":8192,"rope_type":"llama3"}}"#;
        let c = ModelConfig::from_hf_str(Path::new("config.json"), text).unwrap();
        assert_eq!(c.head_dim, 128);
        assert_eq!(c.num_kv_heads, 8);
        assert!(matches!(c.rope_scaling, RopeScaling::Llama3 { factor, .. } if factor == 8.0));
        assert_eq!(c.kv_bytes_per_token(2), 2 * 32 * 8 * 128 * 2);
    }

    #[test]
    fn rejects_unknown_architecture_and_bad_heads() {
        let gpt = r#"{"model_type":"gpt2","vocab_size":1,"hidden_size":8,"intermediate_size":8,
            "num_hidden_layers":1,"num_attention_heads":2}"#;
        let e = ModelConfig::from_hf_str(Path::new("x/config.json"), gpt).unwrap_err().to_string();
        assert!(e.contains("x/config.json") && e.contains("gpt2"), "{e}");
        let heads = r#"{"vocab_size":1,"hidden_size":8,"intermediate_size":8,
            "num_hidden_layers":1,"num_attention_heads":3,"num_key_value_heads":2}"#;
        let e = ModelConfig::from_hf_str(Path::new("c.json"), heads).unwrap_err().to_string();
        assert!(e.contains("3 heads"), "{e}");
    }
}

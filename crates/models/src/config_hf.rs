//! [`ModelConfig`] from a Hugging Face `config.json`. `save_pretrained` leaves out values equal
//! to the config class's defaults, so the defaults that matter for the forward pass are filled in
//! per `model_type` here, as transformers' config classes define them.

use std::path::Path;

use pagoda_ops::{RopeScaling, RotaryStyle};
use serde::Deserialize;

use crate::config::{
    check_architecture, sliding_pattern, LongRope, ModelConfig, MoeConfig, GEMMA2_SLIDING_PATTERN,
    GEMMA3_SLIDING_PATTERN,
};
use crate::error::{ModelError, Result};

/// Our architecture name for a Hugging Face `model_type`.
fn architecture_of(model_type: &str) -> &str {
    match model_type {
        "qwen3_moe" => "qwen3moe",
        "gemma3_text" => "gemma3",
        other => other,
    }
}

/// transformers' defaults for the fields a `config.json` may omit: `(rms_norm_eps, rope_theta,
/// sliding_window, query_pre_attn_scalar, attn softcap, final softcap)`.
type Defaults = (f32, f32, Option<usize>, Option<f32>, Option<f32>, Option<f32>);

fn defaults(architecture: &str) -> Defaults {
    match architecture {
        "gemma2" => (1e-6, 10_000.0, Some(4096), Some(256.0), Some(50.0), Some(30.0)),
        "gemma3" => (1e-6, 1_000_000.0, Some(4096), Some(256.0), None, None),
        "qwen3" | "qwen3moe" => (1e-6, 10_000.0, None, None, None, None),
        "mistral" => (1e-6, 10_000.0, Some(4096), None, None, None),
        "mixtral" => (1e-5, 1_000_000.0, None, None, None, None),
        "qwen2" => (1e-6, 10_000.0, None, None, None, None),
        _ => (1e-5, 10_000.0, None, None, None, None),
    }
}

impl ModelConfig {
    /// Reads a Hugging Face `config.json`.
    pub fn from_hf_json(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| ModelError::Io { path: path.to_path_buf(), source })?;
        Self::from_hf_str(path, &text)
    }

    /// Parses the text of a Hugging Face `config.json`; `path` is only used in errors.
    pub fn from_hf_str(path: &Path, text: &str) -> Result<Self> {
        let err = |message: String| ModelError::Config { path: path.to_path_buf(), message };
        let mut raw: HfConfig = serde_json::from_str(text).map_err(|e| err(e.to_string()))?;
        raw.take_rope_parameters().map_err(|e| err(format!("rope_parameters: {e}")))?;
        let architecture = architecture_of(raw.model_type.as_deref().unwrap_or("llama")).to_string();
        check_architecture(path, &architecture)?;
        let arch = architecture.as_str();
        let (eps, theta, window, query_scalar, attn_cap, final_cap) = defaults(arch);
        let num_kv_heads = raw.num_key_value_heads.unwrap_or(raw.num_attention_heads);
        if raw.num_attention_heads == 0
            || num_kv_heads == 0
            || !raw.num_attention_heads.is_multiple_of(num_kv_heads)
        {
            return Err(err(format!(
                "{} heads cannot be grouped over {num_kv_heads} KV heads",
                raw.num_attention_heads
            )));
        }
        if raw.partial_rotary_factor.is_some_and(|f| f != 1.0) {
            return Err(err("partial rotary embeddings are not supported".into()));
        }
        let max_positions = raw.max_position_embeddings.unwrap_or(4096);
        let long_rope = match &raw.rope_scaling {
            Some(s) if matches!(s.rope_type.as_deref().or(s.kind.as_deref()), Some("longrope" | "su")) => {
                let original = raw.original_max_position_embeddings.or(s.original_max_position_embeddings);
                let original =
                    original.ok_or_else(|| err("longrope needs original_max_position_embeddings".into()))?;
                let (Some(short), Some(long)) = (&s.short_factor, &s.long_factor) else {
                    return Err(err("longrope needs short_factor and long_factor".into()));
                };
                Some(LongRope {
                    short_factors: short.clone(),
                    long_factors: long.clone(),
                    original_max_position_embeddings: original,
                    attention_factor: s
                        .attention_factor
                        .unwrap_or_else(|| LongRope::default_attention_factor(max_positions, original)),
                })
            }
            _ => None,
        };
        let rope_scaling = match raw.rope_scaling {
            None => RopeScaling::None,
            Some(s) => match s.rope_type.as_deref().or(s.kind.as_deref()) {
                Some("llama3") => RopeScaling::Llama3 {
                    factor: s.factor.unwrap_or(1.0),
                    low_freq_factor: s.low_freq_factor.unwrap_or(1.0),
                    high_freq_factor: s.high_freq_factor.unwrap_or(4.0),
                    original_max_position_embeddings: s.original_max_position_embeddings.unwrap_or(8192),
                },
                Some("linear") => RopeScaling::Linear { factor: s.factor.unwrap_or(1.0) },
                // Phi-3's LongRoPE is built from `long_rope` below.
                Some("longrope" | "su") => RopeScaling::None,
                Some("default") | None => RopeScaling::None,
                Some(other) => return Err(err(format!("unsupported rope_scaling type `{other}`"))),
            },
        };
        let gemma = matches!(arch, "gemma2" | "gemma3");
        let layers = raw.num_hidden_layers;
        // Qwen2/3 list a window they use only with `use_sliding_window`; Mixtral's is null.
        let uses_window = match arch {
            "qwen2" | "qwen3" | "qwen3moe" => raw.use_sliding_window.unwrap_or(false),
            _ => true,
        };
        let sliding_window = match raw.sliding_window {
            Some(w) => w,
            None => window,
        }
        .filter(|&w| w > 0 && uses_window);
        let sliding_layers = match (&raw.layer_types, sliding_window, arch) {
            (_, None, _) => vec![false; layers],
            (Some(types), Some(_), _) => types.iter().map(|t| t == "sliding_attention").collect(),
            (None, Some(_), "gemma3") => {
                sliding_pattern(layers, raw.sliding_window_pattern.unwrap_or(GEMMA3_SLIDING_PATTERN))
            }
            (None, Some(_), "gemma2") => sliding_pattern(layers, GEMMA2_SLIDING_PATTERN),
            (None, Some(_), _) => vec![true; layers],
        };
        let moe = match arch {
            "qwen3moe" => {
                if raw.decoder_sparse_step.unwrap_or(1) != 1 || !raw.mlp_only_layers.is_empty() {
                    return Err(err("dense layers between MoE layers are not supported".into()));
                }
                Some(MoeConfig {
                    num_experts: raw.num_experts.or(raw.num_local_experts).unwrap_or(128),
                    experts_per_token: raw.num_experts_per_tok.unwrap_or(8),
                    expert_intermediate_size: raw.moe_intermediate_size.unwrap_or(768),
                    normalize_top_k: raw.norm_topk_prob.unwrap_or(false),
                })
            }
            "mixtral" => Some(MoeConfig {
                num_experts: raw.num_local_experts.unwrap_or(8),
                experts_per_token: raw.num_experts_per_tok.unwrap_or(2),
                expert_intermediate_size: raw.intermediate_size,
                normalize_top_k: true,
            }),
            _ => None,
        };
        let softcap = |value: Option<Option<f32>>, default: Option<f32>| match value {
            Some(v) => v.filter(|&c| c > 0.0),
            None => default,
        };
        Self {
            vocab_size: raw.vocab_size,
            hidden_size: raw.hidden_size,
            intermediate_size: raw.intermediate_size,
            num_layers: layers,
            num_heads: raw.num_attention_heads,
            num_kv_heads,
            head_dim: raw.head_dim.unwrap_or(if gemma {
                256
            } else {
                raw.hidden_size / raw.num_attention_heads
            }),
            rms_norm_eps: raw.rms_norm_eps.unwrap_or(eps),
            rope_theta: raw.rope_theta.unwrap_or(theta),
            rope_scaling,
            rope_freq_factors: None,
            rope_style: RotaryStyle::Halves,
            max_position_embeddings: max_positions,
            tie_word_embeddings: raw.tie_word_embeddings.unwrap_or(gemma),
            attention_bias: raw.attention_bias.unwrap_or(arch == "qwen2"),
            qk_norm: matches!(arch, "qwen3" | "qwen3moe" | "gemma3"),
            sliding_window,
            sliding_layers,
            rope_local_theta: match arch {
                "gemma3" => Some(raw.rope_local_base_freq.unwrap_or(10_000.0)),
                _ => None,
            },
            query_pre_attn_scalar: if gemma { raw.query_pre_attn_scalar.or(query_scalar) } else { None },
            attn_logit_softcapping: softcap(raw.attn_logit_softcapping, attn_cap),
            final_logit_softcapping: softcap(raw.final_logit_softcapping, final_cap),
            moe,
            long_rope,
            architecture,
        }
        .validated(path)
    }
}

#[derive(Debug, Clone, Deserialize)]
struct HfRopeScaling {
    rope_theta: Option<f32>,
    rope_type: Option<String>,
    #[serde(rename = "type")]
    kind: Option<String>,
    factor: Option<f32>,
    low_freq_factor: Option<f32>,
    high_freq_factor: Option<f32>,
    original_max_position_embeddings: Option<usize>,
    short_factor: Option<Vec<f32>>,
    long_factor: Option<Vec<f32>>,
    attention_factor: Option<f32>,
    partial_rotary_factor: Option<f32>,
}

/// Tells an absent key (outer `None`) from an explicit `null` (`Some(None)`).
fn double_option<'de, D, T>(deserializer: D) -> std::result::Result<Option<Option<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(deserializer).map(Some)
}

#[derive(Debug, Deserialize)]
struct HfConfig {
    model_type: Option<String>,
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    rms_norm_eps: Option<f32>,
    rope_theta: Option<f32>,
    rope_scaling: Option<HfRopeScaling>,
    /// transformers 5's home of the rope settings: one set, or one per layer type.
    rope_parameters: Option<serde_json::Value>,
    max_position_embeddings: Option<usize>,
    original_max_position_embeddings: Option<usize>,
    partial_rotary_factor: Option<f32>,
    tie_word_embeddings: Option<bool>,
    attention_bias: Option<bool>,
    /// Outer `None`: absent (the class default applies); inner `None`: `null` (no window).
    #[serde(default, deserialize_with = "double_option")]
    sliding_window: Option<Option<usize>>,
    /// Qwen2/3 list a window they do not use unless this is set.
    use_sliding_window: Option<bool>,
    sliding_window_pattern: Option<usize>,
    /// Per layer, `sliding_attention` or `full_attention` (newer Gemma configs).
    layer_types: Option<Vec<String>>,
    rope_local_base_freq: Option<f32>,
    query_pre_attn_scalar: Option<f32>,
    /// Outer `None`: absent (the class default applies); inner `None`: `null` (off).
    #[serde(default, deserialize_with = "double_option")]
    attn_logit_softcapping: Option<Option<f32>>,
    #[serde(default, deserialize_with = "double_option")]
    final_logit_softcapping: Option<Option<f32>>,
    num_experts: Option<usize>,
    num_local_experts: Option<usize>,
    num_experts_per_tok: Option<usize>,
    moe_intermediate_size: Option<usize>,
    norm_topk_prob: Option<bool>,
    decoder_sparse_step: Option<usize>,
    #[serde(default)]
    mlp_only_layers: Vec<usize>,
}

impl HfConfig {
    /// Moves transformers 5's `rope_parameters` (written instead of `rope_theta`/`rope_scaling`)
    /// into the legacy fields, which it takes precedence over: a flat set applies to every layer;
    /// a set per layer type gives the global (`full_attention`) and local (`sliding_attention`)
    /// bases.
    fn take_rope_parameters(&mut self) -> std::result::Result<(), serde_json::Error> {
        let Some(value) = self.rope_parameters.take() else { return Ok(()) };
        let (global, local) = match value.get("full_attention") {
            Some(full) => (full.clone(), value.get("sliding_attention").cloned()),
            None => (value, None),
        };
        let global: HfRopeScaling = serde_json::from_value(global)?;
        if let Some(local) = local {
            let local: HfRopeScaling = serde_json::from_value(local)?;
            self.rope_local_base_freq = local.rope_theta.or(self.rope_local_base_freq);
        }
        self.rope_theta = global.rope_theta.or(self.rope_theta);
        self.partial_rotary_factor = self.partial_rotary_factor.or(global.partial_rotary_factor);
        self.rope_scaling = Some(global);
        Ok(())
    }
}

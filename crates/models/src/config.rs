//! The shape of a model (Llama family, Gemma 3), read from GGUF metadata or a Hugging Face
//! `config.json`.

use std::collections::HashMap;
use std::path::Path;

use candle_core::quantized::gguf_file;
use pagoda_ops::{RopeScaling, RotaryStyle};
use serde::Deserialize;

use crate::error::{ModelError, Result};

/// Everything a forward pass needs to know about the model's shape.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
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
    /// Local attention span of the layers that use one (Mistral, Gemma 3's local layers).
    pub sliding_window: Option<usize>,
    /// Which layers attend only inside `sliding_window`; `num_layers` entries.
    pub sliding_layers: Vec<bool>,
    /// Rope base of the windowed layers when it differs from `rope_theta` (Gemma 3: 10k local,
    /// 1M global). The windowed layers' rope is never scaled.
    pub rope_local_theta: Option<f32>,
    /// Attention scores are scaled by `query_pre_attn_scalar^-1/2` rather than `head_dim^-1/2`
    /// (Gemma).
    pub query_pre_attn_scalar: Option<f32>,
}

const SUPPORTED: &[&str] = &["llama", "mistral", "qwen2", "smollm", "gemma3"];

/// Gemma 3 makes every sixth layer global and the others local.
const GEMMA3_SLIDING_PATTERN: usize = 6;
/// Gemma 3's local rope base; llama.cpp's GGUFs do not store it.
const GEMMA3_LOCAL_ROPE_THETA: f32 = 10_000.0;

/// Whether each of `num_layers` layers is windowed when all but every `pattern`-th one are.
fn sliding_pattern(num_layers: usize, pattern: usize) -> Vec<bool> {
    (0..num_layers).map(|i| pattern == 0 || (i + 1) % pattern != 0).collect()
}

fn check_architecture(path: &Path, architecture: &str) -> Result<()> {
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
    /// Reads the `{arch}.*` keys of a GGUF file. `has_output` says whether the file has its own
    /// lm-head tensor (else embeddings are tied).
    pub fn from_gguf(
        path: &Path,
        metadata: &HashMap<String, gguf_file::Value>,
        has_output: bool,
        has_qkv_bias: bool,
    ) -> Result<Self> {
        let err = |message: String| ModelError::Config { path: path.to_path_buf(), message };
        let get = |key: &str| metadata.get(key).ok_or_else(|| err(format!("missing metadata key `{key}`")));
        let architecture = get("general.architecture")?
            .to_string()
            .map_err(|e| err(format!("general.architecture: {e}")))?
            .clone();
        check_architecture(path, &architecture)?;
        let arch = architecture.as_str();
        let int = |key: &str| -> Result<usize> {
            let full = format!("{arch}.{key}");
            let v = get(&full)?;
            v.to_u64()
                .map(|v| v as usize)
                .or_else(|_| v.to_u32().map(|v| v as usize))
                .or_else(|_| v.to_i32().map(|v| v as usize))
                .map_err(|e| err(format!("{full}: {e}")))
        };
        let float = |key: &str| -> Result<Option<f32>> {
            let full = format!("{arch}.{key}");
            match metadata.get(&full) {
                None => Ok(None),
                Some(v) => v.to_f32().map(Some).map_err(|e| err(format!("{full}: {e}"))),
            }
        };
        let hidden_size = int("embedding_length")?;
        let num_heads = int("attention.head_count")?;
        let num_kv_heads = int("attention.head_count_kv").unwrap_or(num_heads);
        if num_heads == 0 || num_kv_heads == 0 || num_heads % num_kv_heads != 0 {
            return Err(err(format!("{num_heads} heads cannot be grouped over {num_kv_heads} KV heads")));
        }
        let head_dim = int("attention.key_length").unwrap_or(hidden_size / num_heads);
        let vocab_size = match int("vocab_size") {
            Ok(v) => v,
            Err(_) => get("tokenizer.ggml.tokens")?
                .to_vec()
                .map_err(|e| err(format!("tokenizer.ggml.tokens: {e}")))?
                .len(),
        };
        // llama.cpp's converter permutes Q/K rows of llama-type models so that rotary pairs
        // adjacent dimensions; Qwen2 keeps the Hugging Face (halves) order.
        let rope_style =
            if matches!(arch, "qwen2" | "gemma3") { RotaryStyle::Halves } else { RotaryStyle::Interleaved };
        let num_layers = int("block_count")?;
        let sliding_window = int("attention.sliding_window").ok().filter(|&w| w > 0);
        let gemma3 = arch == "gemma3";
        let sliding_layers = match sliding_window {
            None => vec![false; num_layers],
            Some(_) if gemma3 => sliding_pattern(
                num_layers,
                int("attention.sliding_window_pattern").unwrap_or(GEMMA3_SLIDING_PATTERN),
            ),
            Some(_) => vec![true; num_layers],
        };
        // llama.cpp's rule: Gemma 3 27B scales by hidden / heads, the others by head_dim.
        let query_pre_attn_scalar = gemma3.then(|| match num_layers {
            62 => (hidden_size / num_heads) as f32,
            _ => head_dim as f32,
        });
        let rope_local_theta = match float("rope.freq_base_swa")? {
            Some(theta) => Some(theta),
            None => gemma3.then_some(GEMMA3_LOCAL_ROPE_THETA),
        };
        Self {
            vocab_size,
            hidden_size,
            intermediate_size: int("feed_forward_length")?,
            num_layers,
            num_heads,
            num_kv_heads,
            head_dim,
            rms_norm_eps: float("attention.layer_norm_rms_epsilon")?.unwrap_or(1e-5),
            rope_theta: float("rope.freq_base")?.unwrap_or(10_000.0),
            rope_scaling: match (
                metadata.get(&format!("{arch}.rope.scaling.type")).and_then(|v| v.to_string().ok()),
                float("rope.scaling.factor")?,
            ) {
                (Some(t), Some(factor)) if t == "linear" => RopeScaling::Linear { factor },
                _ => RopeScaling::None,
            },
            rope_freq_factors: None,
            rope_style,
            max_position_embeddings: int("context_length").unwrap_or(4096),
            tie_word_embeddings: !has_output,
            attention_bias: has_qkv_bias,
            sliding_window,
            sliding_layers,
            rope_local_theta,
            query_pre_attn_scalar,
            architecture,
        }
        .validated(path)
    }

    /// Reads a Hugging Face `config.json`.
    pub fn from_hf_json(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| ModelError::Io { path: path.to_path_buf(), source })?;
        Self::from_hf_str(path, &text)
    }

    /// Parses the text of a Hugging Face `config.json`; `path` is only used in errors.
    pub fn from_hf_str(path: &Path, text: &str) -> Result<Self> {
        let err = |message: String| ModelError::Config { path: path.to_path_buf(), message };
        let raw: HfConfig = serde_json::from_str(text).map_err(|e| err(e.to_string()))?;
        let architecture = raw.model_type.clone().unwrap_or_else(|| "llama".to_string());
        check_architecture(path, &architecture)?;
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
                Some("default") | None => RopeScaling::None,
                Some(other) => return Err(err(format!("unsupported rope_scaling type `{other}`"))),
            },
        };
        let sliding_window = raw
            .sliding_window
            .filter(|&w| w > 0 && raw.use_sliding_window.unwrap_or(architecture != "qwen2"));
        Self {
            vocab_size: raw.vocab_size,
            hidden_size: raw.hidden_size,
            intermediate_size: raw.intermediate_size,
            num_layers: raw.num_hidden_layers,
            num_heads: raw.num_attention_heads,
            num_kv_heads,
            head_dim: raw.head_dim.unwrap_or(raw.hidden_size / raw.num_attention_heads),
            rms_norm_eps: raw.rms_norm_eps.unwrap_or(1e-5),
            rope_theta: raw.rope_theta.unwrap_or(10_000.0),
            rope_scaling,
            rope_freq_factors: None,
            rope_style: RotaryStyle::Halves,
            max_position_embeddings: raw.max_position_embeddings.unwrap_or(4096),
            tie_word_embeddings: raw.tie_word_embeddings.unwrap_or(false),
            attention_bias: raw.attention_bias.unwrap_or(architecture == "qwen2"),
            sliding_window,
            sliding_layers: vec![sliding_window.is_some(); raw.num_hidden_layers],
            rope_local_theta: None,
            query_pre_attn_scalar: None,
            architecture,
        }
        .validated(path)
    }

    fn validated(self, path: &Path) -> Result<Self> {
        let problem = if self.num_layers == 0 {
            Some("the model has no layers".to_string())
        } else if self.vocab_size == 0 || self.hidden_size == 0 || self.intermediate_size == 0 {
            Some("vocab, hidden and intermediate sizes must be positive".to_string())
        } else if self.head_dim == 0 || !self.head_dim.is_multiple_of(2) {
            Some(format!("head_dim {} must be even and positive", self.head_dim))
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

#[derive(Debug, Deserialize)]
struct HfRopeScaling {
    rope_type: Option<String>,
    #[serde(rename = "type")]
    kind: Option<String>,
    factor: Option<f32>,
    low_freq_factor: Option<f32>,
    high_freq_factor: Option<f32>,
    original_max_position_embeddings: Option<usize>,
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
    max_position_embeddings: Option<usize>,
    tie_word_embeddings: Option<bool>,
    attention_bias: Option<bool>,
    sliding_window: Option<usize>,
    /// Qwen2 lists a window it does not use unless this is set.
    use_sliding_window: Option<bool>,
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

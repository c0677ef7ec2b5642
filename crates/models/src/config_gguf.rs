//! [`ModelConfig`] from a GGUF file's `{arch}.*` metadata, with llama.cpp's conventions: its
//! architecture names, its Q/K row permutation for llama-type models, and the Gemma constants it
//! does not store.

use std::collections::HashMap;
use std::path::Path;

use candle_core::quantized::gguf_file;
use pagoda_ops::{RopeScaling, RotaryStyle};

use crate::config::{
    check_architecture, gemma_query_scalar, sliding_pattern, ModelConfig, MoeConfig, GEMMA2_SLIDING_PATTERN,
    GEMMA3_LOCAL_ROPE_THETA, GEMMA3_SLIDING_PATTERN,
};
use crate::error::{ModelError, Result};

impl ModelConfig {
    /// Reads the `{arch}.*` keys of a GGUF file. `has_output` says whether the file has its own
    /// lm-head tensor (else embeddings are tied). Tensors that carry configuration (rope factor
    /// tables) are read by the loader.
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
        let flag = |key: &str| metadata.get(&format!("{arch}.{key}")).and_then(|v| v.to_bool().ok());
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
        let gemma = matches!(arch, "gemma2" | "gemma3");
        // llama.cpp's converter permutes Q/K rows of llama-type models so that rotary pairs
        // adjacent dimensions; the others keep the Hugging Face (halves) order.
        let rope_style = match arch {
            "llama" | "mistral" | "smollm" => RotaryStyle::Interleaved,
            _ => RotaryStyle::Halves,
        };
        let num_layers = int("block_count")?;
        let sliding_window = int("attention.sliding_window").ok().filter(|&w| w > 0);
        let pattern = |default: usize| int("attention.sliding_window_pattern").unwrap_or(default);
        let sliding_layers = match (sliding_window, arch) {
            (None, _) => vec![false; num_layers],
            (Some(_), "gemma3") => sliding_pattern(num_layers, pattern(GEMMA3_SLIDING_PATTERN)),
            (Some(_), "gemma2") => sliding_pattern(num_layers, pattern(GEMMA2_SLIDING_PATTERN)),
            (Some(_), _) => vec![true; num_layers],
        };
        let rope_local_theta = match float("rope.freq_base_swa")? {
            Some(theta) => Some(theta),
            None => (arch == "gemma3").then_some(GEMMA3_LOCAL_ROPE_THETA),
        };
        let moe = match int("expert_count").unwrap_or(0) {
            0 => None,
            num_experts => Some(MoeConfig {
                num_experts,
                experts_per_token: int("expert_used_count")?,
                expert_intermediate_size: int("expert_feed_forward_length")
                    .or_else(|_| int("feed_forward_length"))?,
                // llama.cpp renormalizes Mixtral's and Qwen3-MoE's top-k weights.
                normalize_top_k: flag("expert_weights_norm").unwrap_or(true),
            }),
        };
        Self {
            vocab_size,
            hidden_size,
            intermediate_size: int("feed_forward_length")
                .or_else(|e| moe.map(|m| m.expert_intermediate_size).ok_or(e))?,
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
            qk_norm: matches!(arch, "qwen3" | "qwen3moe" | "gemma3"),
            sliding_window,
            sliding_layers,
            rope_local_theta,
            query_pre_attn_scalar: gemma
                .then(|| gemma_query_scalar(num_layers, hidden_size, num_heads, head_dim)),
            attn_logit_softcapping: float("attn_logit_softcapping")?.filter(|&c| c > 0.0),
            final_logit_softcapping: float("final_logit_softcapping")?.filter(|&c| c > 0.0),
            moe,
            long_rope: None,
            architecture,
        }
        .validated(path)
    }
}

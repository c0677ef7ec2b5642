//! Weights from a Hugging Face model directory: `config.json` plus `*.safetensors` (bf16/f16/f32).

use std::path::{Path, PathBuf};

use candle_core::safetensors::MmapedSafetensors;
use candle_core::{DType, Device, Tensor};

use super::{check_shape, WeightSource};
use crate::error::{ModelError, Result};
use crate::linear::{Linear, LinearWeight};

pub struct SafetensorsWeights {
    dir: PathBuf,
    tensors: MmapedSafetensors,
    device: Device,
    dtype: DType,
}

/// Maps our GGUF-style tensor names to Hugging Face Llama names.
fn hf_name(name: &str) -> String {
    let fixed = match name {
        "token_embd.weight" => Some("model.embed_tokens.weight"),
        "output_norm.weight" => Some("model.norm.weight"),
        "output.weight" => Some("lm_head.weight"),
        _ => None,
    };
    if let Some(n) = fixed {
        return n.to_string();
    }
    let Some(rest) = name.strip_prefix("blk.") else { return name.to_string() };
    let Some((layer, tail)) = rest.split_once('.') else { return name.to_string() };
    let (part, suffix) = tail.split_once('.').unwrap_or((tail, "weight"));
    let module = match part {
        "attn_norm" => "input_layernorm",
        "ffn_norm" => "post_attention_layernorm",
        "attn_q" => "self_attn.q_proj",
        "attn_k" => "self_attn.k_proj",
        "attn_v" => "self_attn.v_proj",
        "attn_output" => "self_attn.o_proj",
        "ffn_gate" => "mlp.gate_proj",
        "ffn_up" => "mlp.up_proj",
        "ffn_down" => "mlp.down_proj",
        other => other,
    };
    format!("model.layers.{layer}.{module}.{suffix}")
}

impl SafetensorsWeights {
    /// Memory-maps every `*.safetensors` file in `dir`.
    pub fn open(dir: &Path, device: &Device, dtype: DType) -> Result<Self> {
        let io = |source| ModelError::Io { path: dir.to_path_buf(), source };
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(io)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
            .collect();
        files.sort();
        if files.is_empty() {
            return Err(ModelError::Config {
                path: dir.to_path_buf(),
                message: "no *.safetensors files".into(),
            });
        }
        // SAFETY: the files are opened read-only; modifying them while the server runs is
        // outside what we support, as with every mmap-based loader.
        #[allow(unsafe_code)]
        let tensors = unsafe { MmapedSafetensors::multi(&files) }
            .map_err(|e| ModelError::Config { path: dir.to_path_buf(), message: e.to_string() })?;
        Ok(Self { dir: dir.to_path_buf(), tensors, device: device.clone(), dtype })
    }

    fn load(&self, name: &str, shape: &[usize]) -> Result<Tensor> {
        let hf = hf_name(name);
        let view = self
            .tensors
            .get(&hf)
            .map_err(|_| ModelError::MissingTensor { path: self.dir.clone(), tensor: hf.clone() })?;
        use ::safetensors::Dtype as S;
        if !matches!(view.dtype(), S::BF16 | S::F16 | S::F32) {
            return Err(ModelError::UnsupportedDtype {
                path: self.dir.clone(),
                tensor: hf,
                dtype: format!("{:?}", view.dtype()),
            });
        }
        check_shape(&self.dir, &hf, shape, view.shape())?;
        Ok(self.tensors.load(&hf, &self.device)?.to_dtype(self.dtype)?)
    }
}

impl WeightSource for SafetensorsWeights {
    fn path(&self) -> &Path {
        &self.dir
    }

    fn device(&self) -> &Device {
        &self.device
    }

    fn contains(&self, name: &str) -> bool {
        self.tensors.get(&hf_name(name)).is_ok()
    }

    fn dense(&mut self, name: &str, shape: &[usize]) -> Result<Tensor> {
        self.load(name, shape)
    }

    fn linear(&mut self, name: &str, out_dim: usize, in_dim: usize, bias: Option<&str>) -> Result<Linear> {
        let weight = LinearWeight::Dense(self.load(name, &[out_dim, in_dim])?);
        let bias = match bias {
            Some(b) if self.contains(b) => Some(self.load(b, &[out_dim])?),
            _ => None,
        };
        Ok(Linear::new(weight, bias))
    }
}

#[cfg(test)]
mod tests {
    use super::hf_name;

    #[test]
    fn maps_gguf_names_to_hf() {
        assert_eq!(hf_name("blk.3.attn_q.weight"), "model.layers.3.self_attn.q_proj.weight");
        assert_eq!(hf_name("blk.0.attn_k.bias"), "model.layers.0.self_attn.k_proj.bias");
        assert_eq!(hf_name("blk.12.ffn_norm.weight"), "model.layers.12.post_attention_layernorm.weight");
        assert_eq!(hf_name("output.weight"), "lm_head.weight");
        assert_eq!(hf_name("token_embd.weight"), "model.embed_tokens.weight");
    }
}

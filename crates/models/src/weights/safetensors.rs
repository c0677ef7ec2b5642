//! Weights from a Hugging Face model directory: `config.json` plus `*.safetensors` (bf16/f16/f32).

use std::path::{Path, PathBuf};

use candle_core::safetensors::MmapedSafetensors;
use candle_core::{DType, Device, Tensor};

use super::{check_shape, WeightSource};
use crate::error::{ModelError, Result};
use crate::kernel_plan::KernelPlan;
use crate::linear::Linear;
use crate::linear_fp8::WeightQuantization;

pub struct SafetensorsWeights {
    dir: PathBuf,
    /// Decides the naming, and Gemma's norm convention.
    architecture: String,
    tensors: MmapedSafetensors,
    device: Device,
    dtype: DType,
    /// How the CPU multiplies the (dense) projections.
    kernel_plan: KernelPlan,
    /// How dense layer projections are stored (`--quantization`).
    quantization: Option<WeightQuantization>,
}

/// Maps our GGUF-style tensor names to Hugging Face names for `architecture`; other names (a
/// vision tower's, asked for by their Hugging Face names) pass through unchanged.
fn hf_name(architecture: &str, name: &str) -> String {
    if !(name.starts_with("blk.")
        || matches!(name, "token_embd.weight" | "output_norm.weight" | "output.weight"))
    {
        return name.to_string();
    }
    let name = hf_text_name(architecture, name);
    // Idefics3 (SmolVLM) nests its Llama decoder under `model.text_model`; the lm head stays.
    match name.strip_prefix("model.") {
        Some(rest) if architecture == "idefics3" => format!("model.text_model.{rest}"),
        _ => name,
    }
}

/// [`hf_name`] of a decoder-only checkpoint.
fn hf_text_name(architecture: &str, name: &str) -> String {
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
    let gemma = architecture.starts_with("gemma");
    let module = match part {
        "attn_norm" => "input_layernorm",
        // Gemma normalizes attention's output and the MLP's input separately.
        "post_attention_norm" => "post_attention_layernorm",
        "ffn_norm" if gemma => "pre_feedforward_layernorm",
        "post_ffw_norm" => "post_feedforward_layernorm",
        "ffn_norm" => "post_attention_layernorm",
        "attn_q" => "self_attn.q_proj",
        "attn_k" => "self_attn.k_proj",
        "attn_v" => "self_attn.v_proj",
        "attn_output" => "self_attn.o_proj",
        "attn_q_norm" => "self_attn.q_norm",
        "attn_k_norm" => "self_attn.k_norm",
        "ffn_gate" => "mlp.gate_proj",
        "attn_qkv" => "self_attn.qkv_proj",
        "ffn_up" if architecture == "phi3" => "mlp.gate_up_proj",
        "ffn_up" => "mlp.up_proj",
        "ffn_down" => "mlp.down_proj",
        "ffn_gate_inp" if architecture == "mixtral" => "block_sparse_moe.gate",
        "ffn_gate_inp" => "mlp.gate",
        other => other,
    };
    format!("model.layers.{layer}.{module}.{suffix}")
}

/// Hugging Face name of expert `expert` of the stacked weight `name` (`blk.N.ffn_gate_exps.weight`).
fn hf_expert_name(architecture: &str, name: &str, expert: usize) -> Option<String> {
    let rest = name.strip_prefix("blk.")?;
    let (layer, tail) = rest.split_once('.')?;
    let (part, suffix) = tail.split_once('.')?;
    let projection = match (architecture, part) {
        ("mixtral", "ffn_gate_exps") => "w1",
        ("mixtral", "ffn_down_exps") => "w2",
        ("mixtral", "ffn_up_exps") => "w3",
        (_, "ffn_gate_exps") => "gate_proj",
        (_, "ffn_up_exps") => "up_proj",
        (_, "ffn_down_exps") => "down_proj",
        _ => return None,
    };
    let block = if architecture == "mixtral" { "block_sparse_moe" } else { "mlp" };
    Some(format!("model.layers.{layer}.{block}.experts.{expert}.{projection}.{suffix}"))
}

impl SafetensorsWeights {
    /// Memory-maps every `*.safetensors` file in `dir`, named as `architecture` names them.
    pub fn open(dir: &Path, architecture: &str, device: &Device, dtype: DType) -> Result<Self> {
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
        Ok(Self {
            dir: dir.to_path_buf(),
            architecture: architecture.to_string(),
            tensors,
            device: device.clone(),
            dtype,
            kernel_plan: KernelPlan::default(),
            quantization: None,
        })
    }

    pub fn set_kernel_plan(&mut self, plan: KernelPlan) {
        self.kernel_plan = plan;
    }

    pub fn set_quantization(&mut self, quantization: Option<WeightQuantization>) {
        self.quantization = quantization;
    }

    fn load(&self, name: &str, shape: &[usize]) -> Result<Tensor> {
        self.load_hf(hf_name(&self.architecture, name), shape)
    }

    fn load_hf(&self, hf: String, shape: &[usize]) -> Result<Tensor> {
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

    /// Gemma's RMSNorm multiplies by `1 + w`; our norms multiply by the stored weight, as GGUF
    /// files store it.
    fn shifts_norms(&self) -> bool {
        self.architecture.starts_with("gemma")
    }
}

impl WeightSource for SafetensorsWeights {
    fn kernel_plan(&self) -> KernelPlan {
        self.kernel_plan
    }

    fn quantization(&self) -> Option<WeightQuantization> {
        self.quantization
    }

    fn path(&self) -> &Path {
        &self.dir
    }

    fn device(&self) -> &Device {
        &self.device
    }

    fn contains(&self, name: &str) -> bool {
        self.tensors.get(&hf_name(&self.architecture, name)).is_ok()
    }

    fn dense(&mut self, name: &str, shape: &[usize]) -> Result<Tensor> {
        let tensor = self.load(name, shape)?;
        if self.shifts_norms() && name.ends_with("norm.weight") {
            return Ok((tensor + 1.0)?);
        }
        Ok(tensor)
    }

    fn experts(&mut self, name: &str, num_experts: usize, rows: usize, cols: usize) -> Result<Vec<Linear>> {
        (0..num_experts)
            .map(|e| {
                let hf =
                    hf_expert_name(&self.architecture, name, e).ok_or_else(|| ModelError::MissingTensor {
                        path: self.dir.clone(),
                        tensor: format!("{name} (expert {e})"),
                    })?;
                Linear::dense(self.load_hf(hf, &[rows, cols])?, None, self.kernel_plan)
            })
            .collect()
    }

    fn linear(&mut self, name: &str, out_dim: usize, in_dim: usize, bias: Option<&str>) -> Result<Linear> {
        let weight = self.load(name, &[out_dim, in_dim])?;
        let bias = match bias {
            Some(b) if self.contains(b) => Some(self.load(b, &[out_dim])?),
            _ => None,
        };
        Linear::dense(weight, bias, self.kernel_plan)
    }
}

#[cfg(test)]
mod tests {
    use super::{hf_expert_name, hf_name};

    #[test]
    fn maps_gguf_names_to_hf() {
        let llama = |n| hf_name("llama", n);
        assert_eq!(llama("blk.3.attn_q.weight"), "model.layers.3.self_attn.q_proj.weight");
        assert_eq!(llama("blk.0.attn_k.bias"), "model.layers.0.self_attn.k_proj.bias");
        assert_eq!(llama("blk.12.ffn_norm.weight"), "model.layers.12.post_attention_layernorm.weight");
        assert_eq!(llama("output.weight"), "lm_head.weight");
        assert_eq!(llama("token_embd.weight"), "model.embed_tokens.weight");
        let idefics3 = |n| hf_name("idefics3", n);
        assert_eq!(
            idefics3("blk.2.ffn_norm.weight"),
            "model.text_model.layers.2.post_attention_layernorm.weight"
        );
        assert_eq!(idefics3("token_embd.weight"), "model.text_model.embed_tokens.weight");
        assert_eq!(idefics3("output.weight"), "lm_head.weight");
        let vision = "model.vision_model.encoder.layers.0.mlp.fc1.weight";
        assert_eq!(idefics3(vision), vision);
        let gemma = |n| hf_name("gemma3", n);
        assert_eq!(gemma("blk.1.ffn_norm.weight"), "model.layers.1.pre_feedforward_layernorm.weight");
        assert_eq!(
            gemma("blk.1.post_attention_norm.weight"),
            "model.layers.1.post_attention_layernorm.weight"
        );
        assert_eq!(gemma("blk.1.attn_q_norm.weight"), "model.layers.1.self_attn.q_norm.weight");
        assert_eq!(hf_name("qwen3moe", "blk.2.ffn_gate_inp.weight"), "model.layers.2.mlp.gate.weight");
        assert_eq!(
            hf_name("mixtral", "blk.2.ffn_gate_inp.weight"),
            "model.layers.2.block_sparse_moe.gate.weight"
        );
        assert_eq!(
            hf_expert_name("mixtral", "blk.2.ffn_up_exps.weight", 5).unwrap(),
            "model.layers.2.block_sparse_moe.experts.5.w3.weight"
        );
        assert_eq!(
            hf_expert_name("qwen3moe", "blk.0.ffn_down_exps.weight", 1).unwrap(),
            "model.layers.0.mlp.experts.1.down_proj.weight"
        );
    }
}

//! LoRA adapters in PEFT's format (`adapter_config.json` + `adapter_model.safetensors`) and
//! how a step applies several of them at once. A projection `W` adapted with rank-`r` matrices
//! `A` (`[r, in]`) and `B` (`[out, r]`) computes `W x + s * B (A x)`, `s` being `alpha / r`
//! (`alpha / sqrt(r)` with rsLoRA). A step's rows are the batch's sequences one after another;
//! [`LoraBatch`] splits them into segments of one adapter (or none), and one op
//! (`pagoda_ops::lora_add`) adds each segment's adapter delta to the base projection's output,
//! so sequences of many adapters and of the base model share one step, as Punica's segmented
//! gather does.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use serde_json::Value;

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};

/// The projections an adapter may adapt, by PEFT's module names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LoraModule {
    Q,
    K,
    V,
    O,
    Gate,
    Up,
    Down,
}

impl LoraModule {
    const ALL: [LoraModule; 7] = [
        LoraModule::Q,
        LoraModule::K,
        LoraModule::V,
        LoraModule::O,
        LoraModule::Gate,
        LoraModule::Up,
        LoraModule::Down,
    ];

    /// PEFT's name and the module's path under a layer.
    fn peft_name(self) -> (&'static str, &'static str) {
        match self {
            LoraModule::Q => ("q_proj", "self_attn"),
            LoraModule::K => ("k_proj", "self_attn"),
            LoraModule::V => ("v_proj", "self_attn"),
            LoraModule::O => ("o_proj", "self_attn"),
            LoraModule::Gate => ("gate_proj", "mlp"),
            LoraModule::Up => ("up_proj", "mlp"),
            LoraModule::Down => ("down_proj", "mlp"),
        }
    }

    /// (input, output) width of the module in `c`.
    fn dims(self, c: &ModelConfig) -> (usize, usize) {
        let (h, q, kv, ffn) = (c.hidden_size, c.q_size(), c.kv_size(), c.intermediate_size);
        match self {
            LoraModule::Q => (h, q),
            LoraModule::K | LoraModule::V => (h, kv),
            LoraModule::O => (q, h),
            LoraModule::Gate | LoraModule::Up => (h, ffn),
            LoraModule::Down => (ffn, h),
        }
    }
}

/// One adapted projection: `A` (`[r, in]`) and `s * B` (`[out, r]`).
#[derive(Debug, Clone)]
struct LoraPair {
    a: Tensor,
    b: Tensor,
}

/// A loaded adapter: per layer, the pair of each module it adapts.
#[derive(Debug)]
pub struct LoraAdapter {
    rank: usize,
    layers: Vec<[Option<LoraPair>; 7]>,
}

impl LoraAdapter {
    /// The PEFT adapter in `dir` for a model of shape `config`, its weights in `dtype` on
    /// `device`. Refuses ranks above `max_rank`, modules other than the seven projections,
    /// options that change the computation (DoRA, biases, per-module ranks, `fan_in_fan_out`)
    /// and any tensor whose shape does not fit the model.
    pub fn load_peft(
        dir: &Path,
        config: &ModelConfig,
        max_rank: usize,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let config_path = dir.join("adapter_config.json");
        let bad = |message: String| ModelError::Config { path: config_path.clone(), message };
        let text = std::fs::read_to_string(&config_path)
            .map_err(|source| ModelError::Io { path: config_path.clone(), source })?;
        let c: Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
        if c["peft_type"].as_str() != Some("LORA") {
            return Err(bad(format!("peft_type {} is not LORA", c["peft_type"])));
        }
        let rank =
            c["r"].as_u64().filter(|&r| r > 0).ok_or_else(|| bad("r must be a positive integer".into()))?
                as usize;
        if rank > max_rank {
            return Err(bad(format!("rank {rank} is above the server's --max-lora-rank {max_rank}")));
        }
        let alpha = c["lora_alpha"].as_f64().ok_or_else(|| bad("lora_alpha is missing".into()))?;
        let refused = [
            ("use_dora", c["use_dora"].as_bool().unwrap_or(false)),
            ("fan_in_fan_out", c["fan_in_fan_out"].as_bool().unwrap_or(false)),
            ("bias", c["bias"].as_str().is_some_and(|b| b != "none")),
            ("lora_bias", c["lora_bias"].as_bool().unwrap_or(false)),
            ("rank_pattern", c["rank_pattern"].as_object().is_some_and(|m| !m.is_empty())),
            ("alpha_pattern", c["alpha_pattern"].as_object().is_some_and(|m| !m.is_empty())),
            ("modules_to_save", c["modules_to_save"].as_array().is_some_and(|m| !m.is_empty())),
            ("layers_to_transform", !c["layers_to_transform"].is_null()),
        ];
        if let Some((key, _)) = refused.iter().find(|(_, set)| *set) {
            return Err(bad(format!("`{key}` is not supported")));
        }
        let targets: Vec<&str> = match &c["target_modules"] {
            Value::Array(list) => list.iter().filter_map(Value::as_str).collect(),
            other => return Err(bad(format!("target_modules must be a list of module names, got {other}"))),
        };
        let mut modules = BTreeSet::new();
        for target in targets {
            let module = LoraModule::ALL.into_iter().find(|m| m.peft_name().0 == target);
            modules.insert(module.ok_or_else(|| {
                bad(format!("target module `{target}` is not supported (q, k, v, o, gate, up and down projections are)"))
            })?);
        }
        let scale = if c["use_rslora"].as_bool().unwrap_or(false) {
            alpha / (rank as f64).sqrt()
        } else {
            alpha / rank as f64
        };
        let weights_path = dir.join("adapter_model.safetensors");
        let mut tensors = candle_core::safetensors::load(&weights_path, &Device::Cpu)
            .map_err(|e| ModelError::Config { path: weights_path.clone(), message: e.to_string() })?;
        let wrong = |message: String| ModelError::Config { path: weights_path.clone(), message };
        let mut layers: Vec<[Option<LoraPair>; 7]> =
            (0..config.num_layers).map(|_| Default::default()).collect();
        for (i, layer) in layers.iter_mut().enumerate() {
            for &module in &modules {
                let (name, parent) = module.peft_name();
                let key =
                    |ab: &str| format!("base_model.model.model.layers.{i}.{parent}.{name}.lora_{ab}.weight");
                let (Some(a), Some(b)) = (tensors.remove(&key("A")), tensors.remove(&key("B"))) else {
                    return Err(wrong(format!("{} or its lora_B is missing", key("A"))));
                };
                let (input, output) = module.dims(config);
                if a.dims() != [rank, input] || b.dims() != [output, rank] {
                    return Err(wrong(format!(
                        "layer {i} {name}: lora_A {:?} and lora_B {:?} do not fit the model ([{rank}, {input}] and [{output}, {rank}])",
                        a.dims(),
                        b.dims()
                    )));
                }
                let a = a.to_dtype(dtype)?.to_device(device)?;
                let b = (b.to_dtype(DType::F64)? * scale)?.to_dtype(dtype)?.to_device(device)?;
                layer[module as usize] = Some(LoraPair { a, b });
            }
        }
        if let Some(extra) = tensors.keys().min() {
            return Err(wrong(format!("tensor `{extra}` is not a LoRA weight of the targeted modules")));
        }
        Ok(Self { rank, layers })
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    fn pair(&self, layer: usize, module: LoraModule) -> Option<&LoraPair> {
        self.layers.get(layer).and_then(|l| l[module as usize].as_ref())
    }
}

/// Which adapter each row of a step uses: runs of rows with one adapter (or none).
#[derive(Debug, Clone, Default)]
pub struct LoraBatch {
    /// (first row, rows, adapter), covering the step's rows in order.
    segments: Vec<(usize, usize, Option<Arc<LoraAdapter>>)>,
}

impl LoraBatch {
    /// Adds `rows` rows running with `adapter` after those already added.
    pub fn push(&mut self, rows: usize, adapter: Option<Arc<LoraAdapter>>) {
        let start = self.segments.last().map_or(0, |&(s, n, _)| s + n);
        match self.segments.last_mut() {
            Some((_, n, last)) if same(last, &adapter) => *n += rows,
            _ => self.segments.push((start, rows, adapter)),
        }
    }

    /// Whether any row runs with an adapter.
    pub fn is_active(&self) -> bool {
        self.segments.iter().any(|(_, _, a)| a.is_some())
    }

    /// `base` (the projection of `x`, `[rows, out]` or `[rows, heads, head_dim]`) plus each
    /// row's adapter delta for `module` of layer `layer`, all segments in one op.
    pub fn apply(&self, layer: usize, module: LoraModule, x: &Tensor, base: Tensor) -> Result<Tensor> {
        let segments: Vec<pagoda_ops::LoraSegment> = self
            .segments
            .iter()
            .filter_map(|(start, rows, adapter)| {
                let pair = adapter.as_ref()?.pair(layer, module)?;
                Some(pagoda_ops::LoraSegment {
                    start: *start,
                    rows: *rows,
                    a: pair.a.clone(),
                    b: pair.b.clone(),
                })
            })
            .collect();
        if segments.is_empty() {
            return Ok(base);
        }
        Ok(pagoda_ops::lora_add(&base, x, &segments)?)
    }
}

fn same(a: &Option<Arc<LoraAdapter>>, b: &Option<Arc<LoraAdapter>>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => Arc::ptr_eq(a, b),
        _ => false,
    }
}

//! Reading LoRA adapters from disk: a PEFT directory (`adapter_config.json` +
//! `adapter_model.safetensors`) or a GGUF file as llama.cpp's `convert_lora_to_gguf.py` writes it
//! (`general.type = adapter`, `adapter.type = lora`, `adapter.lora.alpha`, tensors
//! `blk.N.<module>.weight.lora_a` / `.lora_b`). Both become the same [`AdapterFile`]: each adapted
//! projection's `A` (`[r, in]`), `B` (`[out, r]`) and scale, and the row order of Q and K.

use std::collections::BTreeMap;
use std::path::Path;

use candle_core::quantized::{gguf_file, GgmlDType};
use candle_core::{DType, Device, Tensor};
use serde_json::Value;

use crate::lora::LoraModule;
use crate::lora_open::{self, AdapterError, Confinement};

type Result<T> = std::result::Result<T, AdapterError>;

/// How an adapter orders the rows of its Q and K projections: as Hugging Face models do
/// (PEFT), or permuted for interleaved rotary pairs as llama.cpp's converter writes llama-type
/// models (a GGUF adapter of one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum QkRows {
    Halves,
    Interleaved,
}

/// What a file's pair adapts: one projection, or a fused one (Phi-3's `qkv_proj` and
/// `gate_up_proj`, llama.cpp's `attn_qkv`), whose `B` rows are its parts' one after another.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum FileModule {
    One(LoraModule),
    Qkv,
    GateUp,
}

impl FileModule {
    /// PEFT's name and the module's path under a layer.
    fn peft_name(self) -> (&'static str, &'static str) {
        match self {
            FileModule::One(m) => m.peft_name(),
            FileModule::Qkv => ("qkv_proj", "self_attn"),
            FileModule::GateUp => ("gate_up_proj", "mlp"),
        }
    }

    /// llama.cpp's name of the module's weight in a block (its `ffn_up` is Phi-3's gate and
    /// up together: the rows of `B` tell).
    fn gguf_name(self) -> &'static str {
        match self {
            FileModule::One(m) => gguf_name(m),
            FileModule::Qkv => "attn_qkv",
            FileModule::GateUp => "ffn_up",
        }
    }

    const ALL: [FileModule; 9] = [
        FileModule::One(LoraModule::Q),
        FileModule::One(LoraModule::K),
        FileModule::One(LoraModule::V),
        FileModule::One(LoraModule::O),
        FileModule::One(LoraModule::Gate),
        FileModule::One(LoraModule::Up),
        FileModule::One(LoraModule::Down),
        FileModule::Qkv,
        FileModule::GateUp,
    ];
}

/// One adapted projection as read: `A` `[r, in]`, `B` `[out, r]` (the file's dtype, or f32 for
/// a GGUF type other than F32 and BF16; on the CPU) and the scale of `B A`.
pub(crate) struct FilePair {
    pub layer: usize,
    pub module: FileModule,
    pub a: Tensor,
    pub b: Tensor,
    pub scale: f64,
}

pub(crate) struct AdapterFile {
    pub pairs: Vec<FilePair>,
    /// The Q/K row order, when the file fixes one (a GGUF adapter of a llama-type model).
    pub qk_rows: QkRows,
    /// The architecture the adapter was made for, when the file says.
    pub architecture: Option<String>,
}

/// Reads `path`: a `.gguf` file, else a PEFT directory, every file of it inside `confine` and
/// the weights at most `limit` bytes. `max_rank` bounds every pair's rank; `num_layers` the
/// layers named.
pub(crate) fn read_adapter(
    path: &Path,
    max_rank: usize,
    num_layers: usize,
    confine: &Confinement,
    limit: u64,
) -> Result<AdapterFile> {
    let file = if !path.is_dir() && path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf")) {
        read_gguf(path, confine, limit)?
    } else {
        read_peft(path, confine, limit)?
    };
    for p in &file.pairs {
        let rank = p.a.dim(0)?;
        if rank > max_rank {
            return Err(AdapterError::Mismatch(format!(
                "rank {rank} is above the server's --max-lora-rank {max_rank}"
            )));
        }
        if p.layer >= num_layers {
            return Err(AdapterError::Mismatch(format!(
                "layer {} is past the model's {num_layers} layers",
                p.layer
            )));
        }
    }
    Ok(file)
}

fn read_peft(dir: &Path, confine: &Confinement, limit: u64) -> Result<AdapterFile> {
    let bad = |message: String| AdapterError::invalid("adapter_config.json", message);
    let c = lora_open::read_config(&dir.join("adapter_config.json"), confine)?;
    if c["peft_type"].as_str() != Some("LORA") {
        return Err(bad(format!("peft_type {} is not LORA", c["peft_type"])));
    }
    let rank =
        c["r"].as_u64().filter(|&r| r > 0).ok_or_else(|| bad("r must be a positive integer".into()))?;
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
    let mut modules = Vec::new();
    for target in targets {
        let module = FileModule::ALL.into_iter().find(|m| m.peft_name().0 == target);
        modules.push(module.ok_or_else(|| {
            bad(format!(
                "target module `{target}` is not supported (q, k, v, o, gate, up and down projections \
                 are, and the fused qkv_proj and gate_up_proj)"
            ))
        })?);
    }
    modules.sort();
    modules.dedup();
    let scale = if c["use_rslora"].as_bool().unwrap_or(false) {
        alpha / (rank as f64).sqrt()
    } else {
        alpha / rank as f64
    };
    let bytes = lora_open::read_safetensors(&dir.join("adapter_model.safetensors"), confine, limit)?;
    let wrong = |message: String| AdapterError::invalid("adapter_model.safetensors", message);
    let mut tensors =
        candle_core::safetensors::load_buffer(&bytes, &Device::Cpu).map_err(|e| wrong(e.to_string()))?;
    drop(bytes);
    // Layers by the tensors present: a layer the file names is checked against the model later.
    let key = |i: usize, module: FileModule, ab: &str| {
        let (name, parent) = module.peft_name();
        format!("base_model.model.model.layers.{i}.{parent}.{name}.lora_{ab}.weight")
    };
    let mut pairs = Vec::new();
    for i in 0.. {
        if !modules.iter().any(|&m| tensors.contains_key(&key(i, m, "A"))) {
            break;
        }
        for &module in &modules {
            let (Some(a), Some(b)) =
                (tensors.remove(&key(i, module, "A")), tensors.remove(&key(i, module, "B")))
            else {
                return Err(wrong(format!("{} or its lora_B is missing", key(i, module, "A"))));
            };
            if a.dim(0)? != rank as usize || b.dims().get(1) != Some(&(rank as usize)) {
                return Err(wrong(format!(
                    "layer {i} {}: lora_A {:?} and lora_B {:?} are not of rank {rank}",
                    module.peft_name().0,
                    a.dims(),
                    b.dims()
                )));
            }
            pairs.push(FilePair { layer: i, module, a, b, scale });
        }
    }
    if pairs.is_empty() {
        return Err(wrong("no LoRA weights of the targeted modules".into()));
    }
    if let Some(extra) = tensors.keys().min() {
        return Err(wrong(format!("tensor `{extra}` is not a LoRA weight of the targeted modules")));
    }
    Ok(AdapterFile { pairs, qk_rows: QkRows::Halves, architecture: None })
}

/// llama.cpp's name of a module's weight in a block.
fn gguf_name(module: LoraModule) -> &'static str {
    match module {
        LoraModule::Q => "attn_q",
        LoraModule::K => "attn_k",
        LoraModule::V => "attn_v",
        LoraModule::O => "attn_output",
        LoraModule::Gate => "ffn_gate",
        LoraModule::Up => "ffn_up",
        LoraModule::Down => "ffn_down",
    }
}

fn read_gguf(path: &Path, confine: &Confinement, limit: u64) -> Result<AdapterFile> {
    let err = |message: String| AdapterError::invalid("the GGUF adapter", message);
    let mut reader = lora_open::open_gguf(path, confine, limit)?;
    let content = gguf_file::Content::read(&mut reader).map_err(|e| err(e.to_string()))?;
    let text = |key: &str| content.metadata.get(key).and_then(|v| v.to_string().ok()).cloned();
    if text("general.type").as_deref() != Some("adapter") || text("adapter.type").as_deref() != Some("lora") {
        return Err(err("not a LoRA adapter (general.type must be `adapter`, adapter.type `lora`)".into()));
    }
    let alpha = content
        .metadata
        .get("adapter.lora.alpha")
        .and_then(|v| v.to_f32().ok())
        .ok_or_else(|| err("adapter.lora.alpha is missing".into()))? as f64;
    let architecture = text("general.architecture");
    // (layer, module) -> (a, b), as the names come.
    let mut halves: BTreeMap<(usize, FileModule), (Option<Tensor>, Option<Tensor>)> = BTreeMap::new();
    for name in content.tensor_infos.keys() {
        let parsed = name.strip_prefix("blk.").and_then(|rest| {
            let (layer, rest) = rest.split_once('.')?;
            let (module, ab) = rest.rsplit_once(".weight.lora_")?;
            let module = FileModule::ALL.into_iter().find(|&m| m.gguf_name() == module)?;
            Some((layer.parse::<usize>().ok()?, module, ab))
        });
        let Some((layer, module, ab)) = parsed.filter(|(_, _, ab)| matches!(*ab, "a" | "b")) else {
            return Err(err(format!(
                "tensor `{name}` is not a LoRA weight of a q, k, v, o, gate, up or down projection"
            )));
        };
        // bfloat16 stays bfloat16 (exactly: it widens to f32 and narrows back), for an f32
        // model that keeps adapters in their files' dtype; other types become f32.
        let tensor = content
            .tensor(&mut reader, name, &Device::Cpu)
            .and_then(|q| match q.dtype() {
                GgmlDType::BF16 => q.dequantize(&Device::Cpu)?.to_dtype(DType::BF16),
                _ => q.dequantize(&Device::Cpu),
            })
            .map_err(|e| err(format!("{name}: {e}")))?;
        let entry = halves.entry((layer, module)).or_default();
        if ab == "a" {
            entry.0 = Some(tensor);
        } else {
            entry.1 = Some(tensor);
        }
    }
    let mut pairs = Vec::with_capacity(halves.len());
    for ((layer, module), half) in halves {
        let (Some(a), Some(b)) = half else {
            return Err(err(format!("blk.{layer}.{}: lora_a or lora_b is missing", module.gguf_name())));
        };
        let rank = a.dim(0)?;
        if rank == 0 || b.dims().get(1) != Some(&rank) {
            return Err(err(format!(
                "blk.{layer}.{}: lora_a {:?} and lora_b {:?} disagree on the rank",
                module.gguf_name(),
                a.dims(),
                b.dims()
            )));
        }
        // llama.cpp applies an adapter without alpha at scale 1.
        let scale = if alpha == 0.0 { 1.0 } else { alpha / rank as f64 };
        pairs.push(FilePair { layer, module, a, b, scale });
    }
    if pairs.is_empty() {
        return Err(err("no LoRA weights".into()));
    }
    let qk_rows = match architecture.as_deref() {
        Some("llama" | "mistral" | "smollm") => QkRows::Interleaved,
        _ => QkRows::Halves,
    };
    Ok(AdapterFile { pairs, qk_rows, architecture })
}

//! LoRA adapters (PEFT's or llama.cpp's GGUF, read by `lora_files`) fitted to a model, and how
//! a step applies several of them at once. A projection `W` adapted with rank-`r` matrices
//! `A` (`[r, in]`) and `B` (`[out, r]`) computes `W x + s * B (A x)`, `s` being `alpha / r`
//! (`alpha / sqrt(r)` with rsLoRA). A step's rows are the batch's sequences one after another;
//! [`LoraBatch`] splits them into segments of one adapter (or none), and one op
//! (`pagoda_ops::lora_add`) adds each segment's adapter delta to the base projection's output,
//! so sequences of many adapters and of the base model share one step, as Punica's segmented
//! gather does.

use std::path::Path;
use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use pagoda_ops::RotaryStyle;

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::lora_files::{read_adapter, FileModule, QkRows};
use crate::lora_open::{AdapterError, Confinement};

/// The projections an adapter may adapt, by PEFT's module names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
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
    /// PEFT's name and the module's path under a layer.
    pub(crate) fn peft_name(self) -> (&'static str, &'static str) {
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

/// How an f32 model stores its adapters' matrices (`--lora-dtype`); models computing in a half
/// dtype store them in that dtype whatever this says.
///
/// - `Auto`: bfloat16 where that loses nothing: a projection whose file matrices are bfloat16 and
///   whose scaled `B` (`alpha / r` times the file's) is still exactly bfloat16 (a power-of-two
///   scale, as `alpha` = `r` or `2r` gives). Every other projection is f32.
/// - `Float32`: f32 always (the file's values, exactly, whatever its dtype).
/// - `Bfloat16`: bfloat16 always: f32 and f16 files' values, and scaled `B`s, rounded to the
///   nearest bfloat16 (relative error up to 2^-9 per value). Half the bytes a step reads of f32.
///
/// (The variants carry no docs of their own: the flag's help describes them.)
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum LoraDtype {
    #[default]
    Auto,
    #[cfg_attr(feature = "clap", value(alias = "f32"))]
    #[serde(alias = "f32")]
    Float32,
    #[cfg_attr(feature = "clap", value(alias = "bf16"))]
    #[serde(alias = "bf16")]
    Bfloat16,
}

/// One adapted projection: `A` (`[r, in]`) and `s * B^T` (`[r, out]`, as `lora_add` takes it).
#[derive(Debug, Clone)]
struct LoraPair {
    a: Tensor,
    b: Tensor,
}

/// A loaded adapter: per layer, the pair of each module it adapts.
#[derive(Debug)]
pub struct LoraAdapter {
    layers: Vec<[Option<LoraPair>; 7]>,
    /// The model's dtype: pairs kept in bfloat16 for the CPU take it on other devices.
    dtype: DType,
}

impl LoraAdapter {
    /// The adapter at `path` (a PEFT directory or a GGUF LoRA file) for a model of shape
    /// `config`, its weights in `dtype` on `device`. Fused projections (Phi-3's `qkv_proj`,
    /// `gate_up_proj`) become their parts. Refuses ranks above `max_rank`, modules other than
    /// the seven projections, the MLP of a mixture-of-experts model, options that change the
    /// computation (DoRA, biases, per-module ranks, `fan_in_fan_out`), an adapter of another
    /// architecture and any tensor whose shape does not fit the model. Q and K rows are put in
    /// the model's order.
    pub fn load(
        path: &Path,
        config: &ModelConfig,
        max_rank: usize,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        Self::load_as(path, config, max_rank, (dtype, LoraDtype::Auto), device)
    }

    /// [`Self::load`] with the storage `lora_dtype` asks for (of an f32 model).
    pub fn load_as(
        path: &Path,
        config: &ModelConfig,
        max_rank: usize,
        (dtype, lora_dtype): (DType, LoraDtype),
        device: &Device,
    ) -> Result<Self> {
        let adapter = Self::read_as(path, config, max_rank, (dtype, lora_dtype), &Confinement::default())
            .map_err(|source| ModelError::Adapter { path: path.to_path_buf(), source: Box::new(source) })?;
        adapter.to_device(device)
    }

    /// [`Self::load`] on the CPU, reading only regular files inside `confine`, with errors that
    /// name no path: what a server loads while serving, off its engine thread.
    pub fn read(
        path: &Path,
        config: &ModelConfig,
        max_rank: usize,
        dtype: DType,
        confine: &Confinement,
    ) -> std::result::Result<Self, AdapterError> {
        Self::read_as(path, config, max_rank, (dtype, LoraDtype::Auto), confine)
    }

    /// [`Self::read`] with the storage `lora_dtype` asks for (of an f32 model).
    pub fn read_as(
        path: &Path,
        config: &ModelConfig,
        max_rank: usize,
        (dtype, lora_dtype): (DType, LoraDtype),
        confine: &Confinement,
    ) -> std::result::Result<Self, AdapterError> {
        let limit = max_adapter_bytes(config, max_rank);
        let file = read_adapter(path, max_rank, config.num_layers, confine, limit)?;
        let device = &Device::Cpu;
        let wrong = AdapterError::Mismatch;
        if let Some(arch) = file.architecture.as_deref().filter(|&a| a != config.architecture) {
            return Err(wrong(format!(
                "the adapter is for `{arch}`, the model is `{}`",
                config.architecture
            )));
        }
        let model_rows = match config.rope_style {
            RotaryStyle::Interleaved => QkRows::Interleaved,
            RotaryStyle::Halves => QkRows::Halves,
        };
        let mut layers: Vec<[Option<LoraPair>; 7]> =
            (0..config.num_layers).map(|_| Default::default()).collect();
        for p in file.pairs {
            let r = p.a.dim(0)?;
            // The projections the pair adapts; a fused one's B rows are its parts' in order.
            let parts: &[LoraModule] = match p.module {
                FileModule::One(LoraModule::Up) if p.b.dim(0)? == 2 * config.intermediate_size => {
                    &[LoraModule::Gate, LoraModule::Up]
                }
                FileModule::One(m) => &[m][..],
                FileModule::Qkv => &[LoraModule::Q, LoraModule::K, LoraModule::V],
                FileModule::GateUp => &[LoraModule::Gate, LoraModule::Up],
            };
            let mlp = parts.iter().any(|m| matches!(m, LoraModule::Gate | LoraModule::Up | LoraModule::Down));
            if mlp && config.moe.is_some() {
                return Err(wrong(format!(
                    "the adapter adapts the MLP ({:?}), which is a mixture of experts in `{}`; adapters \
                     of mixture-of-experts models may adapt q, k, v and o only",
                    p.module, config.architecture
                )));
            }
            let input = parts[0].dims(config).0;
            let output: usize = parts.iter().map(|m| m.dims(config).1).sum();
            if p.a.dims() != [r, input] || p.b.dims() != [output, r] {
                return Err(wrong(format!(
                    "layer {} {:?}: lora_A {:?} and lora_B {:?} do not fit the model ([{r}, {input}] and [{output}, {r}])",
                    p.layer,
                    p.module,
                    p.a.dims(),
                    p.b.dims()
                )));
            }
            // The dtype the pair is kept in: bfloat16 only for an f32 model (the CPU kernel reads
            // it beside f32 rows), where lossless or asked for.
            let half = dtype == DType::F32
                && match lora_dtype {
                    LoraDtype::Float32 => false,
                    LoraDtype::Bfloat16 => true,
                    LoraDtype::Auto => {
                        p.a.dtype() == DType::BF16
                            && p.b.dtype() == DType::BF16
                            && exactly_bf16(&(p.b.to_dtype(DType::F64)? * p.scale)?.to_dtype(DType::F32)?)?
                    }
                };
            // Through f32 to bfloat16: half's f64-to-bfloat16 drops low bits before rounding.
            let narrow = |t: Tensor| {
                if half {
                    t.to_dtype(DType::F32)?.to_dtype(DType::BF16)
                } else {
                    t.to_dtype(dtype)
                }
            };
            let a = narrow(p.a.clone())?.to_device(device)?;
            let mut first_row = 0;
            for &module in parts {
                let rows = module.dims(config).1;
                let b = p.b.narrow(0, first_row, rows)?;
                first_row += rows;
                let heads = match module {
                    LoraModule::Q => Some(config.num_heads),
                    LoraModule::K => Some(config.num_kv_heads),
                    _ => None,
                };
                let b = match heads {
                    Some(heads) if file.qk_rows != model_rows => reorder_rotary_rows(&b, heads, model_rows)?,
                    _ => b,
                };
                let b = narrow((b.t()?.to_dtype(DType::F64)? * p.scale)?)?.contiguous()?.to_device(device)?;
                layers[p.layer][module as usize] = Some(LoraPair { a: a.clone(), b });
            }
        }
        Ok(Self { layers, dtype })
    }

    /// The adapter with its weights on `device` (a GPU takes them in the model's dtype: only
    /// the CPU kernel reads bfloat16 beside f32).
    pub fn to_device(self, device: &Device) -> Result<Self> {
        if device.is_cpu() {
            return Ok(self);
        }
        let dtype = self.dtype;
        let move_pair = |p: LoraPair| -> Result<LoraPair> {
            Ok(LoraPair {
                a: p.a.to_dtype(dtype)?.to_device(device)?,
                b: p.b.to_dtype(dtype)?.to_device(device)?,
            })
        };
        let layers = self
            .layers
            .into_iter()
            .map(|modules| {
                let moved: Vec<Option<LoraPair>> =
                    modules.into_iter().map(|p| p.map(move_pair).transpose()).collect::<Result<_>>()?;
                Ok(moved.try_into().unwrap_or_else(|_| unreachable!("seven modules in, seven out")))
            })
            .collect::<Result<_>>()?;
        Ok(Self { layers, dtype })
    }

    /// The dtype of the adapter's matrices on the CPU: bfloat16 when every pair is kept so,
    /// f32 when none is, `None` when they are mixed (or the adapter adapts nothing).
    pub fn weight_dtype(&self) -> Option<DType> {
        let mut dtypes = self.layers.iter().flatten().flatten().map(|p| p.a.dtype());
        let first = dtypes.next()?;
        dtypes.all(|d| d == first).then_some(first)
    }

    fn pair(&self, layer: usize, module: LoraModule) -> Option<&LoraPair> {
        self.layers.get(layer).and_then(|l| l[module as usize].as_ref())
    }
}

/// The most bytes an adapter file of a model shaped `config` can need for ranks up to
/// `max_rank`: every layer's seven projections adapted, at 8 bytes a value (f64, the widest
/// dtype), plus room for headers and metadata. Files beyond it are refused before they are read.
pub fn max_adapter_bytes(config: &ModelConfig, max_rank: usize) -> u64 {
    let per_rank: u64 = [
        LoraModule::Q,
        LoraModule::K,
        LoraModule::V,
        LoraModule::O,
        LoraModule::Gate,
        LoraModule::Up,
        LoraModule::Down,
    ]
    .iter()
    .map(|m| {
        let (input, output) = m.dims(config);
        input as u64 + output as u64
    })
    .sum();
    per_rank
        .saturating_mul(max_rank as u64)
        .saturating_mul(config.num_layers as u64)
        .saturating_mul(8)
        .saturating_add(16 << 20)
}

/// Reads adapters for one model (its shape and dtype) while it serves, off its engine thread;
/// the engine then only installs what this prepared ([`pagoda_engine::EngineHandle::install_lora`]).
#[derive(Debug, Clone)]
pub struct AdapterReader {
    config: ModelConfig,
    dtype: DType,
    lora_dtype: LoraDtype,
}

impl AdapterReader {
    /// A reader for a model of shape `config` computing in `dtype`, storing adapters as
    /// `lora_dtype` asks.
    pub fn new(config: ModelConfig, dtype: DType, lora_dtype: LoraDtype) -> Self {
        Self { config, dtype, lora_dtype }
    }

    /// The adapter at `path` ([`LoraAdapter::read`]), ready for the engine to install.
    pub fn read(
        &self,
        path: &Path,
        max_rank: usize,
        confine: &Confinement,
    ) -> std::result::Result<pagoda_engine::PreparedLora, AdapterError> {
        let dtypes = (self.dtype, self.lora_dtype);
        Ok(Box::new(LoraAdapter::read_as(path, &self.config, max_rank, dtypes, confine)?))
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
        let segments = self.segments(layer, module);
        if segments.is_empty() {
            return Ok(base);
        }
        Ok(pagoda_ops::lora_add(&base, x, &segments)?)
    }

    /// [`Self::apply`] of several modules that share the input `x` (Q/K/V, gate/up), each with
    /// its base, in one op: on the CPU one pass of parallel work for all of them.
    pub fn apply_parts<const N: usize>(
        &self,
        layer: usize,
        modules: [LoraModule; N],
        x: &Tensor,
        bases: [Tensor; N],
    ) -> Result<[Tensor; N]> {
        let segments = modules.map(|module| self.segments(layer, module));
        if segments.iter().all(Vec::is_empty) {
            return Ok(bases);
        }
        let parts: Vec<pagoda_ops::LoraPart> = bases
            .into_iter()
            .zip(segments)
            .map(|(base, segments)| pagoda_ops::LoraPart { base, segments })
            .collect();
        let sums = pagoda_ops::lora_add_parts(x, &parts)?;
        Ok(sums.try_into().unwrap_or_else(|_| unreachable!("N parts in, N out")))
    }

    /// The segments of rows whose adapter adapts `module` of layer `layer`.
    fn segments(&self, layer: usize, module: LoraModule) -> Vec<pagoda_ops::LoraSegment> {
        self.segments
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
            .collect()
    }
}

/// `b`'s rows (`[heads * head_dim, r]`) from one rotary order to the other (`to`): llama.cpp's
/// converter pairs dimension `i` with `i + head_dim / 2` of each head (Hugging Face's halves)
/// into adjacent rows.
fn reorder_rotary_rows(b: &Tensor, heads: usize, to: QkRows) -> candle_core::Result<Tensor> {
    let (rows, r) = b.dims2()?;
    let half = rows / heads / 2;
    let reordered = match to {
        QkRows::Interleaved => b.reshape((heads, 2, half, r))?.transpose(1, 2)?,
        QkRows::Halves => b.reshape((heads, half, 2, r))?.transpose(1, 2)?,
    };
    reordered.contiguous()?.reshape((rows, r))
}

/// Whether every value of `t` is a bfloat16 (rounding to bfloat16 and back gives it again; a NaN
/// never does, so an adapter holding one stays f32).
fn exactly_bf16(t: &Tensor) -> candle_core::Result<bool> {
    let back = t.to_dtype(DType::BF16)?.to_dtype(t.dtype())?;
    Ok(back.ne(t)?.to_dtype(DType::F32)?.sum_all()?.to_scalar::<f32>()? == 0.0)
}

fn same(a: &Option<Arc<LoraAdapter>>, b: &Option<Arc<LoraAdapter>>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => Arc::ptr_eq(a, b),
        _ => false,
    }
}

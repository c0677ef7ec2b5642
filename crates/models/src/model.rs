//! [`Model`]: the architectures behind one interface, chosen by the config's `architecture`.
//! Each architecture is one file holding only its block; attention, embeddings, linear layers
//! and the paged cache are shared.

use candle_core::{DType, Device, Tensor};
use pagoda_ops::AttentionMetadata;

use crate::bert::Bert;
use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::gemma::Gemma;
use crate::idefics3::Idefics3;
use crate::kv_cache::KvCache;
use crate::llama::Llama;
use crate::lora::{LoraAdapter, LoraBatch, LoraDtype};
use crate::pooling::Pooling;
use crate::weights::WeightSource;

/// One step's flattened inputs, built by the model runner.
pub struct ForwardInput<'a> {
    /// u32 `[num_tokens]`.
    pub input_ids: &'a Tensor,
    /// u32 `[num_tokens]`.
    pub positions: &'a Tensor,
    /// One per KV group (see [`crate::KvLayout`]): layer `i` uses its group's.
    pub attention: &'a [AttentionMetadata],
    /// u32 `[num_rows]`: the token rows whose logits are wanted; `None` when none is (a
    /// prefill chunk that samples nothing), and the forward returns [`no_logits`].
    pub logits_rows: Option<&'a Tensor>,
    /// Run only the first this many layers, then the final norm and the head (self-speculative
    /// drafting); every layer when `None`.
    pub num_layers: Option<usize>,
    /// u32 `[num_pooled]`: token rows whose final-normed hidden states are wanted (pooling
    /// sequences of a decoder, [`Model::forward_parts`]).
    pub hidden_rows: Option<&'a Tensor>,
    /// The LoRA adapter of each row, when any row has one.
    pub lora: Option<&'a LoraBatch>,
    /// Image features that replace the embeddings of the step's placeholder rows (a
    /// vision-language model's prefill chunks over images); `None` when the step has none.
    pub placeholders: Option<&'a crate::multimodal::PlaceholderEmbeds>,
}

/// The logits of a step that wants none: `[0, vocab]` f32 on the host, since CUDA cannot
/// allocate an empty buffer (the driver refuses a zero-byte allocation).
pub(crate) fn no_logits(vocab: usize) -> Result<Tensor> {
    Ok(Tensor::zeros((0, vocab), DType::F32, &Device::Cpu)?)
}

/// The end of a decoder's pass over the last layer's `hidden` and the `residual` stream: the
/// final norm, then `head` (f32 logits) over `input.logits_rows` and the normed hidden states
/// of `input.hidden_rows`; neither is computed when not asked for.
pub(crate) fn final_outputs(
    hidden: &Tensor,
    residual: Option<&Tensor>,
    final_norm: &Tensor,
    config: &ModelConfig,
    input: &ForwardInput<'_>,
    head: impl FnOnce(&Tensor) -> Result<Tensor>,
) -> Result<(Tensor, Option<Tensor>)> {
    if input.logits_rows.is_none() && input.hidden_rows.is_none() {
        return Ok((no_logits(config.vocab_size)?, None));
    }
    let r = residual.expect("models have at least one layer");
    let (normed, _) = pagoda_ops::add_rms_norm(hidden, r, final_norm, config.rms_norm_eps)?;
    let logits = match input.logits_rows {
        Some(rows) => head(&normed.index_select(rows, 0)?)?,
        None => no_logits(config.vocab_size)?,
    };
    Ok((logits, input.hidden_rows.map(|rows| normed.index_select(rows, 0)).transpose()?))
}

/// Adds `hidden` to the residual stream (which it starts, in the first layer) and returns the
/// stream normalized by `weight`: a pre-norm block's input.
pub(crate) fn join_residual(
    hidden: &Tensor,
    residual: &mut Option<Tensor>,
    weight: &Tensor,
    eps: f32,
) -> Result<Tensor> {
    match residual.as_ref() {
        None => {
            *residual = Some(hidden.clone());
            Ok(pagoda_ops::rms_norm(hidden, weight, eps)?)
        }
        Some(r) => {
            let (normed, sum) = pagoda_ops::add_rms_norm(hidden, r, weight, eps)?;
            *residual = Some(sum);
            Ok(normed)
        }
    }
}

/// A loaded model of any supported architecture, computing in `dtype`.
pub struct Model {
    architecture: Architecture,
    dtype: DType,
    /// How embeddings pool, when set by [`Model::set_pooling`] (an encoder's default is its
    /// own files').
    pooling: Option<Pooling>,
    /// The LoRA adapters loaded, by the engine's ids.
    loras: std::collections::HashMap<pagoda_engine::LoraId, std::sync::Arc<LoraAdapter>>,
    /// How [`Model::add_lora`] stores adapters (`--lora-dtype`).
    lora_dtype: LoraDtype,
}

enum Architecture {
    Llama(Llama),
    Gemma(Gemma),
    /// An encoder: it embeds, it does not generate.
    Bert(Bert),
    /// A vision-language model: a vision encoder and a Llama decoder (boxed: twice the size of
    /// the others, and the enum is matched on every call).
    Idefics3(Box<Idefics3>),
}

/// Why a model has to run on the CPU, if it does: a head dim no CUDA attention kernel covers in
/// `dtype`. Checked when the model loads, so a GPU server refuses it at start-up rather than
/// failing every request.
fn cpu_only_reason(config: &ModelConfig, dtype: DType) -> Option<String> {
    if !pagoda_ops::CUDA_ATTENTION_HEAD_DIMS.contains(&config.head_dim) {
        return Some(format!(
            "has head_dim {}, which the CUDA attention kernels do not cover ({:?}); run it on the CPU",
            config.head_dim,
            pagoda_ops::CUDA_ATTENTION_HEAD_DIMS
        ));
    }
    (!pagoda_ops::cuda_attention_covers(config.head_dim, dtype)).then(|| {
        format!(
            "has head_dim {}, whose CUDA attention kernel is f16/bf16 only; use --dtype bfloat16",
            config.head_dim
        )
    })
}

impl Model {
    pub fn load(
        source: &mut dyn WeightSource,
        config: ModelConfig,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        if let Some(reason) = cpu_only_reason(&config, dtype).filter(|_| !device.is_cpu()) {
            return Err(ModelError::InvalidOption(format!("`{}` {reason}", config.architecture)));
        }
        let architecture = match config.architecture.as_str() {
            "gemma2" | "gemma3" => Architecture::Gemma(Gemma::load(source, config, device)?),
            "bert" => Architecture::Bert(Bert::load(source, config)?),
            _ => Architecture::Llama(Llama::load(source, config, device)?),
        };
        Ok(Self {
            architecture,
            dtype,
            pooling: None,
            loras: Default::default(),
            lora_dtype: LoraDtype::Auto,
        })
    }

    /// A loaded Idefics3 (SmolVLM) as a model, computing in `dtype`. Its decoder must be one
    /// the device's attention kernels run (as [`Model::load`] checks).
    pub fn idefics3(model: Idefics3, dtype: DType, device: &Device) -> Result<Self> {
        if let Some(reason) = cpu_only_reason(model.text_config(), dtype).filter(|_| !device.is_cpu()) {
            return Err(ModelError::InvalidOption(format!("`idefics3` {reason}")));
        }
        Ok(Self {
            architecture: Architecture::Idefics3(Box::new(model)),
            dtype,
            pooling: None,
            loras: Default::default(),
            lora_dtype: LoraDtype::Auto,
        })
    }

    /// The vision-language model's configuration, when this is one.
    pub fn idefics3_config(&self) -> Option<&crate::idefics3::Idefics3Config> {
        match &self.architecture {
            Architecture::Idefics3(m) => Some(m.config()),
            _ => None,
        }
    }

    /// Whether the model has a vision encoder ([`Self::image_features`]).
    pub fn takes_images(&self) -> bool {
        matches!(self.architecture, Architecture::Idefics3(_))
    }

    /// The placeholder token's id of a model that takes images.
    pub fn image_token_id(&self) -> Option<u32> {
        self.idefics3_config().map(|c| c.image_token_id)
    }

    /// One image's encoder features, `[num_features, hidden]`, from its preprocessed pixels
    /// (for Idefics3 `[tiles, 3, size, size]`).
    pub fn image_features(&self, pixels: &Tensor) -> Result<Tensor> {
        match &self.architecture {
            Architecture::Idefics3(m) => m.image_features(pixels),
            _ => Err(ModelError::ImageInput("this model has no vision encoder".into())),
        }
    }

    /// Loads the adapter at `dir` (PEFT directory or GGUF LoRA file) under `id`, its weights on
    /// `device` (an id in use is an error: nothing is replaced). Every generating architecture
    /// takes adapters; a mixture-of-experts model only on its attention projections.
    pub fn add_lora(
        &mut self,
        id: pagoda_engine::LoraId,
        dir: &std::path::Path,
        max_rank: usize,
        device: &Device,
    ) -> Result<()> {
        let arch = &self.config().architecture;
        if let Architecture::Bert(_) = &self.architecture {
            return Err(ModelError::InvalidOption(format!(
                "LoRA adapters serve generation; `{arch}` is an encoder"
            )));
        }
        if self.loras.contains_key(&id) {
            return Err(ModelError::InvalidOption(format!("LoRA id {id} is already loaded")));
        }
        let dtypes = (self.dtype, self.lora_dtype);
        let adapter = LoraAdapter::load_as(dir, self.config(), max_rank, dtypes, device)?;
        self.loras.insert(id, std::sync::Arc::new(adapter));
        Ok(())
    }

    /// The dtype adapter `id`'s matrices are kept in ([`LoraAdapter::weight_dtype`]).
    pub fn lora_weight_dtype(&self, id: pagoda_engine::LoraId) -> Option<DType> {
        self.loras.get(&id).and_then(|a| a.weight_dtype())
    }

    /// How adapters loaded from now on store their matrices (of an f32 model; see [`LoraDtype`]).
    pub fn set_lora_dtype(&mut self, lora_dtype: LoraDtype) {
        self.lora_dtype = lora_dtype;
    }

    /// Installs `adapter`, read for this model by [`LoraAdapter::read`], under `id`, its
    /// weights moved to `device` (an id in use is an error: nothing is replaced).
    pub fn install_lora(
        &mut self,
        id: pagoda_engine::LoraId,
        adapter: LoraAdapter,
        device: &Device,
    ) -> Result<()> {
        if self.loras.contains_key(&id) {
            return Err(ModelError::InvalidOption(format!("LoRA id {id} is already loaded")));
        }
        self.loras.insert(id, std::sync::Arc::new(adapter.to_device(device)?));
        Ok(())
    }

    /// Drops adapter `id`; false when it was not loaded.
    pub fn remove_lora(&mut self, id: pagoda_engine::LoraId) -> bool {
        self.loras.remove(&id).is_some()
    }

    pub(crate) fn lora(&self, id: pagoda_engine::LoraId) -> Option<&std::sync::Arc<LoraAdapter>> {
        self.loras.get(&id)
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn config(&self) -> &ModelConfig {
        match &self.architecture {
            Architecture::Llama(m) => m.config(),
            Architecture::Gemma(m) => m.config(),
            Architecture::Bert(m) => m.config(),
            Architecture::Idefics3(m) => m.text_config(),
        }
    }

    /// Runs every layer over the batch, writing its K/V into `cache`, and returns f32 logits
    /// `[num_rows, vocab]` for the requested rows only.
    pub fn forward(&self, input: &ForwardInput<'_>, cache: &KvCache) -> Result<Tensor> {
        match &self.architecture {
            Architecture::Llama(m) => m.forward(input, cache),
            Architecture::Gemma(m) => m.forward(input, cache),
            Architecture::Idefics3(m) => m.forward(input, cache),
            Architecture::Bert(_) => Err(ModelError::InvalidOption(
                "this is an embedding model (an encoder): it computes no logits".into(),
            )),
        }
    }

    /// A decoder's logits, as [`Self::forward`] gives them, and the final-normed hidden states
    /// of `input.hidden_rows`, which a decoder's embeddings pool.
    pub fn forward_parts(
        &self,
        input: &ForwardInput<'_>,
        cache: &KvCache,
    ) -> Result<(Tensor, Option<Tensor>)> {
        match &self.architecture {
            Architecture::Llama(m) => m.forward_parts(input, cache),
            Architecture::Gemma(m) => m.forward_parts(input, cache),
            Architecture::Idefics3(m) => m.forward_parts(input, cache),
            Architecture::Bert(_) => self.forward(input, cache).map(|logits| (logits, None)),
        }
    }

    /// Whether the projections run as quantized matmuls.
    pub fn is_quantized(&self) -> bool {
        match &self.architecture {
            Architecture::Llama(m) => m.is_quantized(),
            Architecture::Gemma(m) => m.is_quantized(),
            Architecture::Idefics3(m) => m.is_quantized(),
            Architecture::Bert(_) => false,
        }
    }

    /// How the model's embeddings pool: an encoder's own (or as set), a decoder's as set;
    /// `None` for a decoder that only generates.
    pub fn pooling(&self) -> Option<&Pooling> {
        match (&self.pooling, &self.architecture) {
            (Some(pooling), _) => Some(pooling),
            (None, Architecture::Bert(m)) => Some(m.pooling()),
            (None, _) => None,
        }
    }

    /// Makes a decoder embed too (pooling its final-normed hidden states), or changes how an
    /// encoder pools.
    pub fn set_pooling(&mut self, pooling: Pooling) {
        self.pooling = Some(pooling);
    }

    /// Whether the model is an encoder: it embeds whole inputs and generates nothing.
    pub fn is_encoder(&self) -> bool {
        matches!(self.architecture, Architecture::Bert(_))
    }

    /// An encoder's pooled vector of each input: its embedding, or a cross-encoder's score
    /// (see [`Bert::encode`] for the arguments).
    pub fn embed(
        &self,
        input_ids: &Tensor,
        token_types: &Tensor,
        positions: &Tensor,
        bounds: &[usize],
    ) -> Result<Vec<Vec<f32>>> {
        match (&self.architecture, self.pooling()) {
            (Architecture::Bert(m), Some(pooling)) => {
                m.pooled(pooling, input_ids, token_types, positions, bounds)
            }
            _ => Err(ModelError::InvalidOption("embeddings need an encoder model".into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(path: &str) -> ModelConfig {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(path);
        ModelConfig::from_hf_json(&path).unwrap()
    }

    #[test]
    fn models_the_cuda_kernels_cannot_run_are_named_with_the_reason() {
        let shipped = ["configs/models/llama-3.1-8b.json", "configs/models/smollm2-135m.json"];
        let tiny = ["llama", "qwen3", "gemma2", "gemma3_text", "mistral", "phi3", "qwen3_moe", "mixtral"];
        let tiny = tiny.map(|t| format!("tests/fixtures/tiny/{t}/config.json"));
        for path in shipped.iter().copied().chain(tiny.iter().map(String::as_str)) {
            for dtype in [DType::BF16, DType::F32] {
                assert_eq!(cpu_only_reason(&config(path), dtype), None, "{path} {dtype:?}");
            }
        }
        let mut odd = config(shipped[1]);
        odd.head_dim = 72;
        assert!(cpu_only_reason(&odd, DType::BF16).unwrap().contains("head_dim 72"));
        // Gemma's 256 has kernels in half precision only.
        let mut wide = config(shipped[1]);
        wide.head_dim = 256;
        assert_eq!(cpu_only_reason(&wide, DType::BF16), None);
        assert!(cpu_only_reason(&wide, DType::F32).unwrap().contains("bfloat16"));
    }
}

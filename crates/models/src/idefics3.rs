//! Idefics3 (SmolVLM): a SigLIP vision encoder ([`crate::siglip`]), a connector that
//! pixel-shuffles each tile's patch states (`scale_factor`² neighbouring patches into one
//! token) and projects them to the decoder's width, and a Llama decoder whose `<image>`
//! placeholder tokens take those features in order
//! ([`PlaceholderEmbeds`](crate::multimodal::PlaceholderEmbeds)).
//!
//! Weights come from a Hugging Face directory as transformers saves
//! `Idefics3ForConditionalGeneration`: `model.vision_model.*`,
//! `model.connector.modality_projection.proj.weight`, `model.text_model.*`, `lm_head.weight`.

use std::path::Path;

use candle_core::{DType, Device, Tensor};
use serde::Deserialize;

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::kv_cache::KvCache;
use crate::llama::Llama;
use crate::model::ForwardInput;
use crate::siglip::{SiglipVisionConfig, SiglipVisionEncoder};
use crate::weights::{SafetensorsWeights, WeightSource};

/// transformers' `Idefics3Config` defaults.
const DEFAULT_SCALE_FACTOR: usize = 2;
const DEFAULT_IMAGE_TOKEN_ID: u32 = 128_257;

/// An Idefics3 `config.json`.
#[derive(Debug, Clone)]
pub struct Idefics3Config {
    pub vision: SiglipVisionConfig,
    /// The decoder's (`text_config`).
    pub text: ModelConfig,
    /// Side of the square of patches the pixel shuffle folds into one token.
    pub scale_factor: usize,
    /// The `<image>` placeholder token.
    pub image_token_id: u32,
}

#[derive(Deserialize)]
struct RawConfig {
    model_type: Option<String>,
    #[serde(default)]
    vision_config: serde_json::Value,
    text_config: Option<serde_json::Value>,
    scale_factor: Option<usize>,
    image_token_id: Option<u32>,
}

impl Idefics3Config {
    pub fn from_json(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| ModelError::Io { path: path.to_path_buf(), source })?;
        Self::from_str(path, &text)
    }

    /// Parses the text of an Idefics3 `config.json`; `path` is only used in errors.
    pub fn from_str(path: &Path, text: &str) -> Result<Self> {
        let err = |message: String| ModelError::Config { path: path.to_path_buf(), message };
        let raw: RawConfig = serde_json::from_str(text).map_err(|e| err(e.to_string()))?;
        if let Some(t) = raw.model_type.as_deref().filter(|t| *t != "idefics3") {
            return Err(err(format!("model_type `{t}` is not idefics3")));
        }
        let vision_json = if raw.vision_config.is_null() { serde_json::json!({}) } else { raw.vision_config };
        let vision = SiglipVisionConfig::from_json(&vision_json, &SiglipVisionConfig::IDEFICS3_DEFAULTS)
            .map_err(err)?;
        // transformers' default text config is a Llama with rms_norm_eps 1e-5, which is ours too.
        let text_json = raw.text_config.unwrap_or_else(|| serde_json::json!({ "model_type": "llama" }));
        let text = ModelConfig::from_hf_str(path, &text_json.to_string())?;
        if text.architecture != "llama" {
            return Err(err(format!("text_config `{}` is not supported (llama is)", text.architecture)));
        }
        let scale_factor = raw.scale_factor.unwrap_or(DEFAULT_SCALE_FACTOR);
        if scale_factor == 0 || !vision.patches_per_side().is_multiple_of(scale_factor) {
            return Err(err(format!(
                "scale_factor {scale_factor} does not divide the {} patches along a tile's side",
                vision.patches_per_side()
            )));
        }
        let image_token_id = raw.image_token_id.unwrap_or(DEFAULT_IMAGE_TOKEN_ID);
        if image_token_id as usize >= text.vocab_size {
            return Err(err(format!(
                "image_token_id {image_token_id} is outside the vocabulary of {}",
                text.vocab_size
            )));
        }
        Ok(Self { vision, text, scale_factor, image_token_id })
    }

    /// Placeholder tokens (and feature rows) per tile.
    pub fn tokens_per_tile(&self) -> usize {
        self.vision.num_patches() / (self.scale_factor * self.scale_factor)
    }
}

/// The loaded model.
pub struct Idefics3 {
    config: Idefics3Config,
    vision: SiglipVisionEncoder,
    /// The modality projection, transposed: `[vision_hidden * scale², text_hidden]`.
    projection_t: Tensor,
    text: Llama,
}

impl Idefics3 {
    /// Loads the model directory `dir` (`config.json` and `*.safetensors`) in `dtype`.
    pub fn load(dir: &Path, device: &Device, dtype: DType) -> Result<Self> {
        let config = Idefics3Config::from_json(&dir.join("config.json"))?;
        let mut weights = SafetensorsWeights::open(dir, "idefics3", device, dtype)?;
        Self::load_from(&mut weights, config, device)
    }

    /// Loads from `source`, which names tensors as transformers does and maps the decoder's
    /// (GGUF-style) names under `model.text_model`.
    pub fn load_from(source: &mut dyn WeightSource, config: Idefics3Config, device: &Device) -> Result<Self> {
        let vision = SiglipVisionEncoder::load(source, "model.vision_model", config.vision.clone())?;
        let s2 = config.scale_factor * config.scale_factor;
        let projection = source.dense(
            "model.connector.modality_projection.proj.weight",
            &[config.text.hidden_size, config.vision.hidden_size * s2],
        )?;
        let text = Llama::load(source, config.text.clone(), device)?;
        Ok(Self { projection_t: projection.t()?.contiguous()?, vision, text, config })
    }

    pub fn config(&self) -> &Idefics3Config {
        &self.config
    }

    /// The decoder's config (its KV cache is sized from it).
    pub fn text_config(&self) -> &ModelConfig {
        self.text.config()
    }

    /// The image features of normalized pixel tiles `[tiles, 3, image_size, image_size]` (the
    /// processor's split tiles and global tile of one or more images, in prompt order):
    /// `[tiles * tokens_per_tile, text_hidden]` in the decoder's dtype, one row per `<image>`
    /// placeholder of those images.
    pub fn image_features(&self, pixels: &Tensor) -> Result<Tensor> {
        let states = self.vision.forward(pixels)?;
        let shuffled = pixel_shuffle(&states, self.config.scale_factor)?;
        let (tiles, tokens, width) = shuffled.dims3()?;
        Ok(shuffled.reshape((tiles * tokens, width))?.matmul(&self.projection_t)?)
    }

    /// Whether the decoder's projections run as quantized matmuls.
    pub fn is_quantized(&self) -> bool {
        self.text.is_quantized()
    }

    /// The decoder's forward pass over a step (as [`Llama::forward`]), the rows of
    /// `input.placeholders` taking its feature rows instead of the token embeddings. Each of
    /// those rows must hold the `<image>` token; an `<image>` token without a row keeps its own
    /// embedding (as transformers treats one the model generates).
    pub fn forward(&self, input: &ForwardInput<'_>, cache: &KvCache) -> Result<Tensor> {
        Ok(self.forward_parts(input, cache)?.0)
    }

    /// [`Self::forward`], with the final-normed hidden states of `input.hidden_rows` too.
    pub fn forward_parts(
        &self,
        input: &ForwardInput<'_>,
        cache: &KvCache,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let mut hidden = self.text.embed(input.input_ids)?;
        if let Some(p) = input.placeholders {
            let ids = input.input_ids.to_vec1::<u32>()?;
            let image = self.config.image_token_id;
            if let Some(&row) = p.rows().iter().find(|&&r| ids.get(r as usize) != Some(&image)) {
                return Err(ModelError::ImageInput(format!(
                    "image features given for step row {row}, which is not an image placeholder token"
                )));
            }
            hidden = p.merge(&hidden)?;
        }
        self.text.forward_embedded(hidden, input, cache)
    }
}

/// Idefics3's pixel shuffle: `[tiles, side², dim]` patch states (row-major patches) ->
/// `[tiles, (side / s)², dim * s²]`, each output token the `s x s` block of patches it covers,
/// laid out as transformers' `Idefics3Connector.pixel_shuffle` lays it out.
fn pixel_shuffle(x: &Tensor, s: usize) -> Result<Tensor> {
    let (tiles, seq, dim) = x.dims3()?;
    let side = (seq as f64).sqrt().round() as usize;
    if side * side != seq || !side.is_multiple_of(s) {
        return Err(ModelError::ImageInput(format!("{seq} patches do not shuffle by {s}")));
    }
    let x = x.reshape((tiles, side, side / s, dim * s))?.permute((0, 2, 1, 3))?.contiguous()?;
    let x = x.reshape((tiles, side / s, side / s, dim * s * s))?.permute((0, 2, 1, 3))?.contiguous()?;
    Ok(x.reshape((tiles, seq / (s * s), dim * s * s))?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Token (i, j) of the shuffle holds patches (s*i + a, s*j + b) for a, b in 0..s, ordered by
    /// a then b (transformers' view/permute sequence, worked out by hand for s = 2, side 4).
    #[test]
    fn pixel_shuffle_groups_square_blocks_of_patches() {
        let side = 4;
        // Patch (r, c) has the single feature 10 r + c.
        let values: Vec<f32> = (0..side * side).map(|p| (10 * (p / side) + p % side) as f32).collect();
        let x = Tensor::from_vec(values, (1, side * side, 1), &Device::Cpu).unwrap();
        let out = pixel_shuffle(&x, 2).unwrap().squeeze(0).unwrap().to_vec2::<f32>().unwrap();
        assert_eq!(
            out,
            vec![
                vec![0., 1., 10., 11.],
                vec![2., 3., 12., 13.],
                vec![20., 21., 30., 31.],
                vec![22., 23., 32., 33.],
            ]
        );
        assert!(pixel_shuffle(&Tensor::zeros((1, 12, 1), DType::F32, &Device::Cpu).unwrap(), 2).is_err());
    }

    #[test]
    fn config_defaults_and_bad_values_are_named() {
        let path = Path::new("config.json");
        let text = r#""text_config": {"vocab_size": 600, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 4}"#;
        let with = |rest: &str| format!("{{\"model_type\": \"idefics3\", {text}{rest}}}");
        // SmolVLM's tiles: 512 pixels in 16-pixel patches; the rest are transformers' defaults.
        let c = Idefics3Config::from_str(
            path,
            &with(r#", "vision_config": {"image_size": 512, "patch_size": 16}, "image_token_id": 599"#),
        )
        .unwrap();
        assert_eq!(
            (c.scale_factor, c.vision.hidden_size, c.vision.num_layers, c.vision.layer_norm_eps),
            (2, 1152, 12, 1e-6)
        );
        assert_eq!(c.tokens_per_tile(), 256);
        // The default 224-pixel tile in 32-pixel patches has 7 patches a side: no shuffle by 2.
        let err = Idefics3Config::from_str(path, &with(r#", "image_token_id": 599"#)).unwrap_err();
        assert!(err.to_string().contains("scale_factor 2 does not divide the 7 patches"), "{err}");
        // The default image token (128257) is outside this vocabulary.
        let err = Idefics3Config::from_str(
            path,
            &with(r#", "vision_config": {"image_size": 64, "patch_size": 8}"#),
        )
        .unwrap_err();
        assert!(err.to_string().contains("image_token_id 128257 is outside"), "{err}");
        let err = Idefics3Config::from_str(path, &with(r#", "vision_config": {"hidden_act": "relu"}"#))
            .unwrap_err();
        assert!(err.to_string().contains("hidden_act `relu`"), "{err}");
    }
}

//! The SigLIP vision encoder (as Idefics3 / SmolVLM carry it, and Gemma 3's vision tower): a
//! patch embedding (a convolution whose stride is its kernel, i.e. one linear map per patch),
//! learned position embeddings, pre-LayerNorm transformer layers with bidirectional attention
//! and a GELU-tanh MLP, and a final LayerNorm. It maps normalized pixel tiles
//! `[tiles, channels, size, size]` to patch states `[tiles, patches, hidden]`.
//!
//! The encoder runs with candle's own ops in the weights' dtype (f32 on the CPU); it is small
//! next to the decoder and runs once per image.

use candle_core::{DType, Tensor, D};
use serde::Deserialize;

use crate::error::{ModelError, Result};
use crate::weights::WeightSource;

/// The encoder's shape, from a `vision_config` object.
#[derive(Debug, Clone, PartialEq)]
pub struct SiglipVisionConfig {
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_channels: usize,
    /// The side of a (square) tile in pixels.
    pub image_size: usize,
    pub patch_size: usize,
    pub layer_norm_eps: f64,
}

/// A `vision_config` as stored: `save_pretrained` leaves out values equal to the config class's
/// defaults, so every field may be missing.
#[derive(Debug, Deserialize)]
struct RawVisionConfig {
    hidden_size: Option<usize>,
    intermediate_size: Option<usize>,
    num_hidden_layers: Option<usize>,
    num_attention_heads: Option<usize>,
    num_channels: Option<usize>,
    image_size: Option<usize>,
    patch_size: Option<usize>,
    layer_norm_eps: Option<f64>,
    hidden_act: Option<String>,
}

impl SiglipVisionConfig {
    /// transformers' `Idefics3VisionConfig` defaults.
    pub const IDEFICS3_DEFAULTS: SiglipVisionConfig = SiglipVisionConfig {
        hidden_size: 1152,
        intermediate_size: 3072,
        num_layers: 12,
        num_heads: 16,
        num_channels: 3,
        image_size: 224,
        patch_size: 32,
        layer_norm_eps: 1e-6,
    };

    /// Reads a `vision_config` object, missing fields taken from `defaults` (the model's config
    /// class's); a shape the encoder cannot run is an error naming it.
    pub fn from_json(
        value: &serde_json::Value,
        defaults: &SiglipVisionConfig,
    ) -> std::result::Result<Self, String> {
        let raw: RawVisionConfig = serde_json::from_value(value.clone()).map_err(|e| e.to_string())?;
        if let Some(act) = raw.hidden_act.as_deref().filter(|a| *a != "gelu_pytorch_tanh") {
            return Err(format!("vision hidden_act `{act}` is not supported (gelu_pytorch_tanh is)"));
        }
        let d = defaults;
        let c = SiglipVisionConfig {
            hidden_size: raw.hidden_size.unwrap_or(d.hidden_size),
            intermediate_size: raw.intermediate_size.unwrap_or(d.intermediate_size),
            num_layers: raw.num_hidden_layers.unwrap_or(d.num_layers),
            num_heads: raw.num_attention_heads.unwrap_or(d.num_heads),
            num_channels: raw.num_channels.unwrap_or(d.num_channels),
            image_size: raw.image_size.unwrap_or(d.image_size),
            patch_size: raw.patch_size.unwrap_or(d.patch_size),
            layer_norm_eps: raw.layer_norm_eps.unwrap_or(d.layer_norm_eps),
        };
        if c.num_heads == 0 || !c.hidden_size.is_multiple_of(c.num_heads) {
            return Err(format!(
                "vision hidden_size {} is not split by {} heads",
                c.hidden_size, c.num_heads
            ));
        }
        if c.patch_size == 0 || !c.image_size.is_multiple_of(c.patch_size) {
            return Err(format!(
                "vision image_size {} is not a multiple of patch_size {}",
                c.image_size, c.patch_size
            ));
        }
        if c.num_layers == 0 || c.num_channels == 0 || c.intermediate_size == 0 {
            return Err("vision config has no layers, channels or MLP".into());
        }
        Ok(c)
    }

    /// Patches along one side of a tile.
    pub fn patches_per_side(&self) -> usize {
        self.image_size / self.patch_size
    }

    pub fn num_patches(&self) -> usize {
        self.patches_per_side() * self.patches_per_side()
    }
}

/// A dense `[out, in]` projection with a bias.
struct Affine {
    weight_t: Tensor,
    bias: Tensor,
}

impl Affine {
    fn load(source: &mut dyn WeightSource, name: &str, out_dim: usize, in_dim: usize) -> Result<Self> {
        let weight = source.dense(&format!("{name}.weight"), &[out_dim, in_dim])?;
        let bias = source.dense(&format!("{name}.bias"), &[out_dim])?;
        Ok(Self { weight_t: weight.t()?.contiguous()?, bias })
    }

    /// `x` `[rows, in]` -> `[rows, out]`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(x.matmul(&self.weight_t)?.broadcast_add(&self.bias)?)
    }
}

struct LayerNorm {
    weight: Tensor,
    bias: Tensor,
    eps: f64,
}

impl LayerNorm {
    fn load(source: &mut dyn WeightSource, name: &str, dim: usize, eps: f64) -> Result<Self> {
        let weight = source.dense(&format!("{name}.weight"), &[dim])?;
        Ok(Self { weight, bias: source.dense(&format!("{name}.bias"), &[dim])?, eps })
    }

    /// Normalizes the last dimension: `(x - mean) / sqrt(var + eps) * weight + bias`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let centered = x.broadcast_sub(&x.mean_keepdim(D::Minus1)?)?;
        let var = centered.sqr()?.mean_keepdim(D::Minus1)?;
        let normed = centered.broadcast_div(&(var + self.eps)?.sqrt()?)?;
        Ok(normed.broadcast_mul(&self.weight)?.broadcast_add(&self.bias)?)
    }
}

struct EncoderLayer {
    norm1: LayerNorm,
    /// Q, K and V stacked: `[3 * hidden, hidden]`.
    qkv: Affine,
    out_proj: Affine,
    norm2: LayerNorm,
    fc1: Affine,
    fc2: Affine,
}

impl EncoderLayer {
    fn load(source: &mut dyn WeightSource, prefix: &str, c: &SiglipVisionConfig) -> Result<Self> {
        let (h, eps) = (c.hidden_size, c.layer_norm_eps);
        let part = |p: &str| format!("{prefix}.{p}");
        let [q, k, v] = ["q_proj", "k_proj", "v_proj"]
            .map(|p| Affine::load(source, &part(&format!("self_attn.{p}")), h, h));
        let (q, k, v) = (q?, k?, v?);
        let qkv = Affine {
            weight_t: Tensor::cat(&[&q.weight_t, &k.weight_t, &v.weight_t], 1)?,
            bias: Tensor::cat(&[&q.bias, &k.bias, &v.bias], 0)?,
        };
        Ok(Self {
            norm1: LayerNorm::load(source, &part("layer_norm1"), h, eps)?,
            qkv,
            out_proj: Affine::load(source, &part("self_attn.out_proj"), h, h)?,
            norm2: LayerNorm::load(source, &part("layer_norm2"), h, eps)?,
            fc1: Affine::load(source, &part("mlp.fc1"), c.intermediate_size, h)?,
            fc2: Affine::load(source, &part("mlp.fc2"), h, c.intermediate_size)?,
        })
    }

    /// `x` `[tiles, patches, hidden]` -> the same, after attention and MLP residual blocks.
    fn forward(&self, x: &Tensor, num_heads: usize) -> Result<Tensor> {
        let (tiles, patches, hidden) = x.dims3()?;
        let head_dim = hidden / num_heads;
        let rows = self.norm1.forward(&x.reshape((tiles * patches, hidden))?)?;
        let qkv = self.qkv.forward(&rows)?.reshape((tiles, patches, 3, num_heads, head_dim))?;
        // [tiles, heads, patches, head_dim] each.
        let split = |i: usize| -> Result<Tensor> {
            Ok(qkv.narrow(2, i, 1)?.squeeze(2)?.transpose(1, 2)?.contiguous()?)
        };
        let (q, k, v) = (split(0)?, split(1)?, split(2)?);
        let scale = 1.0 / (head_dim as f64).sqrt();
        let scores = (q.matmul(&k.t()?)? * scale)?;
        let attended = softmax_last(&scores)?.matmul(&v)?;
        let attended = attended.transpose(1, 2)?.reshape((tiles * patches, hidden))?;
        let x = (x + self.out_proj.forward(&attended)?.reshape((tiles, patches, hidden))?)?;

        let rows = self.norm2.forward(&x.reshape((tiles * patches, hidden))?)?;
        // candle's `gelu` is the tanh approximation (gelu_pytorch_tanh).
        let mlp = self.fc2.forward(&self.fc1.forward(&rows)?.gelu()?)?;
        Ok((x + mlp.reshape((tiles, patches, hidden))?)?)
    }
}

/// Softmax over the last dimension, shifted by the row maximum.
fn softmax_last(x: &Tensor) -> Result<Tensor> {
    let shifted = x.broadcast_sub(&x.max_keepdim(D::Minus1)?)?.exp()?;
    Ok(shifted.broadcast_div(&shifted.sum_keepdim(D::Minus1)?)?)
}

/// The loaded encoder.
pub struct SiglipVisionEncoder {
    config: SiglipVisionConfig,
    /// The patch convolution as a projection of flattened patches: `[channels * p * p, hidden]`
    /// (transposed) and its bias.
    patch_embedding: Affine,
    /// `[num_patches, hidden]`.
    position_embedding: Tensor,
    layers: Vec<EncoderLayer>,
    post_layernorm: LayerNorm,
}

impl SiglipVisionEncoder {
    /// Loads the tensors under `prefix` (`model.vision_model` for Idefics3), named as
    /// transformers names them (`embeddings.patch_embedding`, `encoder.layers.N.*`,
    /// `post_layernorm`).
    pub fn load(source: &mut dyn WeightSource, prefix: &str, config: SiglipVisionConfig) -> Result<Self> {
        let c = &config;
        let (h, p) = (c.hidden_size, c.patch_size);
        let name = |part: &str| format!("{prefix}.{part}");
        let conv = source.dense(&name("embeddings.patch_embedding.weight"), &[h, c.num_channels, p, p])?;
        let patch_embedding = Affine {
            weight_t: conv.reshape((h, c.num_channels * p * p))?.t()?.contiguous()?,
            bias: source.dense(&name("embeddings.patch_embedding.bias"), &[h])?,
        };
        let position_embedding =
            source.dense(&name("embeddings.position_embedding.weight"), &[c.num_patches(), h])?;
        let layers = (0..c.num_layers)
            .map(|i| EncoderLayer::load(source, &name(&format!("encoder.layers.{i}")), c))
            .collect::<Result<Vec<_>>>()?;
        let post_layernorm = LayerNorm::load(source, &name("post_layernorm"), h, c.layer_norm_eps)?;
        Ok(Self { config, patch_embedding, position_embedding, layers, post_layernorm })
    }

    pub fn config(&self) -> &SiglipVisionConfig {
        &self.config
    }

    /// `pixels` `[tiles, channels, image_size, image_size]` (normalized, any float dtype) ->
    /// `[tiles, num_patches, hidden]` after the final LayerNorm. Only whole tiles are taken:
    /// every patch is real, so the patch attention mask is all ones and the bucketed position
    /// ids of Idefics3's embeddings are `0..num_patches` (a padded tile would need both).
    pub fn forward(&self, pixels: &Tensor) -> Result<Tensor> {
        let c = &self.config;
        let (size, p, side) = (c.image_size, c.patch_size, c.patches_per_side());
        let dims = pixels.dims();
        if dims.len() != 4 || dims[0] == 0 || dims[1] != c.num_channels || dims[2] != size || dims[3] != size
        {
            return Err(ModelError::ImageInput(format!(
                "pixel values have shape {dims:?}; the vision encoder takes [tiles, {}, {size}, {size}]",
                c.num_channels
            )));
        }
        let tiles = dims[0];
        let dtype = self.position_embedding.dtype();
        // [tiles, C, side, p, side, p] -> [tiles, side, side, C, p, p]: each row one patch in the
        // convolution kernel's (channel, y, x) order.
        let patches = pixels
            .to_dtype(dtype)?
            .reshape((tiles, c.num_channels, side, p, side, p))?
            .permute((0, 2, 4, 1, 3, 5))?
            .contiguous()?
            .reshape((tiles * side * side, c.num_channels * p * p))?;
        let embedded =
            self.patch_embedding.forward(&patches)?.reshape((tiles, side * side, c.hidden_size))?;
        let mut x = embedded.broadcast_add(&self.position_embedding)?;
        for layer in &self.layers {
            x = layer.forward(&x, c.num_heads)?;
        }
        self.post_layernorm.forward(&x)
    }

    /// The compute dtype of the encoder's weights.
    pub fn dtype(&self) -> DType {
        self.position_embedding.dtype()
    }
}

//! What the server needs to prepare images for the loaded model ([`VisionSpec`]): which
//! processor turns decoded images into pixel tensors and prompt text, with the settings the
//! model directory's `preprocessor_config.json` / `processor_config.json` give, and which
//! token the prompt's image placeholders are. `None` for a model without a vision encoder.

use std::path::{Path, PathBuf};

use pagoda_media::idefics3::Idefics3Config as Idefics3Processor;
use pagoda_media::{Filter, Normalization};
use pagoda_models::Model;
use pagoda_text::Tokenizer;
use serde_json::Value;

/// Why a vision model's processor settings could not be read.
#[derive(Debug, thiserror::Error)]
pub enum VisionConfigError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: {message}")]
    Invalid { path: PathBuf, message: String },
    #[error("the tokenizer encodes the image placeholder {token:?} as {ids:?}, not as the model's image token {id}")]
    ImageTokenMismatch { token: String, ids: Vec<u32>, id: u32 },
    #[error(transparent)]
    Tokenizer(#[from] pagoda_text::TokenizerError),
}

/// The processor of a vision model, with its settings.
#[derive(Debug, Clone, PartialEq)]
pub enum VisionProcessor {
    /// Idefics3 / SmolVLM: [`pagoda_media::idefics3::preprocess`], then
    /// [`pagoda_media::idefics3::expand_prompt`] with `image_seq_len`.
    Idefics3(Idefics3Processor),
}

/// How the loaded model takes images.
#[derive(Debug, Clone, PartialEq)]
pub struct VisionSpec {
    pub processor: VisionProcessor,
    /// The placeholder text a prompt holds once per image before expansion, and that the
    /// expansion repeats once per feature row (`<image>`).
    pub image_token: String,
    /// The placeholder's token id: the prompt positions holding it are the images'
    /// `placeholder_positions`, in order.
    pub image_token_id: u32,
    /// Placeholder tokens (feature rows) per tile: an Idefics3 image of `t` tiles (split tiles
    /// plus the global one) fills `t * image_seq_len` placeholders.
    pub image_seq_len: usize,
}

impl VisionSpec {
    /// How `model`, loaded from `dir`, takes images (`None`: it has no vision encoder), checked
    /// against its tokenizer: the placeholder text must encode to the model's image token.
    pub fn for_model(
        dir: &Path,
        model: &Model,
        tokenizer: &Tokenizer,
    ) -> Result<Option<Self>, VisionConfigError> {
        let Some(config) = model.idefics3_config() else { return Ok(None) };
        let (id, size, per_tile) =
            (config.image_token_id, config.vision.image_size, config.tokens_per_tile());
        let spec = Self::idefics3(dir, id, size, per_tile)?;
        let ids = tokenizer.encode(&spec.image_token, false)?;
        if ids != [id] {
            return Err(VisionConfigError::ImageTokenMismatch { token: spec.image_token, ids, id });
        }
        Ok(Some(spec))
    }

    /// The placeholder tokens (encoder feature rows) of an image preprocessed into pixels of
    /// `shape` (`[tiles, 3, size, size]`).
    pub fn num_features(&self, shape: &[usize]) -> usize {
        shape.first().copied().unwrap_or(0) * self.image_seq_len
    }

    /// Idefics3's settings from `dir`: `preprocessor_config.json` (sizes, splitting, resampling,
    /// normalization) and `processor_config.json` (`image_seq_len`), each optional (transformers'
    /// defaults, except that the tile size and `image_seq_len` default to the model's own:
    /// `tile_size` its vision encoder's image size, `image_seq_len` its tokens per tile). The
    /// files must agree with the model: tiles of the encoder's size, and `image_seq_len` its
    /// tokens per tile.
    pub fn idefics3(
        dir: &Path,
        image_token_id: u32,
        encoder_image_size: usize,
        tokens_per_tile: usize,
    ) -> Result<Self, VisionConfigError> {
        let pre_path = dir.join("preprocessor_config.json");
        let pre = read_optional(&pre_path)?;
        let invalid =
            |path: &Path, message: String| VisionConfigError::Invalid { path: path.into(), message };
        let mut processor =
            Idefics3Processor { tile_size: encoder_image_size as u32, ..Idefics3Processor::default() };
        processor.longest_edge = 4 * processor.tile_size;
        if let Some(pre) = &pre {
            let edge = |key: &str| pre.get(key).and_then(|v| v.get("longest_edge")).and_then(Value::as_u64);
            if let Some(e) = edge("size") {
                processor.longest_edge = e as u32;
            }
            if let Some(e) = edge("max_image_size") {
                processor.tile_size = e as u32;
            }
            if let Some(split) = pre.get("do_image_splitting").and_then(Value::as_bool) {
                processor.do_image_splitting = split;
            }
            if let Some(r) = pre.get("resample").and_then(Value::as_u64) {
                processor.resample = Filter::from_pil(r as u32).ok_or_else(|| {
                    invalid(&pre_path, format!("resample {r} (PIL's) is not supported (1, 2 and 3 are)"))
                })?;
            }
            processor.normalization = normalization(pre).map_err(|m| invalid(&pre_path, m))?;
        }
        if processor.tile_size as usize != encoder_image_size {
            return Err(invalid(
                &pre_path,
                format!(
                    "tiles of {} pixels (max_image_size.longest_edge) for a vision encoder of {encoder_image_size}",
                    processor.tile_size
                ),
            ));
        }
        if processor.longest_edge == 0 {
            return Err(invalid(&pre_path, "size.longest_edge is 0".into()));
        }
        let proc_path = dir.join("processor_config.json");
        let image_seq_len = match read_optional(&proc_path)? {
            Some(p) => p.get("image_seq_len").and_then(Value::as_u64).map_or(tokens_per_tile, |n| n as usize),
            None => tokens_per_tile,
        };
        if image_seq_len != tokens_per_tile {
            return Err(invalid(
                &proc_path,
                format!(
                    "image_seq_len {image_seq_len}, but the model makes {tokens_per_tile} features a tile"
                ),
            ));
        }
        processor.image_seq_len = image_seq_len;
        Ok(Self {
            processor: VisionProcessor::Idefics3(processor),
            image_token: pagoda_media::idefics3::IMAGE_TOKEN.to_owned(),
            image_token_id,
            image_seq_len,
        })
    }
}

fn read_optional(path: &Path) -> Result<Option<Value>, VisionConfigError> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(VisionConfigError::Io { path: path.into(), source }),
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| VisionConfigError::Invalid { path: path.into(), message: e.to_string() })
}

/// `rescale_factor`, `image_mean` and `image_std` (transformers' `do_rescale` / `do_normalize`
/// off are refused: no Idefics3 checkpoint turns them off, and the encoder expects both).
fn normalization(pre: &Value) -> Result<Normalization, String> {
    for flag in ["do_rescale", "do_normalize"] {
        if pre.get(flag).and_then(Value::as_bool) == Some(false) {
            return Err(format!("{flag} false is not supported"));
        }
    }
    let mut n = Normalization::STANDARD;
    if let Some(f) = pre.get("rescale_factor").and_then(Value::as_f64) {
        n.rescale_factor = f;
    }
    let triple = |key: &str| -> Result<Option<[f64; 3]>, String> {
        match pre.get(key) {
            None => Ok(None),
            Some(Value::Array(v)) if v.len() == 3 && v.iter().all(Value::is_number) => {
                Ok(Some([0, 1, 2].map(|i| v[i].as_f64().unwrap_or_default())))
            }
            Some(Value::Number(x)) => Ok(x.as_f64().map(|x| [x; 3])),
            Some(other) => Err(format!("{key} {other} is not three numbers")),
        }
    };
    if let Some(mean) = triple("image_mean")? {
        n.image_mean = mean;
    }
    if let Some(std) = triple("image_std")? {
        if std.contains(&0.0) {
            return Err("image_std holds 0".into());
        }
        n.image_std = std;
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir_with(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (name, text) in files {
            std::fs::write(dir.path().join(name), text).unwrap();
        }
        dir
    }

    #[test]
    fn settings_come_from_the_files_and_default_to_the_model() {
        let none = dir_with(&[]);
        let spec = VisionSpec::idefics3(none.path(), 9, 64, 16).unwrap();
        let VisionProcessor::Idefics3(p) = &spec.processor;
        assert_eq!((p.tile_size, p.longest_edge, p.image_seq_len), (64, 256, 16));
        assert_eq!((spec.image_token.as_str(), spec.image_token_id), ("<image>", 9));
        assert_eq!(spec.num_features(&[3, 3, 64, 64]), 48);

        let files = dir_with(&[
            (
                "preprocessor_config.json",
                r#"{"size": {"longest_edge": 128}, "max_image_size": {"longest_edge": 64},
                    "do_image_splitting": false, "resample": 3, "image_mean": [0.1, 0.2, 0.3],
                    "image_std": 0.25, "rescale_factor": 0.5}"#,
            ),
            ("processor_config.json", r#"{"image_seq_len": 16}"#),
        ]);
        let spec = VisionSpec::idefics3(files.path(), 9, 64, 16).unwrap();
        let VisionProcessor::Idefics3(p) = &spec.processor;
        assert_eq!((p.longest_edge, p.do_image_splitting, p.resample), (128, false, Filter::Bicubic));
        assert_eq!(p.normalization.image_mean, [0.1, 0.2, 0.3]);
        assert_eq!((p.normalization.image_std, p.normalization.rescale_factor), ([0.25; 3], 0.5));
    }

    #[test]
    fn settings_the_model_cannot_take_are_refused_naming_the_file() {
        let cases = [
            ("preprocessor_config.json", r#"{"max_image_size": {"longest_edge": 512}}"#, "tiles of 512"),
            ("preprocessor_config.json", r#"{"resample": 0}"#, "resample 0"),
            ("preprocessor_config.json", r#"{"image_std": [1, 0, 1]}"#, "image_std holds 0"),
            ("preprocessor_config.json", r#"{"do_normalize": false}"#, "do_normalize"),
            ("preprocessor_config.json", "{", "preprocessor_config.json"),
            ("processor_config.json", r#"{"image_seq_len": 169}"#, "image_seq_len 169"),
        ];
        for (name, text, expected) in cases {
            let dir = dir_with(&[(name, text)]);
            let err = VisionSpec::idefics3(dir.path(), 9, 64, 16).unwrap_err().to_string();
            assert!(err.contains(expected) && err.contains(name), "{name} {text}: {err}");
        }
    }
}

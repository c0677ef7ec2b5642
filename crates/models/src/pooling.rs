//! How an embedding model turns a sequence's hidden states into one vector: the pooling
//! (mean, first token or last token) and whether the result is L2-normalized, read from a
//! sentence-transformers directory (`modules.json`, the Pooling module's `config.json`, a
//! Normalize module) with its input limit (`sentence_bert_config.json`'s `max_seq_length`).
//! A cross-encoder (a sequence classifier) pools its `[CLS]` state, unnormalized, into its
//! classifier head.

use std::path::Path;

use candle_core::{DType, Tensor};
use serde_json::Value;

use crate::error::{ModelError, Result};

/// Which hidden states make the embedding (`--pooling`; the `value(help)`s are the flag's
/// documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum PoolingKind {
    /// The mean over every token of the input.
    #[cfg_attr(feature = "clap", value(help = "The mean over the input's tokens"))]
    Mean,
    /// The first token's (BERT's `[CLS]`).
    #[cfg_attr(feature = "clap", value(help = "The first token's"))]
    Cls,
    /// The last token's (decoder models, whose last position has seen the whole input).
    #[cfg_attr(feature = "clap", value(help = "The last token's (it has seen the whole input)"))]
    Last,
}

impl PoolingKind {
    pub fn name(self) -> &'static str {
        match self {
            PoolingKind::Mean => "mean",
            PoolingKind::Cls => "cls",
            PoolingKind::Last => "last",
        }
    }
}

/// A model's pooling, as its files declare it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pooling {
    pub kind: PoolingKind,
    /// L2-normalize the pooled vector (a sentence-transformers Normalize module).
    pub normalize: bool,
    /// Most input tokens the model was trained to embed (`max_seq_length`); longer text inputs
    /// are cut to it, as sentence-transformers cuts them.
    pub max_input_tokens: Option<usize>,
    /// Trained for Matryoshka truncation (`config.json`'s `is_matryoshka` or
    /// `matryoshka_dimensions`): a prefix of the embedding, normalized again, is an embedding.
    pub matryoshka: bool,
    /// The model is a cross-encoder: it scores text pairs, and each input's pooled vector is
    /// its one score ([`crate::classifier`]), not an embedding.
    pub cross_encoder: bool,
}

impl Pooling {
    /// The pooling a sentence-transformers directory declares, or `default` (normalized, no
    /// input limit) when `dir` has no `modules.json`.
    pub fn of_dir(dir: &Path, default: PoolingKind) -> Result<Self> {
        let config = read_json(&dir.join("config.json"))?.unwrap_or(Value::Null);
        let max_input_tokens = read_json(&dir.join("sentence_bert_config.json"))?
            .and_then(|c| c["max_seq_length"].as_u64())
            .map(|n| n as usize);
        if crate::classifier::is_classifier(&config) {
            let (kind, normalize, matryoshka, cross_encoder) = (PoolingKind::Cls, false, false, true);
            return Ok(Self { kind, normalize, max_input_tokens, matryoshka, cross_encoder });
        }
        let matryoshka =
            config["is_matryoshka"].as_bool().unwrap_or(false) || config["matryoshka_dimensions"].is_array();
        let Some(modules) = read_json(&dir.join("modules.json"))? else {
            let (kind, normalize, cross_encoder) = (default, true, false);
            return Ok(Self { kind, normalize, max_input_tokens: None, matryoshka, cross_encoder });
        };
        let modules = modules.as_array().cloned().unwrap_or_default();
        let of_type =
            |suffix: &str| modules.iter().find(|m| m["type"].as_str().is_some_and(|t| t.ends_with(suffix)));
        let kind = match of_type(".Pooling") {
            Some(module) => {
                let path = dir.join(module["path"].as_str().unwrap_or_default()).join("config.json");
                let config = read_json(&path)?.unwrap_or(Value::Null);
                kind_of(&config).map_err(|message| ModelError::Config { path, message })?
            }
            None => default,
        };
        let normalize = of_type(".Normalize").is_some();
        Ok(Self { kind, normalize, max_input_tokens, matryoshka, cross_encoder: false })
    }

    /// Pools each sequence's rows of `hidden` (`[tokens, hidden]`, the sequences one after
    /// another, `bounds[i]..bounds[i + 1]` the rows of sequence `i`) into one f32 vector each.
    pub fn pool(&self, hidden: &Tensor, bounds: &[usize]) -> Result<Vec<Vec<f32>>> {
        let hidden = hidden.to_dtype(DType::F32)?;
        bounds
            .windows(2)
            .map(|w| {
                let (start, len) = (w[0], w[1] - w[0]);
                let rows = match self.kind {
                    PoolingKind::Mean => hidden.narrow(0, start, len)?.mean(0)?,
                    PoolingKind::Cls => hidden.get(start)?,
                    PoolingKind::Last => hidden.get(start + len - 1)?,
                };
                let mut values = rows.to_vec1::<f32>()?;
                if self.normalize {
                    normalize(&mut values);
                }
                Ok(values)
            })
            .collect()
    }
}

/// Scales `values` to unit L2 norm (a zero vector stays zero, as torch's `normalize` leaves it).
pub fn normalize(values: &mut [f32]) {
    let norm = values.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>().sqrt().max(1e-12);
    for v in values {
        *v = (f64::from(*v) / norm) as f32;
    }
}

/// The one pooling mode a Pooling module's config turns on.
fn kind_of(config: &Value) -> std::result::Result<PoolingKind, String> {
    let on = |key: &str| config[key].as_bool().unwrap_or(false);
    let modes = [
        ("pooling_mode_mean_tokens", Some(PoolingKind::Mean)),
        ("pooling_mode_cls_token", Some(PoolingKind::Cls)),
        ("pooling_mode_lasttoken", Some(PoolingKind::Last)),
        ("pooling_mode_max_tokens", None),
        ("pooling_mode_mean_sqrt_len_tokens", None),
        ("pooling_mode_weightedmean_tokens", None),
    ];
    let chosen: Vec<_> = modes.iter().filter(|(key, _)| on(key)).collect();
    match chosen.as_slice() {
        [(_, Some(kind))] => Ok(*kind),
        [(key, None)] => Err(format!("`{key}` pooling is not supported (mean, cls and lasttoken are)")),
        [] => Err("no pooling mode is on".into()),
        _ => Err("several pooling modes at once are not supported".into()),
    }
}

fn read_json(path: &Path) -> Result<Option<Value>> {
    match std::fs::read_to_string(path) {
        Ok(text) => serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| ModelError::Config { path: path.to_path_buf(), message: e.to_string() }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(ModelError::Io { path: path.to_path_buf(), source }),
    }
}

#[cfg(test)]
mod tests {
    use candle_core::Device;

    use super::*;

    #[test]
    fn each_kind_pools_its_rows_of_each_sequence() {
        let hidden =
            Tensor::new(&[[1f32, 0.0], [3.0, 4.0], [0.0, 2.0], [6.0, 8.0], [1.0, 1.0]], &Device::Cpu)
                .unwrap();
        let bounds = [0, 2, 5];
        let pool = |kind, normalize| {
            Pooling { kind, normalize, max_input_tokens: None, matryoshka: false, cross_encoder: false }
                .pool(&hidden, &bounds)
                .unwrap()
        };
        let near = |got: Vec<Vec<f32>>, want: [[f32; 2]; 2]| {
            let flat: Vec<f32> = got.concat();
            assert!(
                flat.iter().zip(want.concat()).all(|(a, b)| (a - b).abs() < 1e-6),
                "{flat:?} vs {want:?}"
            );
        };
        near(pool(PoolingKind::Mean, false), [[2.0, 2.0], [7.0 / 3.0, 11.0 / 3.0]]);
        near(pool(PoolingKind::Cls, false), [[1.0, 0.0], [0.0, 2.0]]);
        near(pool(PoolingKind::Last, true), [[0.6, 0.8], [std::f32::consts::FRAC_1_SQRT_2; 2]]);
    }

    #[test]
    fn the_sentence_transformers_files_decide() {
        let dir = tempfile::tempdir().unwrap();
        let default = Pooling::of_dir(dir.path(), PoolingKind::Cls).unwrap();
        let default_pooling = Pooling {
            kind: PoolingKind::Cls,
            normalize: true,
            max_input_tokens: None,
            matryoshka: false,
            cross_encoder: false,
        };
        assert_eq!(default, default_pooling);
        std::fs::write(dir.path().join("config.json"), r#"{"matryoshka_dimensions": [64, 128]}"#).unwrap();
        assert!(Pooling::of_dir(dir.path(), PoolingKind::Cls).unwrap().matryoshka);
        let modules = r#"[{"idx":0,"path":"","type":"sentence_transformers.models.Transformer"},
            {"idx":1,"path":"1_Pooling","type":"sentence_transformers.models.Pooling"}]"#;
        std::fs::write(dir.path().join("modules.json"), modules).unwrap();
        std::fs::create_dir(dir.path().join("1_Pooling")).unwrap();
        let write_mode = |mode: &str| {
            std::fs::write(dir.path().join("1_Pooling/config.json"), format!(r#"{{"{mode}": true}}"#))
                .unwrap()
        };
        write_mode("pooling_mode_lasttoken");
        std::fs::write(dir.path().join("sentence_bert_config.json"), r#"{"max_seq_length": 128}"#).unwrap();
        let declared = Pooling::of_dir(dir.path(), PoolingKind::Cls).unwrap();
        let last = Pooling {
            kind: PoolingKind::Last,
            normalize: false,
            max_input_tokens: Some(128),
            matryoshka: true,
            cross_encoder: false,
        };
        assert_eq!(declared, last);
        write_mode("pooling_mode_max_tokens");
        let err = Pooling::of_dir(dir.path(), PoolingKind::Cls).unwrap_err().to_string();
        assert!(err.contains("pooling_mode_max_tokens") && err.contains("1_Pooling"), "{err}");
        let classifier = r#"{"architectures": ["BertForSequenceClassification"]}"#;
        std::fs::write(dir.path().join("config.json"), classifier).unwrap();
        let cross = Pooling::of_dir(dir.path(), PoolingKind::Mean).unwrap();
        let cross_pooling = Pooling {
            kind: PoolingKind::Cls,
            normalize: false,
            max_input_tokens: Some(128),
            matryoshka: false,
            cross_encoder: true,
        };
        assert_eq!(cross, cross_pooling);
    }
}

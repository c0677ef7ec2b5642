//! `--rope-scaling`: a rope scaling that replaces the one the model's files declare, in the
//! `rope_scaling` shape of transformers' `config.json` (vLLM's `--hf-overrides`), e.g.
//! `{"rope_type":"yarn","factor":4.0,"original_max_position_embeddings":8192}`. It also sets the
//! model's positions to `factor * original_max_position_embeddings`, as vLLM derives its longest
//! context from a YaRN scaling, so `--max-model-len` may go that far.

use pagoda_ops::RopeScaling;
use serde::Deserialize;

use crate::config::ModelConfig;

/// A rope scaling asked for at start-up, checked field by field; applied to a model's config by
/// [`ModelConfig::with_rope_override`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopeScalingOverride {
    kind: OverrideKind,
    factor: f32,
    /// `None`: the model's own `max_position_embeddings`.
    original_max_position_embeddings: Option<usize>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum OverrideKind {
    /// `"default"`: no scaling, whatever the files say.
    Plain,
    Linear,
    Dynamic,
    Llama3 {
        low_freq_factor: f32,
        high_freq_factor: f32,
    },
    Yarn {
        beta_fast: f32,
        beta_slow: f32,
        attention_factor: f32,
        truncate: bool,
    },
}

/// What was wrong with a `--rope-scaling` value; names the field.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct RopeOverrideError {
    pub field: String,
    pub message: String,
}

/// Every setting a `rope_scaling` may hold besides its type.
const FIELDS: [&str; 10] = [
    "factor",
    "original_max_position_embeddings",
    "low_freq_factor",
    "high_freq_factor",
    "beta_fast",
    "beta_slow",
    "attention_factor",
    "mscale",
    "mscale_all_dim",
    "truncate",
];

/// The types an override may name.
const TYPES: &str = "default, linear, dynamic, llama3 or yarn";

fn bad(field: &str, message: impl Into<String>) -> RopeOverrideError {
    RopeOverrideError { field: field.to_owned(), message: message.into() }
}

/// The JSON as written; every field optional so that each type can say which it needs.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    rope_type: Option<String>,
    /// transformers' older spelling of `rope_type`.
    #[serde(rename = "type")]
    kind: Option<String>,
    factor: Option<f32>,
    original_max_position_embeddings: Option<usize>,
    low_freq_factor: Option<f32>,
    high_freq_factor: Option<f32>,
    beta_fast: Option<f32>,
    beta_slow: Option<f32>,
    attention_factor: Option<f32>,
    mscale: Option<f32>,
    mscale_all_dim: Option<f32>,
    truncate: Option<bool>,
}

impl Raw {
    /// The fields given, by name, for refusing those a type does not read.
    fn given(&self) -> Vec<&'static str> {
        let fields = [
            ("factor", self.factor.is_some()),
            ("original_max_position_embeddings", self.original_max_position_embeddings.is_some()),
            ("low_freq_factor", self.low_freq_factor.is_some()),
            ("high_freq_factor", self.high_freq_factor.is_some()),
            ("beta_fast", self.beta_fast.is_some()),
            ("beta_slow", self.beta_slow.is_some()),
            ("attention_factor", self.attention_factor.is_some()),
            ("mscale", self.mscale.is_some()),
            ("mscale_all_dim", self.mscale_all_dim.is_some()),
            ("truncate", self.truncate.is_some()),
        ];
        fields.iter().filter(|(_, set)| *set).map(|(name, _)| *name).collect()
    }
}

fn positive(field: &str, value: Option<f32>, default: f32) -> Result<f32, RopeOverrideError> {
    match value {
        None => Ok(default),
        Some(v) if v.is_finite() && v > 0.0 => Ok(v),
        Some(v) => Err(bad(field, format!("must be a positive number, got {v}"))),
    }
}

impl RopeScalingOverride {
    /// Parses and checks `json`: an unknown `rope_type`, an unknown field, a field the type does
    /// not read or a value out of range is an error naming the field.
    pub fn parse(json: &str) -> Result<Self, RopeOverrideError> {
        let raw: Raw = serde_json::from_str(json).map_err(|e| {
            let text = e.to_string();
            match text.split('`').nth(1).filter(|_| text.starts_with("unknown field")) {
                Some(field) => bad(field, format!("unknown field (known: rope_type, {})", FIELDS.join(", "))),
                None => bad("rope_scaling", format!("not a JSON object of rope settings: {text}")),
            }
        })?;
        let rope_type = match (&raw.rope_type, &raw.kind) {
            (Some(t), Some(k)) if t != k => {
                return Err(bad("type", format!("`{k}` disagrees with rope_type `{t}`")));
            }
            (Some(t), _) | (None, Some(t)) => t.clone(),
            (None, None) => return Err(bad("rope_type", format!("missing (one of {TYPES})"))),
        };
        let (kind, reads): (OverrideKind, &[&str]) = match rope_type.as_str() {
            "default" => (OverrideKind::Plain, &[]),
            "linear" => (OverrideKind::Linear, &["factor", "original_max_position_embeddings"]),
            "dynamic" => (OverrideKind::Dynamic, &["factor", "original_max_position_embeddings"]),
            "llama3" => {
                let low = positive("low_freq_factor", raw.low_freq_factor, 1.0)?;
                let high = positive("high_freq_factor", raw.high_freq_factor, 4.0)?;
                if high <= low {
                    return Err(bad(
                        "high_freq_factor",
                        format!("must exceed low_freq_factor {low}, got {high}"),
                    ));
                }
                let reads: &[&str] =
                    &["factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor"];
                (OverrideKind::Llama3 { low_freq_factor: low, high_freq_factor: high }, reads)
            }
            "yarn" => {
                let beta_fast = positive("beta_fast", raw.beta_fast, 32.0)?;
                let beta_slow = positive("beta_slow", raw.beta_slow, 1.0)?;
                if beta_fast <= beta_slow {
                    return Err(bad(
                        "beta_fast",
                        format!("must exceed beta_slow {beta_slow}, got {beta_fast}"),
                    ));
                }
                let mscale = raw.mscale.map(|m| positive("mscale", Some(m), 1.0)).transpose()?;
                let all = raw.mscale_all_dim.map(|m| positive("mscale_all_dim", Some(m), 1.0)).transpose()?;
                let factor = positive("factor", raw.factor, 1.0)?;
                let attention_factor = match raw.attention_factor {
                    Some(a) => positive("attention_factor", Some(a), 1.0)?,
                    None => pagoda_ops::yarn_attention_factor(factor, mscale, all),
                };
                let kind = OverrideKind::Yarn {
                    beta_fast,
                    beta_slow,
                    attention_factor,
                    truncate: raw.truncate.unwrap_or(true),
                };
                let reads: &[&str] = &[
                    "factor",
                    "original_max_position_embeddings",
                    "beta_fast",
                    "beta_slow",
                    "attention_factor",
                    "mscale",
                    "mscale_all_dim",
                    "truncate",
                ];
                (kind, reads)
            }
            "longrope" | "su" | "mrope" => {
                return Err(bad(
                    "rope_type",
                    format!("`{rope_type}` needs per-model factors, not an override (use {TYPES})"),
                ));
            }
            other => {
                return Err(bad("rope_type", format!("unknown `{other}` (use {TYPES})")));
            }
        };
        if let Some(field) = raw.given().into_iter().find(|f| !reads.contains(f)) {
            return Err(bad(field, format!("is not a setting of rope_type `{rope_type}`")));
        }
        let factor = match (kind, raw.factor) {
            (OverrideKind::Plain, _) => 1.0,
            (_, None) => return Err(bad("factor", format!("missing (rope_type `{rope_type}` needs it)"))),
            (_, Some(f)) if f.is_finite() && f >= 1.0 => f,
            (_, Some(f)) => return Err(bad("factor", format!("must be at least 1, got {f}"))),
        };
        if raw.original_max_position_embeddings == Some(0) {
            return Err(bad("original_max_position_embeddings", "must be at least 1"));
        }
        Ok(Self { kind, factor, original_max_position_embeddings: raw.original_max_position_embeddings })
    }

    /// The scaling for a model trained on `model_positions` positions (the original context
    /// when the override names none).
    pub fn scaling(&self, model_positions: usize) -> RopeScaling {
        let factor = self.factor;
        let original = self.original_max_position_embeddings.unwrap_or(model_positions);
        match self.kind {
            OverrideKind::Plain => RopeScaling::None,
            OverrideKind::Linear => RopeScaling::Linear { factor },
            OverrideKind::Dynamic => {
                RopeScaling::DynamicNtk { factor, original_max_position_embeddings: original }
            }
            OverrideKind::Llama3 { low_freq_factor, high_freq_factor } => RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings: original,
            },
            OverrideKind::Yarn { beta_fast, beta_slow, attention_factor, truncate } => RopeScaling::Yarn {
                factor,
                original_max_position_embeddings: original,
                beta_fast,
                beta_slow,
                attention_factor,
                truncate,
            },
        }
    }

    /// The positions the scaled model supports: `factor * original` (the model's own count for
    /// `"default"`).
    pub fn max_positions(&self, model_positions: usize) -> usize {
        match self.kind {
            OverrideKind::Plain => model_positions,
            _ => {
                let original = self.original_max_position_embeddings.unwrap_or(model_positions);
                (self.factor as f64 * original as f64).floor() as usize
            }
        }
    }
}

impl ModelConfig {
    /// This config with `rope` (when given) in place of the scaling its files declare: the
    /// global rope's scaling replaced, GGUF per-frequency divisors and LongRoPE factors dropped
    /// (they are the files' scaling), and the positions set to what the new scaling covers.
    /// Windowed layers' local rope stays unscaled, as ever.
    pub fn with_rope_override(mut self, rope: Option<&RopeScalingOverride>) -> Self {
        if let Some(rope) = rope {
            let trained = self
                .long_rope
                .as_ref()
                .map_or(self.max_position_embeddings, |l| l.original_max_position_embeddings);
            self.rope_scaling = rope.scaling(trained);
            self.max_position_embeddings = rope.max_positions(trained);
            self.rope_freq_factors = None;
            self.long_rope = None;
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field_of(json: &str) -> String {
        RopeScalingOverride::parse(json).unwrap_err().field
    }

    #[test]
    fn yarn_defaults_follow_transformers() {
        let o = RopeScalingOverride::parse(
            r#"{"rope_type":"yarn","factor":4.0,"original_max_position_embeddings":8192}"#,
        )
        .unwrap();
        let RopeScaling::Yarn { beta_fast, beta_slow, attention_factor, truncate, .. } = o.scaling(2048)
        else {
            panic!("not yarn: {o:?}");
        };
        assert_eq!((beta_fast, beta_slow, truncate), (32.0, 1.0, true));
        assert!((attention_factor as f64 - (0.1 * 4f64.ln() + 1.0)).abs() < 1e-6);
        assert_eq!(o.max_positions(2048), 32768);
        // The original context defaults to the model's.
        let o = RopeScalingOverride::parse(r#"{"type":"linear","factor":2.5}"#).unwrap();
        assert_eq!(o.scaling(4096), RopeScaling::Linear { factor: 2.5 });
        assert_eq!(o.max_positions(4096), 10240);
        let o = RopeScalingOverride::parse(r#"{"rope_type":"default"}"#).unwrap();
        assert_eq!((o.scaling(4096), o.max_positions(4096)), (RopeScaling::None, 4096));
    }

    #[test]
    fn override_replaces_the_files_scaling_and_positions() {
        let text = r#"{"model_type":"llama","vocab_size":64,"hidden_size":64,"intermediate_size":128,
            "num_hidden_layers":2,"num_attention_heads":4,"max_position_embeddings":8192,
            "rope_scaling":{"rope_type":"linear","factor":2.0}}"#;
        let mut c = ModelConfig::from_hf_str(std::path::Path::new("config.json"), text).unwrap();
        c.rope_freq_factors = Some(vec![1.0; 8]);
        assert_eq!(c.clone().with_rope_override(None), c);
        let yarn = RopeScalingOverride::parse(r#"{"rope_type":"yarn","factor":4.0}"#).unwrap();
        let scaled = c.with_rope_override(Some(&yarn));
        assert_eq!(scaled.max_position_embeddings, 32768);
        assert!(scaled.rope_freq_factors.is_none());
        assert!(matches!(
            scaled.rope_scaling,
            RopeScaling::Yarn { factor: 4.0, original_max_position_embeddings: 8192, .. }
        ));
    }

    #[test]
    fn bad_values_name_their_field() {
        assert_eq!(field_of(r#"{"rope_type":"ntk","factor":2}"#), "rope_type");
        assert_eq!(field_of(r#"{"factor":2}"#), "rope_type");
        assert_eq!(field_of(r#"{"rope_type":"yarn"}"#), "factor");
        assert_eq!(field_of(r#"{"rope_type":"yarn","factor":0.5}"#), "factor");
        assert_eq!(field_of(r#"{"rope_type":"yarn","factor":4,"beta_fast":-1}"#), "beta_fast");
        assert_eq!(field_of(r#"{"rope_type":"yarn","factor":4,"beta_fast":1,"beta_slow":2}"#), "beta_fast");
        assert_eq!(field_of(r#"{"rope_type":"linear","factor":4,"beta_fast":8}"#), "beta_fast");
        assert_eq!(field_of(r#"{"rope_type":"yarn","factor":4,"scale":8}"#), "scale");
        assert_eq!(
            field_of(r#"{"rope_type":"yarn","factor":4,"original_max_position_embeddings":0}"#),
            "original_max_position_embeddings"
        );
        assert_eq!(
            field_of(r#"{"rope_type":"llama3","factor":8,"low_freq_factor":4,"high_freq_factor":1}"#),
            "high_freq_factor"
        );
        assert_eq!(field_of(r#"{"rope_type":"yarn","type":"linear","factor":4}"#), "type");
        assert_eq!(field_of("[1]"), "rope_scaling");
    }
}

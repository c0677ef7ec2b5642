//! `--speculative-config`: vLLM's JSON object (`{"method": "ngram", "num_speculative_tokens":
//! 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}`, or `"method": "suffix"` with the
//! `suffix_decoding_*` keys, or `"method": "draft_model"` with `"model"`: a smaller model with
//! the same vocabulary, or `"self"` with `num_draft_layers`, the target drafting with its first
//! layers), turned into the engine's [`SpeculativeConfig`] and, for a draft model, its path.
//! Unknown keys and methods, and keys of the other method, are refused by name rather than
//! ignored.

use std::path::PathBuf;

use pagoda_engine::speculative::{DEFAULT_PROMPT_LOOKUP_MAX, DEFAULT_PROMPT_LOOKUP_MIN};
use pagoda_engine::{SpeculativeConfig, SpeculativeMethod};
use serde::Deserialize;

use crate::flags::DeviceArg;

/// Running sequences above which no step proposes anything, unless the config says otherwise.
/// On the CPU a batch of more than a few sequences has no compute to spare for verification
/// (benches/reports/2026-11-24-speculative-batch-crossover.md). On a GPU the default model's steps
/// stay far from compute-bound: n-gram k = 8 still gave 1.27x at 128 streams on an H200, and a
/// Llama-8B-shaped step grows about 37 % from 1 to 128 tokens
/// (benches/reports/2026-11-26-speculative-gpu-h200.md), so proposals stop only above 32 sequences
/// (up to 288 verified positions a step).
pub fn default_disable_by_batch_size(device: DeviceArg) -> usize {
    match device {
        DeviceArg::Cpu => 4,
        DeviceArg::Cuda(_) => 32,
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SpeculativeJson {
    method: Option<String>,
    /// vLLM's older spelling: `"model": "[ngram]"`.
    model: Option<String>,
    num_speculative_tokens: Option<usize>,
    prompt_lookup_max: Option<usize>,
    prompt_lookup_min: Option<usize>,
    suffix_decoding_max_tree_depth: Option<usize>,
    suffix_decoding_max_cached_requests: Option<usize>,
    suffix_decoding_max_spec_factor: Option<f32>,
    suffix_decoding_min_token_prob: Option<f32>,
    /// `draft_model` with `"model": "self"`: the target's first this many layers draft.
    num_draft_layers: Option<usize>,
    disable_by_batch_size: Option<usize>,
}

/// What `--speculative-config` asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct SpeculativeSetting {
    pub config: SpeculativeConfig,
    /// With [`SpeculativeMethod::DraftModel`]: the draft's `"model"` (a path or a hub id).
    pub draft_model: Option<PathBuf>,
}

/// Parses and checks the JSON for a server on `device`; the message names what is wrong.
pub fn parse(json: &str, device: DeviceArg) -> Result<SpeculativeSetting, String> {
    let j: SpeculativeJson = serde_json::from_str(json).map_err(|e| e.to_string())?;
    let method = match (j.method.as_deref(), j.model.as_deref()) {
        (Some(m), _) => m,
        (None, Some("[ngram]")) => "ngram",
        (None, Some(_)) => "draft_model",
        (None, None) => {
            return Err("\"method\" is required (supported: \"ngram\", \"suffix\", \"draft_model\")".into())
        }
    };
    let num_speculative_tokens = j.num_speculative_tokens.ok_or("\"num_speculative_tokens\" is required")?;
    // Each key belongs to one method; another method's key is a mistake worth naming.
    let owned = [
        ("prompt_lookup_max", j.prompt_lookup_max.is_some(), "ngram"),
        ("prompt_lookup_min", j.prompt_lookup_min.is_some(), "ngram"),
        ("suffix_decoding_max_tree_depth", j.suffix_decoding_max_tree_depth.is_some(), "suffix"),
        ("suffix_decoding_max_cached_requests", j.suffix_decoding_max_cached_requests.is_some(), "suffix"),
        ("suffix_decoding_max_spec_factor", j.suffix_decoding_max_spec_factor.is_some(), "suffix"),
        ("suffix_decoding_min_token_prob", j.suffix_decoding_min_token_prob.is_some(), "suffix"),
        ("num_draft_layers", j.num_draft_layers.is_some(), "draft_model"),
        ("model", j.model.as_deref().is_some_and(|m| m != "[ngram]"), "draft_model"),
    ];
    if let Some((key, _, owner)) = owned.iter().find(|(_, given, owner)| *given && *owner != method) {
        return Err(format!("{key} applies to method \"{owner}\", not \"{method}\""));
    }
    let mut draft_model = None;
    let method = match method {
        "ngram" => {
            let max = j.prompt_lookup_max.or(j.prompt_lookup_min).unwrap_or(DEFAULT_PROMPT_LOOKUP_MAX);
            let min = j.prompt_lookup_min.unwrap_or(max.min(DEFAULT_PROMPT_LOOKUP_MIN));
            SpeculativeMethod::Ngram { prompt_lookup_min: min, prompt_lookup_max: max }
        }
        "suffix" => {
            let SpeculativeMethod::Suffix {
                max_tree_depth,
                max_cached_requests,
                max_spec_factor,
                min_token_prob,
            } = SpeculativeConfig::suffix(num_speculative_tokens).method
            else {
                unreachable!("suffix() makes a suffix config")
            };
            SpeculativeMethod::Suffix {
                max_tree_depth: j.suffix_decoding_max_tree_depth.unwrap_or(max_tree_depth),
                max_cached_requests: j.suffix_decoding_max_cached_requests.unwrap_or(max_cached_requests),
                max_spec_factor: j.suffix_decoding_max_spec_factor.unwrap_or(max_spec_factor),
                min_token_prob: j.suffix_decoding_min_token_prob.unwrap_or(min_token_prob),
            }
        }
        "draft_model" => match (j.model.as_deref(), j.num_draft_layers) {
            (Some("self"), Some(num_layers)) => SpeculativeMethod::DraftLayers { num_layers },
            (Some("self"), None) => {
                return Err("\"num_draft_layers\" is required with \"model\": \"self\"".into())
            }
            (Some(path), None) => {
                draft_model = Some(PathBuf::from(path));
                SpeculativeMethod::DraftModel
            }
            (Some(_), Some(_)) => {
                return Err(
                    "num_draft_layers applies to \"model\": \"self\" only, not to a separate draft model"
                        .into(),
                )
            }
            (None, _) => {
                return Err("\"model\" is required with \"draft_model\": a draft model's path or hub id, or \
                            \"self\" with \"num_draft_layers\""
                    .into())
            }
        },
        other => {
            return Err(format!(
                "method {other:?} is not supported (supported: \"ngram\", \"suffix\", \"draft_model\")"
            ))
        }
    };
    let config = SpeculativeConfig {
        method,
        num_speculative_tokens,
        disable_by_batch_size: j
            .disable_by_batch_size
            .unwrap_or_else(|| default_disable_by_batch_size(device)),
    };
    config.validate().map_err(|e| e.to_string())?;
    Ok(SpeculativeSetting { config, draft_model })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<SpeculativeConfig, String> {
        super::parse(json, DeviceArg::Cpu).map(|s| s.config)
    }

    #[test]
    fn the_batch_size_switch_off_defaults_by_device() {
        let json = r#"{"method": "ngram", "num_speculative_tokens": 8}"#;
        assert_eq!(parse(json).unwrap().disable_by_batch_size, 4);
        assert_eq!(super::parse(json, DeviceArg::Cuda(1)).unwrap().config.disable_by_batch_size, 32);
        let set = r#"{"method": "ngram", "num_speculative_tokens": 8, "disable_by_batch_size": 7}"#;
        for device in [DeviceArg::Cpu, DeviceArg::Cuda(0)] {
            assert_eq!(super::parse(set, device).unwrap().config.disable_by_batch_size, 7);
        }
    }

    #[test]
    fn vllm_shapes_parse() {
        let c = parse(r#"{"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 3}"#).unwrap();
        assert_eq!(c.num_speculative_tokens, 5);
        assert_eq!(c.method, SpeculativeMethod::Ngram { prompt_lookup_min: 2, prompt_lookup_max: 3 });
        assert_eq!(c.disable_by_batch_size, 4);
        let c = parse(
            r#"{"model": "[ngram]", "num_speculative_tokens": 2, "prompt_lookup_min": 1,
            "prompt_lookup_max": 1, "disable_by_batch_size": 9}"#,
        )
        .unwrap();
        assert_eq!(c.method, SpeculativeMethod::Ngram { prompt_lookup_min: 1, prompt_lookup_max: 1 });
        assert_eq!(c.disable_by_batch_size, 9);
        let c = parse(r#"{"method": "draft_model", "model": "self", "num_draft_layers": 12, "num_speculative_tokens": 3}"#)
            .unwrap();
        assert_eq!(c.method, SpeculativeMethod::DraftLayers { num_layers: 12 });
        // A separate draft: vLLM's `"model"` key, or its older shape without `"method"`.
        for json in [
            r#"{"method": "draft_model", "model": "models/draft.gguf", "num_speculative_tokens": 5}"#,
            r#"{"model": "models/draft.gguf", "num_speculative_tokens": 5}"#,
        ] {
            let s = super::parse(json, DeviceArg::Cpu).unwrap();
            assert_eq!(s.config.method, SpeculativeMethod::DraftModel);
            assert_eq!(s.draft_model, Some(PathBuf::from("models/draft.gguf")));
        }
        assert_eq!(
            super::parse(r#"{"method": "ngram", "num_speculative_tokens": 2}"#, DeviceArg::Cpu)
                .unwrap()
                .draft_model,
            None
        );
        let c = parse(
            r#"{"method": "suffix", "num_speculative_tokens": 8, "suffix_decoding_max_tree_depth": 24,
            "suffix_decoding_min_token_prob": 0.2}"#,
        )
        .unwrap();
        assert_eq!(
            c.method,
            SpeculativeMethod::Suffix {
                max_tree_depth: 24,
                max_cached_requests: 256,
                max_spec_factor: 1.0,
                min_token_prob: 0.2
            }
        );
    }

    #[test]
    fn mistakes_are_named() {
        let err = |json: &str| parse(json).unwrap_err();
        assert!(
            err(r#"{"method": "eagle", "num_speculative_tokens": 2}"#).contains("\"eagle\" is not supported")
        );
        assert!(err(r#"{"method": "draft_model", "num_speculative_tokens": 2}"#)
            .contains("\"model\" is required"));
        assert!(err(r#"{"method": "draft_model", "model": "self", "num_speculative_tokens": 2}"#)
            .contains("num_draft_layers"));
        assert!(err(r#"{"method": "draft_model", "model": "d.gguf", "num_draft_layers": 2, "num_speculative_tokens": 2}"#)
            .contains("not to a separate draft model"));
        assert!(err(r#"{"method": "ngram", "num_speculative_tokens": 2, "num_draft_layers": 3}"#)
            .contains("num_draft_layers applies to method \"draft_model\""));
        assert!(err(r#"{"method": "ngram"}"#).contains("num_speculative_tokens"));
        assert!(
            err(r#"{"method": "ngram", "num_speculative_tokens": 2, "lookahead": 1}"#).contains("lookahead")
        );
        assert!(err(r#"{"method": "ngram", "num_speculative_tokens": 0}"#).contains("[1, 16]"));
        assert!(err(r#"{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 5,
            "prompt_lookup_max": 3}"#)
        .contains("prompt_lookup_min (5)"));
        assert!(err("ngram").contains("expected"));
        assert!(err(
            r#"{"method": "ngram", "num_speculative_tokens": 2, "suffix_decoding_max_tree_depth": 8}"#
        )
        .contains("suffix_decoding_max_tree_depth applies to method \"suffix\""));
        assert!(err(r#"{"method": "suffix", "num_speculative_tokens": 2, "prompt_lookup_max": 3}"#)
            .contains("prompt_lookup_max applies to method \"ngram\""));
        assert!(err(
            r#"{"method": "suffix", "num_speculative_tokens": 2, "suffix_decoding_max_tree_depth": 2}"#
        )
        .contains("suffix_decoding_max_tree_depth must be in [4, 256]"));
    }
}

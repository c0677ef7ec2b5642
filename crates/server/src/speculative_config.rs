//! `--speculative-config`: vLLM's JSON object (`{"method": "ngram", "num_speculative_tokens":
//! 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}`), turned into the engine's
//! [`SpeculativeConfig`]. Unknown keys and methods are refused by name rather than ignored.

use pagoda_engine::{SpeculativeConfig, SpeculativeMethod};
use serde::Deserialize;

/// Running sequences above which no step proposes anything, unless the config says otherwise
/// (measured on the CPU: see benches/README.md, "Speculative decoding").
pub const DEFAULT_DISABLE_BY_BATCH_SIZE: usize = 4;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SpeculativeJson {
    method: Option<String>,
    /// vLLM's older spelling: `"model": "[ngram]"`.
    model: Option<String>,
    num_speculative_tokens: Option<usize>,
    prompt_lookup_max: Option<usize>,
    prompt_lookup_min: Option<usize>,
    disable_by_batch_size: Option<usize>,
}

/// Parses and checks the JSON; the message names what is wrong.
pub fn parse(json: &str) -> Result<SpeculativeConfig, String> {
    let j: SpeculativeJson = serde_json::from_str(json).map_err(|e| e.to_string())?;
    let method = match (j.method.as_deref(), j.model.as_deref()) {
        (Some(m), _) => m,
        (None, Some("[ngram]")) => "ngram",
        (None, Some(other)) => {
            return Err(format!(
                "draft models are not supported yet (model {other:?}); use \"method\": \"ngram\""
            ))
        }
        (None, None) => return Err("\"method\" is required (supported: \"ngram\")".into()),
    };
    if method != "ngram" {
        return Err(format!("method {method:?} is not supported (supported: \"ngram\")"));
    }
    let num_speculative_tokens = j.num_speculative_tokens.ok_or("\"num_speculative_tokens\" is required")?;
    let max = j.prompt_lookup_max.or(j.prompt_lookup_min).unwrap_or(4);
    let min = j.prompt_lookup_min.unwrap_or(max.min(2));
    let config = SpeculativeConfig {
        method: SpeculativeMethod::Ngram { prompt_lookup_min: min, prompt_lookup_max: max },
        num_speculative_tokens,
        disable_by_batch_size: j.disable_by_batch_size.unwrap_or(DEFAULT_DISABLE_BY_BATCH_SIZE),
    };
    config.validate().map_err(|e| e.to_string())?;
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vllm_shapes_parse() {
        let c = parse(r#"{"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 3}"#).unwrap();
        assert_eq!(c.num_speculative_tokens, 5);
        assert_eq!(c.method, SpeculativeMethod::Ngram { prompt_lookup_min: 2, prompt_lookup_max: 3 });
        assert_eq!(c.disable_by_batch_size, DEFAULT_DISABLE_BY_BATCH_SIZE);
        let c = parse(
            r#"{"model": "[ngram]", "num_speculative_tokens": 2, "prompt_lookup_min": 1,
            "prompt_lookup_max": 1, "disable_by_batch_size": 9}"#,
        )
        .unwrap();
        assert_eq!(c.method, SpeculativeMethod::Ngram { prompt_lookup_min: 1, prompt_lookup_max: 1 });
        assert_eq!(c.disable_by_batch_size, 9);
    }

    #[test]
    fn mistakes_are_named() {
        let err = |json: &str| parse(json).unwrap_err();
        assert!(
            err(r#"{"method": "eagle", "num_speculative_tokens": 2}"#).contains("\"eagle\" is not supported")
        );
        assert!(err(r#"{"model": "org/draft", "num_speculative_tokens": 2}"#).contains("draft models"));
        assert!(err(r#"{"method": "ngram"}"#).contains("num_speculative_tokens"));
        assert!(
            err(r#"{"method": "ngram", "num_speculative_tokens": 2, "lookahead": 1}"#).contains("lookahead")
        );
        assert!(err(r#"{"method": "ngram", "num_speculative_tokens": 0}"#).contains("[1, 16]"));
        assert!(err(r#"{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 5,
            "prompt_lookup_max": 3}"#)
        .contains("prompt_lookup_min (5)"));
        assert!(err("ngram").contains("expected"));
    }
}

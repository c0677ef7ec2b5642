//! Wire types shared by the chat and completions APIs: errors, usage, stream options, stop
//! sequences, the OpenAI fields both requests carry, and the "string or array" shapes OpenAI
//! accepts.
//!
//! The flexible shapes have hand-written `Deserialize` impls so that a wrong shape is reported
//! as a plain sentence with the parameter's name, not serde's "did not match any variant".

use std::collections::HashMap;
use std::fmt;

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::sampling::CommonParams;

/// The OpenAI error body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ErrorResponse {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ErrorDetail {
    pub message: String,
    pub r#type: String,
    /// The request parameter at fault, if any.
    pub param: Option<String>,
    pub code: Option<String>,
}

/// Token counts of one request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
}

impl Usage {
    pub fn new(prompt_tokens: usize, completion_tokens: usize) -> Self {
        Self { prompt_tokens, completion_tokens, total_tokens: prompt_tokens + completion_tokens }
    }
}

/// `stream_options`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct StreamOptions {
    /// Send a last chunk with empty `choices` and the request's `usage`.
    #[serde(default)]
    pub include_usage: Option<bool>,
}

/// `stop`: one string or a list of strings.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
#[serde(untagged)]
pub enum StopSpec {
    One(String),
    Many(Vec<String>),
}

impl StopSpec {
    pub fn into_vec(self) -> Vec<String> {
        match self {
            StopSpec::One(s) => vec![s],
            StopSpec::Many(v) => v,
        }
    }
}

impl<'de> Deserialize<'de> for StopSpec {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = StopSpec;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string or an array of strings")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<StopSpec, E> {
                Ok(StopSpec::One(v.to_owned()))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<StopSpec, A::Error> {
                let mut out = Vec::new();
                while let Some(s) = seq.next_element::<String>()? {
                    out.push(s);
                }
                Ok(StopSpec::Many(out))
            }
        }
        deserializer.deserialize_any(V)
    }
}

/// OpenAI's own fields that chat and completions requests share, flattened into both (with
/// [`super::VllmExtensions`] for the vLLM/SGLang ones).
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
pub struct OpenAiFields {
    /// 0 to 2; 0 is greedy. Default 1.
    #[serde(default)]
    pub temperature: Option<f32>,
    /// (0, 1]. Default 1.
    #[serde(default)]
    pub top_p: Option<f32>,
    /// Number of choices to generate (per prompt). Default 1.
    #[serde(default)]
    pub n: Option<u32>,
    #[serde(default)]
    pub stop: Option<StopSpec>,
    #[serde(default)]
    pub seed: Option<i64>,
    /// [-2, 2].
    #[serde(default)]
    pub presence_penalty: Option<f32>,
    /// [-2, 2].
    #[serde(default)]
    pub frequency_penalty: Option<f32>,
    /// Token id (as a string) to a bias in [-100, 100].
    #[serde(default)]
    pub logit_bias: Option<HashMap<String, f32>>,
    #[serde(default)]
    pub stream: Option<bool>,
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    /// Accepted and ignored.
    #[serde(default)]
    pub user: Option<String>,
}

impl OpenAiFields {
    /// The generation parameters of these fields and of `extensions`; the request fills in
    /// the ones its API spells its own way (`max_tokens`, `logprobs`, `best_of`).
    pub fn common(&self, extensions: &super::VllmExtensions) -> CommonParams {
        CommonParams {
            temperature: self.temperature,
            top_p: self.top_p,
            n: self.n,
            stop: self.stop.clone(),
            seed: self.seed,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            logit_bias: self.logit_bias.clone(),
            ..extensions.common()
        }
    }

    /// Whether the answer streams.
    pub fn streams(&self) -> bool {
        self.stream.unwrap_or(false)
    }

    /// Whether a stream ends with a usage chunk.
    pub fn include_usage(&self) -> bool {
        self.stream_options.as_ref().and_then(|o| o.include_usage).unwrap_or(false)
    }
}

/// A field that is a string when present: `null` and other types are refused (`serde`'s
/// `Option` would take `null` as absent).
pub fn optional_string<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    match serde_json::Value::deserialize(d)? {
        serde_json::Value::String(s) => Ok(Some(s)),
        other => Err(de::Error::custom(format!("must be a string, got {other}"))),
    }
}

/// Seconds since the Unix epoch, for `created` fields.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_accepts_string_or_list_only() {
        let one: StopSpec = serde_json::from_str(r#""\n""#).unwrap();
        assert_eq!(one.into_vec(), vec!["\n"]);
        let many: StopSpec = serde_json::from_str(r#"["a","b"]"#).unwrap();
        assert_eq!(many.into_vec(), vec!["a", "b"]);
        let err = serde_json::from_str::<StopSpec>("3").unwrap_err().to_string();
        assert!(err.contains("a string or an array of strings"), "{err}");
        assert!(serde_json::from_str::<StopSpec>("[1]").is_err());
    }
}

//! `POST /v1/completions` wire types: the request (with its four prompt shapes), the
//! `text_completion` response and its stream events.

use std::collections::HashMap;
use std::fmt;

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::common::{OpenAiFields, Usage};
use super::extensions::VllmExtensions;
use super::sampling::{CommonParams, FinishReason, StopReason};

/// A completion request. Unknown top-level fields are refused (see [`super::fields`]).
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
pub struct CompletionRequest {
    #[serde(default, deserialize_with = "super::common::optional_string")]
    pub model: Option<String>,
    pub prompt: Prompt,
    /// Absent: whatever the context allows.
    #[serde(default)]
    pub max_tokens: Option<u32>,
    /// With `use_beam_search`, the number of beams (at least `n`; the best `n` hypotheses
    /// return); otherwise only equal to `n` (or absent).
    #[serde(default)]
    pub best_of: Option<u32>,
    /// Number of alternatives (0 to 20) returned with each token's logprob.
    #[serde(default)]
    pub logprobs: Option<u32>,
    /// Prepend the prompt to the completion text; with `logprobs`, the prompt's tokens and their
    /// logprobs come first in `logprobs` too (the first token's logprob is null).
    #[serde(default)]
    pub echo: Option<bool>,
    /// Not supported: must be absent or empty.
    #[serde(default)]
    pub suffix: Option<String>,
    // The fields chat requests carry too (plain comments: a doc comment would wrap the inlined
    // schema in a `oneOf` to hang its description on).
    #[serde(flatten)]
    #[schema(inline)]
    pub openai: OpenAiFields,
    #[serde(flatten)]
    #[schema(inline)]
    pub extensions: VllmExtensions,
}

impl CompletionRequest {
    pub fn common(&self) -> CommonParams {
        CommonParams {
            max_tokens: self.max_tokens,
            max_tokens_param: "max_tokens",
            logprobs: self.logprobs,
            logprobs_param: "logprobs",
            best_of: self.best_of,
            ..self.openai.common(&self.extensions)
        }
    }
}

/// `prompt`: a string, an array of strings, an array of token ids, or an array of arrays of
/// token ids. Several prompts give `n` choices each, indexed prompt by prompt.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
    TokenBatches(Vec<Vec<u32>>),
}

impl Default for Prompt {
    fn default() -> Self {
        Prompt::Text(String::new())
    }
}

/// One prompt out of a [`Prompt`].
#[derive(Debug, Clone, PartialEq)]
pub enum PromptInput {
    Text(String),
    Tokens(Vec<u32>),
}

impl Prompt {
    pub fn into_inputs(self) -> Vec<PromptInput> {
        match self {
            Prompt::Text(t) => vec![PromptInput::Text(t)],
            Prompt::Texts(v) => v.into_iter().map(PromptInput::Text).collect(),
            Prompt::Tokens(t) => vec![PromptInput::Tokens(t)],
            Prompt::TokenBatches(v) => v.into_iter().map(PromptInput::Tokens).collect(),
        }
    }
}

const PROMPT_SHAPES: &str =
    "a string, an array of strings, an array of token ids, or an array of arrays of token ids";

impl<'de> Deserialize<'de> for Prompt {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Prompt;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(PROMPT_SHAPES)
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Prompt, E> {
                Ok(Prompt::Text(v.to_owned()))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Prompt, A::Error> {
                let mut items = Vec::new();
                while let Some(v) = seq.next_element::<serde_json::Value>()? {
                    items.push(v);
                }
                classify(items).map_err(de::Error::custom)
            }
        }
        deserializer.deserialize_any(V)
    }
}

fn token_id(v: &serde_json::Value) -> Option<u32> {
    v.as_u64().and_then(|t| u32::try_from(t).ok())
}

fn classify(items: Vec<serde_json::Value>) -> Result<Prompt, String> {
    let bad = || format!("expected {PROMPT_SHAPES}");
    let Some(first) = items.first() else {
        return Ok(Prompt::Texts(Vec::new()));
    };
    if first.is_string() {
        items
            .into_iter()
            .map(|v| match v {
                serde_json::Value::String(s) => Ok(s),
                _ => Err(bad()),
            })
            .collect::<Result<_, _>>()
            .map(Prompt::Texts)
    } else if first.is_number() {
        items
            .iter()
            .map(|v| token_id(v).ok_or_else(|| format!("token ids must be integers in 0..2^32, got {v}")))
            .collect::<Result<_, _>>()
            .map(Prompt::Tokens)
    } else if first.is_array() {
        items
            .iter()
            .map(|inner| {
                inner
                    .as_array()
                    .ok_or_else(bad)?
                    .iter()
                    .map(|v| {
                        token_id(v).ok_or_else(|| format!("token ids must be integers in 0..2^32, got {v}"))
                    })
                    .collect::<Result<Vec<u32>, String>>()
            })
            .collect::<Result<_, _>>()
            .map(Prompt::TokenBatches)
    } else {
        Err(bad())
    }
}

/// `text_completion`, also the `object` of each streamed chunk.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CompletionResponse {
    pub id: String,
    /// Always `text_completion`.
    pub object: String,
    pub created: u64,
    pub model: String,
    pub choices: Vec<CompletionChoice>,
    /// Always present on a non-streamed response; on a stream only in the last chunk with
    /// `stream_options.include_usage`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// Disaggregated serving: on a prefill instance's answer, where a decode instance fetches
    /// the prompt's KV (a router copies it into the decode request).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub kv_transfer_params: Option<serde_json::Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CompletionChoice {
    pub index: usize,
    pub text: String,
    pub logprobs: Option<CompletionLogprobs>,
    pub finish_reason: Option<FinishReason>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<StopReason>,
    /// With `prompt_logprobs`: per prompt token, null for the first, then the token ids (as
    /// strings) of the prompt token and the alternatives with their logprobs (vLLM's shape).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Vec<Object>>)]
    pub prompt_logprobs: Option<PromptLogprobs>,
}

/// vLLM's `prompt_logprobs`: per prompt token, null for the first, then token id -> logprob.
pub type PromptLogprobs = Vec<Option<std::collections::BTreeMap<String, PromptLogprob>>>;

/// One token of a prompt's logprobs (vLLM's `Logprob`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct PromptLogprob {
    pub logprob: f32,
    /// 1 for the most likely token; null for a prompt token outside the alternatives asked for.
    pub rank: Option<usize>,
    pub decoded_token: String,
}

/// Legacy completions logprobs: parallel arrays, one entry per token.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CompletionLogprobs {
    /// Offset of each token's text in the choice's `text`.
    pub text_offset: Vec<usize>,
    pub token_logprobs: Vec<Option<f32>>,
    pub tokens: Vec<String>,
    /// Token text to logprob, for the most likely alternatives at each position.
    pub top_logprobs: Vec<Option<HashMap<String, f32>>>,
}

impl CompletionLogprobs {
    /// `other`'s tokens after these.
    pub fn append(&mut self, other: CompletionLogprobs) {
        self.text_offset.extend(other.text_offset);
        self.token_logprobs.extend(other.token_logprobs);
        self.tokens.extend(other.tokens);
        self.top_logprobs.extend(other.top_logprobs);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prompt(json: &str) -> Result<Prompt, String> {
        serde_json::from_str::<Prompt>(json).map_err(|e| e.to_string())
    }

    #[test]
    fn four_prompt_shapes() {
        assert_eq!(prompt(r#""hi""#).unwrap(), Prompt::Text("hi".into()));
        assert_eq!(prompt(r#"["a","b"]"#).unwrap(), Prompt::Texts(vec!["a".into(), "b".into()]));
        assert_eq!(prompt("[1,2,3]").unwrap(), Prompt::Tokens(vec![1, 2, 3]));
        assert_eq!(prompt("[[1],[2,3]]").unwrap(), Prompt::TokenBatches(vec![vec![1], vec![2, 3]]));
        assert_eq!(prompt("[]").unwrap(), Prompt::Texts(vec![]));
    }

    #[test]
    fn bad_prompt_shapes_are_errors() {
        for bad in
            ["5", "null", "{}", r#"["a",1]"#, "[1,-1]", "[1.5]", "[[1],\"a\"]", "[true]", "[4294967296]"]
        {
            assert!(prompt(bad).is_err(), "{bad} should be rejected");
        }
        assert!(prompt("[1,-1]").unwrap_err().contains("token ids"));
    }

    #[test]
    fn several_prompts_become_several_inputs() {
        let inputs = Prompt::TokenBatches(vec![vec![1], vec![2]]).into_inputs();
        assert_eq!(inputs, vec![PromptInput::Tokens(vec![1]), PromptInput::Tokens(vec![2])]);
    }
}

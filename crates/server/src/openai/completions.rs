//! `POST /v1/completions` wire types: the request (with its four prompt shapes), the
//! `text_completion` response and its stream events.

use std::collections::HashMap;
use std::fmt;

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::common::{StopSpec, StreamOptions, Usage};
use super::sampling::{CommonParams, FinishReason, SpeculativeMethodParam, StopReason};

/// A completion request. Unknown top-level fields are refused (see [`super::fields`]).
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
pub struct CompletionRequest {
    #[serde(default, deserialize_with = "super::common::optional_string")]
    pub model: Option<String>,
    pub prompt: Prompt,
    /// Absent: whatever the context allows.
    #[serde(default)]
    pub max_tokens: Option<u32>,
    #[serde(default)]
    pub temperature: Option<f32>,
    #[serde(default)]
    pub top_p: Option<f32>,
    #[serde(default)]
    pub top_k: Option<i32>,
    #[serde(default)]
    pub min_p: Option<f32>,
    #[serde(default)]
    pub n: Option<u32>,
    /// With `use_beam_search`, the number of beams (at least `n`; the best `n` hypotheses
    /// return); otherwise only equal to `n` (or absent).
    #[serde(default)]
    pub best_of: Option<u32>,
    /// vLLM extension: beam search instead of sampling (deterministic; `n` hypotheses out of
    /// `best_of`, or `n`, beams).
    #[serde(default)]
    pub use_beam_search: Option<bool>,
    /// vLLM extension, with `use_beam_search`: hypotheses score their cumulative logprob over
    /// their length (prompt included) to this power. Default 1.
    #[serde(default)]
    pub length_penalty: Option<f32>,
    #[serde(default)]
    pub stop: Option<StopSpec>,
    #[serde(default)]
    pub stop_token_ids: Option<Vec<u32>>,
    #[serde(default)]
    pub seed: Option<i64>,
    #[serde(default)]
    pub presence_penalty: Option<f32>,
    #[serde(default)]
    pub frequency_penalty: Option<f32>,
    #[serde(default)]
    pub repetition_penalty: Option<f32>,
    #[serde(default)]
    pub logit_bias: Option<HashMap<String, f32>>,
    /// Number of alternatives (0 to 20) returned with each token's logprob.
    #[serde(default)]
    pub logprobs: Option<u32>,
    /// Prepend the prompt to the completion text; with `logprobs`, the prompt's tokens and their
    /// logprobs come first in `logprobs` too (the first token's logprob is null).
    #[serde(default)]
    pub echo: Option<bool>,
    /// vLLM extension: each prompt token's logprob with this many alternatives (0 to 20), in the
    /// choice's `prompt_logprobs` (null for the first token).
    #[serde(default)]
    pub prompt_logprobs: Option<u32>,
    /// Not supported: must be absent or empty.
    #[serde(default)]
    pub suffix: Option<String>,
    #[serde(default)]
    pub ignore_eos: Option<bool>,
    #[serde(default)]
    pub min_tokens: Option<u32>,
    /// Pagoda extension: at most this many tokens proposed per step for this request when the
    /// server runs speculative decoding (0 turns it off for the request; above the server's own
    /// `num_speculative_tokens` changes nothing), in [0, 16].
    #[serde(default)]
    pub num_speculative_tokens: Option<u32>,
    /// Pagoda extension: this request's speculative decoding method, `ngram`, `suffix` or
    /// `draft_model`, in place of the server's (which must run speculative decoding; `draft_model`
    /// needs a server started with a draft).
    #[serde(default)]
    pub speculative_method: Option<SpeculativeMethodParam>,
    #[serde(default)]
    pub skip_special_tokens: Option<bool>,
    #[serde(default)]
    pub stream: Option<bool>,
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    /// Accepted and ignored.
    #[serde(default)]
    pub user: Option<String>,
    /// `{"type": "text"}` (the default), `{"type": "json_object"}`, or `{"type": "json_schema",
    /// "json_schema": {"name", "schema", "strict"}}`: the output is valid by construction.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub response_format: Option<serde_json::Value>,
    /// Structured output, vLLM's form: exactly one of `json` (a schema), `regex`, `choice`,
    /// `grammar` (Lark) or `json_object: true`.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub structured_outputs: Option<serde_json::Value>,
    /// A JSON schema (object or JSON text) the output must match (older vLLM field).
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub guided_json: Option<serde_json::Value>,
    /// A regular expression the output must match (older vLLM field).
    #[serde(default)]
    pub guided_regex: Option<String>,
    /// The output is exactly one of these strings (older vLLM field).
    #[serde(default)]
    pub guided_choice: Option<Vec<String>>,
    /// A Lark grammar the output must match (older vLLM field).
    #[serde(default)]
    pub guided_grammar: Option<String>,
    /// Add the tokenizer's special tokens (e.g. BOS) to text prompts. Default true.
    #[serde(default)]
    pub add_special_tokens: Option<bool>,
    /// With `--scheduling-policy priority`, the queue's order: lower runs first, ties by
    /// arrival. Otherwise only 0 (or absent).
    #[serde(default)]
    pub priority: Option<i64>,
    /// SGLang extension that routers add at its default, `false` (stop strings are trimmed);
    /// only that is served (see [`super::router_fields`]).
    #[serde(default)]
    pub no_stop_trim: Option<bool>,
    /// SGLang extension that routers add at its default, `false`; only that is served.
    #[serde(default)]
    pub return_hidden_states: Option<bool>,
    /// vLLM's disaggregated serving: `{"do_remote_decode": true}` on a prefill instance, or the
    /// prefill's answer (`do_remote_prefill` with `remote_host`, `remote_port`,
    /// `remote_request_id`) on a decode instance. Needs `--kv-transfer-config`.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub kv_transfer_params: Option<serde_json::Value>,
    /// SGLang's disaggregated serving (sglang-router's PD mode): the prefill instance's host.
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    pub bootstrap_host: Option<serde_json::Value>,
    /// SGLang's disaggregated serving: the prefill instance's KV-transfer port.
    #[serde(default)]
    #[schema(value_type = Option<u16>)]
    pub bootstrap_port: Option<serde_json::Value>,
    /// SGLang's disaggregated serving: the transfer's id, the same on both instances.
    #[serde(default)]
    #[schema(value_type = Option<u64>)]
    pub bootstrap_room: Option<serde_json::Value>,
}

impl CompletionRequest {
    /// The structured-output fields, for [`crate::structured`].
    pub fn grammar_fields(&self) -> crate::structured::GrammarFields<'_> {
        crate::structured::GrammarFields {
            response_format: self.response_format.as_ref(),
            structured_outputs: self.structured_outputs.as_ref(),
            guided_json: self.guided_json.as_ref(),
            guided_regex: self.guided_regex.as_deref(),
            guided_choice: self.guided_choice.as_deref(),
            guided_grammar: self.guided_grammar.as_deref(),
        }
    }

    /// The disaggregation fields, for [`crate::disaggregation::directive_of`].
    pub fn pd_fields(&self) -> crate::disaggregation::PdFields<'_> {
        crate::disaggregation::PdFields {
            kv_transfer_params: self.kv_transfer_params.as_ref(),
            bootstrap_host: self.bootstrap_host.as_ref(),
            bootstrap_port: self.bootstrap_port.as_ref(),
            bootstrap_room: self.bootstrap_room.as_ref(),
            stream: self.stream.unwrap_or(false),
        }
    }

    /// The router-added SGLang fields, for [`super::router_fields::check`].
    pub fn router_fields(&self) -> Vec<super::router_fields::RouterField> {
        vec![
            ("no_stop_trim", self.no_stop_trim, false),
            ("return_hidden_states", self.return_hidden_states, false),
        ]
    }

    pub fn common(&self) -> CommonParams {
        CommonParams {
            max_tokens: self.max_tokens,
            max_tokens_param: "max_tokens",
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            min_p: self.min_p,
            n: self.n,
            stop: self.stop.clone(),
            stop_token_ids: self.stop_token_ids.clone(),
            seed: self.seed,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            repetition_penalty: self.repetition_penalty,
            logit_bias: self.logit_bias.clone(),
            logprobs: self.logprobs,
            logprobs_param: "logprobs",
            ignore_eos: self.ignore_eos.unwrap_or(false),
            min_tokens: self.min_tokens,
            num_speculative_tokens: self.num_speculative_tokens,
            speculative_method: self.speculative_method,
            skip_special_tokens: self.skip_special_tokens.unwrap_or(true),
            priority: self.priority,
            use_beam_search: self.use_beam_search.unwrap_or(false),
            best_of: self.best_of,
            length_penalty: self.length_penalty,
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

//! The vLLM, SGLang and Pagoda extension fields that chat and completions requests share,
//! defined once and flattened into both request types (`#[serde(flatten)]`), with the
//! accessors that hand them to validation, structured output, disaggregation and the router
//! check.
//!
//! serde's flatten loses the path of a value it cannot parse; [`super::fields`] parses this
//! struct on its own to name the field at fault (see `KnownFields::flattened_error`).

use serde::Deserialize;
use utoipa::ToSchema;

use super::router_fields::RouterField;
use super::sampling::{CommonParams, SpeculativeMethodParam};

/// The extension fields of a chat or completions request.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
pub struct VllmExtensions {
    /// -1 or 0 disables; otherwise the number of most likely tokens to keep.
    #[serde(default)]
    pub top_k: Option<i32>,
    /// [0, 1]. Default 0.
    #[serde(default)]
    pub min_p: Option<f32>,
    /// (0, 2]; 1 disables.
    #[serde(default)]
    pub repetition_penalty: Option<f32>,
    #[serde(default)]
    pub stop_token_ids: Option<Vec<u32>>,
    #[serde(default)]
    pub ignore_eos: Option<bool>,
    #[serde(default)]
    pub min_tokens: Option<u32>,
    /// vLLM extension: the prompt's token logprobs with this many alternatives (0 to 20), in
    /// the response's `prompt_logprobs` (vLLM's shape, null for the first token).
    #[serde(default)]
    pub prompt_logprobs: Option<u32>,
    /// vLLM extension: beam search instead of sampling (deterministic; `n` hypotheses out of
    /// `best_of`, where the API has it, or `n` beams).
    #[serde(default)]
    pub use_beam_search: Option<bool>,
    /// vLLM extension, with `use_beam_search`: hypotheses score their cumulative logprob over
    /// their length (prompt included) to this power. Default 1.
    #[serde(default)]
    pub length_penalty: Option<f32>,
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
    /// Add the tokenizer's special tokens (e.g. BOS): on top of the chat template's (default
    /// false), or to completions' text prompts (default true).
    #[serde(default)]
    pub add_special_tokens: Option<bool>,
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

impl VllmExtensions {
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

    /// The disaggregation fields, for [`crate::disaggregation::directive_of`]; `stream` is the
    /// request's own field.
    pub fn pd_fields(&self, stream: Option<bool>) -> crate::disaggregation::PdFields<'_> {
        crate::disaggregation::PdFields {
            kv_transfer_params: self.kv_transfer_params.as_ref(),
            bootstrap_host: self.bootstrap_host.as_ref(),
            bootstrap_port: self.bootstrap_port.as_ref(),
            bootstrap_room: self.bootstrap_room.as_ref(),
            stream: stream.unwrap_or(false),
        }
    }

    /// The router-added SGLang fields both APIs carry, for [`super::router_fields::check`].
    pub fn router_fields(&self) -> Vec<RouterField> {
        vec![
            ("no_stop_trim", self.no_stop_trim, false),
            ("return_hidden_states", self.return_hidden_states, false),
        ]
    }

    /// The generation parameters these fields set; the request fills in OpenAI's own.
    pub fn common(&self) -> CommonParams {
        CommonParams {
            top_k: self.top_k,
            min_p: self.min_p,
            stop_token_ids: self.stop_token_ids.clone(),
            repetition_penalty: self.repetition_penalty,
            ignore_eos: self.ignore_eos.unwrap_or(false),
            min_tokens: self.min_tokens,
            num_speculative_tokens: self.num_speculative_tokens,
            speculative_method: self.speculative_method,
            skip_special_tokens: self.skip_special_tokens.unwrap_or(true),
            priority: self.priority,
            use_beam_search: self.use_beam_search.unwrap_or(false),
            length_penalty: self.length_penalty,
            ..CommonParams::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_what_the_request_means_when_silent() {
        let c = VllmExtensions::default().common();
        assert!(!c.ignore_eos && !c.use_beam_search && c.skip_special_tokens);
        let ext: VllmExtensions =
            serde_json::from_str(r#"{"top_k":5,"skip_special_tokens":false,"bootstrap_room":7}"#).unwrap();
        let c = ext.common();
        assert_eq!((c.top_k, c.skip_special_tokens), (Some(5), false));
        assert!(ext.pd_fields(Some(true)).stream);
        assert_eq!(ext.pd_fields(None).bootstrap_room, Some(&serde_json::json!(7)));
    }
}

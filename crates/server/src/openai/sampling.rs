//! The generation parameters that chat and completions requests share, gathered into one view
//! ([`CommonParams`]) so that validation is written once, plus the finish/stop reasons both
//! responses report.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::common::StopSpec;

/// The shared generation parameters of a request, as the client sent them (unvalidated).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CommonParams {
    pub max_tokens: Option<u32>,
    /// Which parameter `max_tokens` came from, for error messages.
    pub max_tokens_param: &'static str,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i32>,
    pub min_p: Option<f32>,
    pub n: Option<u32>,
    pub stop: Option<StopSpec>,
    pub stop_token_ids: Option<Vec<u32>>,
    pub seed: Option<i64>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub logit_bias: Option<HashMap<String, f32>>,
    /// `Some(k)`: return the sampled token's logprob and `k` alternatives.
    pub logprobs: Option<u32>,
    /// Which parameter `logprobs` came from, for error messages.
    pub logprobs_param: &'static str,
    pub ignore_eos: bool,
    pub min_tokens: Option<u32>,
    /// This request's cap on speculative proposals per step.
    pub num_speculative_tokens: Option<u32>,
    /// Where this request's proposals come from, when not the server's method.
    pub speculative_method: Option<SpeculativeMethodParam>,
    pub skip_special_tokens: bool,
    /// The queue's order (lower first), with `--scheduling-policy priority`.
    pub priority: Option<i64>,
    /// vLLM's beam search: `use_beam_search`, its width (`best_of`, else `n`) and
    /// `length_penalty`.
    pub use_beam_search: bool,
    pub best_of: Option<u32>,
    pub length_penalty: Option<f32>,
}

/// Pagoda extension: the speculative decoding method of one request (vLLM's method names).
/// `ngram` and `suffix` work on any server that runs speculative decoding; `draft_model` needs
/// one started with a draft (`"method": "draft_model"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SpeculativeMethodParam {
    Ngram,
    Suffix,
    DraftModel,
}

/// Why a choice ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// End of sequence, a stop string or a stop token.
    Stop,
    /// `max_tokens` or the context length reached.
    Length,
    /// The request was aborted (e.g. the server shut down).
    Abort,
    /// The model called tools.
    ToolCalls,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
            FinishReason::ToolCalls => "tool_calls",
        }
    }
}

/// The stop string or stop token id that ended a choice (vLLM's `stop_reason`). `null` when the
/// choice ended on the model's end-of-sequence token or on its length.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum StopReason {
    Token(u32),
    Text(String),
}

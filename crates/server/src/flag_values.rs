//! The value sets of `pagoda serve`'s own enumerated flags (`--tool-call-parser`,
//! `--reasoning-parser`, `--scheduling-policy`, `--get-load-format`, `--hosted-tools`), each parsed by clap and by the TOML file alike.
//! The model's and engine's flags are `pagoda_runtime::flags`; the flags themselves and their
//! merging live in [`crate::config`], which re-exports these.

use serde::Deserialize;

/// `--tool-call-parser`: how the model writes tool calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum ToolCallParserArg {
    /// `<tool_call>{"name", "arguments"}</tool_call>` (Qwen 2.5/3, Hermes, SmolLM3).
    Hermes,
    /// `{"name", "parameters"}`, optionally after `<|python_tag|>` (Llama 3.1+).
    #[value(name = "llama3_json")]
    #[serde(rename = "llama3_json")]
    Llama3Json,
    /// `[TOOL_CALLS][{"name", "arguments"}]` (Mistral).
    Mistral,
    /// One JSON object, `{"tool_calls": [...]}` or `{"response": ...}`, taught by a system prompt
    /// (models whose template knows no tools).
    Generic,
}

impl ToolCallParserArg {
    pub fn format(self) -> pagoda_text::ToolCallFormat {
        use pagoda_text::ToolCallFormat as F;
        match self {
            Self::Hermes => F::Hermes,
            Self::Llama3Json => F::Llama3Json,
            Self::Mistral => F::Mistral,
            Self::Generic => F::Generic,
        }
    }
}

/// `--reasoning-parser`: where the model's reasoning ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum ReasoningParserArg {
    /// `<think>...</think>`; the opening tag may come from the template (DeepSeek-R1).
    #[value(name = "deepseek_r1")]
    #[serde(rename = "deepseek_r1")]
    DeepseekR1,
    /// `<think>...</think>` when the output opens it (Qwen3; thinking can be switched off).
    Qwen3,
}

impl ReasoningParserArg {
    pub fn format(self) -> pagoda_text::ReasoningFormat {
        match self {
            Self::DeepseekR1 => pagoda_text::ReasoningFormat::DeepSeekR1,
            Self::Qwen3 => pagoda_text::ReasoningFormat::Qwen3,
        }
    }
}

/// `--hosted-tools`: what a request's hosted tools get, the tools a vendor's API runs on its own
/// side (see [`crate::tools::hosted`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum HostedToolsPolicy {
    /// Served without them: left out of the prompt, named in the `x-pagoda-ignored-tools`
    /// response header and in a warning in the log.
    #[default]
    Ignore,
    /// A 400 naming the tool.
    Reject,
}

/// How waiting requests are ordered (vLLM's `--scheduling-policy`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum SchedulingPolicy {
    /// First come, first served; a request's `priority` other than 0 is refused.
    #[default]
    Fcfs,
    /// By the request's `priority` (lower first; ties by arrival); under KV pressure the least
    /// urgent running sequence is preempted first.
    Priority,
}

/// `--get-load-format`: the shape of `GET /get_load`, for the router in front. The two routers
/// poll the same path with the same request and read different shapes, so the operator says
/// which one the replicas serve.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum GetLoadFormat {
    /// SGLang's: `[{"dp_rank": 0, "num_reqs", "num_waiting_reqs", "num_tokens"}]`, one entry per
    /// data-parallel rank (sglang-router sums `num_tokens`).
    #[default]
    Sglang,
    /// vllm-router's: `{"load": N}`, the requests in flight.
    VllmRouter,
}

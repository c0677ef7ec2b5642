//! The value sets of `pagoda serve`'s enumerated flags (`--tool-call-parser`, `--dtype`,
//! `--scheduling-policy`, ...), each parsed by clap and by the TOML file alike. The flags
//! themselves and their merging live in [`crate::config`], which re-exports these.

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

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LoadFormatArg {
    /// GGUF for a file, safetensors for a directory.
    #[default]
    Auto,
    Gguf,
    Safetensors,
    /// Random weights shaped by a config.json-style file (for benchmarking).
    Dummy,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum DtypeArg {
    /// float32 on the CPU, bfloat16 on CUDA.
    #[default]
    Auto,
    #[value(alias = "f32", alias = "float")]
    #[serde(alias = "f32", alias = "float")]
    Float32,
    #[value(alias = "f16", alias = "half")]
    #[serde(alias = "f16", alias = "half")]
    Float16,
    #[value(alias = "bf16")]
    #[serde(alias = "bf16")]
    Bfloat16,
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

/// What the CPU's many-token matmuls multiply in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum GemmDtypeArg {
    /// bfloat16 where the CPU multiplies it natively (AVX512-BF16), else float32; steps of up
    /// to 16 tokens on int16 panels where the CPU has AVX512-VNNI.
    #[default]
    Auto,
    #[value(alias = "f32", alias = "float")]
    #[serde(alias = "f32", alias = "float")]
    Float32,
    #[value(alias = "bf16")]
    #[serde(alias = "bf16")]
    Bfloat16,
    /// GGUF weights' integer codes times activations rounded to 8 bits per block of 32
    /// (llama.cpp's precision), at every step size, on CPUs with AVX512-VNNI; elsewhere `auto`.
    Int8,
    /// GGUF weights' integer codes times activations rounded to 16 bits per block of 32 (finer
    /// than bfloat16), at every step size, on CPUs with AVX512-VNNI; elsewhere `auto`.
    Int16,
}

//! The value sets of `pagoda serve`'s own enumerated flags (`--scheduling-policy`,
//! `--get-load-format`, `--hosted-tools`), each parsed by clap and by the TOML file alike.
//! `--tool-call-parser` and `--reasoning-parser` take pagoda-text's formats as they are.
//! The model's and engine's flags are `pagoda_runtime::flags`; the flags themselves and their
//! merging live in [`crate::config`], which re-exports these.

use serde::Deserialize;

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

//! The command line of `pagoda-bench-offline`: `pagoda serve`'s model and engine flags (with its
//! defaults), the dataset, and the output options of `pagoda-bench serve`.

use clap::{Args, Parser};
use pagoda_bench::cli::{DatasetArgs, OutputArgs};
use pagoda_runtime::EngineArgs;

#[derive(Debug, Parser)]
#[command(
    name = "pagoda-bench-offline",
    version,
    about = "Run Pagoda's engine in-process (no HTTP) on a dataset and report its throughput"
)]
pub struct Cli {
    #[command(flatten)]
    pub args: OfflineArgs,
}

#[derive(Debug, Clone, Args)]
pub struct OfflineArgs {
    #[command(flatten)]
    pub engine: EngineArgs,
    #[command(flatten)]
    pub dataset: DatasetArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn flags_parse_into_the_servers_settings() {
        let cli = Cli::try_parse_from([
            "pagoda-bench-offline",
            "--model",
            "m.gguf",
            "--num-prompts",
            "3",
            "--kv-cache-memory",
            "64MiB",
            "--no-enable-prefix-caching",
            "--dequantize",
            "false",
        ])
        .unwrap();
        let s = cli.args.engine.settings().unwrap();
        assert_eq!(s.kv_cache_memory, Some(64 << 20));
        assert!(!s.enable_prefix_caching);
        assert_eq!((s.dequantize, s.device), (Some(false), pagoda_runtime::DeviceArg::Cpu));
        // The server's CPU step budget, not a benchmark's own.
        assert_eq!(s.max_num_batched_tokens, 512);
        assert_eq!(cli.args.dataset.num_prompts, 3);
    }
}

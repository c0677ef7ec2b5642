//! The `pagoda-bench-offline` binary: parses the command line and runs the engine on the dataset.

use std::process::ExitCode;

use clap::Parser;
use pagoda_bench_offline::cli::Cli;

fn main() -> ExitCode {
    match pagoda_bench_offline::offline(Cli::parse().args) {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

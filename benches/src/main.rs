//! The `pagoda-bench` binary: parses the command line and runs `serve` or `report`.

use std::process::ExitCode;

use clap::Parser;
use pagoda_bench::cli::{Cli, Command};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve(args) => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .map_err(anyhow::Error::from)
            .and_then(|rt| rt.block_on(pagoda_bench::run::serve(args)).map(drop)),
        Command::Report(args) => pagoda_bench::run::report(&args),
    };
    match result {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

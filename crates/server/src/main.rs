//! The `pagoda` binary: `pagoda serve` (the HTTP server) and `pagoda generate` (one answer on
//! the command line through the same engine).

use std::io::IsTerminal;

use clap::{Parser, Subcommand};
use pagoda_server::config::{ServeArgs, ServerConfig};
use pagoda_server::server::{shutdown_signal, Server};

#[derive(Parser)]
#[command(name = "pagoda", version, about = "An OpenAI-compatible LLM inference server")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the OpenAI-compatible HTTP API.
    Serve(Box<ServeArgs>),
    /// Generate one answer to a prompt and print it.
    Generate(pagoda_server::generate::GenerateArgs),
}

fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let config = ServerConfig::from_args(args)?;
    let runtime =
        tokio::runtime::Builder::new_multi_thread().enable_all().thread_name("pagoda-http").build()?;
    runtime.block_on(async {
        let server = Server::build(&config).await?;
        server.run(shutdown_signal()).await
    })?;
    Ok(())
}

/// Serves allocations of 1 MiB and more straight from mmap. glibc otherwise raises its mmap
/// threshold after the first large free (model loading frees many), then serves the KV cache's
/// zeroed allocations from the heap and writes every byte of them: 1.7 s for 1 GiB at start-up,
/// where fresh mmap pages are zero for free.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn use_mmap_for_large_allocations() {
    // SAFETY: mallopt only changes allocator parameters; called before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn use_mmap_for_large_allocations() {}

fn main() {
    use_mmap_for_large_allocations();
    let cli = Cli::parse();
    let default_level = match cli.command {
        Command::Serve(_) => "info",
        Command::Generate(_) => "warn",
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| default_level.into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let result = match cli.command {
        Command::Serve(args) => serve(*args),
        Command::Generate(args) => pagoda_server::generate::run(args),
    };
    if let Err(e) = result {
        // Our errors carry their causes in their messages already.
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

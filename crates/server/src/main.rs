//! The `pagoda` binary: `pagoda serve` (the HTTP server) and `pagoda generate` (one answer on
//! the command line through the same engine).

use std::io::IsTerminal;

use clap::{ArgMatches, CommandFactory, FromArgMatches, Parser, Subcommand};
use pagoda_server::config::{ServeArgs, ServerConfig};
use pagoda_server::server::{shutdown_signals, Server};

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
    Generate(Box<pagoda_server::generate::GenerateArgs>),
}

/// `matches`: `serve`'s own, which say which flags were given and so go over `--config`'s file.
fn serve(matches: &ArgMatches) -> anyhow::Result<()> {
    let config = ServerConfig::from_matches(matches)?;
    let runtime =
        tokio::runtime::Builder::new_multi_thread().enable_all().thread_name("pagoda-http").build()?;
    runtime.block_on(async {
        let server = Server::build(&config).await?;
        // Registered once loaded: Ctrl-C while loading still stops the process at once.
        server.run_with_signals(shutdown_signals()?).await
    })?;
    Ok(())
}

/// Serves allocations of 16 MiB and more straight from mmap and keeps freed heap memory. glibc
/// otherwise raises its mmap threshold after the first large free (model loading frees many),
/// then serves the KV cache's zeroed per-layer tensors from the heap and writes every byte of
/// them (1.7 s for 1 GiB at start-up, where fresh mmap pages are zero for free). Below the
/// threshold, a step's activations reuse the heap: served from mmap, each would be unmapped when
/// freed and fault its pages in again on the next step (a fifth of a 128-token prefill's time).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn tune_allocator() {
    // SAFETY: mallopt only changes allocator parameters; called before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 16 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 512 << 20);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn tune_allocator() {}

fn main() {
    tune_allocator();
    let matches = Cli::command().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.format(&mut Cli::command()).exit());
    let default_level = match cli.command {
        Command::Serve(_) => "info",
        // The kernel plan and its timing, then only what went wrong.
        Command::Generate(_) => "warn,pagoda_runtime=info",
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| default_level.into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let result = match cli.command {
        Command::Serve(_) => serve(matches.subcommand_matches("serve").expect("clap matched `serve`")),
        Command::Generate(args) => pagoda_server::generate::run(*args),
    };
    if let Err(e) = result {
        // Our errors carry their causes in their messages already.
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

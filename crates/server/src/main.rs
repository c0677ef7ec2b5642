//! The `pagoda` binary: `pagoda serve` (the HTTP server), `pagoda generate` (one answer on the
//! command line through the same engine) and `pagoda run-batch` (a Batch API file answered
//! offline, as vLLM's `run_batch`).

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
    /// Answer a Batch API input file (JSONL of `{custom_id, method, url, body}`) offline, as
    /// vLLM's `run-batch`, and write the answers in input order. Takes `serve`'s flags.
    RunBatch(Box<RunBatchArgs>),
}

#[derive(clap::Args)]
struct RunBatchArgs {
    /// The input: one request per line, as OpenAI's Batch API takes them (`url` is
    /// /v1/chat/completions, /v1/completions or /v1/embeddings; a file may mix them).
    #[arg(short = 'i', long, value_name = "FILE")]
    input_file: std::path::PathBuf,
    /// Where the answers go: one line per input line, in its order, OpenAI's batch output shape
    /// (`response` with `status_code` and `body`, or `error`).
    #[arg(short = 'o', long, value_name = "FILE")]
    output_file: std::path::PathBuf,
    #[command(flatten)]
    serve: ServeArgs,
}

/// `matches`: `run-batch`'s own. The server is built as `serve` builds it, on a free local port,
/// its Batch API under a scratch directory unless `--batch-dir` names one.
fn run_batch(args: &RunBatchArgs, matches: &ArgMatches) -> anyhow::Result<()> {
    let mut serve = ServeArgs::layered(matches)?;
    serve.host = Some("127.0.0.1".into());
    serve.port = Some(0);
    let scratch = serve
        .batch_dir
        .is_none()
        .then(|| std::env::temp_dir().join(format!("pagoda-run-batch-{}", std::process::id())));
    if let Some(dir) = &scratch {
        serve.batch_dir = Some(dir.clone());
    }
    let config = ServerConfig::from_args(serve)?;
    let runtime =
        tokio::runtime::Builder::new_multi_thread().enable_all().thread_name("pagoda-batch").build()?;
    let result = runtime.block_on(async {
        let server = Server::build(&config).await?;
        let router = server.router();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let serving = tokio::spawn(server.run(async move {
            let _ = stopped.await;
        }));
        let answered = pagoda_server::batch::offline::run(
            &router,
            config.api_key.as_deref(),
            &args.input_file,
            &args.output_file,
        )
        .await;
        let _ = stop.send(());
        serving.await??;
        let failed = answered?;
        tracing::info!(output = %args.output_file.display(), failed, "batch written");
        anyhow::Ok(())
    });
    if let Some(dir) = scratch {
        let _ = std::fs::remove_dir_all(dir);
    }
    result
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
        Command::RunBatch(_) => "warn,pagoda_server::batch=info",
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
        Command::RunBatch(args) => {
            run_batch(&args, matches.subcommand_matches("run-batch").expect("clap matched `run-batch`"))
        }
    };
    if let Err(e) = result {
        // Our errors carry their causes in their messages already.
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

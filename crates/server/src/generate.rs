//! `pagoda generate`: one answer on the command line, through the same engine as the server.

use std::io::Write;
use std::sync::Arc;

use anyhow::Context;
use pagoda_engine::{NoopObserver, Request, SamplingParams, Shutdown, StopConditions};
use pagoda_runtime::{EngineArgs, LoadedRuntime};
use pagoda_text::ChatMessage;

#[derive(Debug, clap::Args)]
pub struct GenerateArgs {
    /// The model and engine, with `pagoda serve`'s flags and defaults.
    #[command(flatten)]
    pub engine: EngineArgs,
    /// The user's message (or the raw prompt with --raw).
    #[arg(long)]
    pub prompt: String,
    /// A system message; without one the chat template's default applies.
    #[arg(long)]
    pub system: Option<String>,
    /// Send the prompt as it is, without the chat template.
    #[arg(long)]
    pub raw: bool,
    #[arg(long, default_value_t = 256)]
    pub max_tokens: usize,
    /// 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    #[arg(long)]
    pub seed: Option<u64>,
}

pub fn run(args: GenerateArgs) -> anyhow::Result<()> {
    let options = args.engine.settings()?.runtime_options()?;
    let loaded = LoadedRuntime::load(&options)?;
    let runtime = loaded.start(Arc::new(NoopObserver), Shutdown::new())?;
    let tokenizer = &runtime.tokenizer;

    let prompt_ids = if args.raw {
        tokenizer.encode(&args.prompt, true)?
    } else {
        let template = runtime.chat_template.as_ref().context("the model has no chat template; use --raw")?;
        let mut messages = Vec::new();
        if let Some(system) = &args.system {
            messages.push(ChatMessage::new("system", system));
        }
        messages.push(ChatMessage::new("user", &args.prompt));
        tokenizer.encode(&template.render(&messages, true)?, false)?
    };

    let params = SamplingParams {
        temperature: args.temperature,
        top_p: args.top_p,
        seed: args.seed,
        ..SamplingParams::default()
    };
    let stop =
        StopConditions { eos_token_ids: tokenizer.eos_token_ids().to_vec(), ..StopConditions::default() };
    let request = Request::new(runtime.engine.next_request_id(), prompt_ids, Arc::new(params))
        .with_max_tokens(args.max_tokens)
        .with_stop(stop);
    let mut stream = runtime.engine.submit(request)?;
    let mut stdout = std::io::stdout().lock();
    while let Some(event) = stream.blocking_recv() {
        stdout.write_all(event.text.as_bytes())?;
        stdout.flush()?;
        if let Some(usage) = event.usage {
            writeln!(stdout)?;
            let reason = event.finished.map(|r| r.as_str().to_string()).unwrap_or_default();
            eprintln!(
                "[{} prompt tokens, {} generated, finished: {reason}]",
                usage.prompt_tokens, usage.completion_tokens
            );
        }
    }
    Ok(())
}

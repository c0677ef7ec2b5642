//! `pagoda generate`: one answer on the command line, through the same engine as the server.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use pagoda_engine::{NoopObserver, Request, SamplingParams, Shutdown, StopConditions};
use pagoda_models::LoadFormat;
use pagoda_text::ChatMessage;

use crate::runtime::{LoadedRuntime, RuntimeOptions};

#[derive(Debug, clap::Args)]
pub struct GenerateArgs {
    /// GGUF file, Hugging Face directory, or hub id (ORG/NAME or ORG/NAME/FILE.gguf).
    #[arg(long, default_value = crate::config::DEFAULT_MODEL)]
    pub model: PathBuf,
    /// Tokenizer source when it is not the model itself.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
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
    /// GGUF projections as dequantized f32 matmuls (true) or quantized matmuls (false);
    /// unset: dequantize models whose f32 weights fit in 2 GiB.
    #[arg(long)]
    pub dequantize: Option<bool>,
}

pub fn run(args: GenerateArgs) -> anyhow::Result<()> {
    let model = match args.model.to_str() {
        Some(id) if !args.model.exists() && crate::hub::is_hub_id(id) => {
            crate::hub::resolve(id, None, crate::hub::offline_from_env())
                .map_err(|e| anyhow::anyhow!("--model {e}"))?
        }
        _ => args.model.clone(),
    };
    let mut options = RuntimeOptions::new(model);
    options.tokenizer = args.tokenizer.clone();
    options.load_format = LoadFormat::Auto;
    options.dequantize = args.dequantize;
    options.kv_cache_bytes = 512 << 20;
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

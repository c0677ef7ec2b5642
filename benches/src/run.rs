//! `pagoda-bench serve` from parsed arguments to the printed table and the saved JSON, and the
//! printing and saving that `pagoda-bench-offline` shares.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use pagoda_text::Tokenizer;
use serde_json::Value;

use crate::cli::{OutputArgs, ReportArgs, ServeArgs};
use crate::client::{first_model, Client, ClientConfig, Endpoint};
use crate::dataset::{generate, Dataset};
use crate::html_report::{self, ReportRun};
use crate::metrics::{summarize, RequestResult, Summary};
use crate::report::{save, table, SavedResult, TableInfo};
use crate::serve::ServeOptions;
use crate::structured::{invalid_examples, load_schemas, use_schema_prompts, SchemaSet};
use crate::words::TextSynth;

/// Invalid answers shown on stderr after a `--json-schema` run.
const INVALID_EXAMPLES_SHOWN: usize = 5;

/// What a command produced (also printed and, if asked, saved).
#[derive(Debug, Clone)]
pub struct Report {
    pub summary: Summary,
    pub results: Vec<RequestResult>,
    pub table: String,
}

/// A tokenizer from a GGUF file, a `tokenizer.json` file, or a directory holding one.
pub fn load_tokenizer(path: &Path) -> anyhow::Result<Tokenizer> {
    let tokenizer = if path.is_dir() {
        Tokenizer::from_dir(path)
    } else if path.file_name().is_some_and(|n| n == "tokenizer.json") {
        Tokenizer::from_dir(path.parent().unwrap_or(Path::new(".")))
    } else {
        Tokenizer::from_gguf(path)
    };
    tokenizer.with_context(|| format!("loading the tokenizer {}", path.display()))
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn length_notes(dataset: &Dataset) -> Vec<String> {
    if dataset.exact_lengths {
        return Vec::new();
    }
    vec![format!(
        "prompts were sized without a tokenizer (about one token per word, {} words in all); pass \
         --tokenizer for exact lengths",
        dataset.total_prompt_tokens()
    )]
}

/// Prints the table, saves the JSON and writes the HTML report if asked, and fails when no
/// request succeeded.
pub fn finish(
    mode: &'static str,
    info: TableInfo,
    output: &OutputArgs,
    config: Value,
    summary: Summary,
    results: Vec<RequestResult>,
) -> anyhow::Result<Report> {
    let table = table(&summary, &info);
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(table.as_bytes())?;
    stdout.flush()?;
    let saved = SavedResult {
        pagoda_bench_version: env!("CARGO_PKG_VERSION"),
        mode,
        date_unix_s: unix_now(),
        config,
        summary: &summary,
        requests: &results,
    };
    if let Some(path) = &output.save_result {
        save(path, &saved)?;
        eprintln!("results saved to {}", path.display());
    }
    if let Some(path) = &output.report {
        let label = output
            .save_result
            .as_ref()
            .and_then(|p| p.file_stem())
            .map_or_else(|| "this run".to_owned(), |s| s.to_string_lossy().into_owned());
        let mut runs = vec![ReportRun { label, saved: serde_json::to_value(&saved)? }];
        for compared in &output.compare {
            runs.push(ReportRun::load(compared).context("--compare")?);
        }
        html_report::write(path, &runs)?;
        eprintln!("report written to {}", path.display());
    }
    if summary.completed == 0 {
        bail!("every request failed");
    }
    Ok(Report { summary, results, table })
}

/// `pagoda-bench report`: the HTML report of saved results.
pub fn report(args: &ReportArgs) -> anyhow::Result<()> {
    let runs = args.results.iter().map(|p| ReportRun::load(p)).collect::<anyhow::Result<Vec<_>>>()?;
    html_report::write(&args.output, &runs)?;
    eprintln!("report written to {}", args.output.display());
    Ok(())
}

/// `pagoda-bench serve`.
pub async fn serve(args: ServeArgs) -> anyhow::Result<Report> {
    // A file --compare cannot read fails the command before the run, not after it.
    for path in &args.output.compare {
        ReportRun::load(path).context("--compare")?;
    }
    let model = match &args.model {
        Some(m) => m.clone(),
        None => first_model(&args.base_url, args.api_key.as_deref()).await?,
    };
    let synth = match &args.tokenizer {
        Some(path) => TextSynth::exact(Arc::new(load_tokenizer(path)?)),
        None => TextSynth::approximate(),
    };
    if args.endpoint == Endpoint::Embeddings && args.json_schema.is_some() {
        anyhow::bail!("--json-schema asks for structured answers; --endpoint embeddings has none");
    }
    let schemas = match &args.json_schema {
        Some(path) => Some(Arc::new(
            SchemaSet::new(load_schemas(path)?, args.validating()).context("--json-schema: no schema")?,
        )),
        None => None,
    };
    let spec = args.dataset.spec();
    let prompt_schemas = schemas.clone();
    let dataset = tokio::task::spawn_blocking(move || {
        let mut dataset = generate(&spec, &synth)?;
        if let Some(set) = &prompt_schemas {
            use_schema_prompts(&mut dataset, set, |text| synth.count(text))?;
        }
        anyhow::Ok(dataset)
    })
    .await??;
    let client = Arc::new(Client::new(ClientConfig {
        base_url: args.base_url.clone(),
        model: model.clone(),
        endpoint: args.endpoint,
        api_key: args.api_key.clone(),
        ignore_eos: args.ignore_eos,
        temperature: args.temperature,
        extra_body: args.extra_body.clone().unwrap_or_default(),
        timeout: Some(args.request_timeout),
    })?);
    let rate =
        if args.request_rate.is_finite() { format!("{} req/s", args.request_rate) } else { "inf".into() };
    eprintln!(
        "pagoda-bench serve: {} requests ({}, {} prompt / {} output tokens) to {} (model {model}), rate {rate}, \
         max concurrency {}",
        dataset.prompts.len(),
        args.dataset.dataset,
        dataset.total_prompt_tokens(),
        dataset.total_output_tokens(),
        client.url(),
        args.max_concurrency.map_or("unlimited".to_owned(), |c| c.to_string()),
    );
    let options = ServeOptions {
        request_rate: args.request_rate,
        max_concurrency: args.max_concurrency,
        seed: args.dataset.seed,
        progress: !args.output.no_progress,
        test_request: !args.skip_test_request,
        schemas: schemas.clone(),
        save_text: args.save_text,
        lora_modules: Arc::new(args.lora_modules.clone().unwrap_or_default()),
    };
    let run = crate::serve::run(client, &dataset, &options).await?;
    let summary = summarize(&run.results, run.duration, &args.output.percentiles.0);

    let mut notes = length_notes(&dataset);
    if args.endpoint == Endpoint::Chat {
        notes.push("chat endpoint: the server's chat template adds tokens to every prompt".into());
    }
    if let (Some(set), Some(path)) = (&schemas, &args.json_schema) {
        notes.push(schema_note(set, path));
        show_invalid_examples(&run.results, summary.validity.as_ref().map_or(0, |v| v.checked - v.valid));
    }
    let info = TableInfo {
        title: "Serving Benchmark Result".into(),
        max_concurrency: args.max_concurrency,
        request_rate: args.request_rate.is_finite().then_some(args.request_rate),
        notes,
    };
    let mut config = args.dataset.to_json();
    config.insert("base_url".into(), args.base_url.clone().into());
    config.insert("model".into(), model.into());
    config.insert("endpoint".into(), serde_json::to_value(args.endpoint)?);
    config.insert("tokenizer".into(), args.tokenizer.as_ref().map(|p| p.display().to_string()).into());
    config.insert("exact_prompt_lengths".into(), dataset.exact_lengths.into());
    config.insert(
        "request_rate".into(),
        if args.request_rate.is_finite() { args.request_rate.into() } else { "inf".into() },
    );
    config.insert("max_concurrency".into(), args.max_concurrency.into());
    config.insert("ignore_eos".into(), args.ignore_eos.into());
    config.insert("temperature".into(), args.temperature.into());
    config.insert("extra_body".into(), args.extra_body.clone().map(Value::Object).unwrap_or(Value::Null));
    config.insert("json_schema".into(), args.json_schema.as_ref().map(|p| p.display().to_string()).into());
    config.insert("validate".into(), args.validating().into());
    config.insert("lora_modules".into(), args.lora_modules.clone().into());
    finish("serve", info, &args.output, Value::Object(config), summary, run.results)
}

/// The table's note on the schemas of a `--json-schema` run.
fn schema_note(set: &SchemaSet, path: &Path) -> String {
    let described = set.schemas().iter().filter(|s| s.description.is_some()).count();
    let mut note = format!(
        "{} JSON schema(s) from {} (request i asks for schema i % {}); {described} of them give \
         their description as the prompt",
        set.schemas().len(),
        path.display(),
        set.schemas().len(),
    );
    if !set.validate {
        note.push_str("; answers not validated (--validate false)");
    }
    note
}

/// Prints the first invalid answers of a `--json-schema` run to stderr.
fn show_invalid_examples(results: &[RequestResult], invalid: usize) {
    let examples = invalid_examples(results, INVALID_EXAMPLES_SHOWN);
    if examples.is_empty() {
        return;
    }
    eprintln!("invalid answers ({} shown of {invalid}):", examples.len());
    for example in examples {
        eprintln!("  {example}");
    }
}

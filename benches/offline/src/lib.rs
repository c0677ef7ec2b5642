//! `pagoda-bench-offline`: the engine's throughput without HTTP, like `vllm bench throughput`.
//! The model and engine are started by `pagoda_runtime` from `pagoda serve`'s own flags and
//! defaults, so the kernel plan and the step budget are the server's for the same flags; the
//! table and the saved JSON are `pagoda-bench serve`'s ([`pagoda_bench::report`]).

pub mod cli;
pub mod run;

use pagoda_bench::metrics::summarize;
use pagoda_bench::report::TableInfo;
use pagoda_bench::run::{finish, Report};
use pagoda_runtime::RuntimeOptions;
use serde_json::Value;

use crate::cli::OfflineArgs;

/// The runtime options `args` ask for: the server's, except that every request may wait (all
/// are submitted at once).
pub fn runtime_options(args: &OfflineArgs) -> anyhow::Result<RuntimeOptions> {
    let mut settings = args.engine.clone().settings()?;
    settings.max_waiting_requests = settings.max_waiting_requests.max(args.dataset.num_prompts);
    Ok(settings.runtime_options()?)
}

/// Runs the dataset and reports.
pub fn offline(args: OfflineArgs) -> anyhow::Result<Report> {
    let options = runtime_options(&args)?;
    eprintln!("pagoda-bench-offline: loading {}", options.model.display());
    let run = run::run(&options, &args.dataset.spec(), !args.output.no_progress)?;
    eprintln!(
        "model loaded and engine started in {:.2}s; ran {} requests ({}, {} prompt / {} output tokens)",
        run.startup.as_secs_f64(),
        run.dataset.prompts.len(),
        args.dataset.dataset,
        run.dataset.total_prompt_tokens(),
        run.dataset.total_output_tokens(),
    );
    let summary = summarize(&run.results, run.duration, &args.output.percentiles.0);
    let info = TableInfo {
        title: "Offline Throughput Result".into(),
        notes: vec![
            format!(
                "in-process engine, all requests submitted at once with ignore_eos; start-up ({:.2}s) not counted",
                run.startup.as_secs_f64()
            ),
            run.plan.to_string(),
        ],
        ..TableInfo::default()
    };
    let mut config = args.dataset.to_json();
    config.insert("model".into(), options.model.display().to_string().into());
    let s = &options.settings;
    config.insert("max_num_seqs".into(), s.max_num_seqs.into());
    config.insert("max_num_batched_tokens".into(), s.max_num_batched_tokens.into());
    config.insert("max_model_len".into(), s.max_model_len.into());
    config.insert("kv_cache_bytes".into(), options.kv_cache_bytes().into());
    config.insert("block_size".into(), s.block_size.into());
    config.insert("enable_prefix_caching".into(), s.enable_prefix_caching.into());
    config.insert("dequantize".into(), s.dequantize.into());
    config.insert("device".into(), s.device.to_string().into());
    config.insert("kernel_plan".into(), run.plan.to_string().into());
    config.insert("startup_s".into(), run.startup.as_secs_f64().into());
    finish("offline", info, &args.output, Value::Object(config), summary, run.results)
}

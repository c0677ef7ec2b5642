//! `pagoda-bench-offline` on the real model (`models/SmolLM2-135M-Instruct.Q4_1.gguf`, fetched
//! by `make model`), and the kernel plan it resolves against `pagoda serve`'s and `pagoda
//! generate`'s for the same flags.

use std::path::PathBuf;
use std::sync::Arc;

use clap::Parser;
use pagoda_bench::dataset::{generate, DatasetKind, DatasetSpec};
use pagoda_bench::run::Report;
use pagoda_bench::words::TextSynth;
use pagoda_bench_offline::cli::{Cli, OfflineArgs};
use pagoda_runtime::{resolve_plan, RuntimeOptions, RuntimePlan};
use pagoda_server::config::{ServeArgs, ServerConfig};
use pagoda_server::generate::GenerateArgs;
use pagoda_text::Tokenizer;

fn model_path() -> PathBuf {
    // Cargo's run-time value: a test binary reused from a build in another checkout still
    // carries that checkout's compile-time path.
    let path = std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from)
        .join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(path.exists(), "{} is missing: run `make model` first", path.display());
    path
}

fn parse(argv: &[&str]) -> OfflineArgs {
    let full = std::iter::once("pagoda-bench-offline").chain(argv.iter().copied());
    Cli::try_parse_from(full).unwrap().args
}

/// Prompt tokens the engine counts for each prompt of `spec` (exact dataset, special tokens added).
fn prompt_lens(spec: &DatasetSpec) -> Vec<usize> {
    let t = Arc::new(Tokenizer::from_gguf(model_path()).unwrap());
    let d = generate(spec, &TextSynth::exact(t.clone())).unwrap();
    d.prompts.iter().map(|p| t.encode(&p.text, true).unwrap().len()).collect()
}

fn check_latencies(report: &Report, output_len: usize) {
    for r in &report.results {
        let ttft = r.ttft_ms.expect("a first token");
        assert!(ttft > 0.0 && ttft < r.e2el_ms, "ttft {ttft}, e2el {}", r.e2el_ms);
        assert!(!r.itl_ms.is_empty() && r.itl_ms.len() < output_len, "{} ITLs", r.itl_ms.len());
        let tpot = r.tpot_ms.expect("more than one token");
        assert!((tpot * (output_len - 1) as f64 - (r.e2el_ms - ttft)).abs() < 1e-6);
    }
}

#[test]
fn offline_runs_the_engine_in_process() {
    let model = model_path().display().to_string();
    let args = parse(&[
        "--model",
        &model,
        "--num-prompts",
        "4",
        "--input-len",
        "24",
        "--output-len",
        "8",
        "--kv-cache-memory",
        "32MiB",
        "--max-model-len",
        "512",
        "--no-progress",
        "--seed",
        "2",
    ]);
    let report = pagoda_bench_offline::offline(args).unwrap();
    let s = &report.summary;
    assert_eq!((s.completed, s.failed, s.total_output_tokens), (4, 0, 32), "{:?}", s.errors);
    let spec = DatasetSpec {
        input_len: Some(24),
        output_len: Some(8),
        seed: 2,
        ..DatasetSpec::new(DatasetKind::Random, 4)
    };
    assert_eq!(s.total_input_tokens, prompt_lens(&spec).iter().sum::<usize>());
    assert!(s.duration_s > 0.0 && s.output_throughput > 0.0);
    check_latencies(&report, 8);
    assert!(report.table.contains("Offline Throughput Result"));
}

#[test]
fn offline_reports_requests_the_engine_refuses() {
    let model = model_path().display().to_string();
    // 300 + 8 tokens do not fit --max-model-len 128: every submission is refused, and said so.
    let args = parse(&[
        "--model",
        &model,
        "--num-prompts",
        "2",
        "--input-len",
        "300",
        "--output-len",
        "8",
        "--kv-cache-memory",
        "16MiB",
        "--max-model-len",
        "128",
        "--no-progress",
    ]);
    let err = pagoda_bench_offline::offline(args).unwrap_err();
    assert!(format!("{err:#}").contains("every request failed"), "{err:#}");
}

#[derive(Parser)]
struct ServeCli {
    #[command(flatten)]
    args: ServeArgs,
}

#[derive(Parser)]
struct GenerateCli {
    #[command(flatten)]
    args: GenerateArgs,
}

/// The plan each command resolves for `flags`.
fn plans(flags: &[&str]) -> [(&'static str, RuntimeOptions, RuntimePlan); 3] {
    let argv = |first: &'static str| std::iter::once(first).chain(flags.iter().copied());
    let serve = ServeCli::try_parse_from(argv("pagoda")).unwrap().args;
    let serve = ServerConfig::from_args(serve).unwrap().engine.runtime_options().unwrap();
    let generate = GenerateCli::try_parse_from(argv("pagoda").chain(["--prompt", "hi"])).unwrap().args.engine;
    let generate = generate.settings().unwrap().runtime_options().unwrap();
    let offline = pagoda_bench_offline::runtime_options(&parse(flags)).unwrap();
    [("serve", serve), ("generate", generate), ("offline", offline)].map(|(name, options)| {
        let plan = resolve_plan(&options).unwrap().0;
        (name, options, plan)
    })
}

/// `pagoda serve`, `pagoda generate` and `pagoda-bench-offline` resolve the same kernel plan
/// (the same `kernel plan: ...` line) and step budget for the same flags.
#[test]
fn serve_generate_and_offline_resolve_the_same_plan() {
    let model = model_path().display().to_string();
    let cases: [&[&str]; 5] = [
        &[],
        &["--cpu-gemm-dtype", "float32"],
        &["--cpu-gemm-dtype", "bfloat16", "--max-num-batched-tokens", "256"],
        &["--batch-invariant"],
        &["--dequantize", "false", "--kv-cache-dtype", "float32"],
    ];
    for flags in cases {
        let mut argv = vec!["--model", model.as_str()];
        argv.extend_from_slice(flags);
        let [serve, generate, offline] = plans(&argv);
        eprintln!("{flags:?}: {}", serve.2);
        assert!(serve.2.to_string().starts_with("kernel plan: cpu, float32 compute"), "{}", serve.2);
        for other in [&generate, &offline] {
            assert_eq!(other.2, serve.2, "{flags:?}: {} against serve", other.0);
            assert_eq!(other.2.to_string(), serve.2.to_string());
            let (a, b) = (&other.1.settings, &serve.1.settings);
            assert_eq!(
                (a.max_num_batched_tokens, a.max_num_seqs, a.block_size, a.kv_cache_memory, a.dequantize),
                (b.max_num_batched_tokens, b.max_num_seqs, b.block_size, b.kv_cache_memory, b.dequantize),
                "{flags:?}: {} against serve",
                other.0
            );
        }
    }
    // The CPU's default step budget, whoever starts the engine.
    let [serve, ..] = plans(&["--model", model.as_str()]);
    assert_eq!(serve.2.step_budget, 512);
}

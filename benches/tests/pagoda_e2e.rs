//! `pagoda-bench` against the real thing: the Pagoda server started in-process on 127.0.0.1:0
//! with the real model (`models/SmolLM2-135M-Instruct.Q4_1.gguf`, fetched by `make model`), and
//! exact prompt lengths with its tokenizer.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use clap::Parser;
use pagoda_bench::cli::{Cli, Command};
use pagoda_bench::dataset::{generate, DatasetKind, DatasetSpec};
use pagoda_bench::run::Report;
use pagoda_bench::words::{TextSynth, WORDS};
use pagoda_server::config::{ServeArgs, ServerConfig};
use pagoda_server::server::Server;
use pagoda_text::Tokenizer;

fn model_path() -> PathBuf {
    // Cargo's run-time value: a test binary reused from a build in another checkout still
    // carries that checkout's compile-time path.
    let path = std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from)
        .join("../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(path.exists(), "{} is missing: run `make model` first", path.display());
    path
}

fn tokenizer() -> Arc<Tokenizer> {
    static TOKENIZER: OnceLock<Arc<Tokenizer>> = OnceLock::new();
    TOKENIZER.get_or_init(|| Arc::new(Tokenizer::from_gguf(model_path()).unwrap())).clone()
}

#[derive(Parser)]
struct ServerCli {
    #[command(flatten)]
    args: ServeArgs,
}

/// One real server for the whole file, on its own thread and runtime; it lives until the test
/// process exits.
fn server() -> SocketAddr {
    static ADDR: OnceLock<SocketAddr> = OnceLock::new();
    *ADDR.get_or_init(|| {
        let model = model_path().display().to_string();
        let argv = [
            "pagoda",
            "--model",
            &model,
            "--served-model-name",
            "smol",
            "--port",
            "0",
            "--kv-cache-memory",
            "64MiB",
            "--max-model-len",
            "1024",
        ];
        let config = ServerConfig::from_args(ServerCli::try_parse_from(argv).unwrap().args).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let rt =
                tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
            rt.block_on(async move {
                let server = Server::build(&config).await.expect("the server starts");
                tx.send(server.local_addr().unwrap()).unwrap();
                server.run(std::future::pending()).await.unwrap();
            });
        });
        rx.recv_timeout(Duration::from_secs(120)).expect("the server started in time")
    })
}

fn parse(argv: &[&str]) -> Command {
    let mut full = vec!["pagoda-bench"];
    full.extend_from_slice(argv);
    Cli::try_parse_from(full).unwrap().command
}

async fn serve(extra: &[&str]) -> Report {
    let url = format!("http://{}", server());
    let tok = model_path().display().to_string();
    let mut argv = vec!["serve", "--base-url", &url, "--tokenizer", &tok, "--no-progress"];
    argv.extend_from_slice(extra);
    let Command::Serve(args) = parse(&argv);
    pagoda_bench::run::serve(args).await.unwrap()
}

/// Prompt tokens the server counts for each prompt of `spec` (exact dataset, special tokens added).
fn server_prompt_lens(spec: &DatasetSpec) -> Vec<usize> {
    let t = tokenizer();
    let d = generate(spec, &TextSynth::exact(t.clone())).unwrap();
    d.prompts.iter().map(|p| t.encode(&p.text, true).unwrap().len()).collect()
}

fn check_latencies(report: &Report, output_len: usize) {
    for r in &report.results {
        let ttft = r.ttft_ms.expect("a first token");
        assert!(ttft > 0.0 && ttft < r.e2el_ms, "ttft {ttft}, e2el {}", r.e2el_ms);
        assert!(!r.itl_ms.is_empty() && r.itl_ms.len() < output_len, "{} ITLs", r.itl_ms.len());
        assert!(r.itl_ms.iter().all(|&g| g >= 0.0));
        // The gaps add up to the time after the first token.
        let gaps: f64 = r.itl_ms.iter().sum();
        assert!(gaps <= r.e2el_ms - ttft + 1.0, "gaps {gaps} vs {}", r.e2el_ms - ttft);
        let tpot = r.tpot_ms.expect("more than one token");
        assert!((tpot * (output_len - 1) as f64 - (r.e2el_ms - ttft)).abs() < 1e-6);
        assert!(tpot > 0.0 && tpot < 10_000.0, "tpot {tpot}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_completions_against_pagoda() {
    let report = serve(&[
        "--model",
        "smol",
        "--num-prompts",
        "6",
        "--input-len",
        "32",
        "--output-len",
        "16",
        "--ignore-eos",
        "--seed",
        "1",
    ])
    .await;
    let s = &report.summary;
    assert_eq!((s.completed, s.failed, s.requests_without_usage), (6, 0, 0), "{:?}", s.errors);
    assert_eq!(s.total_output_tokens, 6 * 16);
    let spec = DatasetSpec {
        input_len: Some(32),
        output_len: Some(16),
        seed: 1,
        ..DatasetSpec::new(DatasetKind::Random, 6)
    };
    let want = server_prompt_lens(&spec);
    assert!(want.iter().all(|&n| (32..=33).contains(&n)), "exact lengths (plus a BOS if any): {want:?}");
    let got: Vec<usize> = report.results.iter().map(|r| r.prompt_len).collect();
    assert_eq!(got, want, "the server counted the prompts the tokenizer sized");
    assert_eq!(s.total_input_tokens, want.iter().sum::<usize>());
    assert!(report
        .results
        .iter()
        .all(|r| r.output_len == 16 && r.finish_reason.as_deref() == Some("length")));
    check_latencies(&report, 16);
    assert!(s.output_throughput > 0.0 && s.request_throughput > 0.0);
    assert!(s.peak_concurrency >= 2, "sent at once: {}", s.peak_concurrency);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_chat_prefix_repetition_with_a_concurrency_limit() {
    // No --model: the name comes from GET /v1/models.
    let report = serve(&[
        "--endpoint",
        "chat",
        "--dataset",
        "prefix-repetition",
        "--prefix-len",
        "48",
        "--input-len",
        "8",
        "--num-prompts",
        "4",
        "--output-len",
        "8",
        "--ignore-eos",
        "--max-concurrency",
        "2",
        "--request-rate",
        "50",
    ])
    .await;
    let s = &report.summary;
    assert_eq!((s.completed, s.failed), (4, 0), "{:?}", s.errors);
    assert_eq!(s.total_output_tokens, 32);
    assert!(s.peak_concurrency <= 2);
    // The chat template wraps each 56-token prompt in its own tokens.
    assert!(report.results.iter().all(|r| r.prompt_len > 56), "{:?}", report.results);
    check_latencies(&report, 8);
}

#[test]
fn every_word_is_one_token_with_its_leading_space() {
    let t = tokenizer();
    for w in WORDS {
        assert_eq!(t.encode(&format!(" {w}"), false).unwrap().len(), 1, "{w:?}");
    }
}

#[test]
fn a_tokenizer_makes_lengths_exact() {
    let synth = TextSynth::exact(tokenizer());
    let t = tokenizer();
    for kind in [DatasetKind::Random, DatasetKind::SharegptLike, DatasetKind::PrefixRepetition] {
        let spec =
            DatasetSpec { range_ratio: 0.5, input_len: None, seed: 4, ..DatasetSpec::new(kind.clone(), 12) };
        let d = generate(&spec, &synth).unwrap();
        assert!(d.exact_lengths);
        for p in &d.prompts {
            assert_eq!(t.encode(&p.text, false).unwrap().len(), p.prompt_len, "{kind}");
        }
        if kind == DatasetKind::Random {
            assert!(d.prompts.iter().all(|p| (64..=192).contains(&p.prompt_len)));
        }
    }
    // Prompts sharing a prefix share its tokens exactly, so a prefix cache can reuse them.
    let spec = DatasetSpec {
        prefix_len: Some(40),
        input_len: Some(10),
        ..DatasetSpec::new(DatasetKind::PrefixRepetition, 3)
    };
    let d = generate(&spec, &synth).unwrap();
    let ids: Vec<Vec<u32>> = d.prompts.iter().map(|p| t.encode(&p.text, false).unwrap()).collect();
    assert!(ids.iter().all(|i| i.len() == 50 && i[..40] == ids[0][..40]));
    assert_ne!(ids[0][40..], ids[1][40..]);
}

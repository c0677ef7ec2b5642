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
use pagoda_bench::html_report::ReportRun;
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
    let Command::Serve(args) = parse(&argv) else { panic!("not serve") };
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

/// Checks that `page` parses as HTML without errors and loads nothing from elsewhere: no
/// element names an external `src` or `href`, no style imports a URL. Returns the document.
fn self_contained(page: &str) -> scraper::Html {
    let doc = scraper::Html::parse_document(page);
    assert!(doc.errors.is_empty(), "HTML parse errors: {:?}", &doc.errors[..doc.errors.len().min(5)]);
    let linked = scraper::Selector::parse("[src], [href], link").unwrap();
    for element in doc.select(&linked) {
        let target = element.value().attr("src").or(element.value().attr("href")).unwrap_or("<link>");
        assert!(!target.contains("//") && !target.starts_with("http"), "external resource {target}");
        assert_ne!(element.value().name(), "link", "a <link> element");
    }
    let styles = scraper::Selector::parse("style").unwrap();
    assert!(doc.select(&styles).all(|s| !s.text().collect::<String>().contains("url(")));
    doc
}

/// The cells of the summary table's row named `metric`, one per run.
fn row(doc: &scraper::Html, metric: &str) -> Vec<String> {
    let rows = scraper::Selector::parse("table.summary tbody tr").unwrap();
    let cells = scraper::Selector::parse("td").unwrap();
    let row = doc
        .select(&rows)
        .map(|r| r.select(&cells).map(|c| c.text().collect::<String>()).collect::<Vec<_>>())
        .find(|r| r[0] == metric)
        .unwrap_or_else(|| panic!("no row {metric}"));
    row[1..].to_vec()
}

/// The data of plot `id` (its script's text).
fn plot_script(doc: &scraper::Html, id: &str) -> String {
    let plot = scraper::Selector::parse(&format!("div#{id} + script")).unwrap();
    doc.select(&plot).next().unwrap_or_else(|| panic!("no plot {id}")).text().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn html_reports_of_a_run_and_of_runs_compared() {
    let dir = std::env::temp_dir().join(format!("pagoda-bench-report-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = |name: &str| dir.join(name).display().to_string();
    let (first_json, first_html) = (path("first.json"), path("first.html"));
    let run = |seed: &'static str| {
        [
            "--model",
            "smol",
            "--num-prompts",
            "4",
            "--input-len",
            "16",
            "--output-len",
            "8",
            "--ignore-eos",
            "--seed",
            seed,
        ]
    };
    let mut argv = run("1").to_vec();
    argv.extend(["--save-result", &first_json, "--report", &first_html]);
    let first = serve(&argv).await;

    let page = std::fs::read_to_string(&first_html).unwrap();
    let doc = self_contained(&page);
    assert!(page.contains("Plotly.newPlot"), "the plot library and its plots are in the page");
    let s = &first.summary;
    assert_eq!(row(&doc, "successful requests"), ["4"]);
    assert_eq!(row(&doc, "request throughput (req/s)"), [format!("{:.2}", s.request_throughput)]);
    assert_eq!(row(&doc, "median TTFT (ms)"), [format!("{:.2}", s.ttft_ms.as_ref().unwrap().median)]);
    assert_eq!(row(&doc, "P99 ITL (ms)"), [format!("{:.2}", s.itl_ms.as_ref().unwrap().percentiles[0].1)]);
    // Every request's TTFT is a point of the TTFT CDF, its last at fraction 1.
    let ttft = plot_script(&doc, "plot-ttft");
    for r in &first.results {
        assert!(ttft.contains(&serde_json::to_string(&r.ttft_ms.unwrap()).unwrap()), "{ttft}");
    }
    for id in ["plot-tpot", "plot-itl", "plot-e2el", "plot-throughput"] {
        assert!(plot_script(&doc, id).contains("\"first\""), "{id} names the run");
    }

    // A second run beside the first, then the two saved files by `pagoda-bench report`.
    let (second_json, compared_html) = (path("second.json"), path("compared.html"));
    let mut argv = run("2").to_vec();
    argv.extend(["--save-result", &second_json, "--report", &compared_html, "--compare", &first_json]);
    let second = serve(&argv).await;
    let doc = self_contained(&std::fs::read_to_string(&compared_html).unwrap());
    let throughputs = [second.summary.request_throughput, s.request_throughput].map(|t| format!("{t:.2}"));
    assert_eq!(row(&doc, "request throughput (req/s)"), throughputs);
    let headers = scraper::Selector::parse("table.summary thead th").unwrap();
    let names: Vec<String> = doc.select(&headers).map(|h| h.text().collect()).collect();
    assert_eq!(names, ["metric", "second", "first"]);
    assert!(
        plot_script(&doc, "plot-ttft").contains("\"second\"")
            && plot_script(&doc, "plot-ttft").contains("\"first\"")
    );

    let offline_html = path("offline.html");
    let Command::Report(args) = parse(&["report", &first_json, &second_json, "-o", &offline_html]) else {
        panic!("not report")
    };
    pagoda_bench::run::report(&args).unwrap();
    let doc = self_contained(&std::fs::read_to_string(&offline_html).unwrap());
    assert_eq!(row(&doc, "successful requests"), ["4", "4"]);
    // A file that is not a saved result is refused by name.
    let err = ReportRun::load(std::path::Path::new(&first_html)).unwrap_err().to_string();
    assert!(err.contains("first.html"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

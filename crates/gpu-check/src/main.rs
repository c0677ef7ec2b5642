//! `pagoda-gpu-check`: runs every GPU check in one go and writes a results table.
//!
//! Sections, each recorded even if another fails: `ops` (every CUDA op against its CPU op on
//! fresh random inputs, and the KV cache's block copies), `fp8` (the matmul over FP8 weights
//! against the CPU, a model loaded in FP8, and the matmul timed), `model` (the default model on
//! CUDA against the CPU, greedy), `invariance` (`--batch-invariant`: a sequence's logits decoded
//! alone and verified in one step beside another sequence, bit for bit), `server` (the release
//! server on CUDA answering chat requests, and a request of `n: 64` against one of `n: 1`),
//! `timings` (paged decode attention bandwidth against a device-to-device copy, prefill attention
//! TFLOP/s), and on request `steps` (where a decode step's time goes, on random Llama-3.1-8B
//! weights). Results go to `OUT/results.md` and `OUT/results.json`, logs beside them. Exit
//! status 0 only when every check passed.

mod bench;
mod fp8_check;
mod invariance_check;
mod ops_check;
mod quant_check;
mod sampler_check;
mod step_profile;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use candle_core::Device;
use clap::Parser;
use pagoda_gpu_check::report::Report;
use pagoda_gpu_check::server::{chat, fork_cost, ServerProcess};
use pagoda_gpu_check::{block_copy_check, model_check};

#[derive(Parser)]
#[command(name = "pagoda-gpu-check", about = "Checks Pagoda's CUDA backend on this GPU")]
struct Args {
    /// The default model (SmolLM2-135M-Instruct.Q4_1.gguf).
    #[arg(long)]
    model: PathBuf,
    /// The release `pagoda` binary built with the cuda feature.
    #[arg(long)]
    server_binary: Option<PathBuf>,
    /// Folder for results.md, results.json and the logs.
    #[arg(long)]
    out: PathBuf,
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    device: usize,
    /// The tiny checkpoints for the `tiny` section (`<arch>.gguf` files; gpu-check.sh packs
    /// tests/fixtures/tiny there).
    #[arg(long)]
    tiny_dir: Option<PathBuf>,
    /// Model shape for the `steps` and `quant` sections (random weights).
    #[arg(long, default_value = "configs/models/llama-3.1-8b.json")]
    dummy_config: PathBuf,
    /// Sections to run (comma-separated): ops, fp8, model, tiny, invariance, server, timings,
    /// steps and quant (the last two not in the default set: they load 8B models of random
    /// weights).
    #[arg(long, value_delimiter = ',', default_value = "ops,fp8,model,tiny,invariance,server,timings")]
    sections: Vec<String>,
}

fn device_description(ordinal: usize) -> String {
    use candle_core::cuda_backend::cudarc::driver::CudaContext;
    match CudaContext::new(ordinal) {
        Ok(ctx) => {
            let name = ctx.name().unwrap_or_else(|_| "unknown GPU".into());
            let (major, minor) = ctx.compute_capability().unwrap_or((0, 0));
            let mem = ctx.total_mem().unwrap_or(0) as f64 / (1u64 << 30) as f64;
            format!("{name} (sm_{major}{minor}, {mem:.0} GiB)")
        }
        Err(e) => format!("CUDA device {ordinal} unavailable: {e}"),
    }
}

fn server_section(args: &Args, report: &mut Report) -> Result<()> {
    const SECTION: &str = "server";
    let binary = match &args.server_binary {
        Some(b) => b.clone(),
        None => std::env::current_exe()?.with_file_name("pagoda"),
    };
    let log = args.out.join("server.log");
    let serve_args: Vec<String> = [
        "--model",
        &args.model.display().to_string(),
        "--served-model-name",
        "smol",
        "--device",
        &format!("cuda:{}", args.device),
        "--max-model-len",
        "2048",
        "--kv-cache-memory",
        "1GiB",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    // The first start on a machine JIT-compiles every PTX module for the GPU.
    let server = match ServerProcess::start(&binary, &serve_args, &log, Duration::from_secs(300)) {
        Ok(s) => s,
        Err(e) => {
            report.error(SECTION, "starts with --device cuda", format!("{e:#}"));
            return Ok(());
        }
    };
    report.info(SECTION, "start-up (load, cache, bind)", format!("{:.1} s", server.startup_seconds));
    for (prompt, expect) in
        [("What is the capital of France?", Some("Paris")), ("Write a haiku about the sea.", None)]
    {
        match chat(server.addr, "smol", prompt, 48) {
            Ok(reply) => {
                let answered = !reply.content.trim().is_empty()
                    && reply.completion_tokens > 0
                    && expect.is_none_or(|word| reply.content.contains(word));
                let shown: String = reply.content.chars().take(60).collect::<String>().replace('\n', " ");
                report.expect(
                    SECTION,
                    &format!("chat: {prompt}"),
                    answered,
                    format!(
                        "{shown:?} ({} tokens, {}, {:.2} s)",
                        reply.completion_tokens, reply.finish_reason, reply.seconds
                    ),
                );
            }
            Err(e) => report.error(SECTION, &format!("chat: {prompt}"), format!("{e:#}")),
        }
    }
    // A fork costs its pages, not the KV cache (1 GiB here, the server's default).
    let check = "completions: n: 64 under twice n: 1 (2 tokens, medians of 3)";
    match fork_cost(server.addr, "smol") {
        Ok((one, many)) => {
            report.expect(SECTION, check, many < 2.0 * one, format!("n: 1 {one:.3} s, n: 64 {many:.3} s"))
        }
        Err(e) => report.error(SECTION, check, format!("{e:#}")),
    }
    Ok(())
}

fn main() -> Result<()> {
    let args = Args::parse();
    std::fs::create_dir_all(&args.out).with_context(|| format!("creating {}", args.out.display()))?;
    let mut report = Report::new(device_description(args.device));
    println!("GPU check on {}", report.device);
    let device = Device::new_cuda(args.device).context("opening the CUDA device")?;
    let started = Instant::now();
    for section in &args.sections {
        let t = Instant::now();
        let result = match section.as_str() {
            "ops" => ops_check::run(&device, &mut report)
                .and_then(|()| block_copy_check::run(&device, &mut report)),
            "model" => model_check::run(&args.model, &device, &mut report),
            "tiny" => match &args.tiny_dir {
                Some(dir) => model_check::run_tiny(dir, &device, &mut report),
                None => Err(anyhow::anyhow!("the tiny section needs --tiny-dir")),
            },
            "invariance" => invariance_check::run(&args.model, &device, &mut report),
            "server" => server_section(&args, &mut report),
            "timings" => bench::run(&device, &mut report),
            "steps" => step_profile::run(&args.dummy_config, &device, &mut report),
            "quant" => quant_check::run(&args.dummy_config, &device, &mut report),
            "fp8" => fp8_check::run(&device, &mut report),
            other => Err(anyhow::anyhow!("unknown section {other:?}")),
        };
        if let Err(e) = result {
            report.error(section, "section", format!("{e:#}"));
        }
        println!("section {section}: {:.1} s", t.elapsed().as_secs_f64());
        report.write(&args.out).context("writing the results")?;
    }
    println!("\n{}", report.markdown());
    println!("total {:.1} s; results in {}", started.elapsed().as_secs_f64(), args.out.display());
    if report.failures() > 0 {
        std::process::exit(1);
    }
    Ok(())
}

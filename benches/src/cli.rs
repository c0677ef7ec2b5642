//! The command line of `pagoda-bench serve` (an OpenAI-API client against a running server), and
//! the dataset and output options that `pagoda-bench-offline` shares.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use serde_json::{Map, Value};

use crate::client::Endpoint;
use crate::dataset::{DatasetKind, DatasetSpec};

#[derive(Debug, Parser)]
#[command(
    name = "pagoda-bench",
    version,
    about = "Load generator and throughput benchmark for Pagoda (and any OpenAI-compatible server)"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

// Parsed once per process: the size of the serve variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Stream requests to an OpenAI-compatible server and report throughput and latencies.
    Serve(ServeArgs),
    /// Write the HTML report of results saved with --save-result, side by side.
    Report(ReportArgs),
}

/// `pagoda-bench report`.
#[derive(Debug, Clone, Args)]
pub struct ReportArgs {
    /// Files written by --save-result; the first is the run the report is about.
    #[arg(required = true, value_name = "SAVED.json")]
    pub results: Vec<PathBuf>,
    /// The self-contained HTML page to write.
    #[arg(long, short, value_name = "FILE.html")]
    pub output: PathBuf,
}

/// The request set; `pagoda-bench serve` and `pagoda-bench-offline` share it.
#[derive(Debug, Clone, Args)]
pub struct DatasetArgs {
    /// random, sharegpt-like, prefix-repetition, or a FILE.jsonl of {"prompt": ..., "output_len": N} lines.
    #[arg(long, default_value = "random", value_name = "NAME|FILE.jsonl")]
    pub dataset: DatasetKind,
    /// Number of requests.
    #[arg(long, default_value_t = 100)]
    pub num_prompts: usize,
    /// Prompt tokens (random), or suffix tokens after the shared prefix (prefix-repetition). [default: 128]
    #[arg(long)]
    pub input_len: Option<usize>,
    /// Output tokens (max_tokens) per request; for sharegpt-like it fixes the output length,
    /// for FILE.jsonl it is the default of lines without output_len. [default: 128]
    #[arg(long)]
    pub output_len: Option<usize>,
    /// Input and output lengths are uniform in [len·(1−r), len·(1+r)].
    #[arg(long, default_value_t = 0.0, value_name = "R")]
    pub range_ratio: f64,
    /// Tokens of the prefix shared by prompts (random: one prefix, default 0; prefix-repetition: default 256).
    #[arg(long)]
    pub prefix_len: Option<usize>,
    /// Distinct prefixes of prefix-repetition, used round-robin.
    #[arg(long, default_value_t = 1)]
    pub num_prefixes: usize,
    /// Seed of the request set (and of serve's arrival times): the same seed gives the same requests.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

impl DatasetArgs {
    pub fn spec(&self) -> DatasetSpec {
        DatasetSpec {
            kind: self.dataset.clone(),
            num_prompts: self.num_prompts,
            input_len: self.input_len,
            output_len: self.output_len,
            range_ratio: self.range_ratio,
            prefix_len: self.prefix_len,
            num_prefixes: self.num_prefixes,
            seed: self.seed,
        }
    }

    /// The options as saved with the results.
    pub fn to_json(&self) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert("dataset".into(), self.dataset.to_string().into());
        m.insert("num_prompts".into(), self.num_prompts.into());
        m.insert("input_len".into(), self.input_len.into());
        m.insert("output_len".into(), self.output_len.into());
        m.insert("range_ratio".into(), self.range_ratio.into());
        m.insert("prefix_len".into(), self.prefix_len.into());
        m.insert("num_prefixes".into(), self.num_prefixes.into());
        m.insert("seed".into(), self.seed.into());
        m
    }
}

/// How results are shown and saved.
#[derive(Debug, Clone, Args)]
pub struct OutputArgs {
    /// Percentiles to report besides mean and median, comma-separated.
    #[arg(long, default_value = "99", value_parser = parse_percentiles, value_name = "P,P,..")]
    pub percentiles: Percentiles,
    /// Write the summary and every request's TTFT, ITLs and lengths to this JSON file.
    #[arg(long, value_name = "FILE.json")]
    pub save_result: Option<PathBuf>,
    /// Write a self-contained HTML report to this file: the summary table, the TTFT, TPOT, ITL
    /// and end-to-end latency CDFs, and output tokens per second over the run (plotly.js is
    /// written into the page; opening it fetches nothing).
    #[arg(long, value_name = "FILE.html")]
    pub report: Option<PathBuf>,
    /// Results saved with --save-result to show beside this run in --report (repeatable).
    #[arg(long, value_name = "SAVED.json", requires = "report")]
    pub compare: Vec<PathBuf>,
    /// No progress bar on stderr.
    #[arg(long)]
    pub no_progress: bool,
}

/// Parsed `--percentiles`.
#[derive(Debug, Clone, PartialEq)]
pub struct Percentiles(pub Vec<f64>);

fn parse_percentiles(s: &str) -> Result<Percentiles, String> {
    let mut ps = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let p: f64 = part.parse().map_err(|_| format!("{part:?} is not a number"))?;
        if !(0.0..=100.0).contains(&p) {
            return Err(format!("percentile {p} is outside [0, 100]"));
        }
        ps.push(p);
    }
    Ok(Percentiles(ps))
}

fn parse_rate(s: &str) -> Result<f64, String> {
    let r: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("expected a number of requests per second or inf, got {s:?}"))?;
    if r > 0.0 {
        Ok(r)
    } else {
        Err(format!("the request rate must be positive, got {s}"))
    }
}

fn parse_json_object(s: &str) -> Result<Map<String, Value>, String> {
    match serde_json::from_str::<Value>(s) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err("expected a JSON object".into()),
        Err(e) => Err(format!("invalid JSON: {e}")),
    }
}

fn parse_seconds(s: &str) -> Result<Duration, String> {
    let secs: f64 = s.parse().map_err(|_| format!("expected seconds, got {s:?}"))?;
    Duration::try_from_secs_f64(secs).map_err(|e| e.to_string())
}

#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Server address (a trailing /v1 is fine); http or https.
    #[arg(long, default_value = "http://127.0.0.1:8000")]
    pub base_url: String,
    /// Model name sent in requests. [default: the first one GET /v1/models lists]
    #[arg(long)]
    pub model: Option<String>,
    /// Which API to call.
    #[arg(long, value_enum, default_value_t = Endpoint::Completions)]
    pub endpoint: Endpoint,
    /// Tokenizer (GGUF, tokenizer.json, or a model directory) for exact prompt lengths; without one a
    /// prompt of N tokens is N common words, which most BPE vocabularies count as about N tokens.
    #[arg(long, value_name = "PATH")]
    pub tokenizer: Option<PathBuf>,
    #[command(flatten)]
    pub dataset: DatasetArgs,
    /// Requests per second, arriving as a Poisson process; inf sends all at once.
    #[arg(long, default_value = "inf", value_parser = parse_rate)]
    pub request_rate: f64,
    /// Most requests in flight at once; arrivals beyond it wait.
    #[arg(long)]
    pub max_concurrency: Option<usize>,
    /// Ask the server to ignore end-of-sequence tokens (`ignore_eos: true`), so every request
    /// generates its full output length.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Sampling temperature sent with every request.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f64,
    /// JSON object merged into every request body (e.g. '{"top_k": 1}').
    #[arg(long, value_parser = parse_json_object, value_name = "JSON")]
    pub extra_body: Option<Map<String, Value>>,
    /// Bearer token for the server.
    #[arg(long, env = "OPENAI_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Seconds one request (its whole stream) may take before it counts as failed.
    #[arg(long, default_value = "600", value_parser = parse_seconds, value_name = "SECONDS")]
    pub request_timeout: Duration,
    /// Do not send the short test request that checks the server before the run.
    #[arg(long)]
    pub skip_test_request: bool,
    /// A JSON schema file, or a directory of *.json schemas (read in file-name order): request i
    /// asks for schema i % n as a strict `response_format` json_schema, and a schema's top-level
    /// description becomes its prompt ("<description>. Answer in JSON.").
    #[arg(long, value_name = "PATH")]
    pub json_schema: Option<PathBuf>,
    /// Check every answer against its schema (JSON parse + jsonschema, formats included). On
    /// with --json-schema; `--validate false` keeps no answer text and checks nothing.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true", requires = "json_schema")]
    pub validate: Option<bool>,
    /// LoRA adapters (names the server serves) the requests take turns at: request i names
    /// adapter i % n in `model`, so every step mixes them (vLLM's benchmark picks one at random).
    #[arg(long, num_args = 1.., value_name = "NAME")]
    pub lora_modules: Option<Vec<String>>,
    /// Keep every answer's text and write it into --save-result as the request's `text` (to
    /// compare two servers' or configurations' outputs request by request).
    #[arg(long, requires = "save_result")]
    pub save_text: bool,
    #[command(flatten)]
    pub output: OutputArgs,
}

impl ServeArgs {
    /// Whether answers are checked against their schemas.
    pub fn validating(&self) -> bool {
        self.json_schema.is_some() && self.validate.unwrap_or(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn serve_flags_parse() {
        let cli = Cli::try_parse_from([
            "pagoda-bench",
            "serve",
            "--base-url",
            "http://h:1/v1",
            "--model",
            "m",
            "--endpoint",
            "chat",
            "--dataset",
            "prefix-repetition",
            "--num-prompts",
            "7",
            "--prefix-len",
            "64",
            "--input-len",
            "8",
            "--request-rate",
            "2.5",
            "--max-concurrency",
            "4",
            "--ignore-eos",
            "--seed",
            "3",
            "--percentiles",
            "50, 90,99.9",
            "--extra-body",
            "{\"top_k\": 1}",
            "--save-result",
            "r.json",
        ])
        .unwrap();
        let Command::Serve(a) = cli.command else { panic!("not serve") };
        assert_eq!(
            (a.endpoint, a.request_rate, a.max_concurrency, a.ignore_eos),
            (Endpoint::Chat, 2.5, Some(4), true)
        );
        assert_eq!(a.output.percentiles, Percentiles(vec![50.0, 90.0, 99.9]));
        assert_eq!(a.extra_body.unwrap()["top_k"], 1);
        let spec = a.dataset.spec();
        assert_eq!(spec.kind, DatasetKind::PrefixRepetition);
        assert_eq!((spec.num_prompts, spec.prefix_len, spec.input_len, spec.seed), (7, Some(64), Some(8), 3));
    }

    #[test]
    fn serve_defaults_send_everything_at_once() {
        let Command::Serve(a) = Cli::try_parse_from(["pagoda-bench", "serve"]).unwrap().command else {
            panic!("not serve")
        };
        assert!(a.request_rate.is_infinite());
        assert_eq!(
            (a.endpoint, a.max_concurrency, a.dataset.num_prompts),
            (Endpoint::Completions, None, 100)
        );
        assert_eq!(a.output.percentiles, Percentiles(vec![99.0]));
        assert!(a.json_schema.is_none() && !a.validating());
    }

    #[test]
    fn json_schema_turns_validation_on_unless_told_not_to() {
        let serve = |extra: &[&str]| {
            let argv = ["pagoda-bench", "serve"].into_iter().chain(extra.iter().copied());
            match Cli::try_parse_from(argv).map(|c| c.command) {
                Ok(Command::Serve(a)) => Ok(a),
                Ok(Command::Report(_)) => panic!("not serve"),
                Err(e) => Err(e),
            }
        };
        let a = serve(&["--json-schema", "s.json"]).unwrap();
        assert_eq!(a.json_schema, Some(PathBuf::from("s.json")));
        assert!(a.validating());
        assert!(serve(&["--json-schema", "dir", "--validate"]).unwrap().validating());
        assert!(!serve(&["--json-schema", "dir", "--validate", "false"]).unwrap().validating());
        assert!(serve(&["--validate"]).is_err(), "--validate needs --json-schema");
    }

    #[test]
    fn bad_values_are_refused() {
        for bad in [
            ["--request-rate", "0"],
            ["--request-rate", "fast"],
            ["--percentiles", "101"],
            ["--extra-body", "[1]"],
            ["--dataset", "sharegpt.json"],
            ["--request-timeout", "-1"],
        ] {
            let argv = ["pagoda-bench", "serve", bad[0], bad[1]];
            assert!(Cli::try_parse_from(argv).is_err(), "{bad:?}");
        }
    }
}

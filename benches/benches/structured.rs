//! Structured-output costs against the default model's real vocabulary (SmolLM2, 49,152 tokens),
//! printed as a markdown table (and written to `--out FILE` when given):
//!
//! - the factory build (`GrammarCompiler::new`: token trie and llguidance's parser factory);
//! - compiling each schema of `tests/fixtures/schemas`, uncached, `REPS` times;
//! - the per-token mask: each schema's example (`examples/<same name>.json`), laid out as the
//!   grammar writes JSON, is tokenized and walked through a constraint, timing every
//!   `compute_mask` (one per token, plus the last one, where end-of-sequence is allowed).
//!   "fresh grammar" walks a just-compiled grammar (its lexer states are built on the way, as
//!   for a schema's first request; its first mask is also shown alone); "repeated grammar" walks
//!   it again (as for later requests of a cached schema, whose clones share those states).
//!
//! Run: `cargo bench -p pagoda-bench --bench structured [-- --out FILE]`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use pagoda_bench::metrics::Distribution;
use pagoda_bench::structured::{grammar_layout, load_schemas};
use pagoda_engine::TokenConstraint;
use pagoda_structured::{CompiledGrammar, GrammarCompiler, GrammarSpec};
use pagoda_text::Tokenizer;
use serde_json::Value;

/// Times each schema is compiled and walked (and the factory built).
const REPS: usize = 5;
const MODEL: &str = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
const SCHEMAS: &str = "tests/fixtures/schemas";

/// One schema with its example's tokens.
struct Case {
    file: String,
    spec: GrammarSpec,
    tokens: Vec<u32>,
}

/// Everything measured, in milliseconds (compile, factory) and microseconds (masks).
#[derive(Default)]
struct Samples {
    factory_ms: Vec<f64>,
    compile_ms: Vec<f64>,
    /// `(p50 of the compiles, file)` per schema.
    compile_by_schema: Vec<(f64, String)>,
    fresh_mask_us: Vec<f64>,
    /// The first mask of each fresh walk (also in `fresh_mask_us`).
    first_mask_us: Vec<f64>,
    repeated_mask_us: Vec<f64>,
    /// `(largest fresh mask, file)` per schema.
    slowest_mask_by_schema: Vec<(f64, String)>,
    tokens_per_walk: usize,
    /// Masks timed per round of walks over all schemas: one per token, plus a last one for
    /// each example after which the grammar is not finished.
    masks_per_walk: usize,
}

fn main() {
    let out = output_path(std::env::args().skip(1));
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let model = root.join(MODEL);
    let tokenizer = Arc::new(
        Tokenizer::from_gguf(&model)
            .unwrap_or_else(|e| panic!("{}: {e} (run `make model` first)", model.display())),
    );
    let mut samples = Samples::default();
    let mut compiler = None;
    for _ in 0..REPS {
        let began = Instant::now();
        let built = GrammarCompiler::new(Arc::clone(&tokenizer)).expect("the factory builds");
        samples.factory_ms.push(began.elapsed().as_secs_f64() * 1e3);
        compiler = Some(built);
    }
    let compiler = compiler.expect("REPS > 0");
    let cases = load_cases(&root.join(SCHEMAS), &tokenizer);
    samples.tokens_per_walk = cases.iter().map(|c| c.tokens.len()).sum();
    for case in &cases {
        let mut compiles = Vec::with_capacity(REPS);
        let mut slowest: f64 = 0.0;
        for _ in 0..REPS {
            let began = Instant::now();
            let compiled =
                compiler.compile_uncached(&case.spec).unwrap_or_else(|e| panic!("{}: {e}", case.file));
            compiles.push(began.elapsed().as_secs_f64() * 1e3);
            let fresh = walk(&compiled, case, &tokenizer);
            slowest = fresh.iter().copied().fold(slowest, f64::max);
            samples.first_mask_us.extend(fresh.first().copied());
            samples.fresh_mask_us.extend(fresh);
            samples.repeated_mask_us.extend(walk(&compiled, case, &tokenizer));
        }
        let p50 = Distribution::of(&compiles, &[]).expect("REPS > 0").median;
        samples.compile_by_schema.push((p50, case.file.clone()));
        samples.slowest_mask_by_schema.push((slowest, case.file.clone()));
        samples.compile_ms.extend(compiles);
    }
    samples.masks_per_walk = samples.fresh_mask_us.len() / REPS;
    let table = render(&samples, cases.len(), compiler.vocab_size());
    print!("{table}");
    if let Some(path) = out {
        std::fs::write(&path, &table).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        eprintln!("table written to {}", path.display());
    }
}

/// `--out FILE` among the arguments (cargo adds `--bench`; other arguments are ignored).
fn output_path(mut args: impl Iterator<Item = String>) -> Option<PathBuf> {
    while let Some(arg) = args.next() {
        if arg == "--out" {
            return Some(PathBuf::from(args.next().expect("--out needs a file")));
        }
        if let Some(path) = arg.strip_prefix("--out=") {
            return Some(PathBuf::from(path));
        }
    }
    None
}

/// Every schema of `dir` with its example, laid out and tokenized.
fn load_cases(dir: &Path, tokenizer: &Tokenizer) -> Vec<Case> {
    let schemas = load_schemas(dir).unwrap_or_else(|e| panic!("{e}"));
    schemas
        .into_iter()
        .map(|s| {
            let path = dir.join("examples").join(&s.file);
            let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let example: Value =
                serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let tokens = tokenizer.encode(&grammar_layout(&example), false).expect("the example tokenizes");
            Case { file: s.file, spec: GrammarSpec::JsonSchema(s.schema), tokens }
        })
        .collect()
}

/// Walks the case's tokens through a new constraint of `compiled`; returns every mask's time (µs).
fn walk(compiled: &CompiledGrammar, case: &Case, tokenizer: &Tokenizer) -> Vec<f64> {
    let mut constraint = compiled.constraint();
    let mut times = Vec::with_capacity(case.tokens.len() + 1);
    for &token in &case.tokens {
        let began = Instant::now();
        let mask = constraint.compute_mask().unwrap_or_else(|e| panic!("{}: {}", case.file, e.0));
        times.push(began.elapsed().as_secs_f64() * 1e6);
        assert!(mask.allows(token), "{}: the grammar refuses token {token} of the example", case.file);
        constraint.accept_token(token).unwrap_or_else(|e| panic!("{}: {}", case.file, e.0));
    }
    if !constraint.is_finished() {
        let began = Instant::now();
        let mask = constraint.compute_mask().unwrap_or_else(|e| panic!("{}: {}", case.file, e.0));
        times.push(began.elapsed().as_secs_f64() * 1e6);
        let eos = tokenizer.eos_token_ids();
        assert!(
            eos.iter().any(|&e| mask.allows(e)),
            "{}: the example does not complete the grammar",
            case.file
        );
    }
    times
}

/// One table row: samples, mean, p50, p99, max.
fn row(out: &mut String, what: &str, values: &[f64], digits: usize) {
    let d = Distribution::of(values, &[99.0]).expect("samples");
    let p99 = d.percentiles[0].1;
    let _ = writeln!(
        out,
        "| {what} | {} | {:.digits$} | {:.digits$} | {p99:.digits$} | {:.digits$} |",
        d.count, d.mean, d.median, d.max
    );
}

/// The `n` largest `(value, file)` pairs, as `file (value unit)`.
fn slowest(pairs: &[(f64, String)], n: usize, unit: &str) -> String {
    let mut sorted = pairs.to_vec();
    sorted.sort_by(|a, b| b.0.total_cmp(&a.0));
    sorted.iter().take(n).map(|(v, f)| format!("{f} ({v:.2} {unit})")).collect::<Vec<_>>().join(", ")
}

fn render(s: &Samples, schemas: usize, vocab: usize) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "## Structured outputs: grammar compile and token-mask times\n");
    let _ = writeln!(
        out,
        "Vocabulary: {MODEL} ({vocab} tokens). {schemas} schemas from {SCHEMAS}, each compiled and walked \
         {REPS} times. A round of walks over all the examples is {} tokens and {} masks (one per token, \
         plus one after each example that does not finish its grammar).\n",
        s.tokens_per_walk, s.masks_per_walk
    );
    out.push_str("| measure | samples | mean | p50 | p99 | max |\n|---|---|---|---|---|---|\n");
    row(&mut out, "factory build, `GrammarCompiler::new` (ms)", &s.factory_ms, 1);
    row(&mut out, "grammar compile, uncached (ms)", &s.compile_ms, 3);
    row(&mut out, "mask per token, fresh grammar (µs)", &s.fresh_mask_us, 1);
    row(&mut out, "first mask of a fresh grammar (µs)", &s.first_mask_us, 1);
    row(&mut out, "mask per token, repeated grammar (µs)", &s.repeated_mask_us, 1);
    let _ = writeln!(out, "\nSlowest compiles (p50): {}.", slowest(&s.compile_by_schema, 3, "ms"));
    let _ = writeln!(out, "Slowest single masks (fresh): {}.", slowest(&s.slowest_mask_by_schema, 3, "µs"));
    out
}

//! The request set of a run: prompts with their lengths and wanted output lengths.
//!
//! - `random`: prompt lengths uniform in `[input_len·(1−r), input_len·(1+r)]` and output lengths
//!   likewise around `output_len` (`r` = `--range-ratio`), after an optional shared prefix of
//!   `--prefix-len` tokens.
//! - `sharegpt-like`: lengths drawn from fixed log-normal distributions shaped like ShareGPT's
//!   (see [`SHAREGPT_PROMPT`] and [`SHAREGPT_OUTPUT`]): mean ≈ 200 prompt and ≈ 180 output
//!   tokens, medians ≈ 137 and ≈ 128, long tails up to 1024.
//! - `prefix-repetition`: `--num-prefixes` prefixes of `--prefix-len` tokens (256 unless given),
//!   assigned round-robin, each followed by a unique random suffix of `input_len` tokens.
//! - `FILE.jsonl`: one `{"prompt": "...", "output_len": N}` object per line (`output_len`
//!   defaults to `--output-len`); the file is repeated from the start when it has fewer lines
//!   than `--num-prompts`.
//!
//! The same seed and options (tokenizer included) give the same request set, whatever the
//! request rate or concurrency.

use std::path::{Path, PathBuf};

use anyhow::{bail, ensure, Context};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::words::TextSynth;

/// Default `--input-len` and `--output-len` of the random datasets.
pub const DEFAULT_INPUT_LEN: usize = 128;
pub const DEFAULT_OUTPUT_LEN: usize = 128;
/// `--prefix-len` of `prefix-repetition` when none is given.
pub const DEFAULT_REPEATED_PREFIX_LEN: usize = 256;

/// A log-normal length distribution, `round(exp(N(mu, sigma²)))`, redrawn until within
/// `[min, max]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LogNormalLengths {
    pub mu: f64,
    pub sigma: f64,
    pub min: usize,
    pub max: usize,
}

/// ShareGPT-shaped prompt lengths: mean ≈ 200, median ≈ 137, p99 ≈ 880 tokens.
pub const SHAREGPT_PROMPT: LogNormalLengths = LogNormalLengths { mu: 4.95, sigma: 1.0, min: 4, max: 1024 };
/// ShareGPT-shaped output lengths: mean ≈ 180, median ≈ 128, p99 ≈ 810 tokens.
pub const SHAREGPT_OUTPUT: LogNormalLengths = LogNormalLengths { mu: 4.86, sigma: 0.9, min: 4, max: 1024 };

impl LogNormalLengths {
    pub fn sample(&self, rng: &mut StdRng) -> usize {
        loop {
            let x = (self.mu + self.sigma * standard_normal(rng)).exp().round();
            if x >= self.min as f64 && x <= self.max as f64 {
                return x as usize;
            }
        }
    }
}

/// One N(0, 1) draw (Box–Muller).
fn standard_normal(rng: &mut StdRng) -> f64 {
    let u1: f64 = 1.0 - rng.random::<f64>(); // (0, 1]: ln is finite
    let u2: f64 = rng.random();
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// Which dataset `--dataset` names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DatasetKind {
    Random,
    SharegptLike,
    PrefixRepetition,
    File(PathBuf),
}

impl std::str::FromStr for DatasetKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "random" => Ok(Self::Random),
            "sharegpt-like" | "sharegpt_like" => Ok(Self::SharegptLike),
            "prefix-repetition" | "prefix_repetition" => Ok(Self::PrefixRepetition),
            path if path.ends_with(".jsonl") => Ok(Self::File(PathBuf::from(path))),
            other => Err(format!(
                "expected random, sharegpt-like, prefix-repetition or a FILE.jsonl, got {other:?}"
            )),
        }
    }
}

impl std::fmt::Display for DatasetKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Random => f.write_str("random"),
            Self::SharegptLike => f.write_str("sharegpt-like"),
            Self::PrefixRepetition => f.write_str("prefix-repetition"),
            Self::File(p) => write!(f, "{}", p.display()),
        }
    }
}

/// What to generate. `None` lengths take the dataset's defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct DatasetSpec {
    pub kind: DatasetKind,
    pub num_prompts: usize,
    pub input_len: Option<usize>,
    pub output_len: Option<usize>,
    pub range_ratio: f64,
    pub prefix_len: Option<usize>,
    pub num_prefixes: usize,
    pub seed: u64,
}

impl DatasetSpec {
    /// A random dataset of `num_prompts` prompts with the default lengths.
    pub fn new(kind: DatasetKind, num_prompts: usize) -> Self {
        Self {
            kind,
            num_prompts,
            input_len: None,
            output_len: None,
            range_ratio: 0.0,
            prefix_len: None,
            num_prefixes: 1,
            seed: 0,
        }
    }

    fn check(&self) -> anyhow::Result<()> {
        ensure!(self.num_prompts > 0, "--num-prompts must be at least 1");
        ensure!(
            (0.0..1.0).contains(&self.range_ratio),
            "--range-ratio must be in [0, 1), got {}",
            self.range_ratio
        );
        ensure!(self.num_prefixes > 0, "--num-prefixes must be at least 1");
        ensure!(self.output_len != Some(0), "--output-len must be at least 1");
        let fixed_prompts = matches!(self.kind, DatasetKind::SharegptLike | DatasetKind::File(_));
        if fixed_prompts && self.input_len.is_some() {
            bail!(
                "--input-len does not apply to the {} dataset (its prompts have their own lengths)",
                self.kind
            );
        }
        if fixed_prompts && self.prefix_len.is_some() {
            bail!("--prefix-len does not apply to the {} dataset", self.kind);
        }
        if self.kind != DatasetKind::PrefixRepetition && self.num_prefixes != 1 {
            bail!("--num-prefixes applies to the prefix-repetition dataset only");
        }
        if self.kind == DatasetKind::PrefixRepetition {
            ensure!(self.prefix_len != Some(0), "prefix-repetition needs --prefix-len of at least 1");
        }
        Ok(())
    }
}

/// One request of the set.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Prompt {
    pub text: String,
    /// Tokens in `text`: exact with a tokenizer, else approximate (see [`TextSynth`]).
    pub prompt_len: usize,
    /// `max_tokens` of the request.
    pub output_len: usize,
}

/// The generated request set.
#[derive(Debug, Clone, PartialEq)]
pub struct Dataset {
    pub prompts: Vec<Prompt>,
    /// Whether `prompt_len`s were counted by a tokenizer.
    pub exact_lengths: bool,
}

impl Dataset {
    pub fn total_prompt_tokens(&self) -> usize {
        self.prompts.iter().map(|p| p.prompt_len).sum()
    }

    pub fn total_output_tokens(&self) -> usize {
        self.prompts.iter().map(|p| p.output_len).sum()
    }
}

/// A length uniform in `[len·(1−r), len·(1+r)]` (at least 1).
pub fn ranged_len(rng: &mut StdRng, len: usize, ratio: f64) -> usize {
    let low = ((len as f64 * (1.0 - ratio)).floor() as usize).max(1);
    let high = ((len as f64 * (1.0 + ratio)).floor() as usize).max(low);
    rng.random_range(low..=high)
}

/// Generates the request set `spec` describes.
pub fn generate(spec: &DatasetSpec, synth: &TextSynth) -> anyhow::Result<Dataset> {
    spec.check()?;
    let mut rng = StdRng::seed_from_u64(spec.seed);
    let output_default = spec.output_len.unwrap_or(DEFAULT_OUTPUT_LEN);
    let input_len = spec.input_len.unwrap_or(DEFAULT_INPUT_LEN);
    let mut prompts = Vec::with_capacity(spec.num_prompts);
    match &spec.kind {
        DatasetKind::Random | DatasetKind::PrefixRepetition => {
            let (prefix_len, num_prefixes) = match spec.kind {
                DatasetKind::Random => (spec.prefix_len.unwrap_or(0), 1),
                _ => (spec.prefix_len.unwrap_or(DEFAULT_REPEATED_PREFIX_LEN), spec.num_prefixes),
            };
            let mut prefixes = Vec::with_capacity(num_prefixes);
            for _ in 0..num_prefixes {
                prefixes.push(synth.extend(&mut rng, "", prefix_len)?);
            }
            for i in 0..spec.num_prompts {
                let (prefix, have) = &prefixes[i % num_prefixes];
                let suffix = ranged_len(&mut rng, input_len, spec.range_ratio);
                let output_len = ranged_len(&mut rng, output_default, spec.range_ratio);
                let (text, prompt_len) = synth.extend(&mut rng, prefix, have + suffix)?;
                prompts.push(Prompt { text, prompt_len, output_len });
            }
        }
        DatasetKind::SharegptLike => {
            for _ in 0..spec.num_prompts {
                let want = SHAREGPT_PROMPT.sample(&mut rng);
                let sampled_output = SHAREGPT_OUTPUT.sample(&mut rng);
                let output_len = spec.output_len.unwrap_or(sampled_output);
                let (text, prompt_len) = synth.extend(&mut rng, "", want)?;
                prompts.push(Prompt { text, prompt_len, output_len });
            }
        }
        DatasetKind::File(path) => {
            let lines = read_jsonl(path)?;
            for line in lines.iter().cycle().take(spec.num_prompts) {
                let output_len = line.output_len.unwrap_or(output_default);
                let prompt_len = synth.count(&line.prompt)?;
                prompts.push(Prompt { text: line.prompt.clone(), prompt_len, output_len });
            }
        }
    }
    Ok(Dataset { prompts, exact_lengths: synth.is_exact() })
}

/// One line of a `FILE.jsonl` dataset.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileLine {
    pub prompt: String,
    #[serde(default)]
    pub output_len: Option<usize>,
}

/// Reads the non-empty lines of a JSONL dataset.
pub fn read_jsonl(path: &Path) -> anyhow::Result<Vec<FileLine>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    parse_jsonl(&text).with_context(|| format!("in {}", path.display()))
}

/// Parses JSONL dataset text; errors name the line.
pub fn parse_jsonl(text: &str) -> anyhow::Result<Vec<FileLine>> {
    let mut lines = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let parsed: FileLine = serde_json::from_str(line).with_context(|| {
            format!("line {}: expected {{\"prompt\": \"...\", \"output_len\": N}}", i + 1)
        })?;
        ensure!(!parsed.prompt.is_empty(), "line {}: empty prompt", i + 1);
        ensure!(parsed.output_len != Some(0), "line {}: output_len must be at least 1", i + 1);
        lines.push(parsed);
    }
    ensure!(!lines.is_empty(), "the dataset file has no prompts");
    Ok(lines)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(kind: DatasetKind, n: usize) -> DatasetSpec {
        DatasetSpec { seed: 7, ..DatasetSpec::new(kind, n) }
    }

    #[test]
    fn ranged_lengths_stay_in_bounds_and_cover_them() {
        let mut rng = StdRng::seed_from_u64(1);
        let draws: Vec<usize> = (0..2000).map(|_| ranged_len(&mut rng, 100, 0.5)).collect();
        assert!(draws.iter().all(|&n| (50..=150).contains(&n)));
        assert_eq!(draws.iter().min(), Some(&50));
        assert_eq!(draws.iter().max(), Some(&150));
        assert_eq!(ranged_len(&mut rng, 100, 0.0), 100);
        assert_eq!(ranged_len(&mut rng, 1, 0.9), 1);
    }

    #[test]
    fn random_dataset_has_the_asked_lengths() {
        let d = generate(&spec(DatasetKind::Random, 20), &TextSynth::approximate()).unwrap();
        assert_eq!(d.prompts.len(), 20);
        assert!(!d.exact_lengths);
        for p in &d.prompts {
            assert_eq!((p.prompt_len, p.output_len), (DEFAULT_INPUT_LEN, DEFAULT_OUTPUT_LEN));
            assert_eq!(p.text.split(' ').count(), DEFAULT_INPUT_LEN);
        }
        assert_ne!(d.prompts[0].text, d.prompts[1].text);
    }

    #[test]
    fn random_prefix_len_adds_one_shared_prefix() {
        let s = DatasetSpec { prefix_len: Some(10), input_len: Some(5), ..spec(DatasetKind::Random, 4) };
        let d = generate(&s, &TextSynth::approximate()).unwrap();
        let head = |p: &Prompt| p.text.split(' ').take(10).collect::<Vec<_>>().join(" ");
        assert!(d.prompts.iter().all(|p| p.prompt_len == 15 && head(p) == head(&d.prompts[0])));
    }

    #[test]
    fn prefix_repetition_assigns_prefixes_round_robin() {
        let s = DatasetSpec {
            prefix_len: Some(8),
            input_len: Some(4),
            num_prefixes: 2,
            ..spec(DatasetKind::PrefixRepetition, 6)
        };
        let d = generate(&s, &TextSynth::approximate()).unwrap();
        let head = |i: usize| d.prompts[i].text.split(' ').take(8).collect::<Vec<_>>().join(" ");
        assert_eq!(head(0), head(2));
        assert_eq!(head(2), head(4));
        assert_eq!(head(1), head(3));
        assert_ne!(head(0), head(1));
        let tails: std::collections::HashSet<_> = d.prompts.iter().map(|p| p.text.clone()).collect();
        assert_eq!(tails.len(), 6, "suffixes are unique");
        assert!(d.prompts.iter().all(|p| p.prompt_len == 12));
    }

    #[test]
    fn prefix_repetition_defaults_to_a_256_token_prefix() {
        let d = generate(&spec(DatasetKind::PrefixRepetition, 2), &TextSynth::approximate()).unwrap();
        assert!(d.prompts.iter().all(|p| p.prompt_len == DEFAULT_REPEATED_PREFIX_LEN + DEFAULT_INPUT_LEN));
    }

    #[test]
    fn same_seed_same_set_other_seed_other_set() {
        let synth = TextSynth::approximate();
        for kind in [DatasetKind::Random, DatasetKind::SharegptLike, DatasetKind::PrefixRepetition] {
            let s = DatasetSpec { range_ratio: 0.5, ..spec(kind.clone(), 8) };
            let a = generate(&s, &synth).unwrap();
            assert_eq!(a, generate(&s, &synth).unwrap(), "{kind}");
            assert_ne!(a, generate(&DatasetSpec { seed: 8, ..s }, &synth).unwrap(), "{kind}");
        }
    }

    #[test]
    fn sharegpt_like_lengths_have_the_documented_shape() {
        let mut rng = StdRng::seed_from_u64(11);
        for (dist, mean, median) in [(SHAREGPT_PROMPT, 200.0, 137.0), (SHAREGPT_OUTPUT, 180.0, 128.0)] {
            let mut draws: Vec<usize> = (0..40_000).map(|_| dist.sample(&mut rng)).collect();
            draws.sort_unstable();
            let m = draws.iter().sum::<usize>() as f64 / draws.len() as f64;
            assert!((m - mean).abs() < mean * 0.05, "mean {m} vs {mean}");
            let med = draws[draws.len() / 2] as f64;
            assert!((med - median).abs() < median * 0.06, "median {med} vs {median}");
            assert!(draws[0] >= 4 && *draws.last().unwrap() <= 1024);
            assert!(*draws.last().unwrap() > 800, "long tail");
        }
    }

    #[test]
    fn sharegpt_like_output_len_can_be_fixed() {
        let s = DatasetSpec { output_len: Some(32), ..spec(DatasetKind::SharegptLike, 10) };
        let d = generate(&s, &TextSynth::approximate()).unwrap();
        assert!(d.prompts.iter().all(|p| p.output_len == 32));
        let lens: std::collections::HashSet<_> = d.prompts.iter().map(|p| p.prompt_len).collect();
        assert!(lens.len() > 5, "prompt lengths vary: {lens:?}");
    }

    #[test]
    fn options_that_do_not_apply_are_refused() {
        let synth = TextSynth::approximate();
        let bad = [
            DatasetSpec { input_len: Some(5), ..spec(DatasetKind::SharegptLike, 1) },
            DatasetSpec { prefix_len: Some(5), ..spec(DatasetKind::File("x.jsonl".into()), 1) },
            DatasetSpec { num_prefixes: 2, ..spec(DatasetKind::Random, 1) },
            DatasetSpec { range_ratio: 1.0, ..spec(DatasetKind::Random, 1) },
            DatasetSpec { prefix_len: Some(0), ..spec(DatasetKind::PrefixRepetition, 1) },
            spec(DatasetKind::Random, 0),
        ];
        for s in bad {
            assert!(generate(&s, &synth).is_err(), "{s:?}");
        }
    }

    #[test]
    fn jsonl_lines_parse_with_defaults_and_errors_name_the_line() {
        let lines = parse_jsonl("{\"prompt\": \"a b\", \"output_len\": 3}\n\n{\"prompt\": \"c\"}\n").unwrap();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0].output_len, Some(3));
        assert_eq!(lines[1].output_len, None);
        let err = parse_jsonl("{\"prompt\": \"a\"}\n{\"text\": \"b\"}\n").unwrap_err();
        assert!(format!("{err:#}").contains("line 2"), "{err:#}");
        assert!(parse_jsonl("\n").is_err());
    }

    #[test]
    fn jsonl_dataset_repeats_the_file_and_fills_output_len() {
        let path = std::env::temp_dir().join(format!("pagoda-bench-{}.jsonl", std::process::id()));
        std::fs::write(&path, "{\"prompt\": \"one two three\", \"output_len\": 5}\n{\"prompt\": \"four\"}\n")
            .unwrap();
        let s = DatasetSpec { output_len: Some(9), ..spec(DatasetKind::File(path.clone()), 3) };
        let d = generate(&s, &TextSynth::approximate()).unwrap();
        std::fs::remove_file(&path).unwrap();
        let got: Vec<_> = d.prompts.iter().map(|p| (p.text.as_str(), p.prompt_len, p.output_len)).collect();
        assert_eq!(got, [("one two three", 3, 5), ("four", 1, 9), ("one two three", 3, 5)]);
    }

    #[test]
    fn dataset_names_parse() {
        assert_eq!("random".parse::<DatasetKind>(), Ok(DatasetKind::Random));
        assert_eq!("sharegpt-like".parse::<DatasetKind>(), Ok(DatasetKind::SharegptLike));
        assert_eq!("prefix-repetition".parse::<DatasetKind>(), Ok(DatasetKind::PrefixRepetition));
        assert_eq!("d/x.jsonl".parse::<DatasetKind>(), Ok(DatasetKind::File("d/x.jsonl".into())));
        assert!("sharegpt".parse::<DatasetKind>().is_err());
    }
}

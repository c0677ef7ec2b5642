//! Printing a run's summary as a table (the layout of `vllm bench serve`, so the numbers read
//! the same) and saving everything as JSON for scripts (`--save-result`).

use std::io::Write;
use std::path::Path;

use anyhow::Context;
use serde::Serialize;
use serde_json::Value;

use crate::metrics::{Distribution, RequestResult, Summary};

const WIDTH: usize = 50;

/// What the table's header says besides the numbers.
#[derive(Debug, Clone, Default)]
pub struct TableInfo {
    /// e.g. "Serving Benchmark Result".
    pub title: String,
    pub max_concurrency: Option<usize>,
    /// Requests per second, `None` for all at once.
    pub request_rate: Option<f64>,
    /// Extra lines printed under the table (approximations the reader should know about).
    pub notes: Vec<String>,
}

fn centered(text: &str, fill: char) -> String {
    let text = if text.is_empty() { String::new() } else { format!(" {text} ") };
    let n = text.chars().count();
    let left = WIDTH.saturating_sub(n) / 2;
    let right = WIDTH.saturating_sub(n + left);
    format!("{}{text}{}", fill.to_string().repeat(left), fill.to_string().repeat(right))
}

fn row(out: &mut impl Write, label: &str, value: impl std::fmt::Display) -> std::io::Result<()> {
    writeln!(out, "{:<40} {value}", format!("{label}:"))
}

fn percentile_label(p: f64) -> String {
    if p.fract() == 0.0 {
        format!("P{p:.0}")
    } else {
        format!("P{p}")
    }
}

fn latency_block(
    out: &mut impl Write,
    heading: &str,
    short: &str,
    dist: Option<&Distribution>,
) -> std::io::Result<()> {
    writeln!(out, "{}", centered(heading, '-'))?;
    let Some(d) = dist else {
        return row(out, &format!("{short} (ms)"), "n/a (no samples)");
    };
    row(out, &format!("Mean {short} (ms)"), format!("{:.2}", d.mean))?;
    row(out, &format!("Median {short} (ms)"), format!("{:.2}", d.median))?;
    for &(p, v) in &d.percentiles {
        row(out, &format!("{} {short} (ms)", percentile_label(p)), format!("{v:.2}"))?;
    }
    Ok(())
}

/// Writes the results table.
pub fn write_table(out: &mut impl Write, s: &Summary, info: &TableInfo) -> std::io::Result<()> {
    writeln!(out, "{}", centered(&info.title, '='))?;
    row(out, "Successful requests", s.completed)?;
    row(out, "Failed requests", s.failed)?;
    if s.connection_retries > 0 {
        row(out, "Connection retries", s.connection_retries)?;
    }
    if let Some(rate) = info.request_rate {
        row(out, "Request rate (req/s)", format!("{rate:.2}"))?;
    }
    if let Some(c) = info.max_concurrency {
        row(out, "Maximum request concurrency", c)?;
    }
    row(out, "Benchmark duration (s)", format!("{:.2}", s.duration_s))?;
    row(out, "Total input tokens", s.total_input_tokens)?;
    row(out, "Total generated tokens", s.total_output_tokens)?;
    row(out, "Request throughput (req/s)", format!("{:.2}", s.request_throughput))?;
    row(out, "Output token throughput (tok/s)", format!("{:.2}", s.output_throughput))?;
    row(out, "Peak concurrent requests", s.peak_concurrency)?;
    row(out, "Total token throughput (tok/s)", format!("{:.2}", s.total_token_throughput))?;
    latency_block(out, "Time to First Token", "TTFT", s.ttft_ms.as_ref())?;
    latency_block(out, "Time per Output Token (excl. 1st token)", "TPOT", s.tpot_ms.as_ref())?;
    latency_block(out, "Inter-token Latency", "ITL", s.itl_ms.as_ref())?;
    latency_block(out, "End-to-end Latency", "E2EL", s.e2el_ms.as_ref())?;
    if let Some(v) = &s.validity {
        writeln!(out, "{}", centered("Structured Output Validity", '-'))?;
        row(out, "Valid answers / successful requests", format!("{} / {}", v.valid, s.completed))?;
        row(out, "Finished by length (cut off)", v.finished_length)?;
        row(out, "Invalid, not cut off", v.invalid_not_cut_off)?;
    }
    writeln!(out, "{}", centered("", '='))?;
    if s.requests_without_usage > 0 {
        writeln!(
            out,
            "Note: the server sent no usage for {} request(s); their output tokens are counted as \
             content chunks and their input tokens taken from the dataset.",
            s.requests_without_usage
        )?;
    }
    if s.connection_retries > 0 {
        writeln!(
            out,
            "Note: {} request(s) were sent a second time, on a new connection, because the server \
             closed the first connection without answering; their times count from the first \
             attempt.",
            s.connection_retries
        )?;
    }
    for note in &info.notes {
        writeln!(out, "Note: {note}")?;
    }
    if !s.errors.is_empty() {
        writeln!(out, "Errors:")?;
        for (error, n) in &s.errors {
            writeln!(out, "  {n} × {error}")?;
        }
    }
    Ok(())
}

/// The table as a string.
pub fn table(s: &Summary, info: &TableInfo) -> String {
    let mut buf = Vec::new();
    write_table(&mut buf, s, info).expect("writing to memory");
    String::from_utf8(buf).expect("UTF-8")
}

/// Everything `--save-result` writes.
#[derive(Debug, Serialize)]
pub struct SavedResult<'a> {
    pub pagoda_bench_version: &'static str,
    /// `serve` or `offline`.
    pub mode: &'static str,
    /// Unix time of the run's start, in seconds.
    pub date_unix_s: u64,
    /// The options of the run.
    pub config: Value,
    pub summary: &'a Summary,
    pub requests: &'a [RequestResult],
}

/// Writes `result` to `path` as pretty JSON.
pub fn save(path: &Path, result: &SavedResult<'_>) -> anyhow::Result<()> {
    let file = std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut w = std::io::BufWriter::new(file);
    serde_json::to_writer_pretty(&mut w, result).with_context(|| format!("writing {}", path.display()))?;
    w.write_all(b"\n")?;
    w.flush().with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::summarize;
    use std::time::Duration;

    fn results() -> Vec<RequestResult> {
        let ok = RequestResult {
            index: 0,
            success: true,
            error: None,
            connection_retries: 0,
            prompt_len: 8,
            output_len: 3,
            usage_reported: true,
            max_tokens: 3,
            start_s: 0.0,
            ttft_ms: Some(10.0),
            tpot_ms: Some(5.0),
            itl_ms: vec![5.0, 5.0],
            e2el_ms: 20.0,
            finish_reason: Some("length".into()),
            schema_check: None,
            text: None,
        };
        let failed = RequestResult {
            index: 1,
            success: false,
            error: Some("HTTP 404: no such model".into()),
            usage_reported: false,
            ttft_ms: None,
            tpot_ms: None,
            itl_ms: vec![],
            ..ok.clone()
        };
        vec![ok, failed]
    }

    #[test]
    fn table_shows_counts_latencies_and_errors() {
        let s = summarize(&results(), Duration::from_secs(2), &[99.0]);
        let info = TableInfo {
            title: "Serving Benchmark Result".into(),
            max_concurrency: Some(4),
            ..Default::default()
        };
        let t = table(&s, &info);
        assert!(t.starts_with("============ Serving Benchmark Result ============\n"), "{t}");
        for line in [
            "Successful requests:                     1\n",
            "Failed requests:                         1\n",
            "Maximum request concurrency:             4\n",
            "Benchmark duration (s):                  2.00\n",
            "Total generated tokens:                  3\n",
            "Request throughput (req/s):              0.50\n",
            "Output token throughput (tok/s):         1.50\n",
            "Total token throughput (tok/s):          5.50\n",
            "Mean TTFT (ms):                          10.00\n",
            "P99 TPOT (ms):                           5.00\n",
            "Median ITL (ms):                         5.00\n",
            "P99 E2EL (ms):                           20.00\n",
            "  1 × HTTP 404: no such model\n",
        ] {
            assert!(t.contains(line), "missing {line:?} in\n{t}");
        }
        assert!(!t.contains("no usage"));
        assert!(!t.contains("Connection retries") && !t.contains("second time"), "none to show");
        assert!(t.lines().all(|l| l.chars().count() <= WIDTH || l.starts_with("  ")));
    }

    #[test]
    fn missing_usage_retries_and_empty_distributions_are_said() {
        let mut rs = results();
        rs[0].usage_reported = false;
        rs.truncate(1);
        rs[0].itl_ms.clear();
        let s = summarize(&rs, Duration::from_secs(1), &[90.0, 99.9]);
        let t = table(&s, &TableInfo { notes: vec!["lengths are approximate".into()], ..Default::default() });
        assert!(t.contains("sent no usage for 1 request(s)"), "{t}");
        assert!(t.contains("Note: lengths are approximate"), "{t}");
        assert!(t.contains("ITL (ms):                                n/a (no samples)"), "{t}");
        assert!(t.contains("P90 TTFT (ms):") && t.contains("P99.9 TTFT (ms):"), "{t}");

        rs[0].connection_retries = 1;
        let t = table(&summarize(&rs, Duration::from_secs(1), &[]), &TableInfo::default());
        assert!(t.contains("Connection retries:                      1\n"), "{t}");
        assert!(t.contains("Note: 1 request(s) were sent a second time, on a new connection"), "{t}");
    }

    #[test]
    fn saved_json_holds_summary_and_requests() {
        let rs = results();
        let s = summarize(&rs, Duration::from_secs(2), &[99.0]);
        let path = std::env::temp_dir().join(format!("pagoda-bench-report-{}.json", std::process::id()));
        let saved = SavedResult {
            pagoda_bench_version: "test",
            mode: "serve",
            date_unix_s: 1,
            config: serde_json::json!({"num_prompts": 2}),
            summary: &s,
            requests: &rs,
        };
        save(&path, &saved).unwrap();
        let v: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(v["summary"]["completed"], 1);
        assert_eq!(v["summary"]["ttft_ms"]["percentiles"][0], serde_json::json!([99.0, 10.0]));
        assert_eq!(v["requests"][0]["itl_ms"], serde_json::json!([5.0, 5.0]));
        assert_eq!(v["requests"][1]["error"], "HTTP 404: no such model");
        assert_eq!(v["config"]["num_prompts"], 2);
    }
}

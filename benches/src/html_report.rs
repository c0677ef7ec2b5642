//! `--report FILE.html`: one self-contained page per run, or per comparison (`--compare
//! SAVED.json`, repeatable, puts saved runs beside this one): the summary table, the TTFT,
//! TPOT, ITL and end-to-end latency distributions as CDFs, and output tokens per second over
//! the run. The plots are plotly.js charts made with the `plotly` crate, whose library is
//! written into the page, so it opens offline and fetches nothing.
//!
//! Every run, this one included, is read in the shape `--save-result` writes, so a report of
//! saved files and of a live run are made the same way.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context;
use plotly::common::{Line, Mode, Title};
use plotly::layout::{Axis, AxisType};
use plotly::{Layout, Plot, Scatter};
use serde_json::Value;

/// Points a CDF is drawn with at most (quantiles of the values).
const CDF_POINTS: usize = 500;
/// Bins of the throughput-over-time plot.
const TIME_BINS: usize = 60;

/// One run of the report: its label and its saved result (`SavedResult` as JSON).
#[derive(Debug, Clone)]
pub struct ReportRun {
    pub label: String,
    pub saved: Value,
}

impl ReportRun {
    /// A file `--save-result` wrote, labelled by its name.
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let saved: Value =
            serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))?;
        if !saved["summary"].is_object() || !saved["requests"].is_array() {
            anyhow::bail!("{} is not a file written by --save-result", path.display());
        }
        let label =
            path.file_stem().map_or_else(|| path.display().to_string(), |s| s.to_string_lossy().into());
        Ok(Self { label, saved })
    }

    fn summary(&self) -> &Value {
        &self.saved["summary"]
    }

    fn requests(&self) -> impl Iterator<Item = &Value> {
        self.saved["requests"].as_array().into_iter().flatten().filter(|r| r["success"] == true)
    }

    /// Every successful request's `key` (a number, or with `flatten` a list of numbers).
    fn values(&self, key: &str, flatten: bool) -> Vec<f64> {
        let mut values: Vec<f64> = if flatten {
            self.requests()
                .flat_map(|r| r[key].as_array().into_iter().flatten().filter_map(Value::as_f64))
                .collect()
        } else {
            self.requests().filter_map(|r| r[key].as_f64()).collect()
        };
        values.sort_by(f64::total_cmp);
        values
    }

    /// When each output token arrived, in seconds from the run's start: the first at TTFT, the
    /// next ones an inter-token latency apart.
    fn token_times(&self) -> Vec<f64> {
        let mut times = Vec::new();
        for r in self.requests() {
            let (Some(start), Some(ttft)) = (r["start_s"].as_f64(), r["ttft_ms"].as_f64()) else {
                continue;
            };
            let mut t = start + ttft / 1e3;
            times.push(t);
            for gap in r["itl_ms"].as_array().into_iter().flatten().filter_map(Value::as_f64) {
                t += gap / 1e3;
                times.push(t);
            }
        }
        times
    }
}

/// Writes the report of `runs` (the first is the one the page is about) to `path`.
pub fn write(path: &Path, runs: &[ReportRun]) -> anyhow::Result<()> {
    std::fs::write(path, render(runs)).with_context(|| format!("writing {}", path.display()))
}

/// The report page of `runs`.
pub fn render(runs: &[ReportRun]) -> String {
    let mut page = String::new();
    let title = match runs {
        [one] => format!("pagoda-bench: {}", one.label),
        _ => format!("pagoda-bench: {} runs compared", runs.len()),
    };
    let _ = write!(
        page,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>{}</title>\n\
         <style>{STYLE}</style>\n{}\n</head>\n<body>\n<h1>{}</h1>\n",
        escape(&title),
        plotly_library(),
        escape(&title)
    );
    page.push_str(&runs_list(runs));
    page.push_str(&summary_table(runs));
    page.push_str("<h2>Latency distributions</h2>\n<div class=\"plots\">\n");
    let distributions = [
        ("ttft", "Time to first token", "ttft_ms", false),
        ("tpot", "Time per output token", "tpot_ms", false),
        ("itl", "Inter-token latency", "itl_ms", true),
        ("e2el", "End-to-end latency", "e2el_ms", false),
    ];
    for (id, name, key, flatten) in distributions {
        page.push_str(&cdf_plot(runs, id, name, key, flatten));
    }
    page.push_str("</div>\n<h2>Throughput over time</h2>\n");
    page.push_str(&throughput_plot(runs));
    page.push_str("</body>\n</html>\n");
    page
}

const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:2em;color:#222}\
table{border-collapse:collapse;margin:1em 0}th,td{border:1px solid #ccc;padding:.3em .7em;text-align:right}\
th:first-child,td:first-child{text-align:left}thead th{background:#f3f3f3}\
.plots{display:grid;grid-template-columns:repeat(auto-fit,minmax(520px,1fr));gap:1em}\
.plot{height:380px}code{font-size:.9em}";

/// The plotly.js library as an inline script. The crate's offline sources are plotly.js and
/// MathJax (for LaTeX titles, which these plots do not use), each in a script element: only the
/// first is kept.
fn plotly_library() -> String {
    let sources = Plot::offline_js_sources();
    match sources.find("</script>") {
        Some(end) => sources[..end + "</script>".len()].to_string(),
        None => sources,
    }
}

fn runs_list(runs: &[ReportRun]) -> String {
    let mut out = String::from("<h2>Runs</h2>\n<ul class=\"runs\">\n");
    for run in runs {
        let config = run.saved["config"].as_object();
        let settings: Vec<String> = config
            .into_iter()
            .flatten()
            .filter(|(_, v)| !v.is_null())
            .map(|(k, v)| format!("{k}={}", v.as_str().map_or_else(|| v.to_string(), str::to_owned)))
            .collect();
        let _ = writeln!(
            out,
            "<li><b>{}</b> ({}, pagoda-bench {}): <code>{}</code></li>",
            escape(&run.label),
            escape(run.saved["mode"].as_str().unwrap_or("serve")),
            escape(run.saved["pagoda_bench_version"].as_str().unwrap_or("?")),
            escape(&settings.join(" "))
        );
    }
    out.push_str("</ul>\n");
    out
}

/// A number as the table shows it.
fn number(v: &Value, decimals: usize) -> String {
    match v.as_f64() {
        Some(x) if v.is_u64() || v.is_i64() => format!("{x:.0}"),
        Some(x) => format!("{x:.decimals$}"),
        None => "-".into(),
    }
}

fn summary_table(runs: &[ReportRun]) -> String {
    let mut out = String::from("<h2>Summary</h2>\n<table class=\"summary\">\n<thead><tr><th>metric</th>");
    for run in runs {
        let _ = write!(out, "<th>{}</th>", escape(&run.label));
    }
    out.push_str("</tr></thead>\n<tbody>\n");
    let mut row = |name: &str, cell: &dyn Fn(&Value) -> String| {
        let _ = write!(out, "<tr><td>{}</td>", escape(name));
        for run in runs {
            let _ = write!(out, "<td>{}</td>", escape(&cell(run.summary())));
        }
        out.push_str("</tr>\n");
    };
    for (name, key, decimals) in [
        ("successful requests", "completed", 0),
        ("failed requests", "failed", 0),
        ("duration (s)", "duration_s", 2),
        ("total input tokens", "total_input_tokens", 0),
        ("total output tokens", "total_output_tokens", 0),
        ("request throughput (req/s)", "request_throughput", 2),
        ("output token throughput (tok/s)", "output_throughput", 2),
        ("total token throughput (tok/s)", "total_token_throughput", 2),
        ("peak concurrency", "peak_concurrency", 0),
    ] {
        row(name, &|s: &Value| number(&s[key], decimals));
    }
    // Percentiles of the first run that has each distribution (all runs asked the same, or
    // the row shows "-" where one did not).
    for (label, key) in [("TTFT", "ttft_ms"), ("TPOT", "tpot_ms"), ("ITL", "itl_ms"), ("E2EL", "e2el_ms")] {
        row(&format!("mean {label} (ms)"), &|s: &Value| number(&s[key]["mean"], 2));
        row(&format!("median {label} (ms)"), &|s: &Value| number(&s[key]["median"], 2));
        let percentiles: Vec<f64> = runs
            .iter()
            .flat_map(|r| r.summary()[key]["percentiles"].as_array().cloned().unwrap_or_default())
            .filter_map(|pair| pair[0].as_f64())
            .fold(Vec::new(), |mut seen, p| {
                if !seen.contains(&p) {
                    seen.push(p);
                }
                seen
            });
        for p in percentiles {
            row(&format!("P{p} {label} (ms)"), &|s: &Value| {
                let pairs = s[key]["percentiles"].as_array().cloned().unwrap_or_default();
                pairs
                    .iter()
                    .find(|pair| pair[0].as_f64() == Some(p))
                    .map_or("-".into(), |pair| number(&pair[1], 2))
            });
        }
    }
    out.push_str("</tbody>\n</table>\n");
    out
}

/// Up to `CDF_POINTS` points `(value, fraction at or below it)` of sorted `values`.
pub fn cdf_points(values: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let n = values.len();
    if n == 0 {
        return (Vec::new(), Vec::new());
    }
    let step = n.div_ceil(CDF_POINTS);
    let mut idx: Vec<usize> = (0..n).step_by(step).collect();
    if idx.last() != Some(&(n - 1)) {
        idx.push(n - 1);
    }
    (idx.iter().map(|&i| values[i]).collect(), idx.iter().map(|&i| (i + 1) as f64 / n as f64).collect())
}

fn cdf_plot(runs: &[ReportRun], id: &str, name: &str, key: &str, flatten: bool) -> String {
    let mut plot = Plot::new();
    let mut any_positive = false;
    for run in runs {
        let values = run.values(key, flatten);
        any_positive |= values.iter().any(|&v| v > 0.0);
        let (x, y) = cdf_points(&values);
        plot.add_trace(Scatter::new(x, y).name(&run.label).mode(Mode::Lines).line(Line::new().width(2.0)));
    }
    let x_axis = Axis::new().title(Title::with_text(format!("{name} (ms)")));
    let x_axis = if any_positive { x_axis.type_(AxisType::Log) } else { x_axis };
    plot.set_layout(
        Layout::new()
            .title(Title::with_text(format!("{name}: CDF")))
            .x_axis(x_axis)
            .y_axis(Axis::new().title(Title::with_text("fraction of samples")).range(vec![0.0, 1.0])),
    );
    format!("<div class=\"plot\">{}</div>\n", plot.to_inline_html(Some(&format!("plot-{id}"))))
}

/// `(bin centres in s, tokens/s)` of the token arrival `times` over `duration` seconds.
pub fn throughput_series(times: &[f64], duration: f64) -> (Vec<f64>, Vec<f64>) {
    let end = times.iter().copied().fold(duration, f64::max);
    if end <= 0.0 {
        return (Vec::new(), Vec::new());
    }
    let width = end / TIME_BINS as f64;
    let mut counts = vec![0usize; TIME_BINS];
    for &t in times {
        counts[((t / width) as usize).min(TIME_BINS - 1)] += 1;
    }
    let centres = (0..TIME_BINS).map(|i| (i as f64 + 0.5) * width).collect();
    (centres, counts.iter().map(|&c| c as f64 / width).collect())
}

fn throughput_plot(runs: &[ReportRun]) -> String {
    let mut plot = Plot::new();
    for run in runs {
        let duration = run.summary()["duration_s"].as_f64().unwrap_or(0.0);
        let (x, y) = throughput_series(&run.token_times(), duration);
        plot.add_trace(Scatter::new(x, y).name(&run.label).mode(Mode::Lines).line(Line::new().width(2.0)));
    }
    plot.set_layout(
        Layout::new()
            .title(Title::with_text("Output tokens per second"))
            .x_axis(Axis::new().title(Title::with_text("time since the run started (s)")))
            .y_axis(Axis::new().title(Title::with_text("tokens/s"))),
    );
    format!("<div class=\"plot\">{}</div>\n", plot.to_inline_html(Some("plot-throughput")))
}

/// `text` with HTML's special characters escaped.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cdf_keeps_the_ends_and_at_most_its_points() {
        let values: Vec<f64> = (1..=2000).map(f64::from).collect();
        let (x, y) = cdf_points(&values);
        assert!(x.len() <= CDF_POINTS + 1);
        assert_eq!((x[0], *x.last().unwrap(), *y.last().unwrap()), (1.0, 2000.0, 1.0));
        assert!(y.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(cdf_points(&[]).0.len(), 0);
    }

    #[test]
    fn throughput_counts_every_token_per_second() {
        // 120 tokens evenly over 6 s: 20 tokens/s in every bin.
        let times: Vec<f64> = (0..120).map(|i| (i as f64 + 0.5) * 0.05).collect();
        let (x, y) = throughput_series(&times, 6.0);
        assert_eq!(x.len(), TIME_BINS);
        let total: f64 = y.iter().map(|r| r * 6.0 / TIME_BINS as f64).sum();
        assert!((total - 120.0).abs() < 1e-9);
        assert!(y.iter().all(|&r| (r - 20.0).abs() < 1e-9), "{y:?}");
    }

    #[test]
    fn labels_and_settings_are_escaped() {
        assert_eq!(escape("<a href=\"x\">&'"), "&lt;a href=&quot;x&quot;&gt;&amp;&#39;");
    }
}

//! The results table of a GPU check: one row per check (what was measured, the limit, pass or
//! fail) or per timing (informational), written as Markdown and JSON after every section so a
//! run cut short still leaves its results.

use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    pub section: String,
    pub check: String,
    pub measured: String,
    pub limit: String,
    /// `None` for rows that only report a number (timings).
    pub pass: Option<bool>,
}

#[derive(Debug, Default, Serialize)]
pub struct Report {
    /// Where the check ran (GPU name, driver), filled in by the binary.
    pub device: String,
    pub rows: Vec<Row>,
}

impl Report {
    pub fn new(device: impl Into<String>) -> Self {
        Self { device: device.into(), rows: Vec::new() }
    }

    fn push(&mut self, section: &str, check: &str, measured: String, limit: String, pass: Option<bool>) {
        self.rows.push(Row { section: section.into(), check: check.into(), measured, limit, pass });
    }

    /// A value that must not exceed `limit` (errors).
    pub fn at_most(&mut self, section: &str, check: &str, value: f64, limit: f64) {
        self.push(section, check, format!("{value:.3e}"), format!("<= {limit:.0e}"), Some(value <= limit));
    }

    /// A value that must reach `limit` (agreement, fractions).
    pub fn at_least(&mut self, section: &str, check: &str, value: f64, limit: f64, unit: &str) {
        self.push(
            section,
            check,
            format!("{value:.3}{unit}"),
            format!(">= {limit}{unit}"),
            Some(value >= limit),
        );
    }

    /// A yes/no check with what was seen.
    pub fn expect(&mut self, section: &str, check: &str, ok: bool, measured: impl Into<String>) {
        self.push(section, check, measured.into(), "ok".into(), Some(ok));
    }

    /// A number reported without a pass/fail verdict.
    pub fn info(&mut self, section: &str, check: &str, measured: impl Into<String>) {
        self.push(section, check, measured.into(), String::new(), None);
    }

    /// A number reported against a goal, without a pass/fail verdict (performance goals).
    pub fn goal(&mut self, section: &str, check: &str, measured: impl Into<String>, goal: impl Into<String>) {
        self.push(section, check, measured.into(), goal.into(), None);
    }

    /// A check that could not run at all.
    pub fn error(&mut self, section: &str, check: &str, error: impl std::fmt::Display) {
        let one_line = error.to_string().replace('\n', " ").replace('|', "/");
        self.push(section, check, format!("error: {one_line}"), "ok".into(), Some(false));
    }

    pub fn failures(&self) -> usize {
        self.rows.iter().filter(|r| r.pass == Some(false)).count()
    }

    pub fn checks(&self) -> usize {
        self.rows.iter().filter(|r| r.pass.is_some()).count()
    }

    pub fn markdown(&self) -> String {
        let mut s = String::new();
        writeln!(
            s,
            "GPU check on {}: {} of {} checks passed\n",
            self.device,
            self.checks() - self.failures(),
            self.checks()
        )
        .unwrap();
        s.push_str("| section | check | measured | limit | result |\n|---|---|---|---|---|\n");
        for r in &self.rows {
            let verdict = match r.pass {
                Some(true) => "pass",
                Some(false) => "FAIL",
                None => "",
            };
            writeln!(s, "| {} | {} | {} | {} | {verdict} |", r.section, r.check, r.measured, r.limit)
                .unwrap();
        }
        s
    }

    /// Writes `results.md` and `results.json` into `dir`.
    pub fn write(&self, dir: &Path) -> std::io::Result<()> {
        std::fs::write(dir.join("results.md"), self.markdown())?;
        let json = serde_json::to_string_pretty(self).map_err(std::io::Error::other)?;
        std::fs::write(dir.join("results.json"), json)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_and_table() {
        let mut r = Report::new("test GPU");
        r.at_most("ops", "rms_norm bf16", 3e-3, 1e-2);
        r.at_most("ops", "rms_norm f32", 2e-5, 1e-5);
        r.at_least("model", "agreement", 0.97, 0.95, "");
        r.expect("server", "chat", true, "\"Paris\"");
        r.info("timings", "copy", "3.0 TB/s");
        r.goal("timings", "decode 64 x 4k", "80% of copy", "goal >= 85%");
        r.error("ops", "attention", "boom\nat | here");
        assert_eq!((r.checks(), r.failures()), (5, 2));
        let md = r.markdown();
        assert!(md.starts_with("GPU check on test GPU: 3 of 5 checks passed"));
        assert!(md.contains("| ops | rms_norm f32 | 2.000e-5 | <= 1e-5 | FAIL |"));
        assert!(md.contains("| timings | copy | 3.0 TB/s |  |  |"));
        assert!(md.contains("| timings | decode 64 x 4k | 80% of copy | goal >= 85% |  |"));
        assert!(md.contains("error: boom at / here"));

        let dir = tempfile::tempdir().unwrap();
        r.write(dir.path()).unwrap();
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.path().join("results.json")).unwrap()).unwrap();
        assert_eq!(json["rows"].as_array().unwrap().len(), 7);
        assert_eq!(json["rows"][1]["pass"], false);
        assert!(std::fs::read_to_string(dir.path().join("results.md"))
            .unwrap()
            .contains("| model | agreement |"));
    }
}

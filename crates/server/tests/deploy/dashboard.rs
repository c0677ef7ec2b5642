//! The Grafana dashboard (docker/grafana/dashboards/pagoda.json) as Grafana would load it:
//! its panels and their PromQL, the metric names those queries read, and the queries with
//! Grafana's variables filled in so that Prometheus can run them. The stack test compares the
//! names with a replica's /metrics and runs the queries against Prometheus.

use std::collections::{BTreeSet, HashMap, HashSet};

use anyhow::{ensure, Context, Result};
use serde_json::Value;

use crate::processes::repo_root;

pub const DASHBOARD: &str = "docker/grafana/dashboards/pagoda.json";
pub const DATASOURCE_PROVISIONING: &str = "docker/grafana/provisioning/datasources/prometheus.yml";

pub fn load() -> Result<Value> {
    let text = std::fs::read_to_string(repo_root().join(DASHBOARD))?;
    serde_json::from_str(&text).with_context(|| format!("{DASHBOARD} is not JSON"))
}

/// Every panel, rows' nested panels included.
pub fn panels(dashboard: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().into_iter().flatten() {
        out.push(panel);
        out.extend(panel["panels"].as_array().into_iter().flatten());
    }
    out
}

/// (panel title, PromQL) for every query target.
pub fn queries(dashboard: &Value) -> Vec<(String, String)> {
    panels(dashboard)
        .into_iter()
        .flat_map(|p| {
            let title = p["title"].as_str().unwrap_or("?").to_owned();
            p["targets"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(move |t| t["expr"].as_str().map(|e| (title.clone(), e.to_owned())))
        })
        .collect()
}

/// Metric names a query selects: identifiers directly followed by `{`. The dashboard writes
/// every selector with braces (even an empty `{}` would do), which keeps functions, keywords
/// and label names out of this set.
pub fn metric_names(expr: &str) -> BTreeSet<String> {
    let bytes = expr.as_bytes();
    let is_name = |b: u8| b.is_ascii_alphanumeric() || b == b'_' || b == b':';
    let mut names = BTreeSet::new();
    for (i, &b) in bytes.iter().enumerate() {
        if b != b'{' {
            continue;
        }
        let start = (0..i).rev().take_while(|&j| is_name(bytes[j])).last();
        if let Some(start) = start {
            names.insert(expr[start..i].to_owned());
        }
    }
    names
}

/// The dashboard's query variables: (name, series selector, label) of each
/// `label_values(selector, label)` definition.
pub fn variables(dashboard: &Value) -> Result<Vec<(String, String, String)>> {
    let mut out = Vec::new();
    for var in dashboard["templating"]["list"].as_array().into_iter().flatten() {
        let name = var["name"].as_str().context("a variable without a name")?;
        let definition = var["definition"].as_str().unwrap_or_default();
        let args = definition
            .strip_prefix("label_values(")
            .and_then(|rest| rest.strip_suffix(')'))
            .and_then(|args| args.rsplit_once(','))
            .with_context(|| {
                format!("variable {name}: {definition:?} is not label_values(selector, label)")
            })?;
        out.push((name.to_owned(), args.0.trim().to_owned(), args.1.trim().to_owned()));
    }
    Ok(out)
}

/// A multi-value variable as Grafana writes it into PromQL: `(a|b)`, regex metacharacters
/// escaped (inside a PromQL string, so the backslash itself is doubled).
pub fn regex_of(values: &[String]) -> String {
    let escaped: Vec<String> = values
        .iter()
        .map(|v| {
            v.chars()
                .map(|c| if r".+*?^$()[]{}|\".contains(c) { format!(r"\\{c}") } else { c.to_string() })
                .collect()
        })
        .collect();
    format!("({})", escaped.join("|"))
}

/// `expr` as Prometheus can run it: each variable replaced by its value in `values` and
/// `$__rate_interval` by `window`.
pub fn for_prometheus(expr: &str, values: &HashMap<String, String>, window: &str) -> String {
    let mut out = expr.replace("$__rate_interval", window);
    for (name, value) in values {
        out = out.replace(&format!("${{{name}}}"), value).replace(&format!("${name}"), value);
    }
    out
}

/// Metric families the server exports, from /metrics text: `# TYPE` names plus the sample
/// names (which add `_bucket`, `_sum` and `_count` for histograms).
pub fn exported_names(metrics_text: &str) -> HashSet<String> {
    metrics_text
        .lines()
        .filter_map(|l| match l.strip_prefix("# TYPE ") {
            Some(rest) => rest.split(' ').next(),
            None if l.starts_with('#') || l.is_empty() => None,
            None => l.split(['{', ' ']).next(),
        })
        .map(str::to_owned)
        .collect()
}

#[test]
fn variables_become_escaped_alternations() {
    let values = HashMap::from([("instance".to_owned(), regex_of(&["127.0.0.1:80".into(), "b".into()]))]);
    assert_eq!(
        for_prometheus(r#"rate(x{instance=~"$instance"}[$__rate_interval])"#, &values, "1m"),
        r#"rate(x{instance=~"(127\\.0\\.0\\.1:80|b)"}[1m])"#
    );
}

#[test]
fn metric_names_skip_functions_and_labels() {
    let names = metric_names(
        r#"histogram_quantile(0.9, sum by (le) (rate(pagoda:ttft_bucket{model_name=~"$m"}[5m]))) / up{job="x"}"#,
    );
    assert_eq!(names.into_iter().collect::<Vec<_>>(), ["pagoda:ttft_bucket", "up"]);
}

/// What Grafana needs to show the dashboard from the compose stack's provisioning: unique
/// panel ids and refIds, panels inside the 24-column grid, every query against the provisioned
/// Prometheus data source, and a panel for each figure the deployment promises.
#[test]
fn dashboard_loads_against_the_provisioned_datasource() -> Result<()> {
    let dashboard = load()?;
    for key in ["uid", "title"] {
        ensure!(dashboard[key].as_str().is_some_and(|s| !s.is_empty()), "{DASHBOARD}: no {key}");
    }
    ensure!(dashboard["schemaVersion"].as_u64().is_some(), "{DASHBOARD}: no schemaVersion");

    let provisioning = std::fs::read_to_string(repo_root().join(DATASOURCE_PROVISIONING))?;
    let datasource_uid = provisioning
        .lines()
        .find_map(|l| l.trim().strip_prefix("uid:"))
        .map(str::trim)
        .with_context(|| format!("{DATASOURCE_PROVISIONING} names no uid"))?;

    let mut ids = HashSet::new();
    for panel in panels(&dashboard) {
        let title = panel["title"].as_str().context("a panel without a title")?;
        let id = panel["id"].as_u64().with_context(|| format!("panel {title:?} has no id"))?;
        ensure!(ids.insert(id), "panel id {id} is used twice");
        let grid = &panel["gridPos"];
        let (x, w, h) = (grid["x"].as_u64(), grid["w"].as_u64(), grid["h"].as_u64());
        ensure!(
            matches!((x, w, h), (Some(x), Some(w), Some(h)) if w > 0 && h > 0 && x + w <= 24)
                && grid["y"].is_u64(),
            "panel {title:?}: gridPos {grid} is outside the 24-column grid"
        );
        let kind = panel["type"].as_str().unwrap_or_default();
        if kind == "row" {
            continue;
        }
        ensure!(["timeseries", "stat"].contains(&kind), "panel {title:?}: unexpected type {kind:?}");
        let targets = panel["targets"].as_array().filter(|t| !t.is_empty());
        let targets = targets.with_context(|| format!("panel {title:?} has no queries"))?;
        let mut ref_ids = HashSet::new();
        for t in targets {
            ensure!(t["expr"].as_str().is_some_and(|e| !e.trim().is_empty()), "panel {title:?}: empty expr");
            ensure!(ref_ids.insert(t["refId"].as_str().unwrap_or_default()), "panel {title:?}: refId reused");
            for ds in [&panel["datasource"], &t["datasource"]] {
                ensure!(
                    ds["type"] == "prometheus" && ds["uid"] == datasource_uid,
                    "panel {title:?}: datasource {ds} is not the provisioned {datasource_uid:?}"
                );
            }
        }
    }

    let all: BTreeSet<String> = queries(&dashboard).iter().flat_map(|(_, e)| metric_names(e)).collect();
    for wanted in [
        "pagoda:time_to_first_token_seconds_bucket",
        "pagoda:inter_token_latency_seconds_bucket",
        "pagoda:generation_tokens_total",
        "pagoda:num_requests_running",
        "pagoda:num_requests_waiting",
        "pagoda:kv_cache_usage_perc",
        "pagoda:prefix_cache_hits_total",
        "pagoda:prefix_cache_queries_total",
        "pagoda:num_preemptions_total",
    ] {
        ensure!(all.contains(wanted), "no panel reads {wanted}");
    }
    for (title, expr) in queries(&dashboard) {
        ensure!(!metric_names(&expr).is_empty(), "panel {title:?}: no metric selector with braces in {expr}");
        if expr.contains("_bucket{") {
            ensure!(expr.contains("histogram_quantile("), "panel {title:?}: raw buckets without quantiles");
        }
    }
    Ok(())
}

//! The playground and the dashboard: served (and not, with `--disable-web-ui`), `/stats`'s
//! answers, and the pages themselves in headless Chromium (tests/browser/check_web_ui.py,
//! Selenium from the virtual environment `make browser-tools` installs, with Debian's
//! chromium and chromedriver). Missing tools fail the test.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::Value;

use crate::harness::{shared, TestServer};

/// The key the browser test's server requires; the page must ask for it.
const BROWSER_KEY: &str = "browser-secret";
/// The whole browser run: about a dozen short generations and a short load.
const BROWSER_TIMEOUT: Duration = Duration::from_secs(600);

fn tool(name: &str) -> PathBuf {
    let path = PathBuf::from("/usr/bin").join(name);
    assert!(path.exists(), "{} is missing: run `make browser-tools`", path.display());
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn playground_and_dashboard_in_headless_chromium() -> Result<()> {
    let server = TestServer::start_with_template(
        "web-ui",
        crate::reasoning::QWEN3_STYLE,
        &["--reasoning-parser", "qwen3", "--api-key", BROWSER_KEY, "--max-num-seqs", "8"],
    );
    let artifacts = crate::sdk::repo_root().join("artifacts/web-ui");
    let script = crate::sdk::repo_root().join("tests/browser/check_web_ui.py");
    let python = crate::sdk::tools_python("browser", "browser-tools");
    let child = crate::sdk::python_check(&python, &script)
        .args(["--base-url", &server.url(""), "--api-key", BROWSER_KEY, "--model", "smol"])
        .arg("--chromium")
        .arg(tool("chromium"))
        .arg("--chromedriver")
        .arg(tool("chromedriver"))
        .arg("--artifacts")
        .arg(&artifacts)
        // Selenium Manager must not look for drivers on the network: both paths are given.
        .env("SE_OFFLINE", "true")
        .spawn()
        .context("starting the browser test")?;
    let output = tokio::time::timeout(BROWSER_TIMEOUT, child.wait_with_output())
        .await
        .context("the browser test timed out")??;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the browser test failed ({}; screenshots in {}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        output.status,
        artifacts.display()
    );
    print!("{stdout}");
    for shot in ["chat.png", "dashboard.png"] {
        let len = std::fs::metadata(artifacts.join(shot)).map(|m| m.len()).unwrap_or(0);
        assert!(len > 10_000, "{shot} is missing or empty ({len} bytes)");
    }
    server.signal_stop();
    Ok(())
}

#[tokio::test]
async fn pages_are_served_from_the_binary_with_their_policy() -> Result<()> {
    let s = shared();
    let http = reqwest::Client::new();
    for (path, kind) in
        [("/", "text/html"), ("/dashboard", "text/html"), ("/ui/playground.js", "text/javascript")]
    {
        // No key: the pages are public; the API they call is not.
        let resp = http.get(s.url(path)).send().await?;
        assert_eq!(resp.status(), 200, "{path}");
        let headers = resp.headers().clone();
        assert!(headers["content-type"].to_str()?.starts_with(kind), "{path}: {headers:?}");
        assert!(headers["content-security-policy"].to_str()?.contains("default-src 'self'"), "{path}");
        assert!(!resp.text().await?.is_empty());
    }
    let resp = http.get(s.url("/ui/missing.js")).send().await?;
    assert_eq!(resp.status(), 404);
    let body: Value = resp.json().await?;
    assert!(body["error"]["message"].as_str().unwrap_or("").contains("/ui/missing.js"), "{body}");
    // A name that is not UTF-8 once decoded: a 400 in the API's shape.
    let resp = http.get(s.url("/ui/%ff")).send().await?;
    assert_eq!(resp.status(), 400);
    assert!(resp.json::<Value>().await?["error"]["message"].is_string());
    assert_eq!(http.get(s.url("/v1/models")).send().await?.status(), 401);
    Ok(())
}

#[tokio::test]
async fn stats_answer_totals_and_samples_after_since() -> Result<()> {
    let s = shared();
    let http = reqwest::Client::new();
    // The sampler takes one reading a second.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let all: Value = http.get(s.url("/stats")).send().await?.error_for_status()?.json().await?;
    assert_eq!(all["model"], "smol");
    assert_eq!(all["interval_s"], 1.0);
    assert!(all["totals"]["generation_tokens"].is_u64(), "{all}");
    let samples = all["samples"].as_array().context("samples")?;
    assert!(samples.len() >= 2, "{all}");
    let times: Vec<u64> = samples.iter().map(|p| p["t"].as_u64().unwrap()).collect();
    assert!(times.windows(2).all(|w| w[0] < w[1]), "{times:?}");
    let since = times[times.len() - 2];
    let later: Value = http.get(s.url(&format!("/stats?since={since}"))).send().await?.json().await?;
    let later_times: Vec<u64> =
        later["samples"].as_array().unwrap().iter().map(|p| p["t"].as_u64().unwrap()).collect();
    assert!(
        !later_times.is_empty() && later_times.iter().all(|&t| t > since),
        "{later_times:?} after {since}"
    );
    for bad in ["/stats?since=yesterday", "/stats?window=5"] {
        let resp = http.get(s.url(bad)).send().await?;
        assert_eq!(resp.status(), 400, "{bad}");
        let body: Value = resp.json().await?;
        assert!(body["error"]["param"].is_string(), "{body}");
    }
    Ok(())
}

#[tokio::test]
async fn disable_web_ui_leaves_the_pages_out_but_not_stats() -> Result<()> {
    let server = TestServer::start(&["--disable-web-ui", "--kv-cache-memory", "32MiB"]);
    let http = reqwest::Client::new();
    for path in ["/", "/dashboard", "/ui/playground.js"] {
        assert_eq!(http.get(server.url(path)).send().await?.status(), 404, "{path}");
    }
    assert_eq!(http.get(server.url("/stats")).send().await?.status(), 200);
    assert_eq!(http.get(server.url("/health")).send().await?.status(), 200);
    server.signal_stop();
    Ok(())
}

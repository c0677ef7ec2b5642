//! The official OpenAI Python SDK against the real server: tests/sdk/check_structured.py
//! (structured output: `chat.completions.parse` with pydantic models, `json_object` streamed,
//! `guided_choice`, `structured_outputs.regex`, completions with `guided_json`, an invalid
//! schema raising `BadRequestError`; tool calls: `required`, the SDK's stream helper
//! reassembling call deltas, `pydantic_function_tool` with `parsed_arguments`, a tool-result
//! turn; and, against a server with `--reasoning-parser`, `reasoning_content`), run with the
//! Python of the virtual environment that `make sdk-tools` (scripts/install-sdk-tools.sh)
//! installs. Its absence fails the test.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result};

use crate::harness::{shared, API_KEY};

/// How long the whole script may take against the shared server. Generous: other tests load the
/// same server (behind the structured-output tests' 104 requests, one SDK call waited 50 s).
const TIMEOUT: Duration = Duration::from_secs(600);
/// How long one SDK request may take (the script's `--timeout`; it does not retry).
const REQUEST_TIMEOUT_S: &str = "240";

/// The repository root (Cargo's run-time value first, as in `harness::model_path`).
pub(crate) fn repo_root() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from)
        .join("../..")
}

/// `$PAGODA_TOOLS_DIR/VENV/bin/python` (default `~/.cache/pagoda-tools/VENV/bin/python`), the
/// Python of a virtual environment that `make MAKE_TARGET` installs; its absence fails the test.
pub(crate) fn tools_python(venv: &str, make_target: &str) -> PathBuf {
    let tools = std::env::var_os("PAGODA_TOOLS_DIR").filter(|d| !d.is_empty()).map_or_else(
        || {
            let home = std::env::var_os("HOME").expect("HOME is unset: cannot find ~/.cache/pagoda-tools");
            PathBuf::from(home).join(".cache/pagoda-tools")
        },
        PathBuf::from,
    );
    let python = tools.join(venv).join("bin/python");
    assert!(python.exists(), "{} is missing: run `make {make_target}`", python.display());
    python
}

/// `python script`, unbuffered, without bytecode files, its output piped and killed when
/// dropped: how the e2e tests run their Python checks (add arguments, then `spawn`).
pub(crate) fn python_check(python: &std::path::Path, script: &std::path::Path) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(python);
    command
        .arg(script)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("PYTHONUNBUFFERED", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    command
}

/// Runs the SDK checks (`extra` arguments select a suite) against the server at `base_url`.
async fn run_checks(base_url: &str, extra: &[&str]) -> Result<()> {
    run_script("check_structured.py", base_url, extra).await
}

/// Runs tests/sdk/`name` against the server at `base_url`.
pub(crate) async fn run_script(name: &str, base_url: &str, extra: &[&str]) -> Result<()> {
    let python = tools_python("sdk", "sdk-tools");
    let script = repo_root().join("tests/sdk").join(name);
    assert!(script.exists(), "{} is missing", script.display());
    let child = python_check(&python, &script)
        .args(["--base-url", base_url, "--api-key", API_KEY])
        .args(["--model", "smol", "--timeout", REQUEST_TIMEOUT_S])
        .args(extra)
        .spawn()
        .with_context(|| format!("starting {}", python.display()))?;
    let output = match tokio::time::timeout(TIMEOUT, child.wait_with_output()).await {
        Ok(output) => output.context("waiting for the SDK checks")?,
        // Dropping the future drops the child, which kills it.
        Err(_) => panic!("{} did not finish within {TIMEOUT:?}", script.display()),
    };
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the OpenAI SDK checks failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        output.status
    );
    // Shown with --nocapture.
    print!("{stdout}");
    Ok(())
}

#[tokio::test]
async fn openai_python_sdk_structured_outputs_and_tools() -> Result<()> {
    run_checks(&shared().url("/v1"), &[]).await
}

/// Anthropic's SDK on `/v1/messages` and OpenAI's on `/v1/responses` (tests/sdk/check_agent_apis.py:
/// create and stream with the stream helpers, tool use under each choice with results, JSON
/// schema output, stored responses and `previous_response_id`, typed errors).
#[tokio::test]
async fn anthropic_and_openai_sdks_on_messages_and_responses() -> Result<()> {
    run_script("check_agent_apis.py", &shared().url(""), &["--suite", "all"]).await
}

/// Thinking blocks (Anthropic) and reasoning items (Responses) against the reasoning server.
#[tokio::test]
async fn anthropic_and_openai_sdks_show_reasoning() -> Result<()> {
    run_script("check_agent_apis.py", &crate::reasoning::server().url(""), &["--suite", "thinking"]).await
}

#[tokio::test]
async fn openai_python_sdk_reasoning_content() -> Result<()> {
    // The reasoning server takes no API key; the script sends one anyway.
    run_checks(&crate::reasoning::server().url("/v1"), &["--suite", "reasoning"]).await
}

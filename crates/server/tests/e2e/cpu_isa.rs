//! The server as an AVX2-only CPU runs it (`PAGODA_CPU_ISA=avx2`: AMD Zen 2/3, most cloud VMs),
//! on whatever box runs the tests: the kernel plan puts decode-sized steps on the int16 panels'
//! AVX2 kernel and says so, and the four golden prompts, sent at once so that their prefills and
//! decodes share steps, continue with the reference's greedy tokens.
//!
//! A child process, since the cap is read once per process.

use anyhow::Result;
use serde_json::{json, Value};

use crate::harness::{client, post_json};
use crate::shutdown::{pagoda_serve, spawn_ready};

/// A `pagoda serve` child under `PAGODA_CPU_ISA=isa`, killed when dropped (a failed assertion
/// included).
struct Server {
    child: std::process::Child,
    url: String,
    log: Option<std::thread::JoinHandle<Vec<String>>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    fn start(isa: &str) -> Result<Server> {
        let mut command = pagoda_serve(&["--served-model-name", "smol", "--max-model-len", "1024"]);
        command.args(["--kv-cache-memory", "96MiB"]).env("PAGODA_CPU_ISA", isa);
        let (child, addr, log) = spawn_ready(command)?;
        Ok(Server { child, url: format!("http://{addr}"), log: Some(log) })
    }

    /// The `kernel plan:` line of the start-up log (the whole log if it has none). Stops the
    /// server, whose log is complete only then.
    fn plan_line(&mut self) -> String {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let log = self.log.take().expect("read once").join().expect("the log reader");
        log.iter().find(|l| l.contains("kernel plan:")).cloned().unwrap_or_else(|| log.join("\n"))
    }
}

fn golden_cases() -> Vec<Value> {
    let path = std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")), std::path::PathBuf::from)
        .join("../../tests/fixtures/golden.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let fixture: Value = serde_json::from_str(&text).expect("valid JSON");
    fixture["logits_cases"].as_array().expect("logits cases").clone()
}

#[tokio::test(flavor = "multi_thread")]
async fn an_avx2_only_cpu_runs_int16_panels_and_keeps_the_golden_greedy_tokens() -> Result<()> {
    let mut server = Server::start("avx2")?;
    let c = client();
    let cases = golden_cases();
    let requests = cases.iter().map(|case| {
        let body = json!({
            "model": "smol", "prompt": case["prompt_ids"], "max_tokens": 16, "temperature": 0,
            "ignore_eos": true, "skip_special_tokens": false,
        });
        let (c, url) = (c.clone(), format!("{}/v1/completions", server.url));
        async move { post_json(&c, &url, &body).await }
    });
    for (case, result) in cases.iter().zip(futures_util::future::join_all(requests).await) {
        let name = case["name"].as_str().unwrap();
        let (status, out) = result?;
        assert_eq!(status, 200, "{name}: {out}");
        let text = out["choices"][0]["text"].as_str().unwrap();
        let greedy_text = case["greedy_text"].as_str().unwrap();
        assert!(!text.is_empty() && greedy_text.starts_with(text), "{name}: {text:?} vs {greedy_text:?}");
        assert_eq!(out["usage"]["completion_tokens"], 16, "{name}");
    }
    let plan = server.plan_line();
    assert!(plan.contains("decode-sized steps (up to 16 tokens) on int16 panels"), "{plan}");
    assert!(plan.contains("(avx2 instructions)"), "{plan}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_portable_only_cpu_keeps_the_exact_blocks_and_says_so() -> Result<()> {
    let mut server = Server::start("portable")?;
    let body =
        json!({"model": "smol", "prompt": "The capital of France is", "max_tokens": 4, "temperature": 0});
    let (status, out) = post_json(&client(), &format!("{}/v1/completions", server.url), &body).await?;
    assert_eq!(status, 200, "{out}");
    assert_eq!(out["usage"]["completion_tokens"], 4, "{out}");
    let plan = server.plan_line();
    assert!(plan.contains("decode-sized steps (up to 16 tokens) on exact f32 blocks"), "{plan}");
    assert!(plan.contains("(portable instructions)"), "{plan}");
    Ok(())
}

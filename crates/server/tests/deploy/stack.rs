//! The compose stack's topology on 127.0.0.1, from the repository's own files: two `pagoda serve`
//! processes (the binary this package builds) with configs/serve-cpu.toml, as the compose CPU
//! profile runs them; nginx with docker/nginx/pagoda.conf.template rendered by
//! docker/nginx/render-conf.sh, as the compose load balancer does; Prometheus with
//! configs/prometheus.yml, its service-discovery block swapped for the replicas' addresses.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use serde_json::Value;

use crate::processes::{find_tool, free_port, repo_root, wait_for, Process};

/// The model every replica serves; its absence fails the test (run `make model`).
pub const MODEL_FILE: &str = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
/// The name configs/serve-cpu.toml serves the model under.
pub const SERVED_MODEL: &str = "smollm2";

pub struct Replica {
    pub process: Process,
    /// `127.0.0.1:port`
    pub addr: String,
}

impl Replica {
    /// Starts `pagoda serve` on `port` as the compose CPU replicas run it, plus `extra` flags,
    /// with its log in `logs/<name>.log`.
    pub fn spawn(name: &str, logs: &Path, port: u16, extra: &[&str]) -> Result<Replica> {
        let root = repo_root();
        let model = root.join(MODEL_FILE);
        ensure!(model.exists(), "{} is missing: run `make model` first", model.display());
        let mut serve = Command::new(env!("CARGO_BIN_EXE_pagoda"));
        serve.current_dir(&root).args(["serve", "--config", "configs/serve-cpu.toml"]);
        // The compose CPU replicas override the model path and address the same way; a small
        // KV cache keeps two replicas light on a shared machine.
        serve.arg("--model").arg(&model);
        serve.args(["--host", "127.0.0.1", "--port", &port.to_string(), "--kv-cache-memory", "64MiB"]);
        serve.args(["--max-model-len", "1024"]);
        serve.args(["--shutdown-timeout", "1"]);
        serve.args(extra);
        let process = Process::spawn(name, serve, logs)?;
        Ok(Replica { process, addr: format!("127.0.0.1:{port}") })
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Waits until the replica answers `/ready`.
    pub async fn wait_ready(&mut self, http: &reqwest::Client) -> Result<()> {
        let url = self.url("/ready");
        let what = format!("{} /ready", self.process.name);
        wait_answering(&mut self.process, http, &url, &what, Duration::from_secs(180)).await
    }
}

/// Waits until `url` answers 2xx, failing at once if `process` (which serves it) exits.
async fn wait_answering(
    process: &mut Process,
    http: &reqwest::Client,
    url: &str,
    what: &str,
    timeout: Duration,
) -> Result<()> {
    wait_for(what, timeout, || {
        let running = process.ensure_running();
        let (http, url) = (http.clone(), url.to_owned());
        async move {
            running?;
            Ok(answers_ok(&http, &url).await)
        }
    })
    .await
}

pub struct Stack {
    pub replicas: Vec<Replica>,
    pub nginx: Process,
    pub prometheus: Process,
    pub lb_url: String,
    pub prometheus_url: String,
    // Dropped last: the processes above write into it until they stop.
    _dir: tempfile::TempDir,
}

impl Stack {
    /// Starts everything and waits until the replicas answer /health directly and through
    /// nginx, and Prometheus is ready.
    pub async fn start(num_replicas: usize) -> Result<Stack> {
        let root = repo_root();
        let nginx_bin = find_tool("nginx")?;
        let prometheus_bin = find_tool("prometheus")?;
        let dir = tempfile::Builder::new().prefix("pagoda-deploy-").tempdir()?;
        // nginx's workers drop root for `nobody`; they must reach their temp directories in here.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))?;
        let logs = dir.path();

        let mut replicas = Vec::new();
        for i in 0..num_replicas {
            replicas.push(Replica::spawn(&format!("pagoda-{i}"), logs, free_port()?, &[])?);
        }
        let addrs: Vec<String> = replicas.iter().map(|r| r.addr.clone()).collect();

        let lb_port = free_port()?;
        render_nginx_config(&root, logs, &addrs, lb_port)?;
        let mut nginx = Command::new(nginx_bin);
        // -e: nginx opens its error log before reading the config; keep it out of /var/log.
        nginx.arg("-e").arg(logs.join("nginx-error.log"));
        nginx.arg("-p").arg(logs).arg("-c").arg(logs.join("nginx.conf"));
        nginx.args(["-g", "daemon off;"]);

        let prometheus_port = free_port()?;
        let config = std::fs::read_to_string(root.join("configs/prometheus.yml"))?;
        std::fs::write(logs.join("prometheus.yml"), with_static_targets(&config, "pagoda", &addrs)?)?;
        let mut prometheus = Command::new(prometheus_bin);
        prometheus.arg(format!("--config.file={}", logs.join("prometheus.yml").display()));
        prometheus.arg(format!("--storage.tsdb.path={}", logs.join("tsdb").display()));
        prometheus.arg(format!("--web.listen-address=127.0.0.1:{prometheus_port}"));

        // nginx resolves its upstream addresses at start-up, before the replicas listen;
        // IP literals need no lookup, so it can start now.
        let nginx = Process::spawn("nginx", nginx, logs)?;
        let prometheus = Process::spawn("prometheus", prometheus, logs)?;
        let mut stack = Stack {
            replicas,
            nginx,
            prometheus,
            lb_url: format!("http://127.0.0.1:{lb_port}"),
            prometheus_url: format!("http://127.0.0.1:{prometheus_port}"),
            _dir: dir,
        };
        stack.wait_ready().await?;
        Ok(stack)
    }

    async fn wait_ready(&mut self) -> Result<()> {
        let http = reqwest::Client::builder().timeout(Duration::from_secs(5)).build()?;
        for replica in &mut self.replicas {
            replica.wait_ready(&http).await?;
        }
        let lb_health = format!("{}/health", self.lb_url);
        wait_answering(&mut self.nginx, &http, &lb_health, "nginx to proxy /health", Duration::from_secs(30))
            .await?;
        let ready = format!("{}/-/ready", self.prometheus_url);
        wait_answering(&mut self.prometheus, &http, &ready, "Prometheus to be ready", Duration::from_secs(60))
            .await
    }

    /// A PromQL instant query; the `data.result` vector.
    pub async fn query(&self, http: &reqwest::Client, promql: &str) -> Result<Vec<Value>> {
        let resp = http
            .get(format!("{}/api/v1/query", self.prometheus_url))
            .query(&[("query", promql)])
            .send()
            .await?;
        let status = resp.status();
        let body: Value = resp.json().await?;
        if !status.is_success() || body["status"] != "success" {
            bail!("Prometheus rejected {promql:?} ({status}): {body}");
        }
        body["data"]["result"].as_array().cloned().with_context(|| format!("no result vector: {body}"))
    }

    /// The values of `label` on the series `selector` selects (Grafana's `label_values`).
    pub async fn label_values(
        &self,
        http: &reqwest::Client,
        label: &str,
        selector: &str,
    ) -> Result<Vec<String>> {
        let url = format!("{}/api/v1/label/{label}/values", self.prometheus_url);
        let body: Value = http.get(url).query(&[("match[]", selector)]).send().await?.json().await?;
        ensure!(body["status"] == "success", "label values of {label} on {selector}: {body}");
        let values = body["data"].as_array().with_context(|| format!("no data: {body}"))?;
        Ok(values.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect())
    }

    /// Every process's log, for a failure message.
    pub fn logs(&self) -> String {
        let mut all: Vec<&Process> = self.replicas.iter().map(|r| &r.process).collect();
        all.extend([&self.nginx, &self.prometheus]);
        all.iter().map(|p| format!("--- {} ---\n{}\n", p.name, p.log_tail(30))).collect()
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("{}", self.logs());
        }
    }
}

/// `Ok` once `url` answers 2xx; the reason it does not otherwise.
pub async fn answers_ok(http: &reqwest::Client, url: &str) -> Result<(), String> {
    match http.get(url).send().await {
        Ok(r) if r.status().is_success() => Ok(()),
        Ok(r) => Err(format!("{url}: status {}", r.status())),
        Err(e) => Err(format!("{url}: {e}")),
    }
}

/// Renders the load balancer's config with the script and template the compose stack uses,
/// and wraps it in a minimal main config (pid file and temp paths in `dir`) like the
/// nginx image's own nginx.conf, which includes conf.d/*.conf inside `http`.
fn render_nginx_config(root: &Path, dir: &Path, upstreams: &[String], port: u16) -> Result<()> {
    let status = Command::new("sh")
        .arg(root.join("docker/nginx/render-conf.sh"))
        .arg(root.join("docker/nginx/pagoda.conf.template"))
        .arg(dir.join("pagoda.conf"))
        .env("PAGODA_UPSTREAMS", upstreams.join(" "))
        .env("PAGODA_LB_PORT", port.to_string())
        .status()?;
    ensure!(status.success(), "docker/nginx/render-conf.sh failed ({status})");
    let temp = |kind: &str| format!("{kind}_temp_path {};", dir.join(format!("temp-{kind}")).display());
    // Compression on for event streams, as a main config may have it: the snippet must still
    // deliver each event at once (with buffering and gzip together, nginx holds the whole
    // answer back until it ends).
    let main = format!(
        "# Test wrapper around the rendered docker/nginx/pagoda.conf.template.\n\
         worker_processes 2;\npid {pid};\nevents {{ worker_connections 256; }}\nhttp {{\n\
         \x20   {client} {proxy} {fastcgi} {uwsgi} {scgi}\n\
         \x20   gzip on; gzip_min_length 0; gzip_types text/event-stream;\n\
         \x20   include {conf};\n}}\n",
        pid = dir.join("nginx.pid").display(),
        client = temp("client_body"),
        proxy = temp("proxy"),
        fastcgi = temp("fastcgi"),
        uwsgi = temp("uwsgi"),
        scgi = temp("scgi"),
        conf = dir.join("pagoda.conf").display(),
    );
    std::fs::write(dir.join("nginx.conf"), main)?;
    Ok(())
}

/// `config` (Prometheus YAML) with the service discovery of job `job` (the first `*_sd_configs:`
/// block after `- job_name: <job>`) replaced by `static_configs` naming `targets`. The rest of
/// the file, scrape intervals included, stays as it is.
pub fn with_static_targets(config: &str, job: &str, targets: &[String]) -> Result<String> {
    let lines: Vec<&str> = config.lines().collect();
    let job_line = lines
        .iter()
        .position(|l| l.trim() == format!("- job_name: {job}"))
        .with_context(|| format!("no `- job_name: {job}` in the Prometheus config"))?;
    let sd = (job_line + 1..lines.len())
        .find(|&i| {
            let t = lines[i].trim();
            t.ends_with("_sd_configs:") && !t.starts_with('#')
        })
        .with_context(|| format!("job {job} has no *_sd_configs block"))?;
    let indent = lines[sd].len() - lines[sd].trim_start().len();
    // The block goes on while lines are blank or indented deeper than its key.
    let end = (sd + 1..lines.len())
        .find(|&i| {
            let l = lines[i];
            !l.trim().is_empty() && l.len() - l.trim_start().len() <= indent
        })
        .unwrap_or(lines.len());
    let pad = " ".repeat(indent);
    let quoted: Vec<String> = targets.iter().map(|t| format!("\"{t}\"")).collect();
    let mut out: Vec<String> = lines[..sd].iter().map(|l| l.to_string()).collect();
    out.push(format!("{pad}static_configs:"));
    out.push(format!("{pad}  - targets: [{}]", quoted.join(", ")));
    out.extend(lines[end..].iter().map(|l| l.to_string()));
    Ok(out.join("\n") + "\n")
}

#[test]
fn static_targets_replace_only_the_discovery_block() {
    let config = "global:\n  scrape_interval: 5s\nscrape_configs:\n  - job_name: pagoda\n    metrics_path: /metrics\n    \
                  dns_sd_configs:\n      - names: [replicas]\n        port: 8000\n\n  - job_name: other\n    \
                  dns_sd_configs:\n      - names: [x]\n";
    let out = with_static_targets(config, "pagoda", &["127.0.0.1:1".into(), "127.0.0.1:2".into()]).unwrap();
    assert_eq!(
        out,
        "global:\n  scrape_interval: 5s\nscrape_configs:\n  - job_name: pagoda\n    metrics_path: /metrics\n    \
         static_configs:\n      - targets: [\"127.0.0.1:1\", \"127.0.0.1:2\"]\n  - job_name: other\n    \
         dns_sd_configs:\n      - names: [x]\n"
    );
    assert!(with_static_targets(config, "missing", &[]).is_err());
}

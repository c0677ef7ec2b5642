//! Child processes of the stack test (the `pagoda` binary, nginx, Prometheus): started with their
//! output in a log file, stopped with SIGTERM (then SIGKILL) when dropped, so that a failing
//! test leaves nothing running; plus finding tools and free ports, and polling.

use std::fs::File;
use std::future::Future;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// The repository root.
pub fn repo_root() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")), std::path::PathBuf::from)
        .join("../..")
        .canonicalize()
        .expect("the repository root exists")
}

/// `name` from PATH or the sbin directories (nginx lives in /usr/sbin, outside a user's PATH).
pub fn find_tool(name: &str) -> Result<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/usr/bin", "/sbin"].map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
        .with_context(|| {
            format!("{name} is not installed: run `make deploy-tools` (scripts/install-deploy-tools.sh)")
        })
}

/// A port that was free a moment ago on 127.0.0.1.
pub fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// A running child process that is stopped when dropped.
pub struct Process {
    pub name: String,
    child: Child,
    log: PathBuf,
}

impl Process {
    /// Starts `command` with stdout and stderr appended to `<log_dir>/<name>.log`.
    pub fn spawn(name: &str, mut command: Command, log_dir: &Path) -> Result<Process> {
        let log = log_dir.join(format!("{name}.log"));
        let out = File::create(&log)?;
        command.stdin(Stdio::null()).stdout(out.try_clone()?).stderr(out);
        let child = command.spawn().with_context(|| format!("starting {name}: {command:?}"))?;
        Ok(Process { name: name.to_owned(), child, log })
    }

    /// An error with the log's tail if the process has exited.
    pub fn ensure_running(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!("{} exited ({status}); its log ends:\n{}", self.name, self.log_tail(40));
        }
        Ok(())
    }

    /// SIGKILL, as a crash or the OOM killer would end it; waits for the exit.
    pub fn kill_hard(&mut self) -> Result<()> {
        self.child.kill()?;
        self.child.wait()?;
        Ok(())
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn log_tail(&self, lines: usize) -> String {
        let text = self.log_text();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(Some(_))) {
            return;
        }
        // SIGTERM first: nginx's master then stops its workers, and pagoda drains and exits.
        let _ = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Polls `check` every 200 ms until it returns `Ok(Ok(value))`. `Ok(Err(reason))` means "not
/// yet" and is retried until `timeout` (then the last reason is the error); `Err` fails at once
/// (a process that died, a query Prometheus rejects).
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Result<T, String>>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        let reason = match check().await.with_context(|| format!("waiting for {what}"))? {
            Ok(value) => return Ok(value),
            Err(reason) => reason,
        };
        if Instant::now() >= deadline {
            bail!("timed out after {timeout:?} waiting for {what}: {reason}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

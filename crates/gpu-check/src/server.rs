//! The server check: start the release `pagoda` binary on 127.0.0.1 (port 0), wait for its
//! "ready on http://..." log line, and speak HTTP to it like any OpenAI client.

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Value};

/// The listening address in the server's "ready on http://ADDR" log line.
pub fn ready_addr(line: &str) -> Option<SocketAddr> {
    let rest = &line[line.find("ready on http://")? + "ready on http://".len()..];
    let end = rest.find(|c: char| c.is_whitespace() || c == '"').unwrap_or(rest.len());
    rest[..end].parse().ok()
}

/// A running `pagoda serve`; killed when dropped. Its stderr (the log) goes to a file.
pub struct ServerProcess {
    child: Child,
    pub addr: SocketAddr,
    pub startup_seconds: f64,
}

impl ServerProcess {
    /// Starts `binary serve ARGS --host 127.0.0.1 --port 0`, logging to `log`, and waits up to
    /// `timeout` for it to listen.
    pub fn start(binary: &Path, args: &[String], log: &Path, timeout: Duration) -> Result<Self> {
        let started = Instant::now();
        let mut child = Command::new(binary)
            .arg("serve")
            .args(args)
            .args(["--host", "127.0.0.1", "--port", "0"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        let stderr = child.stderr.take().expect("stderr is piped");
        let mut log_file =
            std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
        let (tx, rx) = mpsc::channel();
        // Keeps draining the log for the server's whole life, so it never blocks on a full pipe.
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(|l| l.ok()) {
                let _ = writeln!(log_file, "{line}");
                if let Some(addr) = ready_addr(&line) {
                    let _ = tx.send(addr);
                }
            }
        });
        let mut server =
            ServerProcess { child, addr: SocketAddr::from(([127, 0, 0, 1], 0)), startup_seconds: 0.0 };
        loop {
            match rx.recv_timeout(Duration::from_millis(200)) {
                Ok(addr) => {
                    server.addr = addr;
                    server.startup_seconds = started.elapsed().as_secs_f64();
                    return Ok(server);
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    if let Some(status) = server.child.try_wait()? {
                        bail!("the server exited during start-up ({status}); see {}", log.display());
                    }
                    if started.elapsed() > timeout {
                        bail!("the server did not listen within {timeout:?}; see {}", log.display());
                    }
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let status = server.child.wait()?;
                    bail!("the server closed its log ({status}); see {}", log.display());
                }
            }
        }
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One non-streaming chat completion's answer.
#[derive(Debug, Clone)]
pub struct ChatReply {
    pub content: String,
    pub completion_tokens: u64,
    pub finish_reason: String,
    pub seconds: f64,
}

/// Sends `prompt` as a greedy chat request of at most `max_tokens` tokens.
pub fn chat(addr: SocketAddr, model: &str, prompt: &str, max_tokens: u32) -> Result<ChatReply> {
    let agent = ureq::AgentBuilder::new().timeout(Duration::from_secs(120)).build();
    let body = json!({
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
    });
    let started = Instant::now();
    let reply: Value = match agent.post(&format!("http://{addr}/v1/chat/completions")).send_json(body) {
        Ok(r) => r.into_json()?,
        Err(ureq::Error::Status(code, r)) => {
            bail!("HTTP {code}: {}", r.into_string().unwrap_or_default())
        }
        Err(e) => return Err(e.into()),
    };
    let seconds = started.elapsed().as_secs_f64();
    let choice = &reply["choices"][0];
    let content =
        choice["message"]["content"].as_str().ok_or_else(|| anyhow!("no message content in {reply}"))?;
    Ok(ChatReply {
        content: content.to_string(),
        completion_tokens: reply["usage"]["completion_tokens"].as_u64().unwrap_or(0),
        finish_reason: choice["finish_reason"].as_str().unwrap_or_default().to_string(),
        seconds,
    })
}

/// Seconds one `/v1/completions` call of `n` samples of `max_tokens` tokens takes; checks that
/// it answers 200 with `n` choices.
pub fn completions_seconds(
    addr: SocketAddr,
    model: &str,
    prompt: &str,
    n: usize,
    max_tokens: u32,
) -> Result<f64> {
    let agent = ureq::AgentBuilder::new().timeout(Duration::from_secs(120)).build();
    let body =
        json!({"model": model, "prompt": prompt, "n": n, "max_tokens": max_tokens, "ignore_eos": true});
    let started = Instant::now();
    let reply: Value = match agent.post(&format!("http://{addr}/v1/completions")).send_json(body) {
        Ok(r) => r.into_json()?,
        Err(ureq::Error::Status(code, r)) => {
            bail!("HTTP {code}: {}", r.into_string().unwrap_or_default())
        }
        Err(e) => return Err(e.into()),
    };
    let seconds = started.elapsed().as_secs_f64();
    let choices = reply["choices"].as_array().map_or(0, Vec::len);
    if choices != n {
        bail!("{choices} choices for n: {n} in {reply}");
    }
    Ok(seconds)
}

/// What a fork costs (issue 63: it once cost a copy of the whole KV cache per sample): the
/// median seconds of three `/v1/completions` calls of `n: 1` and of `n: 64`, two tokens each,
/// after one of each to warm up. Every call has a prompt of its own, so none is served from the
/// prefix cache.
pub fn fork_cost(addr: SocketAddr, model: &str) -> Result<(f64, f64)> {
    let mut calls = 0;
    let mut timed = |n: usize| {
        calls += 1;
        let prompt =
            format!("Note {calls}: {}", "the river runs past the old mill and on to the sea. ".repeat(8));
        completions_seconds(addr, model, &prompt, n, 2).with_context(|| format!("n: {n}"))
    };
    timed(1)?;
    timed(64)?;
    let (mut one, mut many) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        one.push(timed(1)?);
        many.push(timed(64)?);
    }
    one.sort_by(f64::total_cmp);
    many.sort_by(f64::total_cmp);
    Ok((one[1], many[1]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::net::TcpListener;

    #[test]
    fn finds_the_address_in_the_ready_line() {
        let line = "2026-11-22T07:00:00.000Z  INFO pagoda_server::server: ready on http://127.0.0.1:41234 seconds=\"2.01\"";
        assert_eq!(ready_addr(line), Some("127.0.0.1:41234".parse().unwrap()));
        assert_eq!(ready_addr("ready on http://[::1]:80"), Some("[::1]:80".parse().unwrap()));
        assert_eq!(ready_addr("INFO loading the model"), None);
    }

    #[test]
    fn completions_seconds_counts_the_choices() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            for choices in [2, 1] {
                let (mut stream, _) = listener.accept().unwrap();
                let mut request = Vec::new();
                let mut buf = [0u8; 4096];
                while !String::from_utf8_lossy(&request).contains("\"prompt\"") {
                    let n = stream.read(&mut buf).unwrap();
                    request.extend_from_slice(&buf[..n]);
                }
                let body = format!(r#"{{"choices":[{}]}}"#, vec![r#"{"text":"x"}"#; choices].join(","));
                write!(
                    stream,
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                )
                .unwrap();
            }
        });
        assert!(completions_seconds(addr, "smol", "Hi", 2, 2).unwrap() >= 0.0);
        let short = completions_seconds(addr, "smol", "Hi", 2, 2).unwrap_err();
        assert!(format!("{short:#}").contains("1 choices for n: 2"), "{short:#}");
        server.join().unwrap();
    }

    #[test]
    fn chat_reads_an_openai_reply_over_http() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            let mut request = Vec::new();
            let mut buf = [0u8; 4096];
            // Read the headers and the JSON body (small: one read after the headers suffices).
            while !String::from_utf8_lossy(&request).contains("\"temperature\"") {
                let n = stream.read(&mut buf).unwrap();
                request.extend_from_slice(&buf[..n]);
            }
            let body = r#"{"choices":[{"message":{"role":"assistant","content":"Paris."},"finish_reason":"stop"}],"usage":{"completion_tokens":3}}"#;
            write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )
            .unwrap();
            String::from_utf8(request).unwrap()
        });
        let reply = chat(addr, "smol", "Capital of France?", 8).unwrap();
        assert_eq!(
            (reply.content.as_str(), reply.completion_tokens, reply.finish_reason.as_str()),
            ("Paris.", 3, "stop")
        );
        let request = server.join().unwrap();
        assert!(request.starts_with("POST /v1/chat/completions HTTP/1.1"));
        assert!(request.contains("\"max_tokens\":8"));
    }
}

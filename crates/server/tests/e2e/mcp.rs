//! Remote MCP tools of the Responses API against real MCP servers: tests/sdk/mcp_server.py (the
//! `mcp` package's MCPServer, FastMCP's successor, over streamable HTTP on 127.0.0.1, with tools
//! `add` and `echo`, wanting an `X-Mcp-Key` header) and a server here that accepts connections
//! and never answers. A `pagoda serve` of its own allows both (`--allow-mcp-servers`, with a
//! 3 s `--mcp-timeout`); tests/sdk/check_mcp.py drives it through the OpenAI Python SDK
//! (listing, calls with the tools' real output, approval, a disallowed `server_url`, the
//! hanging server, the stream's events, a background response). Raw HTTP checks the refusals'
//! error shape, that refused requests never reach an MCP server, and that a server answering
//! garbage or redirecting (redirects are not followed) ends its listing with an error item.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

use crate::harness::{assert_error_shape, client, post_json, TestServer, API_KEY};
use crate::sdk::{python_check, repo_root, tools_python};

const MCP_TIMEOUT_S: &str = "3";
const MCP_KEY: &str = "pagoda-test-key";

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    listener.local_addr().expect("local addr").port()
}

/// A server that accepts connections and never answers; counts the connections it took.
async fn hanging_server() -> Result<(u16, Arc<AtomicUsize>)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&accepted);
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            held.push(socket);
        }
    });
    Ok((port, accepted))
}

/// A server that answers every request by its path: `/garbage` with a 200 whose JSON is broken,
/// `/redirect` with a 307 to `redirect_to` (a real MCP server: following it would work).
async fn canned_server(redirect_to: String) -> Result<u16> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            let redirect_to = redirect_to.clone();
            tokio::spawn(async move {
                let mut reader = BufReader::new(socket);
                let mut head = Vec::new();
                let mut length = 0usize;
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).await.unwrap_or(0) == 0 {
                        return;
                    }
                    if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                        length = v.trim().parse().unwrap_or(0);
                    }
                    if line == "\r\n" {
                        break;
                    }
                    head.push(line);
                }
                let mut body = vec![0; length];
                if reader.read_exact(&mut body).await.is_err() {
                    return;
                }
                let answer = if head.first().is_some_and(|l| l.contains("/redirect")) {
                    format!(
                        "HTTP/1.1 307 Temporary Redirect\r\nLocation: {redirect_to}\r\n\
                         Content-Length: 0\r\nConnection: close\r\n\r\n"
                    )
                } else {
                    let junk = "{\"jsonrpc\": \"2.0\", \"id\": 0, \"result\": {\"protocolVers";
                    format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
                         Connection: close\r\n\r\n{junk}",
                        junk.len()
                    )
                };
                let _ = reader.get_mut().write_all(answer.as_bytes()).await;
            });
        }
    });
    Ok(port)
}

/// Starts tests/sdk/mcp_server.py on `port`, waiting for its `ready` line.
async fn mcp_server(port: u16) -> Result<tokio::process::Child> {
    let python = tools_python("sdk", "sdk-tools");
    let script = repo_root().join("tests/sdk/mcp_server.py");
    let mut child = python_check(&python, &script)
        .args(["--port", &port.to_string(), "--key", MCP_KEY])
        .spawn()
        .context("starting tests/sdk/mcp_server.py")?;
    let stdout = child.stdout.take().context("its stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let ready = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await? {
            if line.trim() == "ready" {
                return Ok::<bool, std::io::Error>(true);
            }
        }
        Ok(false)
    })
    .await;
    assert!(matches!(ready, Ok(Ok(true))), "tests/sdk/mcp_server.py did not start: {ready:?}");
    Ok(child)
}

#[tokio::test]
async fn mcp_tools_are_listed_called_approved_and_bounded() -> Result<()> {
    let mcp_port = free_port();
    let _mcp = mcp_server(mcp_port).await?;
    let (hang_port, hang_accepted) = hanging_server().await?;
    let mcp_url = format!("http://127.0.0.1:{mcp_port}/mcp");
    let hang_url = format!("http://127.0.0.1:{hang_port}/mcp");
    let disallowed = format!("http://127.0.0.1:{}/mcp", free_port());
    let canned_port = canned_server(mcp_url.clone()).await?;
    let server = TestServer::start(&[
        "--api-key",
        API_KEY,
        "--allow-mcp-servers",
        &mcp_url,
        &format!("http://127.0.0.1:{hang_port}/"),
        &format!("http://127.0.0.1:{canned_port}/"),
        "--mcp-timeout",
        MCP_TIMEOUT_S,
    ]);

    // Refusals come before any MCP traffic, in OpenAI's error shape.
    let c = client();
    let url = server.url("/v1/responses");
    let tool = |server_url: &str| json!({"type": "mcp", "server_label": "t", "server_url": server_url});
    for (tool, param) in [
        (tool(&disallowed), "tools[0].server_url"),
        (tool(&format!("http://127.0.0.1:{hang_port}@evil.example/mcp")), "tools[0].server_url"),
        (json!({"type": "mcp", "server_url": mcp_url}), "tools[0].server_label"),
        (
            json!({"type": "mcp", "server_label": "t", "server_url": mcp_url, "require_approval": 3}),
            "tools[0].require_approval",
        ),
    ] {
        let body = json!({"model": "smol", "input": "hi", "tools": [tool]});
        let (status, e) = post_json(&c, &url, &body).await?;
        assert_eq!(status, 400, "{e}");
        assert_eq!(assert_error_shape(&e)["param"], param, "{e}");
    }
    assert_eq!(hang_accepted.load(Ordering::SeqCst), 0, "a refused request reached an MCP server");

    // A server answering garbage, and one redirecting to a real MCP server (not followed): the
    // listing fails with an error item, and the response still completes.
    for path in ["garbage", "redirect"] {
        let odd = format!("http://127.0.0.1:{canned_port}/{path}");
        let tool = json!({"type": "mcp", "server_label": "odd", "server_url": odd,
                          "headers": {"X-Mcp-Key": MCP_KEY}, "require_approval": "never"});
        let body = json!({"model": "smol", "input": "hi", "max_output_tokens": 3, "tools": [tool]});
        let (status, r) = post_json(&c, &url, &body).await?;
        assert_eq!(status, 200, "{path}: {r}");
        let listing = &r["output"][0];
        assert_eq!(listing["type"], "mcp_list_tools", "{path}: {r}");
        assert!(listing["error"].as_str().is_some_and(|e| !e.is_empty()), "{path}: {r}");
        assert_eq!(listing["tools"], json!([]), "{path}: {r}");
        assert!(matches!(r["status"].as_str(), Some("completed" | "incomplete")), "{path}: {r}");
    }

    let timeout = MCP_TIMEOUT_S.to_owned();
    crate::sdk::run_script(
        "check_mcp.py",
        &server.url(""),
        &[
            "--mcp-url",
            &mcp_url,
            "--mcp-key",
            MCP_KEY,
            "--hang-url",
            &hang_url,
            "--mcp-timeout",
            &timeout,
            "--disallowed-url",
            &disallowed,
        ],
    )
    .await?;
    assert!(hang_accepted.load(Ordering::SeqCst) > 0, "the hanging server was never asked");
    Ok(())
}

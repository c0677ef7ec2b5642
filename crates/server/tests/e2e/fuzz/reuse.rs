//! A raw HTTP/1.1 check that a pooling client cannot make deterministic: after a response that
//! does not say `connection: close`, the same connection must serve the next request. A server
//! that closes it silently makes the next request of a client (or of a proxy such as nginx with
//! upstream keep-alive) fail whenever the close and that request cross.

use std::io;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use super::gen::Case;

/// How long after the request head the body follows.
const BODY_DELAY: Duration = Duration::from_millis(10);

/// The parts of a response head the check needs.
struct Head {
    status: u16,
    /// The server said it closes the connection (or delimited the body by closing it).
    close: bool,
}

/// The request head of `case`.
fn request_head(host: &str, case: &Case) -> String {
    let mut head = format!(
        "{} {} HTTP/1.1\r\nhost: {host}\r\ncontent-length: {}\r\n",
        case.method,
        case.path,
        case.body.len()
    );
    if let Some(ct) = &case.content_type {
        head.push_str(&format!("content-type: {ct}\r\n"));
    }
    if let Some(auth) = &case.auth {
        head.push_str(&format!("authorization: {auth}\r\n"));
    }
    for (name, value) in &case.headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    head
}

async fn read_line(conn: &mut BufReader<TcpStream>) -> io::Result<String> {
    let mut line = Vec::new();
    if conn.read_until(b'\n', &mut line).await? == 0 {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the connection closed"));
    }
    Ok(String::from_utf8_lossy(&line).trim_end().to_owned())
}

fn bad(why: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why)
}

/// Reads one response, its body included.
async fn read_response(conn: &mut BufReader<TcpStream>, no_body: bool) -> io::Result<Head> {
    let status_line = read_line(conn).await?;
    let status: u16 = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad(format!("bad status line {status_line:?}")))?;
    let (mut length, mut chunked, mut close) = (None, false, false);
    loop {
        let line = read_line(conn).await?;
        if line.is_empty() {
            break;
        }
        let Some((name, value)) = line.split_once(':') else {
            return Err(bad(format!("bad header {line:?}")));
        };
        let value = value.trim().to_ascii_lowercase();
        match name.to_ascii_lowercase().as_str() {
            "content-length" => length = Some(value.parse::<usize>().map_err(|e| bad(e.to_string()))?),
            "transfer-encoding" => chunked = value.contains("chunked"),
            "connection" => close = value.contains("close"),
            _ => {}
        }
    }
    if no_body || status == 204 || status == 304 {
        return Ok(Head { status, close });
    }
    if chunked {
        loop {
            let size_line = read_line(conn).await?;
            let hex = size_line.split(';').next().unwrap_or_default().trim();
            let size =
                usize::from_str_radix(hex, 16).map_err(|_| bad(format!("bad chunk size {size_line:?}")))?;
            if size == 0 {
                while !read_line(conn).await?.is_empty() {}
                break;
            }
            let mut chunk = vec![0; size + 2];
            conn.read_exact(&mut chunk).await?;
        }
    } else if let Some(length) = length {
        let mut body = vec![0; length];
        conn.read_exact(&mut body).await?;
    } else {
        conn.read_to_end(&mut Vec::new()).await?;
        close = true;
    }
    Ok(Head { status, close })
}

/// Sends `case` on a fresh connection, then `GET /health` on the same connection unless the
/// server announced it closes it.
pub async fn connection_survives(addr: &str, case: &Case) -> Result<(), String> {
    let probe = async {
        let mut conn = BufReader::new(TcpStream::connect(addr).await.map_err(|e| format!("connect: {e}"))?);
        // The body a moment after the head, as clients send it: a server that answers from the
        // head alone has not read it yet.
        let sent = async {
            conn.get_mut().write_all(request_head(addr, case).as_bytes()).await?;
            tokio::time::sleep(BODY_DELAY).await;
            conn.get_mut().write_all(&case.body).await
        };
        sent.await.map_err(|e| format!("sending the case: {e}"))?;
        let first = read_response(&mut conn, case.method == "HEAD")
            .await
            .map_err(|e| format!("reading the reply: {e}"))?;
        if first.close {
            return Ok(());
        }
        let lost = |e: io::Error| {
            format!(
                "the connection did not survive a {} without `connection: close`: the next request on it \
                 failed ({e})",
                first.status
            )
        };
        let next = format!("GET /health HTTP/1.1\r\nhost: {addr}\r\n\r\n");
        conn.get_mut().write_all(next.as_bytes()).await.map_err(lost)?;
        let second = read_response(&mut conn, false).await.map_err(lost)?;
        match second.status {
            200 => Ok(()),
            s => Err(format!("GET /health on the reused connection got {s}")),
        }
    };
    tokio::time::timeout(Duration::from_secs(60), probe)
        .await
        .unwrap_or_else(|_| Err("the probe timed out".into()))
}

//! Image fetches against a small HTTP server on 127.0.0.1: redirects inside and outside the
//! allowed hosts, redirect loops, size limits with and without `Content-Length`, timeouts.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::*;
use crate::media::policy::MediaSettings;

/// Serves canned answers by path until the runtime ends; returns its port.
async fn serve() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let Ok((mut conn, _)) = listener.accept().await else { return };
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match conn.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&head);
                let path = head.split_whitespace().nth(1).unwrap_or("/").to_owned();
                let redirect =
                    |to: &str| format!("HTTP/1.1 302 Found\r\nLocation: {to}\r\nContent-Length: 0\r\n\r\n");
                let answer = match path.as_str() {
                    "/ok" => "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello".to_owned(),
                    "/to-ok" => redirect("/ok"),
                    "/to-localhost" => redirect(&format!("http://localhost:{port}/ok")),
                    "/to-ftp" => redirect("ftp://127.0.0.1/ok"),
                    "/loop" => redirect("/loop"),
                    "/declared-big" => "HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n".to_owned(),
                    "/chunked-big" => {
                        let chunk = format!("{:x}\r\n{}\r\n", 600, "x".repeat(600));
                        format!(
                            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n{}0\r\n\r\n",
                            chunk.repeat(4)
                        )
                    }
                    "/slow" => {
                        tokio::time::sleep(Duration::from_secs(5)).await;
                        "HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nx".to_owned()
                    }
                    "/empty" => "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n".to_owned(),
                    _ => "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n".to_owned(),
                };
                let _ = conn.write_all(answer.as_bytes()).await;
                let _ = conn.shutdown().await;
            });
        }
    });
    port
}

fn policy() -> MediaPolicy {
    let mut policy = MediaPolicy::new(MediaSettings {
        allowed_domains: vec!["127.0.0.1".into()],
        fetch_timeout: Duration::from_millis(700),
        ..MediaSettings::default()
    });
    policy.limits.max_bytes = 1000;
    policy
}

#[tokio::test]
async fn fetches_follow_only_allowed_redirects_within_limits() {
    let port = serve().await;
    let fetcher = Fetcher::new().unwrap();
    let policy = policy();
    let get = |path: &str| {
        let url = reqwest::Url::parse(&format!("http://127.0.0.1:{port}{path}")).unwrap();
        let (fetcher, policy) = (fetcher.clone(), policy.clone());
        async move { fetcher.fetch(url, &policy).await }
    };
    assert_eq!(get("/ok").await, Ok(b"hello".to_vec()));
    assert_eq!(get("/to-ok").await, Ok(b"hello".to_vec()));
    assert_eq!(get("/to-localhost").await, Err(MediaRefusal::RedirectNotAllowed("localhost".into())));
    assert_eq!(get("/to-ftp").await, Err(MediaRefusal::RedirectNotAllowed("127.0.0.1".into())));
    assert_eq!(get("/loop").await, Err(MediaRefusal::TooManyRedirects(MAX_REDIRECTS)));
    assert_eq!(
        get("/declared-big").await,
        Err(MediaError::TooManyBytes { size: 1_000_000, limit: 1000 }.into())
    );
    assert!(matches!(get("/chunked-big").await, Err(MediaRefusal::Media(MediaError::TooManyBytes { .. }))));
    assert_eq!(get("/empty").await, Err(MediaError::Empty.into()));
    assert!(matches!(get("/missing").await, Err(MediaRefusal::Fetch(m)) if m.contains("404")));
    assert!(matches!(get("/slow").await, Err(MediaRefusal::Fetch(m)) if m.contains("timed out")));
    // A host not listed is refused before any connection.
    let other = reqwest::Url::parse(&format!("http://localhost:{port}/ok")).unwrap();
    assert_eq!(fetcher.fetch(other, &policy).await, Err(MediaRefusal::HostNotAllowed("localhost".into())));
    let off = MediaPolicy::new(MediaSettings::default());
    let url = reqwest::Url::parse(&format!("http://127.0.0.1:{port}/ok")).unwrap();
    assert_eq!(fetcher.fetch(url, &off).await, Err(MediaRefusal::RemoteOff));
}

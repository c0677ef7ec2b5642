//! `http_requests_total` stays a bounded set of series whatever clients send: unknown methods
//! count as `other`, unknown paths as `unmatched`.

use std::collections::BTreeSet;

use anyhow::Result;
use reqwest::Method;

use crate::harness::{metrics_text, TestServer};

const STANDARD_METHODS: &[&str] =
    &["GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"];

/// Every `http_requests_total` series in /metrics text, as its label set.
fn http_series(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("http_requests_total{"))
        .filter_map(|l| l.split_once('}').map(|(labels, _)| labels.to_owned()))
        .collect()
}

fn label<'a>(labels: &'a str, name: &str) -> Option<&'a str> {
    labels.split(',').find_map(|kv| kv.strip_prefix(&format!("{name}=\"")).and_then(|v| v.strip_suffix('"')))
}

/// `n` requests with made-up methods and paths, and some with made-up paths only.
async fn random_requests(c: &reqwest::Client, server: &TestServer, n: usize) -> Result<()> {
    for i in 0..n {
        let token = uuid::Uuid::new_v4().simple().to_string().to_uppercase();
        let method = Method::from_bytes(format!("X{}", &token[..12]).as_bytes())?;
        let path = if i % 3 == 0 { "/health".to_owned() } else { format!("/nope/{token}") };
        let status = c.request(method, server.url(&path)).send().await?.status();
        assert!(status.is_client_error(), "{status}");
        let status = c.get(server.url(&format!("/{token}"))).send().await?.status();
        assert_eq!(status, 404);
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_methods_and_paths_leave_the_http_series_bounded() -> Result<()> {
    let server = TestServer::start(&[]);
    let c = reqwest::Client::new();
    random_requests(&c, &server, 60).await?;
    let first = http_series(&metrics_text(&c, &server).await?);
    random_requests(&c, &server, 200).await?;
    let text = metrics_text(&c, &server).await?;
    let second = http_series(&text);
    for labels in &second {
        let method = label(labels, "method").unwrap_or_default();
        assert!(
            method == "other" || STANDARD_METHODS.contains(&method),
            "method label {method:?} in {labels}"
        );
        let handler = label(labels, "handler").unwrap_or_default();
        assert!(handler == "unmatched" || handler.starts_with('/'), "handler label {handler:?}");
        assert!(!handler.contains("/nope/"), "a raw path became a label: {labels}");
    }
    // Only /metrics' own series may have appeared since the first scrape.
    let new: Vec<_> = second.difference(&first).filter(|l| !l.contains("handler=\"/metrics\"")).collect();
    assert!(new.is_empty(), "new series after more random requests: {new:?}");
    assert!(second.len() <= 8, "{} series:\n{text}", second.len());
    Ok(())
}

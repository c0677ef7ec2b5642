//! `http(s)://` image URLs, fetched only from the hosts `--allowed-media-domains` lists (as
//! vLLM): redirects are followed by hand, each hop's host checked against the list, at most
//! [`MAX_REDIRECTS`] of them; the whole fetch runs under `--media-fetch-timeout`, and the body
//! is read in chunks and refused as soon as it passes the byte limit (a `Content-Length` over it
//! is refused before any byte is read). Proxies from the environment are not used.

use std::time::Duration;

use futures_util::StreamExt;
use pagoda_media::{MediaError, MediaLimits};

use super::error::MediaRefusal;
use super::policy::MediaPolicy;

/// Redirects followed before giving up (a browser follows 20; an image needs few).
pub const MAX_REDIRECTS: usize = 5;

/// The HTTP client of image fetches: no automatic redirects, no proxy, plain and TLS.
#[derive(Debug, Clone)]
pub struct Fetcher {
    client: reqwest::Client,
}

impl Fetcher {
    pub fn new() -> Result<Self, String> {
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            // No idle connections kept: a server that closes one without saying so would fail
            // the next fetch on it, and images are fetched too rarely for reuse to matter.
            .pool_max_idle_per_host(0)
            .user_agent(concat!("pagoda/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| format!("cannot build the image-fetch HTTP client: {e}"))?;
        Ok(Self { client })
    }

    /// The bytes at `url`, under `policy`'s host list, limits and timeout.
    pub async fn fetch(&self, url: reqwest::Url, policy: &MediaPolicy) -> Result<Vec<u8>, MediaRefusal> {
        if policy.settings.allowed_domains.is_empty() {
            return Err(MediaRefusal::RemoteOff);
        }
        let host = url.host_str().unwrap_or_default().to_owned();
        if !policy.host_allowed(&host) {
            return Err(MediaRefusal::HostNotAllowed(host));
        }
        let timeout = policy.settings.fetch_timeout;
        match tokio::time::timeout(timeout, self.follow(url, policy)).await {
            Ok(result) => result,
            Err(_) => Err(MediaRefusal::Fetch(format!("timed out after {}", seconds(timeout)))),
        }
    }

    async fn follow(&self, mut url: reqwest::Url, policy: &MediaPolicy) -> Result<Vec<u8>, MediaRefusal> {
        for _ in 0..=MAX_REDIRECTS {
            let response = self
                .client
                .get(url.clone())
                .send()
                .await
                .map_err(|e| MediaRefusal::Fetch(without_url(&e)))?;
            let status = response.status();
            if status.is_redirection() {
                let location = response
                    .headers()
                    .get(reqwest::header::LOCATION)
                    .and_then(|v| v.to_str().ok())
                    .ok_or_else(|| MediaRefusal::Fetch(format!("HTTP {status} without a Location")))?;
                let next = url
                    .join(location)
                    .map_err(|e| MediaRefusal::Fetch(format!("redirect to an invalid URL: {e}")))?;
                let host = next.host_str().unwrap_or_default();
                if !matches!(next.scheme(), "http" | "https") || !policy.host_allowed(host) {
                    let shown = if host.is_empty() { next.scheme().to_owned() } else { host.to_owned() };
                    return Err(MediaRefusal::RedirectNotAllowed(shown));
                }
                url = next;
                continue;
            }
            if !status.is_success() {
                return Err(MediaRefusal::Fetch(format!("the server answered HTTP {status}")));
            }
            return read_limited(response, &policy.limits).await;
        }
        Err(MediaRefusal::TooManyRedirects(MAX_REDIRECTS))
    }
}

/// The body, refused once it passes `limits.max_bytes`.
async fn read_limited(response: reqwest::Response, limits: &MediaLimits) -> Result<Vec<u8>, MediaRefusal> {
    if let Some(len) = response.content_length() {
        limits.check_bytes(len)?;
    }
    let mut bytes = Vec::new();
    let mut body = response.bytes_stream();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| MediaRefusal::Fetch(without_url(&e)))?;
        let size = (bytes.len() + chunk.len()) as u64;
        if size > limits.max_bytes {
            return Err(MediaError::TooManyBytes { size, limit: limits.max_bytes }.into());
        }
        bytes.extend_from_slice(&chunk);
    }
    limits.check_bytes(bytes.len() as u64)?;
    Ok(bytes)
}

/// reqwest's error without the URL (the client sent it; a redirect's target it need not see
/// repeated), with its cause.
fn without_url(e: &reqwest::Error) -> String {
    let mut text = if e.is_timeout() {
        "timed out".to_owned()
    } else if e.is_connect() {
        "cannot connect".to_owned()
    } else {
        "the request failed".to_owned()
    };
    if let Some(source) = std::error::Error::source(e) {
        text.push_str(&format!(": {source}"));
    }
    text
}

fn seconds(d: Duration) -> String {
    format!("{} s", d.as_secs_f64())
}

#[cfg(test)]
#[path = "fetch_tests.rs"]
mod tests;

//! API-key authentication: `Authorization: Bearer <key>`, or `x-api-key: <key>` as Anthropic's
//! clients send it, compared in constant time.
//!
//! Both the expected key and the presented one are hashed (SHA-256) first, so the comparison
//! takes the same time whatever the presented key's length or content.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header::AUTHORIZATION;
use axum::http::HeaderName;
use axum::middleware::Next;
use axum::response::Response;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::error::ApiError;

/// The configured key, kept only as its digest.
#[derive(Clone)]
pub struct ApiKey {
    digest: Arc<[u8; 32]>,
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiKey(..)")
    }
}

fn digest(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

impl ApiKey {
    pub fn new(key: &str) -> Self {
        Self { digest: Arc::new(digest(key.as_bytes())) }
    }

    /// Whether `presented` is the key, in time independent of both.
    pub fn matches(&self, presented: &[u8]) -> bool {
        digest(presented).ct_eq(&self.digest[..]).into()
    }

    /// Whether an `Authorization` header value carries the key.
    pub fn authorizes(&self, header: Option<&[u8]>) -> bool {
        let token = header.and_then(|h| {
            let scheme_len = "bearer ".len();
            (h.len() > scheme_len && h[..scheme_len].eq_ignore_ascii_case(b"bearer "))
                .then(|| &h[scheme_len..])
        });
        // Compare even without a token, so a missing header costs the same as a wrong one.
        let ok = self.matches(token.unwrap_or_default());
        ok && token.is_some()
    }
}

/// Anthropic's key header.
pub static X_API_KEY: HeaderName = HeaderName::from_static("x-api-key");

/// Middleware: rejects requests without the right key with 401. A request that sends
/// `x-api-key` is judged by that header alone.
pub async fn require_api_key(State(key): State<ApiKey>, req: Request, next: Next) -> Response {
    let authorized = match req.headers().get(&X_API_KEY) {
        Some(presented) => key.matches(presented.as_bytes()) && !presented.is_empty(),
        None => key.authorizes(req.headers().get(AUTHORIZATION).map(|v| v.as_bytes())),
    };
    if authorized {
        next.run(req).await
    } else {
        crate::layers::reject_unread(req, ApiError::Unauthorized).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_token_must_match_exactly() {
        let key = ApiKey::new("s3cret");
        assert!(key.authorizes(Some(b"Bearer s3cret")));
        assert!(key.authorizes(Some(b"bearer s3cret")));
        assert!(!key.authorizes(Some(b"Bearer s3cre")));
        assert!(!key.authorizes(Some(b"Bearer s3cret ")));
        assert!(!key.authorizes(Some(b"Basic s3cret")));
        assert!(!key.authorizes(Some(b"s3cret")));
        assert!(!key.authorizes(Some(b"Bearer ")));
        assert!(!key.authorizes(None));
    }

    #[test]
    fn empty_key_never_matches_missing_token() {
        let key = ApiKey::new("");
        assert!(!key.authorizes(None));
        assert!(!key.authorizes(Some(b"Bearer")));
    }
}

//! The web UI the binary serves itself: the playground at `/`, the dashboard at `/dashboard`
//! and their scripts and style under `/ui/` (`crates/server/web/`, embedded at build time, so
//! nothing is fetched from elsewhere at run time). `--disable-web-ui` leaves these routes out.
//!
//! The pages are public, like `/health`: they hold no data. The playground calls the API with
//! the key the user gives it, and the dashboard reads the public `/stats`. A content security
//! policy keeps every page to this origin.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use crate::error::ApiError;
use crate::extract::PathParam;
use crate::state::SharedState;

/// Scripts, styles, and connections to this origin only; no inline script.
const CONTENT_SECURITY_POLICY: &str =
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; \
     frame-ancestors 'none'; base-uri 'none'; form-action 'self'";

/// One embedded file: its name under `/ui/`, its media type and its bytes.
struct Asset {
    name: &'static str,
    content_type: &'static str,
    body: &'static str,
}

const PLAYGROUND: Asset = Asset {
    name: "index.html",
    content_type: "text/html; charset=utf-8",
    body: include_str!("../web/index.html"),
};
const DASHBOARD: Asset = Asset {
    name: "dashboard.html",
    content_type: "text/html; charset=utf-8",
    body: include_str!("../web/dashboard.html"),
};
const JS: &str = "text/javascript; charset=utf-8";
const ASSETS: &[Asset] = &[
    Asset {
        name: "style.css",
        content_type: "text/css; charset=utf-8",
        body: include_str!("../web/style.css"),
    },
    Asset { name: "markdown.js", content_type: JS, body: include_str!("../web/markdown.js") },
    Asset { name: "playground.js", content_type: JS, body: include_str!("../web/playground.js") },
    Asset { name: "chart.js", content_type: JS, body: include_str!("../web/chart.js") },
    Asset { name: "dashboard.js", content_type: JS, body: include_str!("../web/dashboard.js") },
];

fn serve(asset: &Asset) -> Response {
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, HeaderValue::from_static(asset.content_type)),
            // The assets change with the binary; a browser revalidates instead of keeping an old one.
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
            (header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CONTENT_SECURITY_POLICY)),
            (header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff")),
        ],
        asset.body,
    )
        .into_response()
}

async fn playground() -> Response {
    serve(&PLAYGROUND)
}

async fn dashboard() -> Response {
    serve(&DASHBOARD)
}

async fn asset(PathParam(name): PathParam) -> Result<Response, ApiError> {
    match ASSETS.iter().find(|a| a.name == name) {
        Some(asset) => Ok(serve(asset)),
        None => Err(ApiError::RouteNotFound { method: "GET".to_owned(), path: format!("/ui/{name}") }),
    }
}

/// The UI's routes.
pub fn routes() -> Router<SharedState> {
    Router::new()
        .route("/", get(playground))
        .route("/dashboard", get(dashboard))
        .route("/ui/{name}", get(asset))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every file the pages load is one the server embeds, and none comes from elsewhere.
    #[test]
    fn pages_load_only_embedded_assets() {
        for page in [&PLAYGROUND, &DASHBOARD] {
            for cap in page.body.split(['"', '\'']).filter(|s| s.starts_with("/ui/")) {
                let name = &cap["/ui/".len()..];
                assert!(
                    ASSETS.iter().any(|a| a.name == name),
                    "{} loads /ui/{name}, which is not embedded",
                    page.name
                );
            }
            assert!(
                !page.body.contains("http://") && !page.body.contains("https://"),
                "{} names another origin",
                page.name
            );
        }
        for asset in ASSETS {
            let external = ["src=\"http", "href=\"http", "fetch(\"http", "import("];
            for pattern in external {
                assert!(!asset.body.contains(pattern), "{} has {pattern}", asset.name);
            }
        }
    }
}

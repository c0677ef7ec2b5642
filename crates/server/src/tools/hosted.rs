//! Hosted tools: the tools a vendor's API runs on its own side, which this server cannot run.
//! OpenAI's Responses API has `web_search` (and its `web_search_preview*` and dated variants),
//! `file_search`, `code_interpreter`, `image_generation` and `computer_use*`; Anthropic's
//! Messages API has the server tools `web_search_*`, `web_fetch_*` and `code_execution_*`.
//!
//! Under `--hosted-tools ignore` (the default) a request that lists them is served without them:
//! they stay out of the prompt, one warning per request names them in the log, and the
//! `x-pagoda-ignored-tools` response header names them to the client. Agent clients list them by
//! default (Codex CLI sends `web_search` on every request) and give up on a 400, while the turn
//! itself needs no search. A `tool_choice` that forces one is still a 400: that answer could not
//! be what was asked for. Under `reject` every hosted tool is a 400 naming it.
//!
//! Tools whose calls the client runs (`local_shell`, `shell`, `apply_patch`, `custom`, Anthropic's
//! `bash_*`, `text_editor_*`, `computer_*`, `memory_*`) and MCP tools are not hosted tools here:
//! they stay a 400, since leaving them out would take away what the agent works with.
//!
//! The names reach the response through a record that [`report_ignored`], a middleware on the API
//! routes, keeps for each request (a task-local): the Responses and Messages request parsers note
//! what they left out wherever they run, with no plumbing through the handlers, and the
//! middleware sets the header on the response head, which a streamed answer also builds only
//! after the parse. (Chat completions have no hosted tool types: OpenAI's chat `tools` are
//! functions, and its search models' `web_search_options` stays an unknown field here.)

use std::cell::RefCell;

use axum::extract::Request;
use axum::http::{HeaderName, HeaderValue};
use axum::middleware::Next;
use axum::response::Response;

/// The response header naming the hosted tools a request's answer was made without.
pub static IGNORED_TOOLS_HEADER: HeaderName = HeaderName::from_static("x-pagoda-ignored-tools");

/// `ty` is `base`, or `base_` and a variant or version (lowercase letters, digits, underscores):
/// `web_search_preview_2025_03_11`. Anything else (other characters included) is not a hosted
/// tool, so what is noted can always go into a header.
fn openai_variant(ty: &str, base: &str) -> bool {
    match ty.strip_prefix(base) {
        Some("") => true,
        Some(rest) => rest.strip_prefix('_').is_some_and(|v| {
            !v.is_empty() && v.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        }),
        None => false,
    }
}

/// A Responses API tool type that OpenAI runs on its side.
pub fn is_openai_hosted(ty: &str) -> bool {
    matches!(ty, "file_search" | "code_interpreter" | "image_generation")
        || openai_variant(ty, "web_search")
        || openai_variant(ty, "computer_use")
}

/// An Anthropic tool type that Anthropic runs on its side (a server tool): the tool's name and
/// its version's date, `web_search_20250305`.
pub fn is_anthropic_server_tool(ty: &str) -> bool {
    ["web_search_", "web_fetch_", "code_execution_"].iter().any(|base| {
        ty.strip_prefix(base).is_some_and(|date| date.len() == 8 && date.bytes().all(|b| b.is_ascii_digit()))
    })
}

tokio::task_local! {
    /// The hosted tools left out of the current request's prompt.
    static IGNORED: RefCell<Vec<String>>;
}

/// Notes that the current request's hosted tools `types` were left out. Outside a request (a
/// unit test calling a parser) there is nobody to tell, and nothing is noted.
pub fn note_ignored<'a>(types: impl IntoIterator<Item = &'a str>) {
    let _ = IGNORED.try_with(|ignored| {
        let mut ignored = ignored.borrow_mut();
        for ty in types {
            if !ignored.iter().any(|t| t == ty) {
                ignored.push(ty.to_owned());
            }
        }
    });
}

/// Middleware: runs the request with an empty record, then names what was noted in the header
/// of a successful answer, and once in the log. An answer that is an error served nothing, so it
/// names nothing.
pub async fn report_ignored(req: Request, next: Next) -> Response {
    let route = req.uri().path().to_owned();
    let (mut response, ignored) = IGNORED
        .scope(RefCell::new(Vec::new()), async {
            let response = next.run(req).await;
            (response, IGNORED.with(RefCell::take))
        })
        .await;
    if ignored.is_empty() || !response.status().is_success() {
        return response;
    }
    let names = ignored.join(", ");
    tracing::warn!(
        route = %route,
        tools = %names,
        "hosted tools left out of the prompt: this server does not run them (--hosted-tools reject refuses them)"
    );
    // Each name is a fixed one or passed `openai_variant` or the date check: a valid header value.
    if let Ok(value) = HeaderValue::from_str(&ignored.join(",")) {
        response.headers_mut().insert(IGNORED_TOOLS_HEADER.clone(), value);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosted_types_are_recognised_by_name_and_version() {
        for ty in [
            "web_search",
            "web_search_preview",
            "web_search_preview_2025_03_11",
            "web_search_2025_08_26",
            "file_search",
            "code_interpreter",
            "image_generation",
            "computer_use_preview",
        ] {
            assert!(is_openai_hosted(ty), "{ty}");
        }
        for ty in [
            "function",
            "namespace",
            "mcp",
            "local_shell",
            "custom",
            "web_searcher",
            "web_search_",
            "web_search_X",
        ] {
            assert!(!is_openai_hosted(ty), "{ty}");
        }
        for ty in ["web_search_20250305", "web_fetch_20250910", "code_execution_20250825"] {
            assert!(is_anthropic_server_tool(ty), "{ty}");
        }
        for ty in
            ["web_search", "web_search_2025", "bash_20250124", "text_editor_20250728", "web_fetch_2025\n"]
        {
            assert!(!is_anthropic_server_tool(ty), "{ty}");
        }
    }

    #[test]
    fn anthropic_server_tools_are_left_out_unless_forced() {
        use crate::anthropic::request::tools;
        use crate::config::HostedToolsPolicy::Ignore;
        use serde_json::json;
        let both = json!([{"name": "get_weather", "input_schema": {"type": "object"}},
                          {"type": "web_search_20250305", "name": "web_search", "max_uses": 5}]);
        let kept = tools(Some(&both), None, Ignore).unwrap().unwrap();
        assert_eq!(kept.tools.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(), ["get_weather"]);
        let only = json!([{"type": "web_fetch_20250910", "name": "web_fetch"}]);
        assert!(tools(Some(&only), Some(&json!({"type": "auto"})), Ignore).unwrap().is_none());
        let forced = json!({"type": "tool", "name": "web_search"});
        let err = tools(Some(&both), Some(&forced), Ignore).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("tool_choice.name"));
        let err = tools(Some(&only), Some(&json!({"type": "any"})), Ignore).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("tool_choice.type"));
    }

    #[tokio::test]
    async fn notes_are_kept_per_request_without_repeats() {
        let noted = IGNORED
            .scope(RefCell::new(Vec::new()), async {
                note_ignored(["web_search", "file_search"]);
                note_ignored(["web_search"]);
                IGNORED.with(RefCell::take)
            })
            .await;
        assert_eq!(noted, ["web_search", "file_search"]);
        // Outside a request: nothing to note into, and no panic.
        note_ignored(["web_search"]);
    }
}

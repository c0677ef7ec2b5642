//! Talking to one MCP server over streamable HTTP with the official SDK (`rmcp`): list its tools,
//! call one. Every operation opens its own session (initialize, the request, close) under one
//! time limit, on an HTTP client that follows no redirect, with the SDK's response-size limits;
//! whatever goes wrong (refused, hung, garbage, an error result) is an [`McpError`] for the
//! caller to put in an item, never a panic.

use std::collections::HashMap;
use std::time::Duration;

use axum::http::{HeaderName, HeaderValue};
use rmcp::model::CallToolRequestParams;
use rmcp::service::RunningService;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{Map, Value};

use super::catalog::ToolInfo;
use super::spec::McpServer;

/// The limits on every MCP operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// For the whole operation: connecting, initializing, the request and its answer.
    pub timeout: Duration,
    /// The most bytes of one answer (a JSON body or one SSE event).
    pub max_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self { timeout: Duration::from_secs(30), max_bytes: 1 << 20 }
    }
}

/// Why an MCP operation failed, as the `error` of its item says.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum McpError {
    #[error("the MCP server did not answer within {0} s")]
    Timeout(u64),
    #[error("cannot set up the MCP client: {0}")]
    Setup(String),
    #[error("the MCP session with {url} failed: {message}")]
    Session { url: String, message: String },
    #[error("the MCP request failed: {0}")]
    Request(String),
    #[error("the tool returned an error: {0}")]
    Tool(String),
}

type Session = RunningService<RoleClient, ()>;

async fn connect(server: &McpServer, limits: Limits) -> Result<Session, McpError> {
    // The whole operation's limit is `with_session`'s; the client's own, a little later, only
    // backs it up, so that a hung server always reads as a timeout.
    let backstop = limits.timeout + Duration::from_secs(5);
    let client = reqwest_mcp::Client::builder()
        .redirect(reqwest_mcp::redirect::Policy::none())
        .timeout(backstop)
        .build()
        .map_err(|e| McpError::Setup(e.to_string()))?;
    let mut headers = HashMap::new();
    for (name, value) in &server.headers {
        let name = HeaderName::from_bytes(name.as_bytes())
            .map_err(|e| McpError::Setup(format!("header `{name}`: {e}")))?;
        let value =
            HeaderValue::from_str(value).map_err(|e| McpError::Setup(format!("header `{name}`: {e}")))?;
        headers.insert(name, value);
    }
    let mut config = StreamableHttpClientTransportConfig::with_uri(server.url.clone())
        .custom_headers(headers)
        .max_json_response_size(limits.max_bytes)
        .max_sse_event_size(limits.max_bytes)
        .max_error_response_size(limits.max_bytes.min(64 << 10))
        .control_request_timeout(backstop);
    if let Some(token) = &server.authorization {
        config = config.auth_header(token.clone());
    }
    let transport = StreamableHttpClientTransport::with_client(client, config);
    ().serve(transport)
        .await
        .map_err(|e| McpError::Session { url: server.url.clone(), message: e.to_string() })
}

/// Runs `op` on a fresh session with `server`, all within the time limit; the session is closed
/// (or, past the limit, dropped, which stops its task) either way.
async fn with_session<T, F, Fut>(server: &McpServer, limits: Limits, op: F) -> Result<T, McpError>
where
    F: FnOnce(Session) -> Fut,
    Fut: std::future::Future<Output = (Session, Result<T, McpError>)>,
{
    let run = async {
        let session = connect(server, limits).await?;
        let (session, result) = op(session).await;
        // Closing is a courtesy to the server; its failure changes nothing here.
        let _ = session.cancel().await;
        result
    };
    tokio::time::timeout(limits.timeout, run)
        .await
        .unwrap_or(Err(McpError::Timeout(limits.timeout.as_secs())))
}

/// The server's tools (all pages).
pub async fn list_tools(server: &McpServer, limits: Limits) -> Result<Vec<ToolInfo>, McpError> {
    with_session(server, limits, |session| async move {
        let listed = session.list_all_tools().await.map_err(|e| McpError::Request(e.to_string()));
        let tools = listed.map(|tools| {
            tools
                .into_iter()
                .map(|t| ToolInfo {
                    name: t.name.into_owned(),
                    description: t.description.map(|d| d.into_owned()),
                    input_schema: Value::Object((*t.input_schema).clone()),
                    annotations: t
                        .annotations
                        .and_then(|a| serde_json::to_value(a).ok())
                        .unwrap_or(Value::Null),
                })
                .collect()
        });
        (session, tools)
    })
    .await
}

/// Calls tool `name` with `arguments`; its output is the result's text parts, joined (or its
/// structured content as JSON when it has no text). A result marked as an error is an error.
pub async fn call_tool(
    server: &McpServer,
    name: &str,
    arguments: Map<String, Value>,
    limits: Limits,
) -> Result<String, McpError> {
    let params = CallToolRequestParams::new(name.to_owned()).with_arguments(arguments);
    with_session(server, limits, |session| async move {
        let result = match session.call_tool(params).await {
            Err(e) => Err(McpError::Request(e.to_string())),
            Ok(r) => {
                let mut texts: Vec<String> =
                    r.content.iter().filter_map(|c| c.as_text().map(|t| t.text.clone())).collect();
                if texts.is_empty() {
                    if let Some(s) = &r.structured_content {
                        texts.push(s.to_string());
                    }
                }
                let text = texts.join("\n");
                if r.is_error == Some(true) {
                    Err(McpError::Tool(text))
                } else {
                    Ok(text)
                }
            }
        };
        (session, result)
    })
    .await
}

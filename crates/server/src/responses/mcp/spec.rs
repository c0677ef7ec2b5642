//! A request's `mcp` tools, checked before anything runs: each tool's fields, its `server_url`
//! against `--allow-mcp-servers` (so that a request cannot make this server fetch an address
//! of its choosing), which of the server's tools it offers (`allowed_tools`) and which calls
//! need the client's approval first (`require_approval`, OpenAI's default being `always`).

use serde_json::{Map, Value};

use crate::error::InvalidParam;

/// The most headers one `mcp` tool may send, and the most bytes of each name and value.
const MAX_HEADERS: usize = 32;
const MAX_HEADER_BYTES: usize = 4096;

fn invalid(param: impl Into<String>, message: impl Into<String>) -> InvalidParam {
    InvalidParam::new(param, message)
}

/// A set of the server's tools: by name, and (with `read_only`) those that say they only read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ToolSet {
    pub names: Vec<String>,
    pub read_only: bool,
}

impl ToolSet {
    /// Whether tool `name` (read-only when `read_only` says so) is in the set.
    pub fn contains(&self, name: &str, read_only: bool) -> bool {
        self.names.iter().any(|n| n == name) || (self.read_only && read_only)
    }
}

/// `require_approval`: which calls wait for an `mcp_approval_response` before they run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Approval {
    Always,
    Never,
    /// Listed tools as listed; any other tool needs approval, OpenAI's default.
    Filter {
        always: ToolSet,
        never: ToolSet,
    },
}

impl Approval {
    /// Whether a call of tool `name` needs the client's approval first.
    pub fn required(&self, name: &str, read_only: bool) -> bool {
        match self {
            Approval::Always => true,
            Approval::Never => false,
            Approval::Filter { always, never } => {
                always.contains(name, read_only) || !never.contains(name, read_only)
            }
        }
    }
}

/// One `mcp` tool of the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpServer {
    /// Its index in `tools`, for error parameters.
    pub index: usize,
    pub label: String,
    pub url: String,
    pub description: Option<String>,
    /// `allowed_tools`: `None` offers every tool the server lists.
    pub allowed: Option<ToolSet>,
    pub approval: Approval,
    /// `headers`, sent with every request to the server.
    pub headers: Vec<(String, String)>,
    /// `authorization`: an OAuth access token, sent as `Authorization: Bearer ...`.
    pub authorization: Option<String>,
}

impl McpServer {
    /// Whether the request offers the server's tool `name` to the model.
    pub fn offers(&self, name: &str, read_only: bool) -> bool {
        self.allowed.as_ref().is_none_or(|set| set.contains(name, read_only))
    }
}

/// An `http://` URL split as far as the allow-list needs: scheme and authority (lowercased), path.
#[derive(Debug, PartialEq, Eq)]
struct Url<'a> {
    origin: String,
    path: &'a str,
}

/// Splits an `http://` URL, refusing what could make one URL mean another to the HTTP client:
/// user info, dot segments, backslashes, fragments, spaces and control characters.
fn split_url(url: &str) -> Result<Url<'_>, String> {
    let rest = url
        .get(..7)
        .filter(|s| s.eq_ignore_ascii_case("http://"))
        .map(|_| &url[7..])
        .ok_or("must be an http:// URL (this server has no TLS client)")?;
    if url.chars().any(|c| c.is_control() || c.is_whitespace() || c == '\\' || c == '#') {
        return Err("must not hold spaces, control characters, backslashes or a fragment".into());
    }
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(end);
    if authority.is_empty() || authority.contains('@') {
        return Err("needs a host, and no user info".into());
    }
    let bare = path.split('?').next().unwrap_or_default();
    let lower = bare.to_ascii_lowercase();
    if bare.split('/').any(|s| s == "." || s == "..") || lower.contains("%2e") || lower.contains("%2f") {
        return Err("must not hold dot segments or encoded dots and slashes".into());
    }
    Ok(Url { origin: format!("http://{}", authority.to_ascii_lowercase()), path })
}

/// Whether `url` is under `prefix`: the same scheme and host, and a path that is the prefix's
/// or goes on from it at a `/` (`/mcp` allows `/mcp` and `/mcp/x`, not `/mcpx`).
pub fn allowed_by(prefix: &str, url: &str) -> bool {
    let (Ok(p), Ok(u)) = (split_url(prefix), split_url(url)) else { return false };
    if p.origin != u.origin {
        return false;
    }
    match u.path.strip_prefix(p.path) {
        None => false,
        Some(rest) => p.path.ends_with('/') || rest.is_empty() || rest.starts_with(['/', '?']),
    }
}

/// Checks `--allow-mcp-servers`' prefixes (each an `http://` URL).
pub fn check_prefixes(prefixes: Vec<String>) -> Result<Vec<String>, String> {
    for p in &prefixes {
        split_url(p).map_err(|why| format!("`{p}` {why}"))?;
    }
    Ok(prefixes)
}

fn string<'a>(p: &str, obj: &'a Map<String, Value>, key: &str) -> Result<Option<&'a str>, InvalidParam> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(invalid(format!("{p}.{key}"), "must be a string")),
    }
}

fn names(p: &str, value: &Value) -> Result<Vec<String>, InvalidParam> {
    let list = value.as_array().ok_or_else(|| invalid(p, "must be a list of tool names"))?;
    list.iter()
        .map(|n| n.as_str().map(str::to_owned).ok_or_else(|| invalid(p, "must be a list of tool names")))
        .collect()
}

/// `{"tool_names": [...], "read_only": bool}`.
fn tool_set(p: &str, value: &Value) -> Result<ToolSet, InvalidParam> {
    let obj = value.as_object().ok_or_else(|| invalid(p, "must be an object with `tool_names`"))?;
    if let Some(k) = obj.keys().find(|k| !matches!(k.as_str(), "tool_names" | "read_only")) {
        return Err(invalid(format!("{p}.{k}"), format!("unknown field `{k}`")));
    }
    let names = match obj.get("tool_names") {
        None | Some(Value::Null) => Vec::new(),
        Some(v) => names(&format!("{p}.tool_names"), v)?,
    };
    let read_only = match obj.get("read_only") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(invalid(format!("{p}.read_only"), "must be a boolean")),
    };
    Ok(ToolSet { names, read_only })
}

fn approval(p: &str, value: Option<&Value>) -> Result<Approval, InvalidParam> {
    match value {
        None | Some(Value::Null) => Ok(Approval::Always),
        Some(Value::String(s)) if s == "always" => Ok(Approval::Always),
        Some(Value::String(s)) if s == "never" => Ok(Approval::Never),
        Some(Value::Object(obj)) => {
            if let Some(k) = obj.keys().find(|k| !matches!(k.as_str(), "always" | "never")) {
                return Err(invalid(format!("{p}.{k}"), format!("unknown field `{k}`")));
            }
            let set = |key: &str| match obj.get(key) {
                None | Some(Value::Null) => Ok(ToolSet::default()),
                Some(v) => tool_set(&format!("{p}.{key}"), v),
            };
            Ok(Approval::Filter { always: set("always")?, never: set("never")? })
        }
        Some(_) => Err(invalid(p, "must be `always`, `never` or {\"always\": {...}, \"never\": {...}}")),
    }
}

fn headers(p: &str, value: Option<&Value>) -> Result<Vec<(String, String)>, InvalidParam> {
    let obj = match value {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Object(obj)) => obj,
        Some(_) => return Err(invalid(p, "must be an object of header names to strings")),
    };
    if obj.len() > MAX_HEADERS {
        return Err(invalid(p, format!("at most {MAX_HEADERS} headers")));
    }
    obj.iter()
        .map(|(name, v)| {
            let hp = format!("{p}.{name}");
            let v = v.as_str().ok_or_else(|| invalid(&hp, "must be a string"))?;
            let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
            if name.is_empty() || name.len() > MAX_HEADER_BYTES || !name.chars().all(token) {
                return Err(invalid(&hp, "is not a valid header name"));
            }
            if v.len() > MAX_HEADER_BYTES || v.chars().any(|c| c.is_control() && c != '\t') {
                return Err(invalid(
                    &hp,
                    format!("must be at most {MAX_HEADER_BYTES} bytes, without control characters"),
                ));
            }
            Ok((name.clone(), v.to_owned()))
        })
        .collect()
}

fn server(i: usize, obj: &Map<String, Value>, prefixes: &[String]) -> Result<McpServer, InvalidParam> {
    let p = format!("tools[{i}]");
    const KEYS: [&str; 8] = [
        "type",
        "server_label",
        "server_url",
        "allowed_tools",
        "require_approval",
        "headers",
        "authorization",
        "server_description",
    ];
    if obj.contains_key("connector_id") {
        return Err(invalid(
            format!("{p}.connector_id"),
            "OpenAI's connectors are not available here: give the MCP server's `server_url`",
        ));
    }
    if let Some(k) = obj.keys().find(|k| !KEYS.contains(&k.as_str())) {
        return Err(invalid(format!("{p}.{k}"), format!("unknown field `{k}` in an `mcp` tool")));
    }
    let label = string(&p, obj, "server_label")?.unwrap_or_default();
    let label_ok = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    if label.is_empty() || label.len() > 64 || !label.chars().all(label_ok) {
        return Err(invalid(format!("{p}.server_label"), "is required: 1 to 64 letters, digits, `_` or `-`"));
    }
    let url_param = format!("{p}.server_url");
    let url = string(&p, obj, "server_url")?.ok_or_else(|| invalid(&url_param, "is required"))?;
    if prefixes.is_empty() {
        return Err(invalid(
            url_param,
            "`mcp` tools are off on this server: it calls only the MCP servers that \
             --allow-mcp-servers lists",
        ));
    }
    split_url(url).map_err(|why| invalid(&url_param, format!("`{url}` {why}")))?;
    if !prefixes.iter().any(|prefix| allowed_by(prefix, url)) {
        return Err(invalid(
            url_param,
            format!("`{url}` is not an MCP server this server may call (see --allow-mcp-servers)"),
        ));
    }
    let allowed = match obj.get("allowed_tools") {
        None | Some(Value::Null) => None,
        Some(v @ Value::Array(_)) => {
            Some(ToolSet { names: names(&format!("{p}.allowed_tools"), v)?, read_only: false })
        }
        Some(v) => Some(tool_set(&format!("{p}.allowed_tools"), v)?),
    };
    Ok(McpServer {
        index: i,
        label: label.to_owned(),
        url: url.to_owned(),
        description: string(&p, obj, "server_description")?.map(str::to_owned),
        allowed,
        approval: approval(&format!("{p}.require_approval"), obj.get("require_approval"))?,
        headers: headers(&format!("{p}.headers"), obj.get("headers"))?,
        authorization: string(&p, obj, "authorization")?.map(str::to_owned),
    })
}

/// The request's `mcp` tools (none when it has none), each checked and allowed.
pub fn servers(tools: Option<&Value>, prefixes: &[String]) -> Result<Vec<McpServer>, InvalidParam> {
    let Some(Value::Array(list)) = tools else { return Ok(Vec::new()) };
    let mut out: Vec<McpServer> = Vec::new();
    for (i, tool) in list.iter().enumerate() {
        let Some(obj) = tool.as_object().filter(|o| o.get("type").and_then(Value::as_str) == Some("mcp"))
        else {
            continue;
        };
        let server = server(i, obj, prefixes)?;
        if out.iter().any(|s| s.label == server.label) {
            return Err(invalid(
                format!("tools[{i}].server_label"),
                format!("`{}` names two `mcp` tools: labels must differ", server.label),
            ));
        }
        out.push(server);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const PREFIX: &str = "http://127.0.0.1:9000/mcp";

    fn parse(tool: Value) -> Result<Vec<McpServer>, InvalidParam> {
        servers(Some(&json!([{"type": "function", "name": "f"}, tool])), &[PREFIX.to_owned()])
    }

    #[test]
    fn the_allow_list_matches_whole_hosts_and_path_segments() {
        for ok in [
            PREFIX,
            "http://127.0.0.1:9000/mcp/",
            "http://127.0.0.1:9000/mcp?x=1",
            "HTTP://127.0.0.1:9000/mcp/a",
        ] {
            assert!(allowed_by(PREFIX, ok), "{ok}");
        }
        for bad in [
            "http://127.0.0.1:90001/mcp",
            "http://127.0.0.1:9000/mcpx",
            "http://127.0.0.1:9000@evil.example/mcp",
            "http://127.0.0.1:9000/mcp/../admin",
            "http://127.0.0.1:9000/mcp/%2e%2e/admin",
            "http://127.0.0.1:9000/mcp\\..\\admin",
            "https://127.0.0.1:9000/mcp",
            "http://127.0.0.1:9001/mcp",
            "file:///etc/passwd",
        ] {
            assert!(!allowed_by(PREFIX, bad), "{bad}");
        }
        assert!(allowed_by("http://h:1/", "http://h:1/anything"));
        assert!(check_prefixes(vec!["https://h/".into()]).is_err());
    }

    #[test]
    fn a_tool_is_parsed_with_its_filters() {
        let got = parse(json!({
            "type": "mcp", "server_label": "calc", "server_url": PREFIX,
            "allowed_tools": {"tool_names": ["add"]},
            "require_approval": {"never": {"tool_names": ["add"]}},
            "headers": {"X-Key": "k"}, "authorization": "tok",
        }))
        .unwrap();
        assert_eq!(got.len(), 1);
        let s = &got[0];
        assert_eq!((s.index, s.label.as_str(), s.authorization.as_deref()), (1, "calc", Some("tok")));
        assert!(s.offers("add", false) && !s.offers("echo", true));
        assert!(!s.approval.required("add", false));
        assert!(s.approval.required("echo", false), "unlisted tools need approval, as OpenAI's default");
        assert_eq!(s.headers, [("X-Key".to_owned(), "k".to_owned())]);
        let list = parse(json!({"type": "mcp", "server_label": "c", "server_url": PREFIX,
                                "allowed_tools": ["echo"], "require_approval": "never"}))
        .unwrap();
        assert!(list[0].offers("echo", false) && !list[0].offers("add", false));
        assert_eq!(list[0].approval, Approval::Never);
    }

    #[test]
    fn approval_defaults_to_always_and_read_only_filters_apply() {
        let s = parse(json!({"type": "mcp", "server_label": "c", "server_url": PREFIX})).unwrap();
        assert_eq!(s[0].approval, Approval::Always);
        let a = approval("p", Some(&json!({"never": {"read_only": true}}))).unwrap();
        assert!(!a.required("look", true));
        assert!(a.required("write", false));
    }

    #[test]
    fn bad_tools_are_named() {
        let err = |tool: Value| parse(tool).unwrap_err().param.unwrap();
        let base = |extra: Value| {
            let mut t = json!({"type": "mcp", "server_label": "c", "server_url": PREFIX});
            t.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            t
        };
        assert_eq!(err(base(json!({"server_url": "http://10.0.0.1/mcp"}))), "tools[1].server_url");
        assert_eq!(err(base(json!({"server_url": 5}))), "tools[1].server_url");
        assert_eq!(err(json!({"type": "mcp", "server_label": "c"})), "tools[1].server_url");
        assert_eq!(err(base(json!({"server_label": "a b"}))), "tools[1].server_label");
        assert_eq!(err(base(json!({"require_approval": "sometimes"}))), "tools[1].require_approval");
        assert_eq!(err(base(json!({"allowed_tools": "add"}))), "tools[1].allowed_tools");
        assert_eq!(err(base(json!({"allowed_tools": {"names": []}}))), "tools[1].allowed_tools.names");
        assert_eq!(err(base(json!({"headers": {"X": 1}}))), "tools[1].headers.X");
        assert_eq!(err(base(json!({"headers": {"A B": "x"}}))), "tools[1].headers.A B");
        assert_eq!(err(base(json!({"connector_id": "connector_gmail"}))), "tools[1].connector_id");
        assert_eq!(err(base(json!({"bogus": 1}))), "tools[1].bogus");
        let off = servers(Some(&json!([base(json!({}))])), &[]).unwrap_err();
        assert_eq!(off.param.as_deref(), Some("tools[0].server_url"));
        assert!(off.message.contains("--allow-mcp-servers"), "{}", off.message);
        let twice = servers(Some(&json!([base(json!({})), base(json!({}))])), &[PREFIX.to_owned()]);
        assert_eq!(twice.unwrap_err().param.as_deref(), Some("tools[1].server_label"));
    }
}

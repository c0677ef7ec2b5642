//! The MCP tools one request offers the model, and the names the model knows them by.
//!
//! OpenAI's items name a call by the server's plain tool name with its `server_label` beside it.
//! The model sees one flat list of functions, so each MCP tool gets a function name there: its
//! own name when that is a valid function name no other tool of the request uses, otherwise
//! `{server_label}__{name}` (made valid and unique). A call the model writes is mapped back by
//! that name; calls of the request's own function tools are left to the client as before.

use serde_json::{json, Value};

use super::spec::McpServer;

/// One tool as an MCP server lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolInfo {
    pub name: String,
    pub description: Option<String>,
    pub input_schema: Value,
    pub annotations: Value,
}

impl ToolInfo {
    /// Whether the tool says it only reads (`readOnlyHint`).
    pub fn read_only(&self) -> bool {
        self.annotations.get("readOnlyHint").and_then(Value::as_bool) == Some(true)
    }

    /// As an `mcp_list_tools` item lists it.
    pub fn listed(&self) -> Value {
        json!({
            "name": self.name, "description": self.description,
            "input_schema": self.input_schema, "annotations": self.annotations,
        })
    }

    /// Read back from an earlier `mcp_list_tools` item's `tools` entry.
    pub fn from_listed(v: &Value) -> Option<Self> {
        Some(Self {
            name: v.get("name")?.as_str()?.to_owned(),
            description: v.get("description").and_then(Value::as_str).map(str::to_owned),
            input_schema: v.get("input_schema").cloned().unwrap_or_else(|| json!({"type": "object"})),
            annotations: v.get("annotations").cloned().unwrap_or(Value::Null),
        })
    }
}

/// An offered tool: its server (by label), the tool, and its function name for the model.
#[derive(Debug, Clone, PartialEq)]
pub struct Offered {
    pub label: String,
    pub tool: ToolInfo,
    pub function: String,
}

/// The MCP tools a request offers. See the module docs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Catalog {
    tools: Vec<Offered>,
}

fn valid_function_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

fn sanitized(name: &str) -> String {
    let s: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '-' { c } else { '_' })
        .take(60)
        .collect();
    if s.is_empty() {
        "tool".into()
    } else {
        s
    }
}

impl Catalog {
    /// The offered tools of each server (`listed[i]` is `servers[i]`'s list, filtered by
    /// `allowed_tools`), named apart from each other and from `taken` (the request's own
    /// function names).
    pub fn new(servers: &[McpServer], listed: &[Vec<ToolInfo>], taken: &[String]) -> Self {
        let offered: Vec<(&McpServer, &ToolInfo)> = servers
            .iter()
            .zip(listed)
            .flat_map(|(s, tools)| {
                tools.iter().filter(|t| s.offers(&t.name, t.read_only())).map(move |t| (s, t))
            })
            .collect();
        let mut used: Vec<String> = taken.to_vec();
        let mut tools = Vec::with_capacity(offered.len());
        for &(server, tool) in &offered {
            let plain_unique = offered.iter().filter(|(_, t)| t.name == tool.name).count() == 1;
            let mut function =
                if plain_unique && valid_function_name(&tool.name) && !used.contains(&tool.name) {
                    tool.name.clone()
                } else {
                    sanitized(&format!("{}__{}", server.label, tool.name))
                };
            let base = function.clone();
            let mut n = 2;
            while used.contains(&function) {
                function = format!("{base}_{n}");
                n += 1;
            }
            used.push(function.clone());
            tools.push(Offered { label: server.label.clone(), tool: tool.clone(), function });
        }
        Self { tools }
    }

    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }

    /// The tool the model calls by `function`.
    pub fn by_function(&self, function: &str) -> Option<&Offered> {
        self.tools.iter().find(|t| t.function == function)
    }

    /// The function name of `label`'s tool `name`, if offered.
    pub fn function_of(&self, label: &str, name: &str) -> Option<&str> {
        self.tools.iter().find(|t| t.label == label && t.tool.name == name).map(|t| t.function.as_str())
    }

    /// The function names of all offered tools.
    pub fn functions(&self) -> Vec<String> {
        self.tools.iter().map(|t| t.function.clone()).collect()
    }

    /// The offered tools as Responses `function` tools, as the request would have given them.
    pub fn function_tools(&self, servers: &[McpServer]) -> Vec<Value> {
        self.tools
            .iter()
            .map(|t| {
                let about =
                    servers.iter().find(|s| s.label == t.label).and_then(|s| s.description.as_deref());
                let description = match (t.tool.description.as_deref(), about) {
                    (Some(d), Some(a)) => format!("{d} (MCP server {}: {a})", t.label),
                    (Some(d), None) => d.to_owned(),
                    (None, Some(a)) => format!("A tool of MCP server {}: {a}", t.label),
                    (None, None) => format!("A tool of MCP server {}", t.label),
                };
                let mut parameters = t.tool.input_schema.clone();
                if !parameters.is_object() {
                    parameters = json!({"type": "object"});
                }
                json!({"type": "function", "name": t.function, "description": description,
                       "parameters": parameters})
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::responses::mcp::spec::{servers, ToolSet};

    fn tool(name: &str) -> ToolInfo {
        ToolInfo {
            name: name.into(),
            description: None,
            input_schema: json!({"type": "object"}),
            annotations: Value::Null,
        }
    }

    fn two_servers() -> Vec<McpServer> {
        let tools = json!([
            {"type": "mcp", "server_label": "a", "server_url": "http://h/a"},
            {"type": "mcp", "server_label": "b", "server_url": "http://h/b"},
        ]);
        servers(Some(&tools), &["http://h/".to_owned()]).unwrap()
    }

    #[test]
    fn plain_names_unless_they_clash() {
        let servers = two_servers();
        let listed = vec![vec![tool("add"), tool("echo"), tool("x.y")], vec![tool("echo"), tool("exec")]];
        let c = Catalog::new(&servers, &listed, &["exec".to_owned()]);
        assert_eq!(c.function_of("a", "add"), Some("add"));
        assert_eq!(c.function_of("a", "echo"), Some("a__echo"));
        assert_eq!(c.function_of("b", "echo"), Some("b__echo"));
        assert_eq!(c.function_of("a", "x.y"), Some("a__x_y"));
        assert_eq!(c.function_of("b", "exec"), Some("b__exec"), "the request's own function keeps its name");
        let back = c.by_function("b__echo").unwrap();
        assert_eq!((back.label.as_str(), back.tool.name.as_str()), ("b", "echo"));
        assert!(c.by_function("exec").is_none());
        let mut names = c.functions();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), 5);
    }

    #[test]
    fn allowed_tools_filter_the_offer() {
        let mut servers = two_servers();
        servers[0].allowed = Some(ToolSet { names: vec!["add".into()], read_only: false });
        let listed = vec![vec![tool("add"), tool("echo")], vec![]];
        let c = Catalog::new(&servers, &listed, &[]);
        assert_eq!(c.functions(), ["add"]);
        let f = c.function_tools(&servers);
        assert_eq!(f[0]["type"], "function");
        assert_eq!(f[0]["parameters"], json!({"type": "object"}));
    }
}

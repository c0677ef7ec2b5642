//! `tool_choice` with MCP tools: OpenAI's `{"type": "mcp", "server_label", "name"?}` checked
//! against the request's servers, and the choice each generation gets. The first generation
//! takes the request's choice (an MCP tool's as its function's, a server's without a name as
//! `required`); once the server has run calls the model chooses freely, and the last generation
//! must answer in text, so that a model that keeps calling tools still ends.

use serde_json::{json, Value};

use super::catalog::Catalog;
use super::spec::McpServer;
use crate::error::InvalidParam;

/// The most generations of one response: after this many, the model must answer in text.
pub const MAX_ROUNDS: usize = 8;

fn mcp_choice(choice: Option<&Value>) -> Option<(&str, Option<&str>)> {
    let c = choice?.as_object().filter(|c| c.get("type").and_then(Value::as_str) == Some("mcp"))?;
    Some((c.get("server_label").and_then(Value::as_str)?, c.get("name").and_then(Value::as_str)))
}

/// Checks an MCP `tool_choice`: its server must be one of the request's `mcp` tools, and a
/// tool it names must be offered, unless listing that server failed (`failed` labels; the
/// model then answers without it).
pub fn check(
    choice: Option<&Value>,
    servers: &[McpServer],
    catalog: &Catalog,
    failed: &[&str],
) -> Result<(), InvalidParam> {
    let Some(c) =
        choice.and_then(Value::as_object).filter(|c| c.get("type").and_then(Value::as_str) == Some("mcp"))
    else {
        return Ok(());
    };
    let Some((label, name)) = mcp_choice(choice) else {
        return Err(InvalidParam::new("tool_choice.server_label", "is required (a string)"));
    };
    if let Some(k) = c.keys().find(|k| !matches!(k.as_str(), "type" | "server_label" | "name")) {
        return Err(InvalidParam::new(format!("tool_choice.{k}"), format!("unknown field `{k}`")));
    }
    if !servers.iter().any(|s| s.label == label) {
        return Err(InvalidParam::new(
            "tool_choice.server_label",
            format!("no `mcp` tool of this request has server_label `{label}`"),
        ));
    }
    match name {
        Some(name) if catalog.function_of(label, name).is_none() && !failed.contains(&label) => {
            Err(InvalidParam::new(
                "tool_choice.name",
                format!(
                    "MCP server `{label}` offers no tool `{name}` (see its mcp_list_tools and allowed_tools)"
                ),
            ))
        }
        _ => Ok(()),
    }
}

/// The `tool_choice` of generation `round` (0 first), in the chat machinery's terms; `None`
/// when no tool is left to offer.
pub fn for_round(choice: Option<&Value>, round: usize, catalog: &Catalog, any_tools: bool) -> Option<Value> {
    if !any_tools {
        return None;
    }
    if round + 1 >= MAX_ROUNDS {
        return Some(json!("none"));
    }
    if round > 0 {
        return Some(json!("auto"));
    }
    match mcp_choice(choice) {
        // A tool of a server whose listing failed: the model answers without it.
        Some((label, Some(name))) => {
            catalog.function_of(label, name).map(|f| json!({"type": "function", "name": f}))
        }
        Some((_, None)) => Some(json!("required")),
        None => choice.cloned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::responses::mcp::catalog::ToolInfo;
    use crate::responses::mcp::spec::servers;

    fn setup() -> (Vec<McpServer>, Catalog) {
        let tools = json!([{"type": "mcp", "server_label": "calc", "server_url": "http://h/mcp"}]);
        let servers = servers(Some(&tools), &["http://h/".to_owned()]).unwrap();
        let add = ToolInfo {
            name: "add".into(),
            description: None,
            input_schema: json!({"type": "object"}),
            annotations: Value::Null,
        };
        let catalog = Catalog::new(&servers, &[vec![add]], &[]);
        (servers, catalog)
    }

    #[test]
    fn the_first_round_forces_the_tool_and_later_ones_let_go() {
        let (_, catalog) = setup();
        let forced = json!({"type": "mcp", "server_label": "calc", "name": "add"});
        assert_eq!(
            for_round(Some(&forced), 0, &catalog, true),
            Some(json!({"type": "function", "name": "add"}))
        );
        assert_eq!(for_round(Some(&forced), 1, &catalog, true), Some(json!("auto")));
        assert_eq!(for_round(Some(&forced), MAX_ROUNDS - 1, &catalog, true), Some(json!("none")));
        let server = json!({"type": "mcp", "server_label": "calc"});
        assert_eq!(for_round(Some(&server), 0, &catalog, true), Some(json!("required")));
        assert_eq!(for_round(Some(&json!("none")), 0, &catalog, true), Some(json!("none")));
        assert_eq!(for_round(Some(&json!("required")), 0, &catalog, false), None);
        assert_eq!(for_round(Some(&forced), 0, &Catalog::default(), true), None, "its listing failed");
    }

    #[test]
    fn mcp_choices_are_checked() {
        let (servers, catalog) = setup();
        let err = |c: Value, failed: &[&str]| {
            check(Some(&c), &servers, &catalog, failed).err().and_then(|e| e.param)
        };
        assert_eq!(err(json!({"type": "mcp", "server_label": "calc", "name": "add"}), &[]), None);
        assert_eq!(
            err(json!({"type": "mcp", "server_label": "other"}), &[]).as_deref(),
            Some("tool_choice.server_label")
        );
        assert_eq!(
            err(json!({"type": "mcp", "name": "add"}), &[]).as_deref(),
            Some("tool_choice.server_label")
        );
        assert_eq!(
            err(json!({"type": "mcp", "server_label": "calc", "name": "sub"}), &[]).as_deref(),
            Some("tool_choice.name")
        );
        assert_eq!(err(json!({"type": "mcp", "server_label": "calc", "name": "sub"}), &["calc"]), None);
        assert_eq!(
            err(json!({"type": "mcp", "server_label": "calc", "x": 1}), &[]).as_deref(),
            Some("tool_choice.x")
        );
        assert_eq!(check(Some(&json!("auto")), &servers, &catalog, &[]), Ok(()));
    }
}

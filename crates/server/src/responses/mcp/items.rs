//! The MCP output items in OpenAI's shapes (`mcp_list_tools`, `mcp_call`,
//! `mcp_approval_request`), the steps that stream them (`response.output_item.added`/`.done`
//! around `response.mcp_list_tools.*`, `response.mcp_call_arguments.*`, `response.mcp_call.*`),
//! and the conversation's MCP items as the model's prompt sees them: a call and its output.

use serde_json::{json, Value};

use super::catalog::{Catalog, ToolInfo};
use super::client::McpError;
use crate::responses::stream::Step;

pub fn new_id(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::new_v4().simple())
}

pub fn list_tools_item(id: &str, label: &str, tools: &[ToolInfo], error: Option<&str>) -> Value {
    let tools: Vec<Value> = tools.iter().map(ToolInfo::listed).collect();
    let mut item = json!({"type": "mcp_list_tools", "id": id, "server_label": label, "tools": tools});
    if let Some(e) = error {
        item["error"] = json!(e);
    }
    item
}

/// One call of an MCP tool, as it stands.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    pub id: String,
    pub label: String,
    pub name: String,
    pub arguments: String,
    pub approval_request_id: Option<String>,
}

impl Call {
    pub fn item(&self, status: &str, output: Option<&str>, error: Option<&str>) -> Value {
        json!({
            "type": "mcp_call", "id": self.id, "server_label": self.label, "name": self.name,
            "arguments": self.arguments, "output": output, "error": error, "status": status,
            "approval_request_id": self.approval_request_id,
        })
    }

    pub fn approval_request(&self) -> Value {
        json!({
            "type": "mcp_approval_request", "id": self.id, "server_label": self.label,
            "name": self.name, "arguments": self.arguments,
        })
    }
}

/// The steps of listing a server's tools, done: its item added, in progress, then completed
/// (with the tools) or failed (with the error).
pub fn listing_steps(label: &str, result: &Result<Vec<ToolInfo>, McpError>) -> Vec<Step> {
    let id = new_id("mcpl");
    let (tools, error) = match result {
        Ok(tools) => (tools.as_slice(), None),
        Err(e) => (&[][..], Some(e.to_string())),
    };
    let end =
        if error.is_some() { "response.mcp_list_tools.failed" } else { "response.mcp_list_tools.completed" };
    vec![
        Step::ItemAdded(list_tools_item(&id, label, &[], None)),
        Step::ItemEvent("response.mcp_list_tools.in_progress", id.clone(), json!({})),
        Step::ItemEvent(end, id.clone(), json!({})),
        Step::ItemDone(list_tools_item(&id, label, tools, error.as_deref())),
    ]
}

/// The steps of a call about to run: its item added, its arguments, in progress.
pub fn call_started(call: &Call) -> Vec<Step> {
    let args = json!({"delta": call.arguments});
    vec![
        Step::ItemAdded(call.item("in_progress", None, None)),
        Step::ItemEvent("response.mcp_call_arguments.delta", call.id.clone(), args),
        Step::ItemEvent(
            "response.mcp_call_arguments.done",
            call.id.clone(),
            json!({"arguments": call.arguments}),
        ),
        Step::ItemEvent("response.mcp_call.in_progress", call.id.clone(), json!({})),
    ]
}

/// The steps of a call that ran: completed with its output, or failed with the error.
pub fn call_finished(call: &Call, result: &Result<String, McpError>) -> (Vec<Step>, Value) {
    let (name, item) = match result {
        Ok(output) => ("response.mcp_call.completed", call.item("completed", Some(output), None)),
        Err(e) => ("response.mcp_call.failed", call.item("failed", None, Some(&e.to_string()))),
    };
    (vec![Step::ItemEvent(name, call.id.clone(), json!({})), Step::ItemDone(item.clone())], item)
}

/// The steps of a call that waits for the client's approval.
pub fn approval_steps(call: &Call) -> Vec<Step> {
    let item = call.approval_request();
    vec![Step::ItemAdded(item.clone()), Step::ItemDone(item)]
}

fn str_of<'a>(item: &'a Value, key: &str) -> &'a str {
    item.get(key).and_then(Value::as_str).unwrap_or_default()
}

/// The function name the model knows `label`'s tool `name` by: the catalog's, or the
/// label-qualified name for a tool this request does not offer (an earlier turn's).
pub fn function_name(catalog: &Catalog, label: &str, name: &str) -> String {
    catalog.function_of(label, name).map_or_else(|| format!("{label}__{name}"), str::to_owned)
}

/// A function call and its output, as the prompt shows a call of the server's.
pub fn as_function_call(
    catalog: &Catalog,
    call_id: &str,
    label: &str,
    name: &str,
    arguments: &str,
    output: &str,
) -> [Value; 2] {
    // The chat machinery wants an object; a model's broken arguments are shown as none.
    let arguments = match serde_json::from_str::<Value>(arguments) {
        Ok(v @ Value::Object(_)) => v.to_string(),
        _ => "{}".to_owned(),
    };
    [
        json!({"type": "function_call", "id": format!("fc_{call_id}"), "call_id": call_id,
               "name": function_name(catalog, label, name), "arguments": arguments}),
        json!({"type": "function_call_output", "id": format!("fco_{call_id}"), "call_id": call_id,
               "output": output}),
    ]
}

/// The conversation's items as the prompt's: an `mcp_call` becomes a function call and its
/// output (the error, when it failed); tool listings, approval requests and responses are
/// the server's business, left out.
pub fn prompt_items(items: &[Value], catalog: &Catalog) -> Vec<Value> {
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        match str_of(item, "type") {
            "mcp_call" => {
                let output = match item.get("error").and_then(Value::as_str) {
                    Some(e) => format!("error: {e}"),
                    None => str_of(item, "output").to_owned(),
                };
                out.extend(as_function_call(
                    catalog,
                    str_of(item, "id"),
                    str_of(item, "server_label"),
                    str_of(item, "name"),
                    str_of(item, "arguments"),
                    &output,
                ));
            }
            "mcp_list_tools" | "mcp_approval_request" | "mcp_approval_response" => {}
            _ => out.push(item.clone()),
        }
    }
    out
}

/// The tools an earlier `mcp_list_tools` item of the conversation listed for `label`, if any
/// (without an error): OpenAI lists a server once per conversation.
pub fn listed_before(items: &[Value], label: &str) -> Option<Vec<ToolInfo>> {
    items
        .iter()
        .rev()
        .find(|i| {
            str_of(i, "type") == "mcp_list_tools"
                && str_of(i, "server_label") == label
                && i.get("error").is_none_or(Value::is_null)
        })
        .and_then(|i| i.get("tools")?.as_array()?.iter().map(ToolInfo::from_listed).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_become_a_call_and_its_output_and_listings_are_left_out() {
        let items = vec![
            json!({"type": "message", "role": "user", "content": "hi"}),
            list_tools_item("mcpl_1", "calc", &[], None),
            json!({"type": "mcp_call", "id": "mcp_1", "server_label": "calc", "name": "add",
                   "arguments": "{\"a\":1}", "output": "3", "error": null}),
            json!({"type": "mcp_call", "id": "mcp_2", "server_label": "calc", "name": "add",
                   "arguments": "oops", "output": null, "error": "boom"}),
            json!({"type": "mcp_approval_request", "id": "mcpr_1", "server_label": "calc", "name": "add",
                   "arguments": "{}"}),
        ];
        let out = prompt_items(&items, &Catalog::default());
        let kinds: Vec<&str> = out.iter().map(|i| str_of(i, "type")).collect();
        assert_eq!(
            kinds,
            ["message", "function_call", "function_call_output", "function_call", "function_call_output"]
        );
        assert_eq!(out[1]["name"], "calc__add");
        assert_eq!(out[2]["output"], "3");
        assert_eq!(out[3]["arguments"], "{}");
        assert_eq!(out[4]["output"], "error: boom");
    }

    #[test]
    fn a_listing_is_found_again_unless_it_failed() {
        let tool = ToolInfo {
            name: "add".into(),
            description: Some("adds".into()),
            input_schema: json!({"type": "object"}),
            annotations: Value::Null,
        };
        let items = vec![
            list_tools_item("a", "calc", std::slice::from_ref(&tool), None),
            list_tools_item("b", "other", &[], Some("down")),
        ];
        assert_eq!(listed_before(&items, "calc"), Some(vec![tool]));
        assert_eq!(listed_before(&items, "other"), None);
        assert_eq!(listed_before(&items, "none"), None);
    }

    #[test]
    fn a_failed_call_has_its_error_and_no_output() {
        let call = Call {
            id: "mcp_1".into(),
            label: "c".into(),
            name: "echo".into(),
            arguments: "{}".into(),
            approval_request_id: None,
        };
        let (steps, item) = call_finished(&call, &Err(McpError::Timeout(3)));
        assert_eq!(item["status"], "failed");
        assert!(item["output"].is_null());
        assert!(item["error"].as_str().unwrap().contains("3 s"));
        assert!(matches!(steps[0], Step::ItemEvent("response.mcp_call.failed", _, _)));
    }
}

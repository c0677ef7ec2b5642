//! Responses requests with `mcp` tools. The fuzz server allows no MCP server (no
//! `--allow-mcp-servers`), so every one is a 400 before any MCP traffic: a well-formed tool for
//! its `server_url` (random hosts, schemes and tricks), a malformed one for its bad field. Either
//! way a 400 in OpenAI's shape, never a 500 and never a hang.

use serde_json::{json, Value};

use super::gen::{text, Case, Expect, Rng, MODEL};

fn server_url(rng: &mut Rng) -> Value {
    let port = rng.range(1, 65535);
    let host = rng
        .pick(&["127.0.0.1", "localhost", "10.0.0.1", "169.254.169.254", "[::1]", "example.com"])
        .to_string();
    let path = rng.pick(&["/mcp", "/", "", "/mcp/../admin", "/%2e%2e/x", "?q=1"]).to_string();
    let url = match rng.below(8) {
        0 => format!("https://{host}:{port}{path}"),
        1 => format!("http://user@{host}:{port}{path}"),
        2 => format!("file:///etc/passwd{path}"),
        3 => return json!(port),
        4 => String::new(),
        _ => format!("http://{host}:{port}{path}"),
    };
    json!(url)
}

/// One `mcp` tool: well-formed but for its URL, or malformed.
fn mcp_tool(rng: &mut Rng) -> Value {
    let mut tool = json!({"type": "mcp", "server_label": "srv", "server_url": server_url(rng)});
    let extra = [
        ("require_approval", json!("never")),
        ("require_approval", json!({"never": {"tool_names": ["add"]}})),
        ("require_approval", json!("sometimes")),
        ("require_approval", json!(7)),
        ("allowed_tools", json!(["add", "echo"])),
        ("allowed_tools", json!({"tool_names": ["add"], "read_only": true})),
        ("allowed_tools", json!("add")),
        ("headers", json!({"X-Key": "v"})),
        ("headers", json!({"bad header": "v"})),
        ("headers", json!(["x"])),
        ("server_label", json!("")),
        ("server_label", json!("a b")),
        ("server_label", json!(null)),
        ("server_url", json!(null)),
        ("connector_id", json!("connector_gmail")),
        ("authorization", json!(5)),
        ("server_description", json!("tools")),
        ("bogus", json!(true)),
    ];
    for _ in 0..rng.below(3) {
        let (key, value) = rng.pick(&extra).clone();
        tool[key] = value;
    }
    tool
}

/// A Responses request with one or two `mcp` tools (maybe beside a function tool, maybe an
/// MCP `tool_choice`, an approval response in its input), expected to be a 400.
pub fn mcp_request(rng: &mut Rng, case: &mut Case) {
    let mut tools = vec![mcp_tool(rng)];
    if rng.chance(30) {
        tools.push(json!({"type": "function", "name": "now", "parameters": {"type": "object"}}));
    }
    if rng.chance(20) {
        tools.push(mcp_tool(rng));
    }
    let mut body = json!({"model": MODEL, "input": text(rng), "max_output_tokens": 2, "tools": tools});
    if rng.chance(30) {
        body["tool_choice"] = json!({"type": "mcp", "server_label": "srv", "name": "add"});
    }
    if rng.chance(20) {
        let approve = rng.chance(50);
        body["input"] =
            json!([{"type": "mcp_approval_response", "approval_request_id": "mcpr_x", "approve": approve}]);
    }
    if rng.chance(20) {
        body["stream"] = json!(true);
    }
    case.what.push(format!("mcp tools {:.200}", body["tools"]));
    case.body = serde_json::to_vec(&body).expect("a Value serializes");
    case.expect = Expect::Status(400);
}

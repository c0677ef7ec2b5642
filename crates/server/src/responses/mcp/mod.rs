//! Remote MCP tools in the Responses API (`{"type": "mcp", "server_label", "server_url", ...}`):
//! the server itself lists an allowed MCP server's tools, offers them to the model, calls them
//! when the model does and feeds the results back, emitting OpenAI's `mcp_list_tools`,
//! `mcp_call` and `mcp_approval_request` items. [`spec`] checks the tools and the allow-list,
//! [`catalog`] names the offered tools for the model, [`choice`] handles `tool_choice`,
//! [`client`] talks to an MCP server,
//! [`items`] makes the items and their stream steps, [`approval`] reads the client's approval
//! answers and [`run`] drives the generations and calls.

pub mod approval;
pub mod catalog;
pub mod choice;
pub mod client;
pub mod items;
pub mod run;
pub mod spec;

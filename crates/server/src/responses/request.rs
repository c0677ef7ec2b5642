//! A Responses request as a [`ChatTurn`]. Input items become chat messages: `message` items by
//! role (`developer` as `system`), `function_call` items the assistant's tool calls,
//! `function_call_output` items `tool` messages; `reasoning` items are left out of the prompt, as
//! reasoning models' templates leave out earlier turns' reasoning. `instructions` comes first as
//! a system message. Tools, `tool_choice`, `text.format` and `reasoning.effort` become the chat
//! machinery's tools, grammar and template kwargs.

use serde_json::{json, Map, Value};

use super::wire::ResponsesRequest;
use crate::config::HostedToolsPolicy;
use crate::conversation::ChatTurn;
use crate::error::{ApiError, InvalidParam};
use crate::media::collect::PartsText;
use crate::media::ImageCollector;
use crate::openai::CommonParams;
use crate::prompt::ChatOptions;
use crate::state::AppState;
use crate::structured::{response_format_at, RequestedGrammar};
use crate::tools::hosted::{is_openai_hosted, note_ignored};
use crate::tools::ToolRequest;
use pagoda_text::ChatMessage;

fn invalid(param: impl Into<String>, message: impl Into<String>) -> InvalidParam {
    InvalidParam::new(param, message)
}

fn new_id(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::new_v4().simple())
}

/// This request's input as items, each with an `id` (as `input_items` lists them).
pub fn input_items(input: Option<&Value>) -> Result<Vec<Value>, InvalidParam> {
    let items = match input {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::String(text)) => {
            return Ok(vec![json!({
                "type": "message", "id": new_id("msg"), "role": "user", "status": "completed",
                "content": [{"type": "input_text", "text": text}],
            })])
        }
        Some(Value::Array(items)) => items,
        Some(_) => return Err(invalid("input", "must be a string or a list of items")),
    };
    items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let mut item = item.as_object().cloned().ok_or_else(|| invalid(format!("input[{i}]"), "an item must be an object"))?;
            let kind = match item.get("type") {
                None if item.contains_key("role") => "message".to_owned(),
                Some(Value::String(t)) => t.clone(),
                _ => return Err(invalid(format!("input[{i}].type"), "an item needs a `type`")),
            };
            let prefix = match kind.as_str() {
                "message" => "msg",
                "function_call" => "fc",
                "function_call_output" => "fco",
                "reasoning" => "rs",
                // The server's own MCP items, given back by a client that keeps its state.
                "mcp_list_tools" => "mcpl",
                "mcp_call" => "mcp",
                "mcp_approval_request" => "mcpr",
                "mcp_approval_response" => "mcpa",
                other => {
                    return Err(invalid(
                        format!("input[{i}].type"),
                        format!("`{other}` items are not supported: give message, function_call, function_call_output, reasoning or mcp_* items"),
                    ))
                }
            };
            // Listed as OpenAI lists input items: string content as one text part, a status.
            if kind == "message" {
                let assistant = item.get("role").and_then(Value::as_str) == Some("assistant");
                match item.get_mut("content") {
                    Some(content @ Value::String(_)) => {
                        let text = content.take();
                        *content = if assistant {
                            json!([{"type": "output_text", "text": text, "annotations": []}])
                        } else {
                            json!([{"type": "input_text", "text": text}])
                        };
                    }
                    Some(Value::Array(parts)) => {
                        for part in parts.iter_mut().filter(|p| p["type"] == "output_text") {
                            if let Some(p) = part.as_object_mut() {
                                p.entry("annotations").or_insert_with(|| json!([]));
                            }
                        }
                    }
                    _ => {}
                }
            }
            if !kind.starts_with("mcp") && kind != "reasoning" && !item.contains_key("status") {
                item.insert("status".into(), json!("completed"));
            }
            item.insert("type".into(), Value::String(kind));
            if !item.get("id").is_some_and(Value::is_string) {
                item.insert("id".into(), Value::String(new_id(prefix)));
            }
            Ok(Value::Object(item))
        })
        .collect()
}

fn only_keys(p: &str, item: &Map<String, Value>, keys: &[&str]) -> Result<(), InvalidParam> {
    match item.keys().find(|k| !keys.contains(&k.as_str())) {
        Some(k) => Err(invalid(
            format!("{p}.{k}"),
            format!("unknown field `{k}` in a `{}` item", item["type"].as_str().unwrap_or("")),
        )),
        None => Ok(()),
    }
}

fn string_field<'a>(p: &str, item: &'a Map<String, Value>, key: &str) -> Result<&'a str, InvalidParam> {
    item.get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| invalid(format!("{p}.{key}"), "is required (a string)"))
}

/// A message's content: a string or `input_text` / `output_text` / `refusal` parts, and in a
/// user message `input_image` parts (handed to `images`).
fn content_text(
    p: &str,
    content: Option<&Value>,
    role: &str,
    images: &mut ImageCollector,
) -> Result<String, InvalidParam> {
    match content {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut texts = PartsText::new("");
            for (j, part) in parts.iter().enumerate() {
                let pp = format!("{p}[{j}]");
                let text = match part.get("type").and_then(Value::as_str) {
                    Some("input_text" | "output_text" | "text") => part.get("text"),
                    Some("refusal") => part.get("refusal"),
                    Some("input_image") if role == "user" => {
                        images.check(&pp)?;
                        let image = crate::media::parts::responses_input_image(&pp, part)?;
                        texts.push_image(images.push(&pp, image)?);
                        continue;
                    }
                    Some("input_image") => {
                        return Err(invalid(pp, "only user messages may hold `input_image` parts"))
                    }
                    Some(other @ ("input_file" | "input_audio")) => {
                        return Err(invalid(pp, format!("`{other}` parts are not supported by this server")))
                    }
                    Some(other) => return Err(invalid(pp, format!("`{other}` parts are not supported"))),
                    None => return Err(invalid(pp, "a part needs a `type`")),
                };
                texts.push_text(
                    text.and_then(Value::as_str).ok_or_else(|| invalid(&pp, "the part's text is missing"))?,
                );
            }
            Ok(texts.finish())
        }
        _ => Err(invalid(p, "content must be a string or a list of parts")),
    }
}

/// Chat messages of the conversation's items (earlier turns' and this request's).
/// `first_new` is the index of this request's first item, for parameter names. Image parts are
/// refused (a text-only model).
pub fn messages(
    instructions: Option<&str>,
    items: &[Value],
    first_new: usize,
) -> Result<Vec<ChatMessage>, InvalidParam> {
    messages_with(instructions, items, first_new, &mut ImageCollector::text_only())
}

/// [`messages`], handing user messages' `input_image` parts to `images`.
pub fn messages_with(
    instructions: Option<&str>,
    items: &[Value],
    first_new: usize,
    images: &mut ImageCollector,
) -> Result<Vec<ChatMessage>, InvalidParam> {
    let mut out: Vec<ChatMessage> = Vec::with_capacity(items.len() + 1);
    if let Some(text) = instructions {
        out.push(ChatMessage::new("system", text));
    }
    let mut calls: Vec<(String, String)> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let p = if i >= first_new {
            format!("input[{}]", i - first_new)
        } else {
            "previous_response_id".to_owned()
        };
        let item = item.as_object().ok_or_else(|| invalid(&p, "an item must be an object"))?;
        match item.get("type").and_then(Value::as_str).unwrap_or("message") {
            "message" => {
                only_keys(&p, item, &["type", "id", "role", "content", "status", "phase"])?;
                let role = match item.get("role").and_then(Value::as_str) {
                    Some("system" | "developer") => "system",
                    Some(r @ ("user" | "assistant")) => r,
                    _ => {
                        return Err(invalid(
                            format!("{p}.role"),
                            "role must be user, assistant, system or developer",
                        ))
                    }
                };
                let content = content_text(&format!("{p}.content"), item.get("content"), role, images)?;
                out.push(ChatMessage::new(role, content));
            }
            "function_call" => {
                only_keys(&p, item, &["type", "id", "call_id", "name", "arguments", "status", "namespace"])?;
                let call_id = string_field(&p, item, "call_id")?;
                let name = string_field(&p, item, "name")?;
                let arguments = match serde_json::from_str::<Value>(string_field(&p, item, "arguments")?) {
                    Ok(v @ Value::Object(_)) => v,
                    _ => return Err(invalid(format!("{p}.arguments"), "must be a JSON object, as a string")),
                };
                calls.push((call_id.to_owned(), name.to_owned()));
                let call = json!({"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}});
                // Calls right after an assistant message (or other calls) belong to it.
                match out.last_mut() {
                    Some(m) if m.role == "assistant" => m.tool_calls.get_or_insert_with(Vec::new).push(call),
                    _ => {
                        let mut m = ChatMessage::new("assistant", "");
                        m.tool_calls = Some(vec![call]);
                        out.push(m);
                    }
                }
            }
            "function_call_output" => {
                only_keys(&p, item, &["type", "id", "call_id", "output", "status"])?;
                let call_id = string_field(&p, item, "call_id")?;
                let name =
                    calls.iter().find(|(id, _)| id == call_id).map(|(_, n)| n.clone()).ok_or_else(|| {
                        invalid(
                            format!("{p}.call_id"),
                            format!("No tool call found for function call output with call_id {call_id}."),
                        )
                    })?;
                let output = content_text(&format!("{p}.output"), item.get("output"), "tool", images)?;
                let mut m = ChatMessage::new("tool", output);
                m.tool_call_id = Some(call_id.to_owned());
                m.name = Some(name);
                out.push(m);
            }
            // Earlier reasoning stays out of the prompt.
            _ => {}
        }
    }
    if !out.iter().any(|m| m.role != "system") {
        return Err(invalid("input", "the conversation has no message to answer"));
    }
    Ok(out)
}

/// Function tools and the tool choice as a [`ToolRequest`] (`None` when no tool may be called).
/// The namespace of each function tool given inside a `namespace` tool: the model sees the
/// functions by name, and its calls name their namespace again.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ToolNamespaces(Vec<(String, String)>);

impl ToolNamespaces {
    /// The namespace of function `name`, if it came in one.
    pub fn of(&self, name: &str) -> Option<&str> {
        self.0.iter().find(|(n, _)| n == name).map(|(_, ns)| ns.as_str())
    }
}

/// One `function` tool in the chat tool shape.
fn function_tool(p: &str, obj: &Map<String, Value>) -> Result<Value, InvalidParam> {
    only_keys(p, obj, &["type", "name", "description", "parameters", "strict"])?;
    let mut function = obj.clone();
    function.remove("type");
    Ok(json!({"type": "function", "function": function}))
}

fn tools(
    req: &ResponsesRequest,
    hosted_tools: HostedToolsPolicy,
) -> Result<(Option<ToolRequest>, ToolNamespaces), InvalidParam> {
    let list = match &req.tools {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(list)) => list.clone(),
        Some(_) => return Err(invalid("tools", "must be a list of tools")),
    };
    let mut functions = Vec::with_capacity(list.len());
    let mut namespaces = ToolNamespaces::default();
    let mut ignored: Vec<&str> = Vec::new();
    for (i, tool) in list.iter().enumerate() {
        let p = format!("tools[{i}]");
        let obj = tool.as_object().ok_or_else(|| invalid(&p, "must be an object"))?;
        match obj.get("type").and_then(Value::as_str) {
            Some("function") => {}
            Some("namespace") => {
                only_keys(&p, obj, &["type", "name", "description", "tools"])?;
                let ns = string_field(&p, obj, "name")?;
                let nested = obj
                    .get("tools")
                    .and_then(Value::as_array)
                    .ok_or_else(|| invalid(format!("{p}.tools"), "must be a list of function tools"))?;
                for (j, t) in nested.iter().enumerate() {
                    let tp = format!("{p}.tools[{j}]");
                    let t =
                        t.as_object().filter(|t| t.get("type").and_then(Value::as_str) == Some("function"));
                    let t = t.ok_or_else(|| invalid(&tp, "a namespace holds `function` tools"))?;
                    functions.push(function_tool(&tp, t)?);
                    namespaces.0.push((string_field(&tp, t, "name")?.to_owned(), ns.to_owned()));
                }
                continue;
            }
            Some(hosted) if is_openai_hosted(hosted) && hosted_tools == HostedToolsPolicy::Ignore => {
                ignored.push(hosted);
                continue;
            }
            Some(other) => {
                let why = if is_openai_hosted(other) { " (--hosted-tools reject)" } else { "" };
                return Err(invalid(
                    format!("{p}.type"),
                    format!(
                        "built-in tool `{other}` is not supported by this server{why}: give `function` tools"
                    ),
                ));
            }
            None => return Err(invalid(format!("{p}.type"), "is required")),
        }
        functions.push(function_tool(&p, obj)?);
    }
    let choice = match &req.tool_choice {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(json!(s)),
        Some(Value::Object(c)) => {
            match (c.get("type").and_then(Value::as_str), c.get("name").and_then(Value::as_str)) {
                (Some("function"), Some(name)) => {
                    Some(json!({"type": "function", "function": {"name": name}}))
                }
                (Some(hosted), _) if is_openai_hosted(hosted) => {
                    return Err(invalid(
                        "tool_choice.type",
                        format!("forces the hosted tool `{hosted}`, which this server does not run: use auto, required, none or a function"),
                    ))
                }
                (Some(other), _) if other != "function" => {
                    return Err(invalid(
                        "tool_choice.type",
                        format!("`{other}` is not supported: use auto, required, none or a function"),
                    ))
                }
                _ => return Err(invalid("tool_choice", "a function choice needs `name`")),
            }
        }
        Some(_) => return Err(invalid("tool_choice", "must be a string or an object")),
    };
    if functions.is_empty() && !ignored.is_empty() && choice.as_ref().is_some_and(|c| c == "required") {
        return Err(invalid(
            "tool_choice",
            format!(
                "`required` needs a function tool: the hosted tools given ({}) are not run by this server",
                ignored.join(", ")
            ),
        ));
    }
    note_ignored(ignored);
    let parsed = ToolRequest::parse(Some(&Value::Array(functions)), choice.as_ref(), req.parallel_tool_calls)
        .map_err(|e| InvalidParam {
            param: e.param.map(|p| p.replace(".function.", ".")),
            message: e.message,
        })?;
    Ok((parsed.filter(ToolRequest::active), namespaces))
}

/// `text.format` as a requested grammar.
fn text_format(text: Option<&Value>) -> Result<Option<RequestedGrammar>, InvalidParam> {
    let Some(text) = text.filter(|v| !v.is_null()) else { return Ok(None) };
    let obj = text.as_object().ok_or_else(|| invalid("text", "must be an object"))?;
    if let Some(k) = obj.keys().find(|k| !matches!(k.as_str(), "format" | "verbosity")) {
        return Err(invalid(format!("text.{k}"), format!("unknown field `{k}`")));
    }
    match obj.get("verbosity") {
        None | Some(Value::Null) => {}
        Some(Value::String(v)) if v == "medium" => {}
        Some(_) => {
            return Err(invalid("text.verbosity", "only `medium` verbosity is available: the model's own"))
        }
    }
    let Some(format) = obj.get("format").filter(|v| !v.is_null()) else { return Ok(None) };
    let response_format = match format.get("type").and_then(Value::as_str) {
        Some("text") => return Ok(None),
        Some("json_object") => json!({"type": "json_object"}),
        Some("json_schema") => {
            let mut schema = format.clone();
            if let Some(o) = schema.as_object_mut() {
                o.remove("type");
            }
            if schema.get("name").and_then(Value::as_str).is_none() {
                return Err(invalid("text.format.name", "is required"));
            }
            json!({"type": "json_schema", "json_schema": schema})
        }
        _ => return Err(invalid("text.format.type", "must be text, json_object or json_schema")),
    };
    response_format_at("text.format", &response_format)
}

/// `reasoning` as template kwargs: `enable_thinking` (false only for effort `none`) and
/// `reasoning_effort`.
fn reasoning(
    state: &AppState,
    value: Option<&Value>,
    kwargs: &mut Map<String, Value>,
) -> Result<(), InvalidParam> {
    let Some(obj) = value.filter(|v| !v.is_null()) else { return Ok(()) };
    let obj = obj.as_object().ok_or_else(|| invalid("reasoning", "must be an object"))?;
    if let Some(k) = obj.keys().find(|k| !matches!(k.as_str(), "effort" | "summary" | "generate_summary")) {
        return Err(invalid(format!("reasoning.{k}"), format!("unknown field `{k}`")));
    }
    // The reasoning comes whole, in the item's `content`: no summarizer runs here, which is
    // what `auto` (the model's own, if any) gives; a summary asked for by name cannot be made.
    for key in ["summary", "generate_summary"] {
        match obj.get(key) {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) if s == "auto" => {}
            Some(Value::String(s)) if matches!(s.as_str(), "concise" | "detailed") => {
                return Err(invalid(
                    format!("reasoning.{key}"),
                    format!("`{s}` summaries are not made by this server: the reasoning itself is in the reasoning item's content; use `auto` or leave it out"),
                ))
            }
            Some(_) => return Err(invalid(format!("reasoning.{key}"), "must be auto, concise or detailed")),
        }
    }
    match obj.get("effort") {
        None | Some(Value::Null) => {}
        Some(Value::String(e)) if e == "none" => {
            kwargs.insert("enable_thinking".into(), Value::Bool(false));
        }
        Some(Value::String(e)) if matches!(e.as_str(), "minimal" | "low" | "medium" | "high" | "xhigh") => {
            if state.reasoning.is_none() {
                return Err(invalid(
                    "reasoning.effort",
                    "this server runs no reasoning model (start it with --reasoning-parser); leave `reasoning` out",
                ));
            }
            kwargs.insert("enable_thinking".into(), Value::Bool(true));
            kwargs.insert("reasoning_effort".into(), Value::String(e.clone()));
        }
        Some(_) => {
            return Err(invalid("reasoning.effort", "must be none, minimal, low, medium, high or xhigh"))
        }
    }
    Ok(())
}

/// The request as a turn over `items` (and the namespaces of its namespaced tools) (earlier turns' items, then this request's from
/// `first_new` on).
pub fn chat_turn(
    state: &AppState,
    req: &ResponsesRequest,
    items: &[Value],
    first_new: usize,
) -> Result<(ChatTurn, ToolNamespaces), ApiError> {
    if let Some(include) = &req.include {
        if let Some(bad) = include.iter().find(|i| i.as_str() != "reasoning.encrypted_content") {
            return Err(ApiError::invalid(
                "include",
                format!("`{bad}` cannot be included: only reasoning.encrypted_content is available"),
            ));
        }
    }
    match req.truncation.as_deref() {
        None | Some("auto" | "disabled") => {}
        Some(other) => {
            return Err(ApiError::invalid("truncation", format!("must be auto or disabled, got `{other}`")))
        }
    }
    if req.max_output_tokens == Some(0) {
        return Err(ApiError::invalid("max_output_tokens", "max_output_tokens must be at least 1"));
    }
    let mut images = state.media.collector();
    let messages = messages_with(req.instructions.as_deref(), items, first_new, &mut images)?;
    let (tools, namespaces) = tools(req, state.hosted_tools)?;
    let grammar = text_format(req.text.as_ref())?;
    let mut kwargs = Map::new();
    reasoning(state, req.reasoning.as_ref(), &mut kwargs)?;
    let options = ChatOptions::of(&messages, Some(true), Some(false), None, Some(kwargs))?;
    let params = CommonParams {
        max_tokens: req.max_output_tokens,
        max_tokens_param: "max_output_tokens",
        temperature: req.temperature,
        top_p: req.top_p,
        logprobs_param: "top_logprobs",
        skip_special_tokens: true,
        ..Default::default()
    };
    let turn = ChatTurn {
        messages,
        images: images.into_images(),
        options,
        tools,
        grammar,
        params,
        prompt_param: "input",
        clamp_max_tokens: false,
        reasoning_budget: None,
        prompt_logprobs: None,
        lora: None,
        kv_transfer: None,
    };
    Ok((turn, namespaces))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_become_messages_with_calls_and_outputs() {
        let items = input_items(Some(&json!([
            {"role": "developer", "content": "be brief"},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "weather?"}]},
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "rain"},
        ])))
        .unwrap();
        assert!(items.iter().all(|i| i["id"].is_string()));
        assert_eq!(items[0]["content"], json!([{"type": "input_text", "text": "be brief"}]));
        assert_eq!(items[3]["status"], "completed");
        let out = messages(Some("You are terse."), &items, 0).unwrap();
        let roles: Vec<&str> = out.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "system", "user", "assistant", "tool"]);
        assert_eq!(out[3].tool_calls.as_ref().unwrap()[0]["function"]["arguments"], json!({"city": "Oslo"}));
        assert_eq!((out[4].name.as_deref(), out[4].content.as_str()), (Some("get_weather"), "rain"));
    }

    #[test]
    fn bad_items_are_named() {
        let p = |input: Value| {
            let items = input_items(Some(&input)).and_then(|items| messages(None, &items, 0).map(|_| ()));
            items.unwrap_err().param.unwrap()
        };
        assert_eq!(
            p(json!([{"type": "function_call_output", "call_id": "nope", "output": "x"}])),
            "input[0].call_id"
        );
        assert_eq!(
            p(json!([{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}])),
            "input[0].content[0]"
        );
        assert_eq!(p(json!([{"type": "web_search_call"}])), "input[0].type");
        assert_eq!(p(json!([["user", "hi"]])), "input[0]");
        assert_eq!(p(json!([{"role": "tool", "content": "x"}])), "input[0].role");
        assert_eq!(p(json!(5)), "input");
    }

    #[test]
    fn namespaced_tools_are_flattened_and_remembered() {
        let req: ResponsesRequest = serde_json::from_value(json!({"tools": [
            {"type": "function", "name": "exec", "parameters": {"type": "object"}},
            {"type": "namespace", "name": "agents_v1", "description": "d", "tools": [
                {"type": "function", "name": "spawn_agent", "parameters": {"type": "object"}}]}]}))
        .unwrap();
        let (tools, ns) = tools(&req, HostedToolsPolicy::Ignore).unwrap();
        assert_eq!(tools.unwrap().tools.len(), 2);
        assert_eq!((ns.of("spawn_agent"), ns.of("exec")), (Some("agents_v1"), None));
        let bad: ResponsesRequest = serde_json::from_value(json!({"tools": [
            {"type": "namespace", "name": "n", "tools": [{"type": "web_search"}]}]}))
        .unwrap();
        assert_eq!(
            super::tools(&bad, HostedToolsPolicy::Ignore).unwrap_err().param.as_deref(),
            Some("tools[0].tools[0]")
        );
    }

    #[test]
    fn hosted_tools_are_left_out_or_refused_as_the_policy_says() {
        let req = |v: Value| serde_json::from_value::<ResponsesRequest>(v).unwrap();
        let err = |v: Value, policy| tools(&req(v), policy).unwrap_err().param.unwrap();
        let function = json!({"type": "function", "name": "exec", "parameters": {"type": "object"}});
        let search = json!({"type": "web_search", "external_web_access": false});
        let both = json!({"tools": [function, search]});
        let (kept, _) = tools(&req(both.clone()), HostedToolsPolicy::Ignore).unwrap();
        assert_eq!(
            kept.unwrap().raw,
            [json!({"type": "function", "function": {"name": "exec", "parameters": {"type": "object"}}})]
        );
        assert_eq!(err(both, HostedToolsPolicy::Reject), "tools[1].type");
        // Only hosted tools: no tool is left for the model.
        let (kept, _) =
            tools(&req(json!({"tools": [search], "tool_choice": "auto"})), HostedToolsPolicy::Ignore)
                .unwrap();
        assert!(kept.is_none());
        let forced = json!({"tools": [search], "tool_choice": {"type": "web_search"}});
        assert_eq!(err(forced, HostedToolsPolicy::Ignore), "tool_choice.type");
        assert_eq!(
            err(json!({"tools": [search], "tool_choice": "required"}), HostedToolsPolicy::Ignore),
            "tool_choice"
        );
        for client_run in ["mcp", "local_shell", "custom", "shell"] {
            assert_eq!(
                err(json!({"tools": [{"type": client_run}]}), HostedToolsPolicy::Ignore),
                "tools[0].type"
            );
        }
    }

    #[test]
    fn formats_map_onto_the_grammar_fields() {
        let schema = json!({"format": {"type": "json_schema", "name": "c", "schema": {"type": "object"}, "strict": true}});
        let g = text_format(Some(&schema)).unwrap().unwrap();
        assert_eq!(g.param, "text.format.schema");
        assert!(text_format(Some(&json!({"format": {"type": "text"}}))).unwrap().is_none());
        assert_eq!(
            text_format(Some(&json!({"format": {"type": "xml"}}))).unwrap_err().param.as_deref(),
            Some("text.format.type")
        );
        assert_eq!(
            text_format(Some(&json!({"format": {"type": "json_schema", "schema": {}}})))
                .unwrap_err()
                .param
                .as_deref(),
            Some("text.format.name")
        );
    }
}

//! A Messages request as a [`ChatTurn`]: the system prompt and turns become chat messages
//! (tool uses become assistant tool calls, tool results `tool` messages, history thinking is
//! left out as Anthropic leaves it out), the tools and tool choice become OpenAI's, which the
//! tool machinery reads, and `thinking` switches the template's `enable_thinking`.

use serde_json::{json, Map, Value};

use super::wire::{CountTokensRequest, MessagesRequest};
use crate::config::HostedToolsPolicy;
use crate::conversation::ChatTurn;
use crate::error::{ApiError, InvalidParam};
use crate::media::collect::PartsText;
use crate::media::ImageCollector;
use crate::openai::{CommonParams, StopSpec};
use crate::prompt::ChatOptions;
use crate::state::AppState;
use crate::structured::{response_format_at, RequestedGrammar};
use crate::tools::hosted::{is_anthropic_server_tool, note_ignored};
use crate::tools::ToolRequest;
use pagoda_text::ChatMessage;

fn invalid(param: impl Into<String>, message: impl Into<String>) -> InvalidParam {
    InvalidParam::new(param, message)
}

/// The text of a `system` field or of a `tool_result`'s content: a string or `text` blocks.
fn text_of(param: &str, value: &Value) -> Result<String, InvalidParam> {
    match value {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            let mut texts = Vec::with_capacity(blocks.len());
            for (j, block) in blocks.iter().enumerate() {
                let p = format!("{param}[{j}]");
                match block.get("type").and_then(Value::as_str) {
                    Some("text") => texts.push(
                        block
                            .get("text")
                            .and_then(Value::as_str)
                            .ok_or_else(|| invalid(&p, "a text block needs a `text` string"))?,
                    ),
                    Some(other @ ("image" | "document" | "search_result")) => {
                        return Err(invalid(p, unsupported_block(other)))
                    }
                    Some(other) => return Err(invalid(p, format!("`{other}` blocks are not allowed here"))),
                    None => return Err(invalid(p, "a block needs a `type`")),
                }
            }
            Ok(texts.join("\n"))
        }
        _ => Err(invalid(param, "must be a string or a list of text blocks")),
    }
}

fn unsupported_block(kind: &str) -> String {
    match kind {
        "image" => {
            "`image` blocks are taken only in a user message's content (and only by a vision model)".into()
        }
        _ => format!("`{kind}` blocks are not supported by this server"),
    }
}

/// Where each tool use of the conversation so far was made: its id and tool name.
#[derive(Default)]
struct CallsSoFar(Vec<(String, String)>);

impl CallsSoFar {
    fn name_of(&self, id: &str) -> Option<&str> {
        self.0.iter().find(|(i, _)| i == id).map(|(_, name)| name.as_str())
    }
}

/// One turn's messages (a user turn with tool results is several chat messages).
fn turn(
    i: usize,
    value: &Value,
    calls: &mut CallsSoFar,
    images: &mut ImageCollector,
) -> Result<Vec<ChatMessage>, InvalidParam> {
    let p = format!("messages[{i}]");
    let obj = value.as_object().ok_or_else(|| invalid(&p, "a message must be an object"))?;
    if let Some(key) = obj.keys().find(|k| !matches!(k.as_str(), "role" | "content")) {
        return Err(invalid(format!("{p}.{key}"), format!("unknown message field `{key}`")));
    }
    let role = match obj.get("role").and_then(Value::as_str) {
        Some(r @ ("user" | "assistant")) => r,
        // A system message between turns (Claude Code sends them).
        Some("system") => {
            let text = text_of(&format!("{p}.content"), obj.get("content").unwrap_or(&Value::Null))?;
            return Ok(if text.is_empty() { Vec::new() } else { vec![ChatMessage::new("system", text)] });
        }
        _ => return Err(invalid(format!("{p}.role"), "role must be `user`, `assistant` or `system`")),
    };
    let blocks = match obj.get("content") {
        Some(Value::String(s)) => return Ok(vec![ChatMessage::new(role, s.clone())]),
        Some(Value::Array(blocks)) => blocks,
        _ => return Err(invalid(format!("{p}.content"), "content must be a string or a list of blocks")),
    };
    let mut text = PartsText::new(if role == "assistant" { "" } else { "\n" });
    let mut any_text = false;
    let mut tool_calls = Vec::new();
    let mut results = Vec::new();
    for (j, block) in blocks.iter().enumerate() {
        let bp = format!("{p}.content[{j}]");
        let field = |name: &str| block.get(name);
        let kind =
            field("type").and_then(Value::as_str).ok_or_else(|| invalid(&bp, "a block needs a `type`"))?;
        match (kind, role) {
            ("text", _) => {
                text.push_text(
                    field("text")
                        .and_then(Value::as_str)
                        .ok_or_else(|| invalid(&bp, "a text block needs a `text` string"))?,
                );
                any_text = true;
            }
            ("image", "user") => {
                images.check(&bp)?;
                let image = crate::media::parts::anthropic_image(&bp, block)?;
                text.push_image(images.push(&bp, image)?);
                any_text = true;
            }
            // Anthropic drops earlier turns' thinking from the context; so does this server.
            ("thinking" | "redacted_thinking", "assistant") => {}
            ("tool_use", "assistant") => {
                let id = field("id")
                    .and_then(Value::as_str)
                    .ok_or_else(|| invalid(format!("{bp}.id"), "is required"))?;
                let name = field("name")
                    .and_then(Value::as_str)
                    .ok_or_else(|| invalid(format!("{bp}.name"), "is required"))?;
                let input = match field("input") {
                    Some(v @ Value::Object(_)) => v.clone(),
                    _ => return Err(invalid(format!("{bp}.input"), "must be an object")),
                };
                calls.0.push((id.to_owned(), name.to_owned()));
                tool_calls.push(
                    json!({"id": id, "type": "function", "function": {"name": name, "arguments": input}}),
                );
            }
            ("tool_result", "user") => {
                let id = field("tool_use_id")
                    .and_then(Value::as_str)
                    .ok_or_else(|| invalid(format!("{bp}.tool_use_id"), "is required"))?;
                let name = calls.name_of(id).ok_or_else(|| {
                    invalid(
                        format!("{bp}.tool_use_id"),
                        format!("`{id}` answers no `tool_use` block of an earlier assistant turn"),
                    )
                })?;
                let mut content = match field("content") {
                    None | Some(Value::Null) => String::new(),
                    Some(v) => text_of(&format!("{bp}.content"), v)?,
                };
                match field("is_error") {
                    None | Some(Value::Null) | Some(Value::Bool(false)) => {}
                    Some(Value::Bool(true)) => content = format!("Error: {content}"),
                    Some(_) => return Err(invalid(format!("{bp}.is_error"), "must be a boolean")),
                }
                let mut message = ChatMessage::new("tool", content);
                message.tool_call_id = Some(id.to_owned());
                message.name = Some(name.to_owned());
                results.push(message);
            }
            (other @ ("image" | "document" | "search_result"), _) => {
                return Err(invalid(bp, unsupported_block(other)))
            }
            (other, _) => {
                return Err(invalid(bp, format!("`{other}` blocks are not allowed in a `{role}` message")))
            }
        }
    }
    let mut out = results;
    if role == "assistant" {
        let mut message = ChatMessage::new("assistant", text.finish());
        message.tool_calls = (!tool_calls.is_empty()).then_some(tool_calls);
        out.push(message);
    } else if any_text || out.is_empty() {
        out.push(ChatMessage::new("user", text.finish()));
    }
    Ok(out)
}

/// The system prompt and the conversation as chat messages; image blocks are refused (a
/// text-only model).
pub fn messages(system: Option<&Value>, turns: &[Value]) -> Result<Vec<ChatMessage>, InvalidParam> {
    messages_with(system, turns, &mut ImageCollector::text_only())
}

/// [`messages`], handing a user turn's `image` blocks to `images`.
pub fn messages_with(
    system: Option<&Value>,
    turns: &[Value],
    images: &mut ImageCollector,
) -> Result<Vec<ChatMessage>, InvalidParam> {
    if turns.is_empty() {
        return Err(invalid("messages", "messages must contain at least one message"));
    }
    let mut out = Vec::with_capacity(turns.len() + 1);
    match system {
        None | Some(Value::Null) => {}
        Some(v) => out.push(ChatMessage::new("system", text_of("system", v)?)),
    }
    let mut calls = CallsSoFar::default();
    for (i, t) in turns.iter().enumerate() {
        out.extend(turn(i, t, &mut calls, images)?);
    }
    Ok(out)
}

/// Anthropic's tools and tool choice as a [`ToolRequest`] (`None` when no tool may be called).
/// Server tools are left out or refused as `hosted_tools` says.
pub fn tools(
    tools: Option<&Value>,
    choice: Option<&Value>,
    hosted_tools: HostedToolsPolicy,
) -> Result<Option<ToolRequest>, InvalidParam> {
    let list = match tools {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(list)) => list.clone(),
        Some(_) => return Err(invalid("tools", "must be a list of tools")),
    };
    let mut openai_tools = Vec::with_capacity(list.len());
    // Each left-out server tool's type and name (a forced choice names the tool by its name).
    let mut ignored: Vec<(&str, Option<&str>)> = Vec::new();
    for (i, tool) in list.iter().enumerate() {
        let p = format!("tools[{i}]");
        let obj = tool.as_object().ok_or_else(|| invalid(&p, "must be an object"))?;
        match obj.get("type").and_then(Value::as_str) {
            None | Some("custom") => {}
            Some(server) if is_anthropic_server_tool(server) && hosted_tools == HostedToolsPolicy::Ignore => {
                ignored.push((server, obj.get("name").and_then(Value::as_str)));
                continue;
            }
            Some(other) => {
                let why = if is_anthropic_server_tool(other) { " (--hosted-tools reject)" } else { "" };
                return Err(invalid(
                    format!("{p}.type"),
                    format!(
                        "tool type `{other}` is not supported{why}: give client tools with an `input_schema`"
                    ),
                ));
            }
        }
        if let Some(key) = obj.keys().find(|k| {
            !matches!(
                k.as_str(),
                "name"
                    | "description"
                    | "input_schema"
                    | "type"
                    | "cache_control"
                    | "strict"
                    | "defer_loading"
            )
        }) {
            return Err(invalid(format!("{p}.{key}"), format!("unknown tool field `{key}`")));
        }
        let deferred = match obj.get("defer_loading") {
            None | Some(Value::Bool(false)) => false,
            Some(Value::Bool(true)) => true,
            Some(_) => return Err(invalid(format!("{p}.defer_loading"), "must be a boolean")),
        };
        let schema =
            obj.get("input_schema").ok_or_else(|| invalid(format!("{p}.input_schema"), "is required"))?;
        // A deferred tool is not in the model's context until a search loads it; Claude Code's
        // own search tool returns the schemas as text, so the tool stays out of the prompt.
        if deferred {
            continue;
        }
        let mut function =
            json!({"name": obj.get("name").cloned().unwrap_or(Value::Null), "parameters": schema});
        if let Some(d) = obj.get("description") {
            function["description"] = d.clone();
        }
        openai_tools.push(json!({"type": "function", "function": function}));
    }
    let (choice, parallel) = match choice {
        None | Some(Value::Null) => (None, None),
        Some(Value::Object(c)) => {
            let parallel = match c.get("disable_parallel_tool_use") {
                None | Some(Value::Null) => None,
                Some(Value::Bool(disable)) => Some(!disable),
                Some(_) => return Err(invalid("tool_choice.disable_parallel_tool_use", "must be a boolean")),
            };
            let choice = match c.get("type").and_then(Value::as_str) {
                Some("auto") => json!("auto"),
                Some("any") => json!("required"),
                Some("none") => json!("none"),
                Some("tool") => match c.get("name").and_then(Value::as_str) {
                    Some(name) if ignored.iter().any(|(_, n)| *n == Some(name)) => {
                        return Err(invalid(
                            "tool_choice.name",
                            format!("forces the server tool `{name}`, which this server does not run: choose auto, any, none or a client tool"),
                        ))
                    }
                    Some(name) => json!({"type": "function", "function": {"name": name}}),
                    None => return Err(invalid("tool_choice.name", "a `tool` choice needs the tool's name")),
                },
                _ => return Err(invalid("tool_choice.type", "must be one of auto, any, tool, none")),
            };
            (Some(choice), parallel)
        }
        Some(_) => return Err(invalid("tool_choice", "must be an object such as {\"type\": \"auto\"}")),
    };
    if openai_tools.is_empty() && !ignored.is_empty() && choice.as_ref().is_some_and(|c| c == "required") {
        let types: Vec<&str> = ignored.iter().map(|(t, _)| *t).collect();
        return Err(invalid(
            "tool_choice.type",
            format!(
                "`any` needs a client tool: the server tools given ({}) are not run by this server",
                types.join(", ")
            ),
        ));
    }
    note_ignored(ignored.iter().map(|(t, _)| *t));
    let parsed = ToolRequest::parse(Some(&Value::Array(openai_tools)), choice.as_ref(), parallel)
        .map_err(|e| InvalidParam { param: e.param.map(|p| anthropic_param(&p)), message: e.message })?;
    Ok(parsed.filter(ToolRequest::active))
}

/// A parameter of the OpenAI tool shape in Anthropic's terms (`tools[0].function.parameters` is
/// `tools[0].input_schema`).
fn anthropic_param(param: &str) -> String {
    param.replace(".function.parameters", ".input_schema").replace(".function.", ".")
}

/// What a request's thinking settings ask of the answer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ThinkingDisplay {
    /// `display: "omitted"`: thinking blocks come without their text.
    pub omitted: bool,
    /// `budget_tokens` of enabled thinking.
    pub budget: Option<usize>,
}

/// `thinking` as the template's `enable_thinking`, checked as Anthropic checks it.
fn thinking(
    state: &AppState,
    value: Option<&Value>,
    max_tokens: Option<u32>,
    kwargs: &mut Map<String, Value>,
) -> Result<ThinkingDisplay, InvalidParam> {
    let Some(obj) = value.filter(|v| !v.is_null()) else { return Ok(ThinkingDisplay::default()) };
    let obj = obj.as_object().ok_or_else(|| invalid("thinking", "must be an object"))?;
    if let Some(key) = obj.keys().find(|k| !matches!(k.as_str(), "type" | "budget_tokens" | "display")) {
        return Err(invalid(format!("thinking.{key}"), format!("unknown thinking field `{key}`")));
    }
    let display = match obj.get("display").and_then(|d| if d.is_null() { None } else { Some(d) }) {
        None => ThinkingDisplay::default(),
        Some(Value::String(d)) if d == "summarized" => ThinkingDisplay::default(),
        Some(Value::String(d)) if d == "omitted" => ThinkingDisplay { omitted: true, budget: None },
        Some(_) => return Err(invalid("thinking.display", "must be `summarized` or `omitted`")),
    };
    let mut display = display;
    match obj.get("type").and_then(Value::as_str) {
        Some("disabled") => {
            kwargs.insert("enable_thinking".into(), Value::Bool(false));
        }
        // The model decides: the template's own default.
        Some("adaptive") => {}
        Some("enabled") => {
            if state.reasoning.is_none() {
                return Err(invalid(
                    "thinking",
                    "thinking needs a reasoning model: start the server with --reasoning-parser",
                ));
            }
            let budget = obj
                .get("budget_tokens")
                .and_then(Value::as_u64)
                .ok_or_else(|| invalid("thinking.budget_tokens", "is required: a whole number of tokens"))?;
            // Anthropic's floor of 1024 is not imposed: small local models think briefly.
            if budget == 0 {
                return Err(invalid("thinking.budget_tokens", "must be at least 1"));
            }
            if let Some(max) = max_tokens {
                if budget >= u64::from(max) {
                    return Err(invalid("thinking.budget_tokens", "must be less than max_tokens"));
                }
            }
            kwargs.insert("enable_thinking".into(), Value::Bool(true));
            display.budget = Some(usize::try_from(budget).unwrap_or(usize::MAX));
        }
        _ => return Err(invalid("thinking.type", "must be `enabled`, `adaptive` or `disabled`")),
    }
    Ok(display)
}

/// `output_config`: the effort as `reasoning_effort`, the format as a grammar.
fn output_config(
    state: &AppState,
    value: Option<&Value>,
    kwargs: &mut Map<String, Value>,
) -> Result<Option<RequestedGrammar>, InvalidParam> {
    let Some(obj) = value.filter(|v| !v.is_null()) else { return Ok(None) };
    let obj = obj.as_object().ok_or_else(|| invalid("output_config", "must be an object"))?;
    if let Some(key) = obj.keys().find(|k| !matches!(k.as_str(), "effort" | "format")) {
        return Err(invalid(format!("output_config.{key}"), format!("unknown output_config field `{key}`")));
    }
    match obj.get("effort") {
        None | Some(Value::Null) => {}
        // Anthropic's default effort: the model as it is.
        Some(Value::String(e)) if e == "high" => {}
        Some(Value::String(e)) if matches!(e.as_str(), "low" | "medium" | "max") => {
            if state.reasoning.is_none() {
                return Err(invalid(
                    "output_config.effort",
                    format!("effort `{e}` needs a reasoning model (--reasoning-parser); this model answers at `high`"),
                ));
            }
            kwargs.insert("reasoning_effort".into(), Value::String(e.clone()));
        }
        Some(_) => return Err(invalid("output_config.effort", "must be low, medium, high or max")),
    }
    let Some(format) = obj.get("format").filter(|f| !f.is_null()) else { return Ok(None) };
    if format.get("type").and_then(Value::as_str) != Some("json_schema") {
        return Err(invalid("output_config.format.type", "must be `json_schema`"));
    }
    let schema = format.get("schema").ok_or_else(|| invalid("output_config.format.schema", "is required"))?;
    let response_format = json!({"type": "json_schema", "json_schema": {"name": "output", "schema": schema}});
    response_format_at("output_config.format", &response_format)
}

/// `context_management`: only clearing earlier thinking, which the prompt always does.
fn context_management(value: Option<&Value>) -> Result<(), InvalidParam> {
    let Some(obj) = value.filter(|v| !v.is_null()) else { return Ok(()) };
    let edits = obj
        .get("edits")
        .and_then(Value::as_array)
        .ok_or_else(|| invalid("context_management.edits", "must be a list of edits"))?;
    for (i, edit) in edits.iter().enumerate() {
        match edit.get("type").and_then(Value::as_str) {
            Some(t) if t.starts_with("clear_thinking_") => {}
            Some(other) => {
                return Err(invalid(
                    format!("context_management.edits[{i}].type"),
                    format!("`{other}` is not supported: only clearing earlier thinking is"),
                ))
            }
            None => return Err(invalid(format!("context_management.edits[{i}].type"), "is required")),
        }
    }
    Ok(())
}

/// The fields that shape the prompt, as both a message and `count_tokens` carry them.
#[derive(Debug, Clone, Copy, Default)]
pub struct PromptFields<'a> {
    pub system: Option<&'a Value>,
    pub messages: &'a [Value],
    pub tools: Option<&'a Value>,
    pub tool_choice: Option<&'a Value>,
    pub thinking: Option<&'a Value>,
    pub output_config: Option<&'a Value>,
    pub context_management: Option<&'a Value>,
}

impl<'a> PromptFields<'a> {
    pub fn of_count(req: &'a CountTokensRequest) -> Self {
        Self {
            system: req.system.as_ref(),
            messages: &req.messages,
            tools: req.tools.as_ref(),
            tool_choice: req.tool_choice.as_ref(),
            thinking: req.thinking.as_ref(),
            output_config: req.output_config.as_ref(),
            context_management: req.context_management.as_ref(),
        }
    }

    pub fn of_message(req: &'a MessagesRequest) -> Self {
        Self {
            system: req.system.as_ref(),
            messages: &req.messages,
            tools: req.tools.as_ref(),
            tool_choice: req.tool_choice.as_ref(),
            thinking: req.thinking.as_ref(),
            output_config: req.output_config.as_ref(),
            context_management: req.context_management.as_ref(),
        }
    }
}

/// The conversation, tools, thinking and output format of a request (what `count_tokens`
/// counts as well), and how thinking is shown.
pub fn turn_of(
    state: &AppState,
    fields: PromptFields<'_>,
    max_tokens: Option<u32>,
) -> Result<(ChatTurn, ThinkingDisplay), ApiError> {
    let mut images = state.media.collector();
    let mut messages = messages_with(fields.system, fields.messages, &mut images)?;
    let tools = tools(fields.tools, fields.tool_choice, state.hosted_tools)?;
    let mut kwargs = Map::new();
    let display = thinking(state, fields.thinking, max_tokens, &mut kwargs)?;
    let grammar = output_config(state, fields.output_config, &mut kwargs)?;
    context_management(fields.context_management)?;
    // A last assistant turn is a prefill: the answer continues it.
    let prefill = messages.last().is_some_and(|m| m.role == "assistant");
    if prefill {
        // Trailing whitespace cannot end a prefill (as at Anthropic).
        if let Some(m) = messages.last_mut() {
            m.content.truncate(m.content.trim_end().len());
        }
        let last = messages.last().filter(|m| m.tool_calls.is_none() && !m.content.is_empty());
        if last.is_none() {
            return Err(ApiError::invalid(
                format!("messages[{}]", fields.messages.len() - 1),
                "a final assistant message is continued, so it must hold text (not only whitespace) and no tool use",
            ));
        }
    }
    let options = ChatOptions::of(&messages, Some(!prefill), Some(prefill), None, Some(kwargs))?;
    let turn = ChatTurn {
        messages,
        images: images.into_images(),
        options,
        tools,
        grammar,
        params: CommonParams::default(),
        prompt_param: "messages",
        clamp_max_tokens: true,
        reasoning_budget: display.budget,
        prompt_logprobs: None,
        lora: None,
        kv_transfer: None,
    };
    Ok((turn, display))
}

/// The whole request as a turn, and how thinking is shown.
pub fn chat_turn(state: &AppState, req: &MessagesRequest) -> Result<(ChatTurn, ThinkingDisplay), ApiError> {
    if let Some(t) = req.temperature {
        if !(0.0..=1.0).contains(&t) {
            return Err(ApiError::invalid("temperature", format!("temperature must be in [0, 1], got {t}")));
        }
    }
    if req.max_tokens == 0 {
        return Err(ApiError::invalid("max_tokens", "max_tokens must be at least 1"));
    }
    match &req.metadata {
        None | Some(Value::Null) => {}
        Some(Value::Object(m)) => {
            if let Some(key) = m.keys().find(|k| k.as_str() != "user_id") {
                return Err(ApiError::invalid(
                    format!("metadata.{key}"),
                    format!("unknown metadata field `{key}`"),
                ));
            }
        }
        Some(_) => return Err(ApiError::invalid("metadata", "must be an object")),
    }
    if let Some(tier) = req.service_tier.as_deref().filter(|t| !matches!(*t, "auto" | "standard_only")) {
        return Err(ApiError::invalid(
            "service_tier",
            format!("must be `auto` or `standard_only`, got `{tier}`"),
        ));
    }
    let (mut turn, display) = turn_of(state, PromptFields::of_message(req), Some(req.max_tokens))?;
    turn.params = CommonParams {
        max_tokens: Some(req.max_tokens),
        max_tokens_param: "max_tokens",
        temperature: req.temperature,
        top_p: req.top_p,
        top_k: req.top_k.map(|k| i32::try_from(k).unwrap_or(i32::MAX)),
        stop: req.stop_sequences.clone().map(StopSpec::Many),
        logprobs_param: "top_logprobs",
        skip_special_tokens: true,
        ..Default::default()
    };
    Ok((turn, display))
}

#[cfg(test)]
#[path = "request_tests.rs"]
mod tests;

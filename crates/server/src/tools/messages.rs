//! Tools in the prompt. An assistant message's `tool_calls` become what chat templates expect
//! (Hugging Face's convention: the arguments as an object, not a JSON string). For a model whose
//! template knows no tools, [`generic_conversation`] rewrites the conversation into our generic
//! format: the tools and the answer format described in the system message, earlier calls and
//! replies written as the JSON the model is to produce, tool results as user turns.

use pagoda_text::ChatMessage;
use serde_json::{json, Value};

use super::{ToolChoice, ToolRequest};
use crate::error::InvalidParam;

/// `messages[i].tool_calls` (OpenAI's shape) as template values.
pub fn template_tool_calls(i: usize, value: &Value) -> Result<Vec<Value>, InvalidParam> {
    let p = |rest: String| format!("messages[{i}].tool_calls{rest}");
    let bad = |rest: String, what: &str| {
        let param = p(rest);
        InvalidParam::new(param.clone(), format!("`{param}`: {what}"))
    };
    let list = match value {
        Value::Null => return Ok(Vec::new()),
        Value::Array(list) => list,
        _ => return Err(bad(String::new(), "must be a list")),
    };
    list.iter()
        .enumerate()
        .map(|(j, call)| {
            let f = call
                .get("function")
                .and_then(Value::as_object)
                .ok_or_else(|| bad(format!("[{j}].function"), "is required"))?;
            let name = f
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| bad(format!("[{j}].function.name"), "is required"))?;
            let arguments = match f.get("arguments") {
                None | Some(Value::Null) => json!({}),
                Some(Value::String(text)) => match serde_json::from_str::<Value>(text) {
                    Ok(v @ Value::Object(_)) => v,
                    _ => {
                        return Err(bad(
                            format!("[{j}].function.arguments"),
                            "must be a JSON object (as a string)",
                        ))
                    }
                },
                Some(v @ Value::Object(_)) => v.clone(),
                Some(_) => {
                    return Err(bad(
                        format!("[{j}].function.arguments"),
                        "must be a JSON object (as a string)",
                    ))
                }
            };
            let mut out = json!({"type": "function", "function": {"name": name, "arguments": arguments}});
            if let Some(id) = call.get("id").and_then(Value::as_str) {
                out["id"] = json!(id);
            }
            Ok(out)
        })
        .collect()
}

/// The system text that teaches a model without tool support our generic format.
fn generic_instructions(request: &ToolRequest) -> String {
    let tools: Vec<Value> = request
        .callable()
        .iter()
        .map(|t| {
            let mut v = json!({"name": t.name, "parameters": t.parameters});
            if let Some(d) = &t.description {
                v["description"] = json!(d);
            }
            v
        })
        .collect();
    let listing = serde_json::to_string_pretty(&tools).unwrap_or_default();
    let call = "{\"tool_calls\": [{\"name\": \"<tool name>\", \"arguments\": {<the arguments>}}]}";
    let how = match request.choice {
        ToolChoice::Auto => format!(
            "To call tools, answer with this JSON only: {call}\nTo answer without a tool, answer with this JSON only: {{\"response\": \"<your answer>\"}}"
        ),
        _ => format!("Call a tool: answer with this JSON only: {call}"),
    };
    format!("You can use these tools. Each one's arguments follow its JSON schema.\n{listing}\n\n{how}")
}

fn calls_json(calls: &[Value]) -> String {
    let calls: Vec<Value> = calls
        .iter()
        .map(|c| json!({"name": c["function"]["name"], "arguments": c["function"]["arguments"]}))
        .collect();
    json!({"tool_calls": calls}).to_string()
}

/// See the module docs. `messages` come from `crate::prompt::chat_messages`.
pub fn generic_conversation(messages: Vec<ChatMessage>, request: &ToolRequest) -> Vec<ChatMessage> {
    let instructions = generic_instructions(request);
    let mut out = Vec::with_capacity(messages.len() + 1);
    let mut messages = messages.into_iter().peekable();
    match messages.peek() {
        Some(first) if first.role == "system" => {
            let first = messages.next().unwrap_or_else(|| ChatMessage::new("system", ""));
            out.push(ChatMessage::new("system", format!("{}\n\n{instructions}", first.content)));
        }
        _ => out.push(ChatMessage::new("system", instructions)),
    }
    for m in messages {
        let rewritten = match m.role.as_str() {
            "assistant" => match &m.tool_calls {
                Some(calls) if !calls.is_empty() => ChatMessage::new("assistant", calls_json(calls)),
                _ => ChatMessage::new("assistant", json!({"response": m.content}).to_string()),
            },
            "tool" => {
                let mut response = json!({"content": m.content});
                if let Some(id) = &m.tool_call_id {
                    response["tool_call_id"] = json!(id);
                }
                if let Some(name) = &m.name {
                    response["name"] = json!(name);
                }
                ChatMessage::new("user", json!({"tool_response": response}).to_string())
            }
            _ => ChatMessage { tool_calls: None, tool_call_id: None, ..m },
        };
        out.push(rewritten);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::ToolSpec;

    #[test]
    fn history_is_written_in_the_generic_format() {
        let request = ToolRequest {
            tools: vec![ToolSpec {
                name: "add".into(),
                description: Some("Adds".into()),
                parameters: json!({"type": "object"}),
            }],
            choice: ToolChoice::Auto,
            parallel: true,
            raw: Vec::new(),
        };
        let calls = template_tool_calls(1, &json!([{"id": "call_1", "type": "function", "function": {"name": "add", "arguments": "{\"a\": 1}"}}])).unwrap();
        assert_eq!(calls[0]["function"]["arguments"], json!({"a": 1}));
        let mut assistant = ChatMessage::new("assistant", "");
        assistant.tool_calls = Some(calls);
        let mut tool = ChatMessage::new("tool", "2");
        tool.tool_call_id = Some("call_1".into());
        let out = generic_conversation(vec![ChatMessage::new("user", "1+1?"), assistant, tool], &request);
        assert_eq!(out.len(), 4);
        assert!(
            out[0].role == "system"
                && out[0].content.contains("\"add\"")
                && out[0].content.contains("\"response\"")
        );
        assert_eq!(out[2].content, r#"{"tool_calls":[{"name":"add","arguments":{"a":1}}]}"#);
        assert_eq!(out[3].role, "user");
        assert!(out[3].content.contains("tool_response") && out[3].content.contains("call_1"));
        let bad =
            template_tool_calls(0, &json!([{"function": {"name": "add", "arguments": "[1]"}}])).unwrap_err();
        assert_eq!(bad.param.as_deref(), Some("messages[0].tool_calls[0].function.arguments"));
    }
}

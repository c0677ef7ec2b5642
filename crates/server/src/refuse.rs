//! Fields the server parses but cannot honour yet (tools, structured outputs, priorities):
//! set to anything but their no-op value, they are refused with a 400 naming them, never
//! dropped in silence.

use serde_json::Value;

use crate::error::InvalidParam;
use crate::openai::{ChatCompletionRequest, CompletionRequest};

fn refuse(param: impl Into<String>, what: &str) -> InvalidParam {
    let param = param.into();
    InvalidParam::new(param.clone(), format!("`{param}`: {what} is not supported by this server yet"))
}

fn is_empty_list(value: &Value) -> bool {
    value.as_array().is_some_and(Vec::is_empty)
}

/// `response_format`: plain text (the default) only.
fn response_format(value: Option<&Value>) -> Result<(), InvalidParam> {
    match value {
        None | Some(Value::Null) => Ok(()),
        Some(v) if v.get("type").and_then(Value::as_str) == Some("text") => Ok(()),
        Some(_) => Err(refuse("response_format", "structured output (a JSON object or schema)")),
    }
}

fn priority(value: Option<i64>) -> Result<(), InvalidParam> {
    match value {
        None | Some(0) => Ok(()),
        Some(_) => Err(refuse("priority", "priority scheduling")),
    }
}

/// Refuses what a chat request asks for that the server cannot do.
pub fn chat(req: &ChatCompletionRequest) -> Result<(), InvalidParam> {
    if req.tools.as_ref().is_some_and(|t| !t.is_null() && !is_empty_list(t)) {
        return Err(refuse("tools", "tool calling"));
    }
    match &req.tool_choice {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if s == "none" => {}
        Some(_) => return Err(refuse("tool_choice", "tool calling")),
    }
    for (i, m) in req.messages.iter().enumerate() {
        if m.tool_calls.as_ref().is_some_and(|t| !t.is_null() && !is_empty_list(t)) {
            return Err(refuse(format!("messages[{i}].tool_calls"), "tool calling"));
        }
    }
    response_format(req.response_format.as_ref())?;
    priority(req.priority)
}

/// Refuses what a completion request asks for that the server cannot do.
pub fn completion(req: &CompletionRequest) -> Result<(), InvalidParam> {
    response_format(req.response_format.as_ref())?;
    priority(req.priority)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat_req(json: &str) -> ChatCompletionRequest {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn no_op_values_pass_and_real_asks_are_named() {
        let ok = chat_req(
            r#"{"messages":[{"role":"assistant","content":"x","tool_calls":[]}],"tools":[],"tool_choice":"none",
                "response_format":{"type":"text"},"priority":0,"parallel_tool_calls":false}"#,
        );
        assert!(chat(&ok).is_ok());
        let cases = [
            (r#"{"messages":[],"tools":[{"type":"function","function":{"name":"f"}}]}"#, "tools"),
            (r#"{"messages":[],"tool_choice":"required"}"#, "tool_choice"),
            (r#"{"messages":[],"response_format":{"type":"json_object"}}"#, "response_format"),
            (r#"{"messages":[],"priority":-5}"#, "priority"),
            (
                r#"{"messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"1"}]}]}"#,
                "messages[0].tool_calls",
            ),
        ];
        for (json, param) in cases {
            let err = chat(&chat_req(json)).unwrap_err();
            assert_eq!(err.param.as_deref(), Some(param), "{json}");
            assert!(err.message.contains("not supported"), "{}", err.message);
        }
        let c: CompletionRequest =
            serde_json::from_str(r#"{"prompt":"x","response_format":{"type":"json_schema"}}"#).unwrap();
        assert_eq!(completion(&c).unwrap_err().param.as_deref(), Some("response_format"));
    }
}

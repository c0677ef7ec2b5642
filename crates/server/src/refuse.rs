//! Fields the server parses but cannot honour yet (priorities):
//! set to anything but their no-op value, they are refused with a 400 naming them, never
//! dropped in silence.

use crate::error::InvalidParam;
use crate::openai::{ChatCompletionRequest, CompletionRequest};

fn refuse(param: impl Into<String>, what: &str) -> InvalidParam {
    let param = param.into();
    InvalidParam::new(param.clone(), format!("`{param}`: {what} is not supported by this server yet"))
}

fn priority(value: Option<i64>) -> Result<(), InvalidParam> {
    match value {
        None | Some(0) => Ok(()),
        Some(_) => Err(refuse("priority", "priority scheduling")),
    }
}

/// Refuses what a chat request asks for that the server cannot do.
pub fn chat(req: &ChatCompletionRequest) -> Result<(), InvalidParam> {
    priority(req.priority)
}

/// Refuses what a completion request asks for that the server cannot do.
pub fn completion(req: &CompletionRequest) -> Result<(), InvalidParam> {
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
        assert!(chat(&chat_req(r#"{"messages":[],"priority":0}"#)).is_ok());
        let err = chat(&chat_req(r#"{"messages":[],"priority":-5}"#)).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("priority"));
        assert!(err.message.contains("not supported"), "{}", err.message);
        let c: CompletionRequest = serde_json::from_str(r#"{"prompt":"x","priority":2}"#).unwrap();
        assert_eq!(completion(&c).unwrap_err().param.as_deref(), Some("priority"));
    }
}

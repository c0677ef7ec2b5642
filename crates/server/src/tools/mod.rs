//! Tool calling. A request's `tools`, `tool_choice` and `parallel_tool_calls` are read into a
//! [`ToolRequest`]; the tools reach the model through the chat template (`tools` variable, Hugging
//! Face's convention) or, when the model's template knows nothing of tools, through our own
//! generic prompt ([`messages`]); `required` and a named choice are enforced by a grammar built
//! from the tools' parameter schemas ([`grammar`]); the output is parsed back into OpenAI's
//! `tool_calls`, whole or as stream deltas ([`output`]).
//!
//! The format (`--tool-call-parser`, or detected from the template) decides the markup: `hermes`
//! (`<tool_call>{json}</tool_call>`), `llama3_json`, `mistral` (`[TOOL_CALLS]`), or `generic`
//! (a JSON object, `{"tool_calls": [...]}` or `{"response": "..."}`, as llama.cpp's generic
//! handler does).
//!
//! Hosted tools (`web_search` and the like, run by a vendor on its side) are left out or refused
//! as `--hosted-tools` says ([`hosted`]).

pub mod grammar;
pub mod hosted;
pub mod messages;
pub mod output;

use serde_json::Value;

use crate::error::InvalidParam;

/// One function the model may call.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    pub name: String,
    pub description: Option<String>,
    /// JSON schema of the arguments object.
    pub parameters: Value,
}

/// `tool_choice`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    None,
    Auto,
    Required,
    Named(String),
}

/// A request's tools, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolRequest {
    pub tools: Vec<ToolSpec>,
    pub choice: ToolChoice,
    /// More than one call in one answer (`parallel_tool_calls`, default true).
    pub parallel: bool,
    /// The tools as the client sent them (OpenAI's shape), for the chat template.
    pub raw: Vec<Value>,
}

fn invalid(param: impl Into<String>, what: impl std::fmt::Display) -> InvalidParam {
    let param = param.into();
    InvalidParam::new(param.clone(), format!("`{param}`: {what}"))
}

/// OpenAI's rule for function names.
fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn tool_spec(i: usize, tool: &Value) -> Result<ToolSpec, InvalidParam> {
    let p = |rest: &str| format!("tools[{i}]{rest}");
    let obj = tool.as_object().ok_or_else(|| invalid(p(""), "must be an object"))?;
    match obj.get("type").and_then(Value::as_str) {
        Some("function") => {}
        _ => return Err(invalid(p(".type"), "must be \"function\"")),
    }
    let f = obj
        .get("function")
        .and_then(Value::as_object)
        .ok_or_else(|| invalid(p(".function"), "is required"))?;
    let name =
        f.get("name").and_then(Value::as_str).ok_or_else(|| invalid(p(".function.name"), "is required"))?;
    if !valid_name(name) {
        return Err(invalid(p(".function.name"), "must be 1 to 64 letters, digits, underscores or dashes"));
    }
    let description = match f.get("description") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err(invalid(p(".function.description"), "must be a string")),
    };
    let parameters = match f.get("parameters") {
        None | Some(Value::Null) => serde_json::json!({"type": "object", "properties": {}}),
        // The arguments are an object: a schema of another type can never be met.
        Some(v @ Value::Object(o)) if o.get("type").is_none_or(|t| t == "object") => v.clone(),
        Some(Value::Object(o)) => {
            return Err(invalid(
                p(".function.parameters"),
                format!("must be a JSON schema of `\"type\": \"object\"`, got `\"type\": {}`", o["type"]),
            ))
        }
        Some(_) => return Err(invalid(p(".function.parameters"), "must be a JSON schema object")),
    };
    // Checked here too so the error names this tool's schema, not the grammar built from all.
    pagoda_structured::limits::check_schema(&parameters)
        .map_err(|e| invalid(p(".function.parameters"), e))?;
    if let Some(strict) = f.get("strict") {
        if !strict.is_boolean() && !strict.is_null() {
            return Err(invalid(p(".function.strict"), "must be a boolean"));
        }
    }
    Ok(ToolSpec { name: name.to_owned(), description, parameters })
}

impl ToolRequest {
    /// Reads the request's tool fields; `None` when it has no tools.
    pub fn parse(
        tools: Option<&Value>,
        tool_choice: Option<&Value>,
        parallel: Option<bool>,
    ) -> Result<Option<Self>, InvalidParam> {
        let raw = match tools {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(list)) => list.clone(),
            Some(_) => return Err(invalid("tools", "must be a list of tools")),
        };
        let specs = raw.iter().enumerate().map(|(i, t)| tool_spec(i, t)).collect::<Result<Vec<_>, _>>()?;
        for (i, t) in specs.iter().enumerate() {
            if specs[..i].iter().any(|other| other.name == t.name) {
                return Err(invalid(
                    format!("tools[{i}].function.name"),
                    format!("`{}` is defined twice", t.name),
                ));
            }
        }
        let choice = match tool_choice {
            None | Some(Value::Null) => {
                if specs.is_empty() {
                    ToolChoice::None
                } else {
                    ToolChoice::Auto
                }
            }
            Some(Value::String(s)) => match s.as_str() {
                "none" => ToolChoice::None,
                "auto" => ToolChoice::Auto,
                "required" => ToolChoice::Required,
                other => {
                    return Err(invalid(
                        "tool_choice",
                        format!("`{other}` is not one of none, auto, required"),
                    ))
                }
            },
            Some(Value::Object(obj)) => {
                let name = obj
                    .get("function")
                    .and_then(|f| f.get("name"))
                    .and_then(Value::as_str)
                    .filter(|_| obj.get("type").and_then(Value::as_str) == Some("function"))
                    .ok_or_else(|| {
                        invalid("tool_choice", "must be none, auto, required or {\"type\": \"function\", \"function\": {\"name\": ...}}")
                    })?;
                if !specs.iter().any(|t| t.name == name) {
                    return Err(invalid(
                        "tool_choice",
                        format!("names `{name}`, which is not among the tools"),
                    ));
                }
                ToolChoice::Named(name.to_owned())
            }
            Some(_) => return Err(invalid("tool_choice", "must be a string or an object")),
        };
        if specs.is_empty() {
            return match choice {
                ToolChoice::None | ToolChoice::Auto => Ok(None),
                _ => Err(invalid("tool_choice", "needs `tools`")),
            };
        }
        Ok(Some(Self { tools: specs, choice, parallel: parallel.unwrap_or(true), raw }))
    }

    /// Whether the model is shown the tools and its output parsed for calls.
    pub fn active(&self) -> bool {
        self.choice != ToolChoice::None
    }

    /// The tools the model may call under the choice.
    pub fn callable(&self) -> Vec<&ToolSpec> {
        match &self.choice {
            ToolChoice::Named(name) => self.tools.iter().filter(|t| &t.name == name).collect(),
            ToolChoice::None => Vec::new(),
            _ => self.tools.iter().collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tools() -> Value {
        json!([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
               {"type": "function", "function": {"name": "add"}}])
    }

    #[test]
    fn choices_and_defaults() {
        let t = tools();
        let r = ToolRequest::parse(Some(&t), None, None).unwrap().unwrap();
        assert_eq!((r.choice.clone(), r.parallel, r.tools.len()), (ToolChoice::Auto, true, 2));
        assert_eq!(r.tools[1].parameters, json!({"type": "object", "properties": {}}));
        let named = json!({"type": "function", "function": {"name": "add"}});
        let r = ToolRequest::parse(Some(&t), Some(&named), Some(false)).unwrap().unwrap();
        assert_eq!(r.choice, ToolChoice::Named("add".into()));
        assert_eq!(r.callable().len(), 1);
        assert!(!r.parallel);
        assert_eq!(ToolRequest::parse(None, Some(&json!("auto")), None), Ok(None));
        assert_eq!(ToolRequest::parse(Some(&json!([])), Some(&json!("none")), None), Ok(None));
        let none = ToolRequest::parse(Some(&t), Some(&json!("none")), None).unwrap().unwrap();
        assert!(!none.active());
    }

    #[test]
    fn bad_tools_name_the_field() {
        let t = tools();
        let cases = [
            (json!({"a": 1}), None, "tools"),
            (json!([{"type": "retrieval"}]), None, "tools[0].type"),
            (json!([{"type": "function"}]), None, "tools[0].function"),
            (json!([{"type": "function", "function": {"name": "a b"}}]), None, "tools[0].function.name"),
            (
                json!([{"type": "function", "function": {"name": "f", "parameters": "x"}}]),
                None,
                "tools[0].function.parameters",
            ),
            (
                json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]),
                None,
                "tools[0].function.parameters",
            ),
            (
                json!([{"type": "function", "function": {"name": "f"}}, {"type": "function", "function": {"name": "f"}}]),
                None,
                "tools[1].function.name",
            ),
            (t.clone(), Some(json!("sometimes")), "tool_choice"),
            (t.clone(), Some(json!({"type": "function", "function": {"name": "nope"}})), "tool_choice"),
            (json!([]), Some(json!("required")), "tool_choice"),
        ];
        for (tools, choice, param) in cases {
            let err = ToolRequest::parse(Some(&tools), choice.as_ref(), None).unwrap_err();
            assert_eq!(err.param.as_deref(), Some(param), "{tools} {choice:?}: {}", err.message);
        }
    }
}

//! The grammar that makes a model call tools: for `tool_choice: required` or a named function in
//! every format, and for `auto` in the generic format (where the answer is always one JSON object,
//! a call or a reply). The arguments follow each tool's parameter schema, so they always parse
//! and validate. `auto` in a model's own format needs no grammar: its output is parsed.

use pagoda_structured::GrammarSpec;
use pagoda_text::ToolCallFormat;
use serde_json::{json, Value};

use super::{ToolChoice, ToolRequest, ToolSpec};

/// `{"name": <const>, <args_key>: <parameters>}` for one tool.
fn call_schema(tool: &ToolSpec, args_key: &str) -> Value {
    json!({
        "type": "object",
        "properties": {"name": {"const": tool.name}, args_key: tool.parameters},
        "required": ["name", args_key],
        "additionalProperties": false,
    })
}

/// One call to any of `tools`.
fn any_call(tools: &[&ToolSpec], args_key: &str) -> Value {
    match tools {
        [one] => call_schema(one, args_key),
        many => json!({"anyOf": many.iter().map(|t| call_schema(t, args_key)).collect::<Vec<_>>()}),
    }
}

fn call_list(tools: &[&ToolSpec], parallel: bool) -> Value {
    let mut list = json!({"type": "array", "items": any_call(tools, "arguments"), "minItems": 1});
    if !parallel {
        list["maxItems"] = json!(1);
    }
    list
}

/// The generic format's answer with calls: `{"tool_calls": [...]}`.
fn generic_calls(tools: &[&ToolSpec], parallel: bool) -> Value {
    json!({
        "type": "object",
        "properties": {"tool_calls": call_list(tools, parallel)},
        "required": ["tool_calls"],
        "additionalProperties": false,
    })
}

/// The grammar for `request` in `format`, if its choice needs one.
pub fn tool_grammar(format: ToolCallFormat, request: &ToolRequest) -> Option<GrammarSpec> {
    let tools = request.callable();
    if tools.is_empty() {
        return None;
    }
    let forced = matches!(request.choice, ToolChoice::Required | ToolChoice::Named(_));
    let parallel = request.parallel && !matches!(request.choice, ToolChoice::Named(_));
    match format {
        ToolCallFormat::Generic => {
            let calls = generic_calls(&tools, parallel);
            Some(GrammarSpec::JsonSchema(if forced {
                calls
            } else {
                let reply = json!({
                    "type": "object",
                    "properties": {"response": {"type": "string"}},
                    "required": ["response"],
                    "additionalProperties": false,
                });
                json!({"anyOf": [calls, reply]})
            }))
        }
        _ if !forced => None,
        ToolCallFormat::Hermes => {
            let call = any_call(&tools, "arguments");
            let repeat = if parallel { " (\"\\n\" call)*" } else { "" };
            Some(GrammarSpec::Lark(format!(
                "start: call{repeat}\ncall: \"<tool_call>\\n\" %json {call} \"\\n</tool_call>\"\n"
            )))
        }
        ToolCallFormat::Llama3Json => Some(GrammarSpec::JsonSchema(any_call(&tools, "parameters"))),
        ToolCallFormat::Mistral => {
            let list = call_list(&tools, parallel);
            Some(GrammarSpec::Lark(format!("start: \"[TOOL_CALLS]\" %json {list}\n")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(choice: ToolChoice, parallel: bool) -> ToolRequest {
        let tools: Vec<ToolSpec> = ["a", "b"]
            .iter()
            .map(|n| ToolSpec {
                name: (*n).to_owned(),
                description: None,
                parameters: json!({"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}),
            })
            .collect();
        ToolRequest { tools, choice, parallel, raw: Vec::new() }
    }

    #[test]
    fn which_choices_get_a_grammar() {
        use ToolCallFormat::*;
        for format in [Hermes, Llama3Json, Mistral] {
            assert_eq!(tool_grammar(format, &request(ToolChoice::Auto, true)), None, "{format:?}");
            assert!(tool_grammar(format, &request(ToolChoice::Required, true)).is_some());
        }
        assert!(tool_grammar(Generic, &request(ToolChoice::Auto, true)).is_some());
        assert_eq!(tool_grammar(Generic, &request(ToolChoice::None, true)), None);
        let Some(GrammarSpec::JsonSchema(s)) =
            tool_grammar(Generic, &request(ToolChoice::Named("b".into()), true))
        else {
            panic!()
        };
        let list = &s["properties"]["tool_calls"];
        assert_eq!(
            (list["maxItems"].clone(), list["items"]["properties"]["name"]["const"].clone()),
            (json!(1), json!("b"))
        );
        let Some(GrammarSpec::Lark(g)) = tool_grammar(Hermes, &request(ToolChoice::Required, false)) else {
            panic!()
        };
        assert!(g.starts_with("start: call\n") && g.contains("%json {"), "{g}");
    }
}

//! Structured output's request fields, read into one [`GrammarSpec`] and compiled off the async
//! runtime. Accepted, as vLLM and the OpenAI SDK send them:
//!
//! - `response_format`: `text`, `json_object`, `json_schema` (`{name, schema, strict}`);
//! - `response_format` of type `structural_tag` and `structured_outputs.structural_tag`: free text
//!   in which tags that start with a trigger must be complete (`begin`, JSON per `schema`, `end`);
//! - `structured_outputs`: exactly one of `json`, `regex`, `choice`, `grammar` (Lark),
//!   `json_object`, `structural_tag`;
//! - the older `guided_json`, `guided_regex`, `guided_choice`, `guided_grammar`.
//!
//! At most one of them may ask for a grammar; anything malformed or unsupported, nested or
//! chained deeper than `pagoda_structured::limits` allows, or matching no output at all is a 400
//! naming the parameter and the reason.

use pagoda_structured::{CompiledGrammar, GrammarError, GrammarSpec, StructuralTag, TagStructure};
use serde_json::Value;

use crate::error::{ApiError, InvalidParam};
use crate::state::AppState;

/// The structured-output fields of a request, as sent.
#[derive(Debug, Default, Clone, Copy)]
pub struct GrammarFields<'a> {
    pub response_format: Option<&'a Value>,
    pub structured_outputs: Option<&'a Value>,
    pub guided_json: Option<&'a Value>,
    pub guided_regex: Option<&'a str>,
    pub guided_choice: Option<&'a [String]>,
    pub guided_grammar: Option<&'a str>,
}

/// A grammar a request asks for, with the parameter that asked (for error messages).
#[derive(Debug, Clone, PartialEq)]
pub struct RequestedGrammar {
    pub spec: GrammarSpec,
    pub param: String,
}

fn invalid(param: &str, what: impl std::fmt::Display) -> InvalidParam {
    InvalidParam::new(param, format!("`{param}`: {what}"))
}

/// A JSON schema given as an object (or `true`), or as a JSON text holding one.
fn schema_of(param: &str, value: &Value) -> Result<GrammarSpec, InvalidParam> {
    match value {
        Value::Object(_) | Value::Bool(true) => Ok(GrammarSpec::JsonSchema(value.clone())),
        Value::String(text) => match serde_json::from_str::<Value>(text) {
            Ok(v @ (Value::Object(_) | Value::Bool(true))) => Ok(GrammarSpec::JsonSchema(v)),
            Ok(_) => Err(invalid(param, "the JSON schema must be an object")),
            Err(e) => Err(invalid(param, format!("the JSON schema is not valid JSON: {e}"))),
        },
        _ => Err(invalid(param, "must be a JSON schema (an object)")),
    }
}

fn string_of<'v>(param: &str, value: &'v Value) -> Result<&'v str, InvalidParam> {
    value.as_str().ok_or_else(|| invalid(param, "must be a string"))
}

fn choices_of(param: &str, value: &Value) -> Result<GrammarSpec, InvalidParam> {
    let list = value.as_array().ok_or_else(|| invalid(param, "must be a list of strings"))?;
    let choices = list
        .iter()
        .map(|c| c.as_str().map(str::to_owned))
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| invalid(param, "must be a list of strings"))?;
    if choices.is_empty() {
        return Err(invalid(param, "the list of choices is empty"));
    }
    Ok(GrammarSpec::Choice(choices))
}

/// vLLM's structural tag, `{"structures": [{"begin", "schema", "end"}], "triggers": [...]}`, as
/// an object or as JSON text (`type: "structural_tag"` may be in it).
fn structural_tag_of(param: &str, value: &Value) -> Result<GrammarSpec, InvalidParam> {
    let parsed;
    let value = match value {
        Value::String(text) => {
            parsed = serde_json::from_str::<Value>(text)
                .map_err(|e| invalid(param, format!("the structural tag is not valid JSON: {e}")))?;
            &parsed
        }
        other => other,
    };
    let obj = value
        .as_object()
        .ok_or_else(|| invalid(param, "must be an object with `structures` and `triggers`"))?;
    let list = |key: &str| {
        obj.get(key)
            .and_then(Value::as_array)
            .ok_or_else(|| invalid(&format!("{param}.{key}"), "is required (a list)"))
    };
    let structures = list("structures")?
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let p = format!("{param}.structures[{i}]");
            let text = |key: &str| {
                s.get(key)
                    .and_then(Value::as_str)
                    .map(str::to_owned)
                    .ok_or_else(|| invalid(&format!("{p}.{key}"), "must be a string"))
            };
            let schema = s.get("schema").cloned().unwrap_or(Value::Bool(true));
            Ok(TagStructure { begin: text("begin")?, schema, end: text("end")? })
        })
        .collect::<Result<Vec<_>, InvalidParam>>()?;
    let triggers = list("triggers")?
        .iter()
        .map(|t| t.as_str().map(str::to_owned))
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| invalid(&format!("{param}.triggers"), "must be a list of strings"))?;
    Ok(GrammarSpec::StructuralTag(StructuralTag { structures, triggers }))
}

/// `response_format`: `None` for plain text.
fn response_format(value: &Value) -> Result<Option<GrammarSpec>, InvalidParam> {
    const P: &str = "response_format";
    let obj = value.as_object().ok_or_else(|| invalid(P, "must be an object with a `type`"))?;
    let kind = obj
        .get("type")
        .and_then(Value::as_str)
        .ok_or_else(|| invalid("response_format.type", "is required"))?;
    match kind {
        "text" => Ok(None),
        "json_object" => Ok(Some(GrammarSpec::JsonObject)),
        "json_schema" => {
            let js = obj.get("json_schema").and_then(Value::as_object).ok_or_else(|| {
                invalid("response_format.json_schema", "is required for type `json_schema`")
            })?;
            if let Some(strict) = js.get("strict") {
                if !strict.is_boolean() && !strict.is_null() {
                    return Err(invalid("response_format.json_schema.strict", "must be a boolean"));
                }
            }
            // OpenAI's SDK also sends the schema as `schema`; some clients use `json_schema`.
            let schema = js
                .get("schema")
                .ok_or_else(|| invalid("response_format.json_schema.schema", "is required"))?;
            schema_of("response_format.json_schema.schema", schema).map(Some)
        }
        "structural_tag" => structural_tag_of("response_format", value).map(Some),
        other => Err(invalid(
            "response_format.type",
            format!(
                "`{other}` is not supported; use `text`, `json_object`, `json_schema` or `structural_tag`"
            ),
        )),
    }
}

/// vLLM's `structured_outputs` object.
fn structured_outputs(value: &Value) -> Result<(GrammarSpec, String), InvalidParam> {
    const P: &str = "structured_outputs";
    let obj = value.as_object().ok_or_else(|| invalid(P, "must be an object"))?;
    let mut found: Option<(GrammarSpec, String)> = None;
    for (key, v) in obj {
        let param = format!("{P}.{key}");
        let spec = match key.as_str() {
            _ if v.is_null() => continue,
            "json" => schema_of(&param, v)?,
            "regex" => GrammarSpec::Regex(string_of(&param, v)?.to_owned()),
            "choice" => choices_of(&param, v)?,
            "grammar" => GrammarSpec::Lark(string_of(&param, v)?.to_owned()),
            "json_object" => match v.as_bool() {
                Some(true) => GrammarSpec::JsonObject,
                Some(false) => continue,
                None => return Err(invalid(&param, "must be a boolean")),
            },
            "structural_tag" => structural_tag_of(&param, v)?,
            _ => {
                return Err(invalid(
                    &param,
                    "unknown field; give one of `json`, `regex`, `choice`, `grammar`, `json_object`",
                ))
            }
        };
        if let Some((_, first)) = &found {
            return Err(invalid(&param, format!("only one grammar may be given, and `{first}` is set")));
        }
        found = Some((spec, param));
    }
    found.ok_or_else(|| invalid(P, "give one of `json`, `regex`, `choice`, `grammar`, `json_object`"))
}

/// A `response_format` that another API spells elsewhere (`text.format` in the Responses API,
/// `output_config.format` in Anthropic's), read by the same rules, its errors naming `param`.
pub fn response_format_at(
    param: &str,
    response_format: &Value,
) -> Result<Option<RequestedGrammar>, InvalidParam> {
    let rename = |p: &str| p.replace("response_format.json_schema", param).replace("response_format", param);
    let fields = GrammarFields { response_format: Some(response_format), ..Default::default() };
    match fields.grammar() {
        Ok(grammar) => Ok(grammar.map(|g| RequestedGrammar { param: rename(&g.param), spec: g.spec })),
        Err(e) => Err(InvalidParam { param: e.param.as_deref().map(rename), message: rename(&e.message) }),
    }
}

impl GrammarFields<'_> {
    /// The grammar the request asks for, if any.
    pub fn grammar(&self) -> Result<Option<RequestedGrammar>, InvalidParam> {
        let mut asked: Vec<RequestedGrammar> = Vec::new();
        let mut push =
            |spec: GrammarSpec, param: &str| asked.push(RequestedGrammar { spec, param: param.to_owned() });
        if let Some(v) = self.response_format.filter(|v| !v.is_null()) {
            if let Some(spec) = response_format(v)? {
                let param = match spec {
                    GrammarSpec::JsonSchema(_) => "response_format.json_schema.schema",
                    _ => "response_format",
                };
                push(spec, param);
            }
        }
        if let Some(v) = self.structured_outputs.filter(|v| !v.is_null()) {
            let (spec, param) = structured_outputs(v)?;
            push(spec, &param);
        }
        if let Some(v) = self.guided_json.filter(|v| !v.is_null()) {
            push(schema_of("guided_json", v)?, "guided_json");
        }
        if let Some(rx) = self.guided_regex {
            push(GrammarSpec::Regex(rx.to_owned()), "guided_regex");
        }
        if let Some(choices) = self.guided_choice {
            push(choices_of("guided_choice", &Value::from(choices.to_vec()))?, "guided_choice");
        }
        if let Some(g) = self.guided_grammar {
            push(GrammarSpec::Lark(g.to_owned()), "guided_grammar");
        }
        if asked.len() > 1 {
            let root = |p: &str| p.split('.').next().unwrap_or(p).to_owned();
            return Err(invalid(
                &root(&asked[1].param),
                format!(
                    "only one structured-output field may be given, and `{}` is set",
                    root(&asked[0].param)
                ),
            ));
        }
        Ok(asked.pop())
    }
}

/// Compiles the grammar on the blocking pool (a cache hit returns at once).
pub async fn compile(state: &AppState, requested: RequestedGrammar) -> Result<CompiledGrammar, ApiError> {
    let RequestedGrammar { spec, param } = requested;
    let kind = spec.kind();
    let grammars = state.grammars.clone();
    // Waits for the compiler too, while it is still being built after start-up.
    let compiled =
        tokio::task::spawn_blocking(move || grammars.get().map(|compiler| compiler.compile(&spec)))
            .await
            .map_err(|e| ApiError::Internal(format!("grammar compilation stopped: {e}")))?;
    let Some(compiled) = compiled else {
        return Err(ApiError::invalid(
            param,
            "structured output is not available for this model's tokenizer (see the server log)",
        ));
    };
    match compiled {
        Ok(grammar) => {
            state.metrics.record_grammar_compile(kind, grammar.compile_time, grammar.cache_hit);
            Ok(grammar)
        }
        // The compiler's own failure is the server's, not the request's.
        Err(GrammarError::Compiler(why)) => {
            Err(ApiError::Internal(format!("grammar compilation stopped: {why}")))
        }
        // Malformed, too deep (`pagoda_structured::limits`), or no vocabulary for it.
        Err(other) => Err(ApiError::invalid(param.clone(), format!("`{param}`: {other}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn fields(v: &Value) -> GrammarFields<'_> {
        GrammarFields { response_format: Some(v), ..Default::default() }
    }

    #[test]
    fn response_format_kinds() {
        assert_eq!(fields(&json!({"type": "text"})).grammar(), Ok(None));
        let g = fields(&json!({"type": "json_object"})).grammar().unwrap().unwrap();
        assert_eq!(g.spec, GrammarSpec::JsonObject);
        let schema = json!({"type": "object"});
        let rf =
            json!({"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": true}});
        let g = fields(&rf).grammar().unwrap().unwrap();
        assert_eq!(
            (g.spec, g.param.as_str()),
            (GrammarSpec::JsonSchema(schema), "response_format.json_schema.schema")
        );
        let bad = [
            (json!("json"), "response_format"),
            (json!({}), "response_format.type"),
            (json!({"type": "yaml"}), "response_format.type"),
            (json!({"type": "json_schema"}), "response_format.json_schema"),
            (
                json!({"type": "json_schema", "json_schema": {"name": "x"}}),
                "response_format.json_schema.schema",
            ),
            (
                json!({"type": "json_schema", "json_schema": {"schema": 3}}),
                "response_format.json_schema.schema",
            ),
            (
                json!({"type": "json_schema", "json_schema": {"schema": {}, "strict": "yes"}}),
                "response_format.json_schema.strict",
            ),
        ];
        for (v, param) in bad {
            let err = fields(&v).grammar().unwrap_err();
            assert_eq!(err.param.as_deref(), Some(param), "{v}: {}", err.message);
        }
    }

    #[test]
    fn structured_outputs_and_guided_fields() {
        let so = json!({"regex": "[0-9]+"});
        let g =
            GrammarFields { structured_outputs: Some(&so), ..Default::default() }.grammar().unwrap().unwrap();
        assert_eq!(
            (g.spec, g.param.as_str()),
            (GrammarSpec::Regex("[0-9]+".into()), "structured_outputs.regex")
        );
        let so = json!({"json": "{\"type\": \"object\"}"});
        let g =
            GrammarFields { structured_outputs: Some(&so), ..Default::default() }.grammar().unwrap().unwrap();
        assert_eq!(g.spec, GrammarSpec::JsonSchema(json!({"type": "object"})));
        let two = json!({"regex": "a", "choice": ["a"]});
        let err =
            GrammarFields { structured_outputs: Some(&two), ..Default::default() }.grammar().unwrap_err();
        assert!(err.message.contains("only one"), "{}", err.message);
        let tag = json!({"structural_tag": "{}"});
        let err =
            GrammarFields { structured_outputs: Some(&tag), ..Default::default() }.grammar().unwrap_err();
        assert_eq!(err.param.as_deref(), Some("structured_outputs.structural_tag.structures"));
        let tag = json!({"structural_tag": {"structures": [{"begin": "<f>", "schema": {"type": "object"}, "end": "</f>"}], "triggers": ["<f"]}});
        let g = GrammarFields { structured_outputs: Some(&tag), ..Default::default() }
            .grammar()
            .unwrap()
            .unwrap();
        assert!(
            matches!(g.spec, GrammarSpec::StructuralTag(ref t) if t.triggers == ["<f"] && t.structures[0].end == "</f>")
        );
        let rf = json!({"type": "structural_tag", "structures": [{"begin": "<f>", "end": "</f>"}], "triggers": ["<f"]});
        let g = fields(&rf).grammar().unwrap().unwrap();
        assert_eq!(g.param, "response_format");
        let choices = vec!["a".to_owned(), "b".to_owned()];
        let g =
            GrammarFields { guided_choice: Some(&choices), ..Default::default() }.grammar().unwrap().unwrap();
        assert_eq!(g.spec, GrammarSpec::Choice(choices.clone()));
        let rf = json!({"type": "json_object"});
        let err = GrammarFields { response_format: Some(&rf), guided_regex: Some("x"), ..Default::default() }
            .grammar()
            .unwrap_err();
        assert_eq!(err.param.as_deref(), Some("guided_regex"));
        let empty: Vec<String> = Vec::new();
        let err = GrammarFields { guided_choice: Some(&empty), ..Default::default() }.grammar().unwrap_err();
        assert_eq!(err.param.as_deref(), Some("guided_choice"));
    }
}

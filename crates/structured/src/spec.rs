//! [`GrammarSpec`]: what a request's output must match, in the forms the API accepts (JSON
//! schema, any JSON object, regex, a choice of literals, a Lark grammar), and its translation
//! to llguidance's grammar.

use llguidance::api::TopLevelGrammar;
use serde_json::{json, Value};

use crate::GrammarError;

/// A grammar the output must match.
#[derive(Debug, Clone, PartialEq)]
pub enum GrammarSpec {
    /// A JSON schema (`response_format: json_schema`, `guided_json`, `structured_outputs.json`).
    JsonSchema(Value),
    /// Any JSON object (`response_format: json_object`).
    JsonObject,
    /// A regular expression the whole output matches (Rust `regex` syntax, no anchors needed).
    Regex(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
    /// A grammar in llguidance's Lark dialect (`guided_grammar`, `structured_outputs.grammar`).
    Lark(String),
}

/// JSON whitespace: none but one space after `:` and `,`, the way models were mostly trained to
/// write JSON. Flexible whitespace lets a small model wander into endless blank lines.
fn json_layout() -> Value {
    json!({ "whitespace_flexible": false, "item_separator": ", ", "key_separator": ": " })
}

/// `schema` with our JSON layout, unless the schema sets its own (`x-guidance`).
fn with_layout(schema: &Value) -> Value {
    let mut schema = schema.clone();
    if let Value::Object(map) = &mut schema {
        let mut layout = json_layout();
        if let (Some(Value::Object(theirs)), Value::Object(ours)) = (map.get("x-guidance"), &mut layout) {
            for (k, v) in theirs {
                ours.insert(k.clone(), v.clone());
            }
        }
        map.insert("x-guidance".into(), layout);
    }
    schema
}

impl GrammarSpec {
    /// A stable text that identifies the grammar: equal keys compile to equal grammars.
    pub fn cache_key(&self) -> String {
        match self {
            GrammarSpec::JsonSchema(v) => format!("json:{v}"),
            GrammarSpec::JsonObject => "json_object".into(),
            GrammarSpec::Regex(r) => format!("regex:{r}"),
            GrammarSpec::Choice(c) => format!("choice:{}", Value::from(c.clone())),
            GrammarSpec::Lark(g) => format!("lark:{g}"),
        }
    }

    /// The kind of grammar, for logs and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            GrammarSpec::JsonSchema(_) => "json_schema",
            GrammarSpec::JsonObject => "json_object",
            GrammarSpec::Regex(_) => "regex",
            GrammarSpec::Choice(_) => "choice",
            GrammarSpec::Lark(_) => "grammar",
        }
    }

    pub(crate) fn to_llguidance(&self) -> Result<TopLevelGrammar, GrammarError> {
        Ok(match self {
            GrammarSpec::JsonSchema(schema) => {
                if !schema.is_object() && !schema.is_boolean() {
                    return Err(GrammarError::Invalid("a JSON schema must be an object".into()));
                }
                let schema = if schema == &Value::Bool(true) { json!({}) } else { schema.clone() };
                TopLevelGrammar::from_json_schema(with_layout(&schema))
            }
            GrammarSpec::JsonObject => {
                TopLevelGrammar::from_json_schema(with_layout(&json!({"type": "object"})))
            }
            GrammarSpec::Regex(rx) => {
                if rx.is_empty() {
                    return Err(GrammarError::Invalid("the regular expression is empty".into()));
                }
                TopLevelGrammar::from_regex(rx)
            }
            GrammarSpec::Choice(choices) => {
                if choices.is_empty() {
                    return Err(GrammarError::Invalid("the list of choices is empty".into()));
                }
                let alternatives: Vec<String> =
                    choices.iter().map(|c| format!("({})", escape_regex(c))).collect();
                TopLevelGrammar::from_regex(&alternatives.join("|"))
            }
            GrammarSpec::Lark(grammar) => {
                if grammar.trim().is_empty() {
                    return Err(GrammarError::Invalid("the grammar is empty".into()));
                }
                TopLevelGrammar::from_lark(grammar.clone())
            }
        })
    }
}

/// `text` as a regex that matches exactly it.
pub(crate) fn escape_regex(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if "\\.+*?()|[]{}^$#&-~/".contains(c) {
            out.push('\\');
            out.push(c);
        } else if c == '\n' {
            out.push_str("\\n");
        } else if c == '\t' {
            out.push_str("\\t");
        } else if c == '\r' {
            out.push_str("\\r");
        } else {
            out.push(c);
        }
    }
    out
}

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
    /// Free text in which each tag that starts with a trigger must be complete and valid
    /// (vLLM's `structural_tag`).
    StructuralTag(StructuralTag),
}

/// One tagged structure: `begin`, a JSON value matching `schema`, `end`.
#[derive(Debug, Clone, PartialEq)]
pub struct TagStructure {
    pub begin: String,
    pub schema: Value,
    pub end: String,
}

/// vLLM's structural tag: text is free until one of `triggers` appears; from there the output
/// must be one of the `structures` whose `begin` starts with that trigger, then free text again.
#[derive(Debug, Clone, PartialEq)]
pub struct StructuralTag {
    pub structures: Vec<TagStructure>,
    pub triggers: Vec<String>,
}

impl StructuralTag {
    /// The tag as a Lark grammar: text that contains no trigger, and complete structures.
    fn to_lark(&self) -> Result<String, GrammarError> {
        let bad = |what: String| Err(GrammarError::Invalid(what));
        if self.triggers.is_empty() || self.triggers.iter().any(String::is_empty) {
            return bad("`triggers` must be a non-empty list of non-empty strings".into());
        }
        if self.structures.is_empty() {
            return bad("`structures` must not be empty".into());
        }
        let mut lines = Vec::new();
        let mut segments = Vec::new();
        for (i, s) in self.structures.iter().enumerate() {
            if !self.triggers.iter().any(|t| s.begin.starts_with(t.as_str())) {
                return bad(format!("structures[{i}].begin {:?} does not start with any trigger", s.begin));
            }
            if !s.schema.is_object() && s.schema != Value::Bool(true) {
                return bad(format!("structures[{i}].schema must be a JSON schema object"));
            }
        }
        // Per trigger: free text up to and including the trigger (a lazy rule that ends at its
        // first occurrence), then the rest of one of the structures it starts.
        for (t, trigger) in self.triggers.iter().enumerate() {
            let mut rests = Vec::new();
            for (i, s) in self.structures.iter().enumerate() {
                let Some(rest) = s.begin.strip_prefix(trigger.as_str()) else { continue };
                let schema = if s.schema == Value::Bool(true) { json!({}) } else { with_layout(&s.schema) };
                let rest = if rest.is_empty() { String::new() } else { format!("{} ", Value::from(rest)) };
                lines.push(format!("tag_{t}_{i}: {rest}%json {schema} {}", Value::from(s.end.as_str())));
                rests.push(format!("tag_{t}_{i}"));
            }
            if rests.is_empty() {
                continue;
            }
            lines.push(format!("to_{t}[suffix={}]: /(.|\\n)*/", Value::from(trigger.as_str())));
            lines.push(format!("after_{t}: {}", rests.join(" | ")));
            segments.push(format!("to_{t} after_{t}"));
        }
        let triggers: Vec<String> = self.triggers.iter().map(|t| escape_regex(t)).collect();
        Ok(format!(
            "start: segment* end\nsegment: {}\nend: \"\" | END\nEND: /(.|\\n)+/ & ~/(.|\\n)*({})(.|\\n)*/\n{}\n",
            segments.join(" | "),
            triggers.join("|"),
            lines.join("\n")
        ))
    }
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
            GrammarSpec::StructuralTag(t) => {
                let structures: Vec<Value> = t
                    .structures
                    .iter()
                    .map(|s| json!({"begin": s.begin, "schema": s.schema, "end": s.end}))
                    .collect();
                format!("structural_tag:{}", json!({"structures": structures, "triggers": t.triggers}))
            }
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
            GrammarSpec::StructuralTag(_) => "structural_tag",
        }
    }

    /// What to tell a client whose grammar compiles but allows no output at all.
    pub(crate) fn matches_nothing(&self) -> &'static str {
        match self {
            GrammarSpec::JsonSchema(_) | GrammarSpec::JsonObject => {
                "the JSON schema matches no value at all, as with a `$ref` that refers only to itself (or a cycle of `$ref`s with nothing else to match)"
            }
            GrammarSpec::Lark(_) | GrammarSpec::StructuralTag(_) => {
                "the grammar matches no text at all, as with a rule that refers only to itself (or rules that refer only to each other)"
            }
            GrammarSpec::Regex(_) | GrammarSpec::Choice(_) => "the pattern matches no text",
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
            GrammarSpec::StructuralTag(tag) => TopLevelGrammar::from_lark(tag.to_lark()?),
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

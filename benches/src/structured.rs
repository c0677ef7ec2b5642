//! `pagoda-bench serve --json-schema`: the JSON schemas requests ask for, the prompts their
//! descriptions give, and the check of every answer against its schema (`--validate`).
//!
//! - [`load_schemas`] reads one schema file, or every `*.json` file of a directory in file-name
//!   order. Request `i` asks for schema `i % n` ([`SchemaSet::for_request`]) with
//!   `response_format: {"type": "json_schema", "json_schema": {"name", "schema", "strict": true}}`,
//!   the name being the file stem with `-` (and anything else OpenAI refuses in a name) as `_`.
//! - A schema with a top-level `description` gives its requests the prompt
//!   `"<description>. Answer in JSON."` ([`Schema::prompt`], [`use_schema_prompts`]).
//! - With validation on, a successful request's answer is parsed as JSON and validated with the
//!   `jsonschema` crate, formats included ([`SchemaSet::check`]); the run's counts are a
//!   [`ValiditySummary`], and the first invalid answers are shown ([`invalid_examples`]).
//! - [`grammar_layout`] writes a JSON value the way Pagoda's grammar does (the `structured`
//!   bench walks such text through the grammar).

use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::{json, Value};

use crate::client::Outcome;
use crate::dataset::Dataset;
use crate::metrics::RequestResult;
use crate::sse::clip;

/// What follows a schema's description in its prompt.
pub const PROMPT_SUFFIX: &str = ". Answer in JSON.";

/// Characters of an invalid answer kept for the report.
pub const INVALID_TEXT_CHARS: usize = 160;

/// Validation errors named in one `invalid_reason`.
const REASONS_KEPT: usize = 3;

/// Why `--json-schema` could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    #[error("--json-schema {}: {source}", path.display())]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{}: not JSON: {source}", path.display())]
    NotJson { path: PathBuf, source: serde_json::Error },
    #[error("{}: not a valid JSON schema: {message}", path.display())]
    Invalid { path: PathBuf, message: String },
    #[error("--json-schema {}: the directory holds no *.json file", path.display())]
    Empty { path: PathBuf },
}

/// One schema of the run.
pub struct Schema {
    /// The file name, e.g. `01-user-profile.json`.
    pub file: String,
    /// `json_schema.name`: the file stem, e.g. `01_user_profile`.
    pub name: String,
    pub schema: Value,
    /// The top-level `description`, when it is a non-empty string.
    pub description: Option<String>,
    response_format: Value,
    validator: jsonschema::Validator,
}

impl std::fmt::Debug for Schema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Schema").field("file", &self.file).field("name", &self.name).finish_non_exhaustive()
    }
}

/// `stem` as a `json_schema.name`: OpenAI accepts `[a-zA-Z0-9_-]`, and `-` becomes `_` too.
pub fn schema_name(stem: &str) -> String {
    stem.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' }).collect()
}

impl Schema {
    /// A schema named after `file`; the error is the reason it is not a valid schema.
    pub fn new(file: impl Into<String>, schema: Value) -> Result<Self, String> {
        let file = file.into();
        let stem = file.strip_suffix(".json").unwrap_or(&file);
        let name = schema_name(stem);
        let validator =
            jsonschema::options().should_validate_formats(true).build(&schema).map_err(|e| e.to_string())?;
        let description = schema
            .get("description")
            .and_then(Value::as_str)
            .map(str::trim)
            .filter(|d| !d.is_empty())
            .map(str::to_owned);
        let response_format = json!({
            "type": "json_schema",
            "json_schema": {"name": name, "schema": schema, "strict": true},
        });
        Ok(Self { file, name, schema, description, response_format, validator })
    }

    /// The `response_format` of its requests.
    pub fn response_format(&self) -> &Value {
        &self.response_format
    }

    /// `"<description>. Answer in JSON."`, when the schema has a description.
    pub fn prompt(&self) -> Option<String> {
        let description = self.description.as_deref()?;
        Some(format!("{}{PROMPT_SUFFIX}", description.trim_end_matches('.')))
    }

    /// Whether `text` is JSON valid against the schema; the error says why not.
    pub fn check_text(&self, text: &str) -> Result<(), String> {
        let value: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
        let reasons: Vec<String> = self
            .validator
            .iter_errors(&value)
            .take(REASONS_KEPT)
            .map(|e| match e.instance_path().to_string() {
                at if at.is_empty() => e.to_string(),
                at => format!("at {at}: {e}"),
            })
            .collect();
        if reasons.is_empty() {
            Ok(())
        } else {
            Err(clip(&reasons.join("; ")))
        }
    }
}

/// Reads `path`: a schema file, or a directory whose `*.json` files are read in name order.
pub fn load_schemas(path: &Path) -> Result<Vec<Schema>, SchemaError> {
    let read_error = |source| SchemaError::Read { path: path.to_owned(), source };
    let files = if path.is_dir() {
        let mut files = Vec::new();
        for entry in std::fs::read_dir(path).map_err(read_error)? {
            let file = entry.map_err(read_error)?.path();
            if file.is_file() && file.extension().is_some_and(|x| x == "json") {
                files.push(file);
            }
        }
        files.sort_by(|a, b| a.file_name().cmp(&b.file_name()));
        if files.is_empty() {
            return Err(SchemaError::Empty { path: path.to_owned() });
        }
        files
    } else {
        vec![path.to_owned()]
    };
    files.iter().map(|f| load_schema_file(f)).collect()
}

fn load_schema_file(path: &Path) -> Result<Schema, SchemaError> {
    let text = std::fs::read_to_string(path)
        .map_err(|source| SchemaError::Read { path: path.to_owned(), source })?;
    let schema: Value = serde_json::from_str(&text)
        .map_err(|source| SchemaError::NotJson { path: path.to_owned(), source })?;
    let file = path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into());
    Schema::new(file, schema).map_err(|message| SchemaError::Invalid { path: path.to_owned(), message })
}

/// The result of checking one request's answer, saved with the request.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SchemaCheck {
    /// The schema's file name.
    pub schema: String,
    /// Whether the answer is JSON valid against the schema; `None` when it was not checked
    /// (validation off, or the request failed).
    pub valid: Option<bool>,
    pub invalid_reason: Option<String>,
    /// The start of an invalid answer.
    pub invalid_text: Option<String>,
}

/// The schemas of a run; request `i` asks for schema `i % n`.
#[derive(Debug)]
pub struct SchemaSet {
    schemas: Vec<Schema>,
    /// Check every answer (the client then keeps the answers' text).
    pub validate: bool,
}

impl SchemaSet {
    /// `None` for no schemas.
    pub fn new(schemas: Vec<Schema>, validate: bool) -> Option<Self> {
        (!schemas.is_empty()).then_some(Self { schemas, validate })
    }

    pub fn schemas(&self) -> &[Schema] {
        &self.schemas
    }

    pub fn for_request(&self, index: usize) -> &Schema {
        &self.schemas[index % self.schemas.len()]
    }

    /// Request `index`'s check: its answer against its schema, if validating and it succeeded.
    pub fn check(&self, index: usize, outcome: &Outcome) -> SchemaCheck {
        let schema = self.for_request(index);
        let mut check = SchemaCheck {
            schema: schema.file.clone(),
            valid: None,
            invalid_reason: None,
            invalid_text: None,
        };
        if !self.validate || outcome.error.is_some() {
            return check;
        }
        let text = outcome.text.as_deref().unwrap_or_default();
        match schema.check_text(text) {
            Ok(()) => check.valid = Some(true),
            Err(reason) => {
                check.valid = Some(false);
                check.invalid_reason = Some(match outcome.finish_reason.as_deref() {
                    Some("length") => format!("cut off by max_tokens; {reason}"),
                    _ => reason,
                });
                check.invalid_text = Some(truncate(text, INVALID_TEXT_CHARS));
            }
        }
        check
    }
}

/// At most `max` characters of `s`, with `…` when cut.
fn truncate(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_owned(),
    }
}

/// Gives every request whose schema has a description that prompt; `count` measures it in
/// tokens. Output lengths (`max_tokens`) stay the dataset's.
pub fn use_schema_prompts<E>(
    dataset: &mut Dataset,
    schemas: &SchemaSet,
    count: impl Fn(&str) -> Result<usize, E>,
) -> Result<(), E> {
    for (index, prompt) in dataset.prompts.iter_mut().enumerate() {
        if let Some(text) = schemas.for_request(index).prompt() {
            prompt.prompt_len = count(&text)?;
            prompt.text = text;
        }
    }
    Ok(())
}

/// How many answers were valid, over the successful requests that were checked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ValiditySummary {
    /// Successful requests whose answer was checked.
    pub checked: usize,
    pub valid: usize,
    /// Checked answers that finished with `length`: cut off by `max_tokens`, so (almost
    /// always) incomplete and invalid.
    pub finished_length: usize,
    /// Invalid answers that were not cut off; a grammar that holds makes these impossible.
    pub invalid_not_cut_off: usize,
}

/// The validity counts of `results`; `None` when no answer was checked.
pub fn summarize_validity(results: &[RequestResult]) -> Option<ValiditySummary> {
    let checked: Vec<(&RequestResult, bool)> = results
        .iter()
        .filter(|r| r.success)
        .filter_map(|r| Some((r, r.schema_check.as_ref()?.valid?)))
        .collect();
    if checked.is_empty() {
        return None;
    }
    let cut = |r: &RequestResult| r.finish_reason.as_deref() == Some("length");
    Some(ValiditySummary {
        checked: checked.len(),
        valid: checked.iter().filter(|(_, valid)| *valid).count(),
        finished_length: checked.iter().filter(|(r, _)| cut(r)).count(),
        invalid_not_cut_off: checked.iter().filter(|(r, valid)| !valid && !cut(r)).count(),
    })
}

/// The first `limit` invalid answers as report lines: file, request, reason and text.
pub fn invalid_examples(results: &[RequestResult], limit: usize) -> Vec<String> {
    results
        .iter()
        .filter_map(|r| Some((r, r.schema_check.as_ref().filter(|c| c.valid == Some(false))?)))
        .take(limit)
        .map(|(r, c)| {
            format!(
                "{} (request {}, finish_reason {}): {}\n    text: {}",
                c.schema,
                r.index,
                r.finish_reason.as_deref().unwrap_or("none"),
                c.invalid_reason.as_deref().unwrap_or("?"),
                c.invalid_text.as_deref().unwrap_or(""),
            )
        })
        .collect()
}

/// `value` as Pagoda's grammar writes JSON: `", "` between items, `": "` after keys, keys in
/// the value's order, nothing else.
pub fn grammar_layout(value: &Value) -> String {
    match value {
        Value::Array(items) => {
            format!("[{}]", items.iter().map(grammar_layout).collect::<Vec<_>>().join(", "))
        }
        Value::Object(map) => {
            let members: Vec<String> = map
                .iter()
                .map(|(k, v)| format!("{}: {}", Value::from(k.as_str()), grammar_layout(v)))
                .collect();
            format!("{{{}}}", members.join(", "))
        }
        other => other.to_string(),
    }
}

#[cfg(test)]
#[path = "structured_tests.rs"]
mod tests;

//! Chat templates: turning a list of chat messages into the prompt text a model expects.
//!
//! Templates are the Jinja sources models ship (`tokenizer.chat_template` in GGUF,
//! `chat_template` in `tokenizer_config.json`), rendered with minijinja in an environment set
//! up like Hugging Face's `apply_chat_template`: `trim_blocks` and `lstrip_blocks` on, loop
//! controls (`break` / `continue`), Python string/dict methods (`.strip()`, `.startswith()`,
//! `.split()`, `.items()`, ...), `raise_exception(msg)`, `strftime_now(fmt)`, a Python-style
//! `tojson`, and the variables `messages`, `add_generation_prompt`, `bos_token`, `eos_token`,
//! `tools` and `documents` (both none unless given).

use std::collections::BTreeMap;

use minijinja::value::Kwargs;
use minijinja::{Environment, Error, ErrorKind, Value};
use serde::{Deserialize, Serialize};

use crate::template_funcs;

/// The template's name inside its environment.
const NAME: &str = "chat_template";

/// One chat message as templates see it (Hugging Face's conventions: an assistant turn's
/// `tool_calls` are `{"type": "function", "function": {"name", "arguments": {...}}}` with the
/// arguments as an object; a `tool` message names the call it answers in `tool_call_id`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<serde_json::Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self { role: role.into(), content: content.into(), tool_calls: None, tool_call_id: None, name: None }
    }
}

/// Why a template could not be compiled or rendered.
#[derive(Debug, thiserror::Error)]
pub enum ChatTemplateError {
    /// The template source is not valid Jinja.
    #[error("chat template does not compile: {0}")]
    Syntax(String),
    /// The template called `raise_exception(message)`, typically to reject the conversation
    /// (e.g. roles not alternating); the message is meant for the client.
    #[error("{0}")]
    Raised(String),
    /// Rendering failed for another reason (e.g. an undefined method or a type error).
    #[error("chat template failed to render: {0}")]
    Render(String),
}

/// The error `raise_exception` returns, found again in the render error's source chain.
#[derive(Debug)]
struct RaisedException(String);

impl std::fmt::Display for RaisedException {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RaisedException {}

/// A compiled chat template. Compile once, render per request; `&self` rendering is thread-safe.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: Option<String>,
    eos_token: Option<String>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// Compiles `source`. `bos_token` / `eos_token` are the texts templates see under those
    /// names (left undefined when `None`).
    pub fn new(
        source: &str,
        bos_token: Option<&str>,
        eos_token: Option<&str>,
    ) -> Result<Self, ChatTemplateError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", |format: &str| template_funcs::strftime_now(format));
        env.add_filter("tojson", |value: &Value, kwargs: Kwargs| template_funcs::tojson(value, kwargs));
        env.add_template_owned(NAME, source.to_owned())
            .map_err(|e| ChatTemplateError::Syntax(describe(&e)))?;
        Ok(Self {
            env,
            source: source.to_owned(),
            bos_token: bos_token.map(str::to_owned),
            eos_token: eos_token.map(str::to_owned),
        })
    }

    /// The template's Jinja source (e.g. to tell whether it knows tools).
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders `messages`; with `add_generation_prompt` the template appends the opening of the
    /// assistant's turn.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, ChatTemplateError> {
        self.render_with(messages, add_generation_prompt, &serde_json::Map::new())
    }

    /// Like [`ChatTemplate::render`], for any serializable message type (e.g. messages with tool
    /// calls), with `extra` variables such as `tools`. `extra` may override `bos_token`,
    /// `eos_token`, `tools` and `documents`, but not `messages` or `add_generation_prompt`.
    pub fn render_with<M: Serialize>(
        &self,
        messages: &[M],
        add_generation_prompt: bool,
        extra: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String, ChatTemplateError> {
        let mut ctx: BTreeMap<String, Value> = BTreeMap::new();
        ctx.insert("tools".into(), Value::from(()));
        ctx.insert("documents".into(), Value::from(()));
        if let Some(bos) = &self.bos_token {
            ctx.insert("bos_token".into(), Value::from(bos.as_str()));
        }
        if let Some(eos) = &self.eos_token {
            ctx.insert("eos_token".into(), Value::from(eos.as_str()));
        }
        for (key, value) in extra {
            ctx.insert(key.clone(), Value::from_serialize(value));
        }
        ctx.insert("messages".into(), Value::from_serialize(messages));
        ctx.insert("add_generation_prompt".into(), Value::from(add_generation_prompt));

        let template = self.env.get_template(NAME).map_err(|e| ChatTemplateError::Render(describe(&e)))?;
        template.render(ctx).map_err(|e| match raised_message(&e) {
            Some(message) => ChatTemplateError::Raised(message),
            None => ChatTemplateError::Render(describe(&e)),
        })
    }
}

/// `raise_exception(message)`: fails the render with `message`.
fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message.clone()).with_source(RaisedException(message)))
}

/// The message of a `raise_exception` call somewhere in `err`'s source chain.
fn raised_message(err: &Error) -> Option<String> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = source {
        if let Some(raised) = e.downcast_ref::<RaisedException>() {
            return Some(raised.0.clone());
        }
        source = e.source();
    }
    None
}

/// The error with its template location, on one line.
fn describe(err: &Error) -> String {
    let mut text = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(e) = source {
        text.push_str(": ");
        text.push_str(&e.to_string());
        source = e.source();
    }
    text
}

#[cfg(test)]
#[path = "chat_template_tests.rs"]
mod tests;

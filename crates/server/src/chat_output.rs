//! What one chat choice's generated text becomes: reasoning (with `--reasoning-parser`), content,
//! and tool calls (when the request has tools). Streamed and whole responses run the same
//! pipeline, so they always agree: the whole response is the stream's pieces put together.

use pagoda_text::{ReasoningFormat, ReasoningSplitter, ToolCallFormat};

use crate::openai::{FunctionCall, ToolCall, ToolCallDelta};
use crate::tools::output::ToolDeltas;

/// One step's worth of a choice's message.
#[derive(Debug, Default, PartialEq)]
pub struct ChoicePiece {
    pub reasoning: String,
    pub content: String,
    pub tool_calls: Vec<ToolCallDelta>,
}

impl ChoicePiece {
    pub fn is_empty(&self) -> bool {
        self.reasoning.is_empty() && self.content.is_empty() && self.tool_calls.is_empty()
    }
}

/// How a choice's text is split (see the module docs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ChoiceSplit {
    /// The reasoning format, and whether the prompt already opened the reasoning.
    pub reasoning: Option<(ReasoningFormat, bool)>,
    pub tools: Option<ToolCallFormat>,
}

/// See the module docs.
pub struct ChoiceText {
    reasoning: Option<ReasoningSplitter>,
    tools: Option<ToolDeltas>,
}

impl ChoiceText {
    pub fn new(split: ChoiceSplit) -> Self {
        Self {
            reasoning: split.reasoning.map(|(format, opened)| ReasoningSplitter::new(format, opened)),
            tools: split.tools.map(ToolDeltas::new),
        }
    }

    fn content(&mut self, text: &str, last: bool) -> ChoicePiece {
        match &mut self.tools {
            None => ChoicePiece { content: text.to_owned(), ..Default::default() },
            Some(tools) => {
                let parts = if last { tools.push_last(text) } else { tools.push(text) };
                ChoicePiece { reasoning: String::new(), content: parts.content, tool_calls: parts.tool_calls }
            }
        }
    }

    /// The next text delta of the choice; `last` when the choice ends with it.
    pub fn push(&mut self, text: &str, last: bool) -> ChoicePiece {
        let Some(splitter) = &mut self.reasoning else { return self.content(text, last) };
        let mut delta = splitter.push(text);
        if last {
            let tail = splitter.finish();
            delta.reasoning.push_str(&tail.reasoning);
            delta.content.push_str(&tail.content);
        }
        let mut piece = self.content(&delta.content, last);
        piece.reasoning = delta.reasoning;
        piece
    }

    /// Whether the model called a tool.
    pub fn made_calls(&self) -> bool {
        self.tools.as_ref().is_some_and(ToolDeltas::made_calls)
    }
}

/// A whole choice: its text run through the pipeline at once.
#[derive(Debug, Default, PartialEq)]
pub struct ChoiceMessage {
    pub reasoning: Option<String>,
    /// `None` when the model only called tools.
    pub content: Option<String>,
    pub tool_calls: Vec<ToolCall>,
}

pub fn whole_message(split: ChoiceSplit, text: &str) -> ChoiceMessage {
    let mut pipeline = ChoiceText::new(split);
    let piece = pipeline.push(text, true);
    let mut calls: Vec<ToolCall> = Vec::new();
    for d in piece.tool_calls {
        if let Some(id) = d.id {
            calls.push(ToolCall {
                id,
                r#type: "function".to_owned(),
                function: FunctionCall {
                    name: d.function.name.unwrap_or_default(),
                    arguments: String::new(),
                },
            });
        }
        if let (Some(call), Some(args)) = (calls.get_mut(d.index), d.function.arguments) {
            call.function.arguments.push_str(&args);
        }
    }
    let content = if piece.content.is_empty() && !calls.is_empty() { None } else { Some(piece.content) };
    let reasoning = (split.reasoning.is_some() && !piece.reasoning.is_empty()).then_some(piece.reasoning);
    ChoiceMessage { reasoning, content, tool_calls: calls }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasoning_then_a_tool_call() {
        let split = ChoiceSplit {
            reasoning: Some((ReasoningFormat::Qwen3, false)),
            tools: Some(ToolCallFormat::Hermes),
        };
        let text = "<think>\nThe user wants weather.\n</think>\n\n<tool_call>\n{\"name\": \"w\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>";
        let whole = whole_message(split, text);
        assert_eq!(whole.reasoning.as_deref(), Some("The user wants weather."));
        assert_eq!(whole.content, None);
        assert_eq!(whole.tool_calls.len(), 1);
        assert_eq!(
            (whole.tool_calls[0].function.name.as_str(), whole.tool_calls[0].function.arguments.as_str()),
            ("w", r#"{"city":"Oslo"}"#)
        );
        // Streamed a character at a time, the pieces add up to the same message.
        let mut pipeline = ChoiceText::new(split);
        let chars: Vec<char> = text.chars().collect();
        let mut reasoning = String::new();
        let mut args = String::new();
        for (i, c) in chars.iter().enumerate() {
            let p = pipeline.push(&c.to_string(), i + 1 == chars.len());
            reasoning.push_str(&p.reasoning);
            assert!(p.content.is_empty(), "{p:?}");
            args.extend(p.tool_calls.iter().filter_map(|d| d.function.arguments.clone()));
        }
        assert_eq!(reasoning, "The user wants weather.");
        assert_eq!(args, r#"{"city":"Oslo"}"#);
        assert!(pipeline.made_calls());
        let plain = whole_message(ChoiceSplit::default(), "hello");
        assert_eq!(
            plain,
            ChoiceMessage { reasoning: None, content: Some("hello".into()), tool_calls: vec![] }
        );
    }
}

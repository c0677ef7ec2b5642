//! Tool calls out of the model's text as OpenAI's stream deltas ([`ToolDeltas`]); a whole message
//! is the deltas put together (`crate::chat_output`). No markup reaches `content`; text that is
//! not a well-formed call stays content.

use pagoda_text::{ToolCallFormat, ToolCallStreamParser, ToolStreamEvent};

use crate::openai::{FunctionCallDelta, ToolCallDelta};

fn call_id() -> String {
    format!("call_{}", uuid::Uuid::new_v4().simple())
}

/// One choice's stream, turned into content text and tool-call deltas.
#[derive(Debug)]
pub struct ToolDeltas {
    parser: ToolCallStreamParser,
    calls: usize,
}

/// What one piece of text adds to a streamed message.
#[derive(Debug, Default, PartialEq)]
pub struct DeltaParts {
    pub content: String,
    pub tool_calls: Vec<ToolCallDelta>,
}

impl ToolDeltas {
    pub fn new(format: ToolCallFormat) -> Self {
        Self { parser: ToolCallStreamParser::new(format), calls: 0 }
    }

    fn convert(&mut self, events: Vec<ToolStreamEvent>) -> DeltaParts {
        let mut parts = DeltaParts::default();
        for e in events {
            match e {
                ToolStreamEvent::Content(text) => parts.content.push_str(&text),
                ToolStreamEvent::CallStart { index, name } => {
                    self.calls = self.calls.max(index + 1);
                    parts.tool_calls.push(ToolCallDelta {
                        index,
                        id: Some(call_id()),
                        r#type: Some("function".to_owned()),
                        function: FunctionCallDelta { name: Some(name), arguments: Some(String::new()) },
                    });
                }
                ToolStreamEvent::CallArguments { index, fragment } => {
                    // One delta per call in a chunk, as OpenAI sends them (the SDK's stream helper
                    // would take two deltas of one index in the same chunk for two calls).
                    match parts.tool_calls.last_mut() {
                        Some(last) if last.index == index => {
                            last.function.arguments.get_or_insert_with(String::new).push_str(&fragment)
                        }
                        _ => parts.tool_calls.push(ToolCallDelta {
                            index,
                            id: None,
                            r#type: None,
                            function: FunctionCallDelta { name: None, arguments: Some(fragment) },
                        }),
                    }
                }
            }
        }
        parts
    }

    pub fn push(&mut self, text: &str) -> DeltaParts {
        let events = self.parser.push(text);
        self.convert(events)
    }

    /// The end of the choice's text.
    pub fn finish(&mut self) -> DeltaParts {
        let events = self.parser.finish();
        self.convert(events)
    }

    /// The last text of the choice and its end, as one piece (a call finished by the end gets
    /// one delta, not two of the same index).
    pub fn push_last(&mut self, text: &str) -> DeltaParts {
        let mut events = self.parser.push(text);
        events.extend(self.parser.finish());
        self.convert(events)
    }

    /// Whether any call was started.
    pub fn made_calls(&self) -> bool {
        self.calls > 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_streams_as_start_then_arguments() {
        let text = "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}\n</tool_call>";
        let mut deltas = ToolDeltas::new(ToolCallFormat::Hermes);
        let mut parts: Vec<DeltaParts> = text.chars().map(|c| deltas.push(&c.to_string())).collect();
        parts.push(deltas.finish());
        let calls: Vec<&ToolCallDelta> = parts.iter().flat_map(|p| &p.tool_calls).collect();
        assert!(calls[0].id.as_deref().is_some_and(|id| id.starts_with("call_")));
        assert_eq!(calls[0].function.name.as_deref(), Some("add"));
        let args: String = calls.iter().filter_map(|d| d.function.arguments.clone()).collect();
        assert_eq!(args, r#"{"a":1,"b":2}"#);
        assert!(parts.iter().all(|p| p.content.is_empty()));
        assert!(deltas.made_calls());
        // A whole call in one piece is one delta, as OpenAI sends it (one per index a chunk).
        let piece = ToolDeltas::new(ToolCallFormat::Hermes).push_last(text);
        assert_eq!(piece.tool_calls.len(), 1, "{piece:?}");
        assert_eq!(piece.tool_calls[0].function.arguments.as_deref(), Some(r#"{"a":1,"b":2}"#));
    }
}

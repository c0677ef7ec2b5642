//! The engine's output as Anthropic's answer: the blocks of a whole message, and the stream's
//! events (`message_start`, a `content_block_start` / `content_block_delta` /
//! `content_block_stop` run per block, `message_delta`, `message_stop`). Both come from the same
//! [`crate::chat_output`] pipeline as chat completions: reasoning becomes a `thinking` block,
//! content a `text` block and each tool call a `tool_use` block, in that order.

use pagoda_engine::{FinishReason, StopReason};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::wire::{MessagesResponse, MessagesUsage, ResponseBlock};
use crate::chat_output::{ChoiceMessage, ChoicePiece};

/// `toolu_...` for a call id the tool parser made (`call_...`).
pub fn tool_use_id(call_id: &str) -> String {
    format!("toolu_{}", call_id.strip_prefix("call_").unwrap_or(call_id))
}

/// The `signature` of a thinking block: a digest of its text. It lets clients that expect one
/// send the block back; the server does not check it.
pub fn signature(thinking: &str) -> String {
    let digest = Sha256::digest(thinking.as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// A call's arguments as the `input` object.
fn input_of(arguments: &str) -> Value {
    match serde_json::from_str::<Value>(arguments) {
        Ok(v @ Value::Object(_)) => v,
        _ => json!({}),
    }
}

/// `stop_reason` and `stop_sequence` for how the answer ended. `clamped`: `max_tokens` was cut
/// to what the context leaves, so a length stop is the context's.
pub fn stop_reason(
    finish: Option<&FinishReason>,
    made_calls: bool,
    clamped: bool,
) -> (String, Option<String>) {
    match finish {
        Some(FinishReason::Stop(StopReason::StopString(s))) => ("stop_sequence".into(), Some(s.clone())),
        Some(FinishReason::Length) if clamped => ("model_context_window_exceeded".into(), None),
        Some(FinishReason::Length) => ("max_tokens".into(), None),
        _ if made_calls => ("tool_use".into(), None),
        _ => ("end_turn".into(), None),
    }
}

/// The blocks of a whole answer (thinking without its text when `omit_thinking`). A message
/// with nothing in it has one empty text block, as the stream does.
pub fn blocks(message: ChoiceMessage, omit_thinking: bool) -> Vec<ResponseBlock> {
    let mut out = Vec::new();
    if let Some(thinking) = message.reasoning.filter(|r| !r.is_empty()) {
        let signature = signature(&thinking);
        let thinking = if omit_thinking { String::new() } else { thinking };
        out.push(ResponseBlock::Thinking { signature, thinking });
    }
    if let Some(text) = message.content.filter(|c| !c.is_empty()) {
        out.push(ResponseBlock::Text { text });
    }
    for call in message.tool_calls {
        out.push(ResponseBlock::ToolUse {
            id: tool_use_id(&call.id),
            name: call.function.name,
            input: input_of(&call.function.arguments),
        });
    }
    if out.is_empty() {
        out.push(ResponseBlock::Text { text: String::new() });
    }
    out
}

/// What a message's fixed fields are.
#[derive(Debug, Clone)]
pub struct MessageHead {
    pub id: String,
    pub model: String,
}

impl MessageHead {
    pub fn message(
        &self,
        content: Vec<ResponseBlock>,
        stop: Option<(String, Option<String>)>,
        usage: MessagesUsage,
    ) -> MessagesResponse {
        let (stop_reason, stop_sequence) = match stop {
            Some((reason, sequence)) => (Some(reason), sequence),
            None => (None, None),
        };
        MessagesResponse {
            id: self.id.clone(),
            r#type: "message".into(),
            role: "assistant".into(),
            model: self.model.clone(),
            content,
            stop_reason,
            stop_sequence,
            usage,
        }
    }
}

/// One stream event: its name and its data.
pub type StreamEvent = (&'static str, Value);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    Thinking,
    Text,
    ToolUse,
}

/// The content block events of a streamed answer, from its pieces.
#[derive(Debug, Default)]
pub struct BlockEvents {
    open: Option<Open>,
    /// The index the next block gets.
    next: usize,
    /// The open thinking block's text, for its signature.
    thinking: String,
    made_calls: bool,
    /// Thinking blocks are sent without their text (`display: "omitted"`).
    omit_thinking: bool,
}

impl BlockEvents {
    pub fn new(omit_thinking: bool) -> Self {
        Self { omit_thinking, ..Default::default() }
    }

    fn close(&mut self, out: &mut Vec<StreamEvent>) {
        let Some(open) = self.open.take() else { return };
        let index = self.next - 1;
        if open == Open::Thinking {
            let delta = json!({"type": "signature_delta", "signature": signature(&self.thinking)});
            out.push((
                "content_block_delta",
                json!({"type": "content_block_delta", "index": index, "delta": delta}),
            ));
            self.thinking.clear();
        }
        out.push(("content_block_stop", json!({"type": "content_block_stop", "index": index})));
    }

    fn open(&mut self, kind: Open, block: Value, out: &mut Vec<StreamEvent>) {
        self.close(out);
        out.push((
            "content_block_start",
            json!({"type": "content_block_start", "index": self.next, "content_block": block}),
        ));
        self.open = Some(kind);
        self.next += 1;
    }

    fn delta(&self, delta: Value, out: &mut Vec<StreamEvent>) {
        out.push((
            "content_block_delta",
            json!({"type": "content_block_delta", "index": self.next - 1, "delta": delta}),
        ));
    }

    /// The events of one piece of the answer.
    pub fn push(&mut self, piece: ChoicePiece) -> Vec<StreamEvent> {
        let mut out = Vec::new();
        if !piece.reasoning.is_empty() {
            if self.open != Some(Open::Thinking) {
                self.open(
                    Open::Thinking,
                    json!({"type": "thinking", "thinking": "", "signature": ""}),
                    &mut out,
                );
            }
            self.thinking.push_str(&piece.reasoning);
            if !self.omit_thinking {
                self.delta(json!({"type": "thinking_delta", "thinking": piece.reasoning}), &mut out);
            }
        }
        if !piece.content.is_empty() {
            if self.open != Some(Open::Text) {
                self.open(Open::Text, json!({"type": "text", "text": ""}), &mut out);
            }
            self.delta(json!({"type": "text_delta", "text": piece.content}), &mut out);
        }
        for call in piece.tool_calls {
            if let Some(id) = &call.id {
                self.made_calls = true;
                let name = call.function.name.clone().unwrap_or_default();
                let block = json!({"type": "tool_use", "id": tool_use_id(id), "name": name, "input": {}});
                self.open(Open::ToolUse, block, &mut out);
            }
            if let Some(args) = call.function.arguments.filter(|a| !a.is_empty()) {
                if self.open == Some(Open::ToolUse) {
                    self.delta(json!({"type": "input_json_delta", "partial_json": args}), &mut out);
                }
            }
        }
        out
    }

    /// Closes the last block (an answer with none gets one empty text block).
    pub fn finish(&mut self) -> Vec<StreamEvent> {
        let mut out = Vec::new();
        if self.next == 0 {
            self.open(Open::Text, json!({"type": "text", "text": ""}), &mut out);
        }
        self.close(&mut out);
        out
    }

    pub fn made_calls(&self) -> bool {
        self.made_calls
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::openai::{FunctionCallDelta, ToolCallDelta};

    fn names(events: &[StreamEvent]) -> Vec<&'static str> {
        events.iter().map(|(n, _)| *n).collect()
    }

    #[test]
    fn blocks_open_and_close_in_order() {
        let mut b = BlockEvents::default();
        let mut events = b.push(ChoicePiece { reasoning: "think".into(), ..Default::default() });
        events.extend(b.push(ChoicePiece {
            reasoning: " more".into(),
            content: "Hi".into(),
            tool_calls: vec![],
        }));
        events.extend(b.push(ChoicePiece {
            tool_calls: vec![
                ToolCallDelta {
                    index: 0,
                    id: Some("call_abc".into()),
                    r#type: Some("function".into()),
                    function: FunctionCallDelta { name: Some("f".into()), arguments: Some("{\"a\"".into()) },
                },
                ToolCallDelta {
                    index: 0,
                    id: None,
                    r#type: None,
                    function: FunctionCallDelta { name: None, arguments: Some(": 1}".into()) },
                },
            ],
            ..Default::default()
        }));
        events.extend(b.finish());
        assert_eq!(
            names(&events),
            [
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
            ]
        );
        assert_eq!(events[3].1["delta"]["signature"], signature("think more"));
        assert_eq!(events[8].1["content_block"]["id"], "toolu_abc");
        assert_eq!(events[11].1["index"], 2);
        assert!(b.made_calls());
    }

    #[test]
    fn an_empty_answer_has_one_empty_text_block() {
        let mut b = BlockEvents::default();
        assert_eq!(names(&b.finish()), ["content_block_start", "content_block_stop"]);
        assert_eq!(
            blocks(ChoiceMessage::default(), false),
            vec![ResponseBlock::Text { text: String::new() }]
        );
        let thought = ChoiceMessage { reasoning: Some("secret".into()), ..Default::default() };
        let omitted = blocks(thought, true);
        assert_eq!(
            omitted[0],
            ResponseBlock::Thinking { thinking: String::new(), signature: signature("secret") }
        );
    }

    #[test]
    fn stop_reasons() {
        let s = |f: FinishReason, calls| stop_reason(Some(&f), calls, false);
        assert_eq!(stop_reason(Some(&FinishReason::Length), false, true).0, "model_context_window_exceeded");
        assert_eq!(s(FinishReason::Length, false).0, "max_tokens");
        assert_eq!(s(FinishReason::Stop(StopReason::Eos(2)), true).0, "tool_use");
        assert_eq!(s(FinishReason::Stop(StopReason::Eos(2)), false).0, "end_turn");
        assert_eq!(
            s(FinishReason::Stop(StopReason::StopString("x".into())), false),
            ("stop_sequence".into(), Some("x".into()))
        );
    }
}

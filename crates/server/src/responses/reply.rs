//! The engine's output as Responses API output items, whole or as the typed stream events
//! (`response.output_item.added`, `response.content_part.added`, the text, reasoning and
//! function-call argument deltas and their `.done` events, `response.output_item.done`). Both
//! come from the same [`crate::chat_output`] pipeline as chat completions: reasoning becomes a
//! `reasoning` item, content a `message` item, each tool call a `function_call` item, in that
//! order; an answer with neither content nor calls still has its (empty) message.

use serde_json::{json, Value};

use super::request::ToolNamespaces;
use crate::chat_output::{ChoiceMessage, ChoicePiece};

fn new_id(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::new_v4().simple())
}

fn reasoning_item(id: &str, text: &str, encrypted: bool) -> Value {
    let mut item = json!({
        "type": "reasoning", "id": id, "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
    });
    if encrypted {
        // Not encrypted: the reasoning text itself, for clients that keep no server state. It
        // is left out of the prompt when it comes back, like any earlier reasoning.
        item["encrypted_content"] = json!(text);
    }
    item
}

fn text_part(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

fn message_item(id: &str, text: &str, status: &str) -> Value {
    let content = if status == "in_progress" { json!([]) } else { json!([text_part(text)]) };
    json!({"type": "message", "id": id, "status": status, "role": "assistant", "content": content})
}

fn call_item(
    id: &str,
    call_id: &str,
    name: &str,
    arguments: &str,
    status: &str,
    ns: &ToolNamespaces,
) -> Value {
    let mut item = json!({"type": "function_call", "id": id, "call_id": call_id, "name": name, "arguments": arguments, "status": status});
    if let Some(namespace) = ns.of(name) {
        item["namespace"] = json!(namespace);
    }
    item
}

/// The output items of a whole answer; `status` is the items' (`completed` or `incomplete`).
pub fn output_items(
    message: ChoiceMessage,
    encrypted_reasoning: bool,
    status: &str,
    ns: &ToolNamespaces,
) -> Vec<Value> {
    let mut out = Vec::new();
    if let Some(r) = message.reasoning.filter(|r| !r.is_empty()) {
        out.push(reasoning_item(&new_id("rs"), &r, encrypted_reasoning));
    }
    let content = message.content.unwrap_or_default();
    if !content.is_empty() || message.tool_calls.is_empty() {
        out.push(message_item(&new_id("msg"), &content, status));
    }
    for call in message.tool_calls {
        out.push(call_item(
            &new_id("fc"),
            &call.id,
            &call.function.name,
            &call.function.arguments,
            status,
            ns,
        ));
    }
    out
}

/// One stream event: its type and its fields (the handler adds `type` and `sequence_number`).
pub type StreamEvent = (&'static str, Value);

#[derive(Debug)]
enum Open {
    Reasoning {
        id: String,
        text: String,
    },
    Message {
        id: String,
        text: String,
    },
    Call {
        id: String,
        call_id: String,
        name: String,
        arguments: String,
    },
    /// A call of a tool the server runs itself (an MCP tool): no events and no item of its
    /// own; the server's run of it adds its own items.
    Held,
}

/// The output item events of a streamed answer, from its pieces.
#[derive(Debug, Default)]
pub struct OutputEvents {
    open: Option<Open>,
    /// Finished items, in order.
    items: Vec<Value>,
    encrypted_reasoning: bool,
    namespaces: ToolNamespaces,
    made_message: bool,
    made_calls: bool,
    /// Function names whose calls are [`Open::Held`].
    held: Vec<String>,
}

impl OutputEvents {
    pub fn new(encrypted_reasoning: bool, namespaces: ToolNamespaces) -> Self {
        Self { encrypted_reasoning, namespaces, ..Default::default() }
    }

    /// Calls of these functions are the server's to run: they get no `function_call` item.
    pub fn holding(mut self, functions: Vec<String>) -> Self {
        self.held = functions;
        self
    }

    /// Another answer follows the server's tool calls: its items go on after these, and it
    /// gets its own (empty) message if it has neither content nor calls.
    pub fn new_round(&mut self) {
        self.made_message = false;
        self.made_calls = false;
    }

    /// Adds an item the server made (not the model's text), returning its `output_index`.
    pub fn add_item(&mut self, item: Value) -> usize {
        self.items.push(item);
        self.items.len() - 1
    }

    /// The `output_index` of the item with `id`.
    pub fn index_of(&self, id: &str) -> Option<usize> {
        self.items.iter().position(|i| i["id"] == id)
    }

    /// Replaces the item at `index` (a server-made item, finished).
    pub fn replace_item(&mut self, index: usize, item: Value) {
        if let Some(slot) = self.items.get_mut(index) {
            *slot = item;
        }
    }

    fn index(&self) -> usize {
        self.items.len()
    }

    fn close(&mut self, status: &str, out: &mut Vec<StreamEvent>) {
        let Some(open) = self.open.take() else { return };
        let index = self.index();
        let item = match open {
            Open::Held => return,
            Open::Reasoning { id, text } => {
                let part = json!({"type": "reasoning_text", "text": text});
                out.push((
                    "response.reasoning_text.done",
                    json!({"item_id": id, "output_index": index, "content_index": 0, "text": text}),
                ));
                out.push((
                    "response.content_part.done",
                    json!({"item_id": id, "output_index": index, "content_index": 0, "part": part}),
                ));
                reasoning_item(&id, &text, self.encrypted_reasoning)
            }
            Open::Message { id, text } => {
                out.push((
                    "response.output_text.done",
                    json!({"item_id": id, "output_index": index, "content_index": 0, "text": text, "logprobs": []}),
                ));
                out.push(("response.content_part.done", json!({"item_id": id, "output_index": index, "content_index": 0, "part": text_part(&text)})));
                message_item(&id, &text, status)
            }
            Open::Call { id, call_id, name, arguments } => {
                out.push((
                    "response.function_call_arguments.done",
                    json!({"item_id": id, "output_index": index, "name": name, "arguments": arguments}),
                ));
                call_item(&id, &call_id, &name, &arguments, status, &self.namespaces)
            }
        };
        out.push(("response.output_item.done", json!({"output_index": index, "item": item})));
        self.items.push(item);
    }

    fn open(&mut self, open: Open, out: &mut Vec<StreamEvent>) {
        self.close("completed", out);
        let index = self.index();
        let (item, part) = match &open {
            Open::Reasoning { id, .. } => (
                json!({"type": "reasoning", "id": id, "summary": [], "content": []}),
                Some((id.clone(), json!({"type": "reasoning_text", "text": ""}))),
            ),
            Open::Message { id, .. } => {
                self.made_message = true;
                (message_item(id, "", "in_progress"), Some((id.clone(), text_part(""))))
            }
            Open::Call { id, call_id, name, .. } => {
                self.made_calls = true;
                (call_item(id, call_id, name, "", "in_progress", &self.namespaces), None)
            }
            Open::Held => {
                self.made_calls = true;
                self.open = Some(open);
                return;
            }
        };
        out.push(("response.output_item.added", json!({"output_index": index, "item": item})));
        if let Some((id, part)) = part {
            out.push((
                "response.content_part.added",
                json!({"item_id": id, "output_index": index, "content_index": 0, "part": part}),
            ));
        }
        self.open = Some(open);
    }

    /// The events of one piece of the answer.
    pub fn push(&mut self, piece: ChoicePiece) -> Vec<StreamEvent> {
        let mut out = Vec::new();
        if !piece.reasoning.is_empty() {
            if !matches!(self.open, Some(Open::Reasoning { .. })) {
                self.open(Open::Reasoning { id: new_id("rs"), text: String::new() }, &mut out);
            }
            let index = self.index();
            if let Some(Open::Reasoning { id, text }) = &mut self.open {
                text.push_str(&piece.reasoning);
                out.push((
                    "response.reasoning_text.delta",
                    json!({"item_id": id, "output_index": index, "content_index": 0, "delta": piece.reasoning}),
                ));
            }
        }
        if !piece.content.is_empty() {
            if !matches!(self.open, Some(Open::Message { .. })) {
                self.open(Open::Message { id: new_id("msg"), text: String::new() }, &mut out);
            }
            let index = self.index();
            if let Some(Open::Message { id, text }) = &mut self.open {
                text.push_str(&piece.content);
                out.push((
                    "response.output_text.delta",
                    json!({"item_id": id, "output_index": index, "content_index": 0, "delta": piece.content, "logprobs": []}),
                ));
            }
        }
        for call in piece.tool_calls {
            if let Some(call_id) = call.id {
                let name = call.function.name.clone().unwrap_or_default();
                let open = if self.held.contains(&name) {
                    Open::Held
                } else {
                    Open::Call { id: new_id("fc"), call_id, name, arguments: String::new() }
                };
                self.open(open, &mut out);
            }
            let index = self.index();
            if let (Some(Open::Call { id, arguments, .. }), Some(delta)) =
                (&mut self.open, call.function.arguments.filter(|a| !a.is_empty()))
            {
                arguments.push_str(&delta);
                out.push((
                    "response.function_call_arguments.delta",
                    json!({"item_id": id, "output_index": index, "delta": delta}),
                ));
            }
        }
        out
    }

    /// Closes the last item (with `status`), adding the empty message of an answer that has
    /// neither content nor calls.
    pub fn finish(&mut self, status: &str) -> Vec<StreamEvent> {
        let mut out = Vec::new();
        if !self.made_message && !self.made_calls {
            self.open(Open::Message { id: new_id("msg"), text: String::new() }, &mut out);
        }
        self.close(status, &mut out);
        out
    }

    /// The finished items.
    pub fn items(&self) -> &[Value] {
        &self.items
    }

    /// The output so far, for polling a background response: the finished items, then the
    /// open one as it stands (`in_progress`, with its text so far).
    pub fn snapshot(&self) -> Vec<Value> {
        let mut out = self.items.clone();
        match &self.open {
            None | Some(Open::Held) => {}
            Some(Open::Reasoning { id, text }) => {
                out.push(reasoning_item(id, text, self.encrypted_reasoning))
            }
            Some(Open::Message { id, text }) => out.push(json!({
                "type": "message", "id": id, "status": "in_progress", "role": "assistant",
                "content": [text_part(text)],
            })),
            Some(Open::Call { id, call_id, name, arguments }) => {
                out.push(call_item(id, call_id, name, arguments, "in_progress", &self.namespaces))
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat_output::whole_message;
    use crate::chat_output::{ChoiceSplit, ChoiceText};
    use pagoda_text::{ReasoningFormat, ToolCallFormat};

    /// Streamed a few characters at a time, the items are the whole answer's (ids aside).
    #[test]
    fn streamed_items_equal_the_whole_answer() {
        let split = ChoiceSplit {
            reasoning: Some((ReasoningFormat::Qwen3, false)),
            tools: Some(ToolCallFormat::Hermes),
        };
        let text = "<think>\nweather\n</think>\n\n<tool_call>\n{\"name\": \"w\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>";
        let strip = |items: &[Value]| -> Vec<Value> {
            items
                .iter()
                .map(|i| {
                    let mut i = i.clone();
                    i.as_object_mut().unwrap().remove("id");
                    i.as_object_mut().unwrap().remove("call_id");
                    i
                })
                .collect()
        };
        let whole = output_items(whole_message(split, text), false, "completed", &ToolNamespaces::default());
        let mut pipeline = ChoiceText::new(split);
        let mut events = OutputEvents::new(false, ToolNamespaces::default());
        let chars: Vec<char> = text.chars().collect();
        let mut names = Vec::new();
        for (i, chunk) in chars.chunks(3).enumerate() {
            let last = (i + 1) * 3 >= chars.len();
            let piece = pipeline.push(&chunk.iter().collect::<String>(), last);
            names.extend(events.push(piece).into_iter().map(|(n, _)| n));
        }
        names.extend(events.finish("completed").into_iter().map(|(n, _)| n));
        assert_eq!(strip(events.items()), strip(&whole));
        assert_eq!(whole.len(), 2, "{whole:?}");
        assert_eq!(names[0], "response.output_item.added");
        assert_eq!(names.iter().filter(|n| **n == "response.output_item.done").count(), 2);
        assert!(names.contains(&"response.function_call_arguments.done"));
    }

    /// Mid-answer, the snapshot holds the finished items and the open one with its text so far.
    #[test]
    fn the_snapshot_shows_the_open_item_so_far() {
        let split = ChoiceSplit { reasoning: Some((ReasoningFormat::Qwen3, false)), tools: None };
        let mut pipeline = ChoiceText::new(split);
        let mut events = OutputEvents::new(false, ToolNamespaces::default());
        assert!(events.snapshot().is_empty());
        events.push(pipeline.push("<think>\nhmm\n</think>\n\nPar", false));
        let snap = events.snapshot();
        assert_eq!(snap.len(), 2, "{snap:?}");
        assert_eq!(snap[0]["type"], "reasoning");
        assert_eq!(
            (snap[1]["type"].as_str(), snap[1]["status"].as_str()),
            (Some("message"), Some("in_progress"))
        );
        assert!(snap[1]["content"][0]["text"].as_str().unwrap().starts_with("Par"), "{snap:?}");
        events.push(pipeline.push("is", true));
        events.finish("completed");
        assert_eq!(events.snapshot(), events.items());
    }

    /// Calls of the server's own (MCP) tools make no events and no items; its items go on after.
    #[test]
    fn held_calls_are_left_to_the_server() {
        let split = ChoiceSplit { reasoning: None, tools: Some(ToolCallFormat::Hermes) };
        let text = "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1}}\n</tool_call>";
        let mut pipeline = ChoiceText::new(split);
        let mut events = OutputEvents::new(false, ToolNamespaces::default()).holding(vec!["add".into()]);
        let mut out = events.push(pipeline.push(text, true));
        out.extend(events.finish("completed"));
        assert!(out.is_empty(), "{out:?}");
        assert!(events.items().is_empty());
        let index = events.add_item(json!({"type": "mcp_call", "id": "mcp_1", "status": "in_progress"}));
        assert_eq!((index, events.index_of("mcp_1")), (0, Some(0)));
        events.replace_item(0, json!({"type": "mcp_call", "id": "mcp_1", "status": "completed"}));
        events.new_round();
        let names: Vec<_> = events.finish("completed").into_iter().map(|(n, _)| n).collect();
        assert_eq!(names.first(), Some(&"response.output_item.added"), "the next answer has its message");
        assert_eq!(events.items()[0]["status"], "completed");
        assert_eq!((events.items().len(), events.items()[1]["type"].as_str()), (2, Some("message")));
    }

    #[test]
    fn an_empty_answer_has_an_empty_message() {
        let mut events = OutputEvents::new(false, ToolNamespaces::default());
        let names: Vec<_> = events.finish("incomplete").into_iter().map(|(n, _)| n).collect();
        assert_eq!(names.first(), Some(&"response.output_item.added"));
        assert_eq!(events.items()[0]["status"], "incomplete");
        assert_eq!(
            output_items(ChoiceMessage::default(), false, "completed", &ToolNamespaces::default())[0]["type"],
            "message"
        );
    }
}

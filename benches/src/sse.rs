//! Server-sent events as OpenAI-compatible servers stream them: [`SseParser`] cuts a byte
//! stream into events (`event:`/`data:` fields, comments ignored, `\n` or `\r\n` line ends,
//! events split anywhere across network reads), and [`interpret`] reads one event as a
//! completion or chat-completion chunk, the `[DONE]` sentinel, or an error.

use serde_json::Value;

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` field, when there was one.
    pub event: Option<String>,
    /// The `data:` lines joined with `\n`.
    pub data: String,
}

/// Incremental SSE framing.
#[derive(Debug, Default)]
pub struct SseParser {
    /// Bytes of an incomplete line.
    line: Vec<u8>,
    event: Option<String>,
    data: Option<String>,
}

impl SseParser {
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds bytes; returns the events they complete.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<SseEvent> {
        let mut events = Vec::new();
        let mut rest = bytes;
        while let Some(pos) = rest.iter().position(|&b| b == b'\n') {
            self.line.extend_from_slice(&rest[..pos]);
            rest = &rest[pos + 1..];
            let mut line = std::mem::take(&mut self.line);
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            if let Some(event) = self.line_done(&String::from_utf8_lossy(&line)) {
                events.push(event);
            }
        }
        self.line.extend_from_slice(rest);
        events
    }

    /// The stream ended: returns the last event if it lacked its closing blank line.
    pub fn finish(&mut self) -> Option<SseEvent> {
        let line = std::mem::take(&mut self.line);
        let mut event = None;
        if !line.is_empty() {
            event = self.line_done(String::from_utf8_lossy(&line).trim_end_matches('\r'));
        }
        event.or_else(|| self.line_done(""))
    }

    fn line_done(&mut self, line: &str) -> Option<SseEvent> {
        if line.is_empty() {
            let data = self.data.take();
            let event = self.event.take();
            return data.map(|data| SseEvent { event, data });
        }
        if line.starts_with(':') {
            return None;
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        match field {
            "data" => match &mut self.data {
                Some(d) => {
                    d.push('\n');
                    d.push_str(value);
                }
                None => self.data = Some(value.to_owned()),
            },
            "event" => self.event = Some(value.to_owned()),
            _ => {} // id, retry and unknown fields do not matter here
        }
        None
    }
}

/// Token counts a chunk's `usage` reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ChunkUsage {
    pub prompt_tokens: Option<usize>,
    pub completion_tokens: Option<usize>,
}

/// One chunk of a streamed completion.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Chunk {
    /// Generated answer text of the chunk (`choices[].text`, or `choices[].delta.content` for
    /// chat), all choices together.
    pub content: String,
    /// Generated reasoning text (`choices[].delta.reasoning_content`): timed like content, but
    /// not part of the answer.
    pub reasoning: String,
    pub finish_reason: Option<String>,
    pub usage: Option<ChunkUsage>,
}

/// What one event means to the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamItem {
    Chunk(Chunk),
    /// `data: [DONE]`, the end of the stream.
    Done,
    /// An error event (`event: error`, or a payload with an `error` member), or a payload that
    /// is not JSON.
    Error(String),
}

/// Reads one event.
pub fn interpret(event: &SseEvent) -> StreamItem {
    let data = event.data.trim();
    if data == "[DONE]" {
        return StreamItem::Done;
    }
    let value: Value = match serde_json::from_str(data) {
        Ok(v) => v,
        Err(e) if event.event.as_deref() == Some("error") => {
            return StreamItem::Error(if data.is_empty() { e.to_string() } else { data.to_owned() })
        }
        Err(e) => return StreamItem::Error(format!("invalid JSON in the stream ({e}): {}", clip(data))),
    };
    if let Some(err) = value.get("error").filter(|e| !e.is_null()) {
        return StreamItem::Error(error_message(err));
    }
    if event.event.as_deref() == Some("error") {
        return StreamItem::Error(error_message(&value));
    }
    let mut chunk = Chunk::default();
    for choice in value["choices"].as_array().into_iter().flatten() {
        for text in [&choice["text"], &choice["delta"]["content"]] {
            if let Some(t) = text.as_str() {
                chunk.content.push_str(t);
            }
        }
        if let Some(t) = choice["delta"]["reasoning_content"].as_str() {
            chunk.reasoning.push_str(t);
        }
        if let Some(r) = choice["finish_reason"].as_str() {
            chunk.finish_reason = Some(r.to_owned());
        }
    }
    let usage = &value["usage"];
    if usage.is_object() {
        let count = |k: &str| usage[k].as_u64().map(|n| n as usize);
        chunk.usage = Some(ChunkUsage {
            prompt_tokens: count("prompt_tokens"),
            completion_tokens: count("completion_tokens"),
        });
    }
    StreamItem::Chunk(chunk)
}

/// The message of an OpenAI error object (`{"message": ..}`), a string, or the JSON itself.
pub fn error_message(err: &Value) -> String {
    if let Some(s) = err.as_str() {
        return s.to_owned();
    }
    match err.get("message").and_then(Value::as_str) {
        Some(m) => m.to_owned(),
        None => clip(&err.to_string()),
    }
}

/// At most 300 characters of `s`, for error messages.
pub fn clip(s: &str) -> String {
    const MAX: usize = 300;
    match s.char_indices().nth(MAX) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A completions stream as vLLM and Pagoda send it, with the usage chunk.
    const COMPLETIONS: &str = concat!(
        "data: {\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"created\":1,\"model\":\"m\",",
        "\"choices\":[{\"index\":0,\"text\":\" Hello\",\"logprobs\":null,\"finish_reason\":null}],\"usage\":null}\n\n",
        "data: {\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"created\":1,\"model\":\"m\",",
        "\"choices\":[{\"index\":0,\"text\":\" world\",\"logprobs\":null,\"finish_reason\":\"length\"}],\"usage\":null}\n\n",
        "data: {\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"created\":1,\"model\":\"m\",\"choices\":[],",
        "\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":2,\"total_tokens\":9}}\n\n",
        "data: [DONE]\n\n",
    );

    /// A chat stream as OpenAI sends it: a role-only first delta, then content deltas.
    const CHAT: &str = concat!(
        "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,",
        "\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\r\n\r\n",
        ": keep-alive comment\r\n\r\n",
        "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,",
        "\"delta\":{\"content\":\"Hi\"},\"finish_reason\":null}]}\r\n\r\n",
        "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,",
        "\"delta\":{},\"finish_reason\":\"stop\"}]}\r\n\r\n",
        "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[],",
        "\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":1,\"total_tokens\":13}}\r\n\r\n",
        "data: [DONE]\r\n\r\n",
    );

    fn items(stream: &str, split: usize) -> Vec<StreamItem> {
        let mut parser = SseParser::new();
        let mut out = Vec::new();
        for piece in stream.as_bytes().chunks(split) {
            out.extend(parser.push(piece).iter().map(interpret));
        }
        out.extend(parser.finish().iter().map(interpret));
        out
    }

    fn chunk(content: &str, finish: Option<&str>, usage: Option<(usize, usize)>) -> StreamItem {
        StreamItem::Chunk(Chunk {
            content: content.into(),
            reasoning: String::new(),
            finish_reason: finish.map(Into::into),
            usage: usage.map(|(p, c)| ChunkUsage { prompt_tokens: Some(p), completion_tokens: Some(c) }),
        })
    }

    #[test]
    fn completions_stream_with_usage_and_done() {
        let want = vec![
            chunk(" Hello", None, None),
            chunk(" world", Some("length"), None),
            chunk("", None, Some((7, 2))),
            StreamItem::Done,
        ];
        // Whole, and cut into every read size down to single bytes.
        for split in [COMPLETIONS.len(), 64, 7, 1] {
            assert_eq!(items(COMPLETIONS, split), want, "split {split}");
        }
    }

    #[test]
    fn chat_stream_with_crlf_comments_and_role_delta() {
        let want = vec![
            chunk("", None, None),
            chunk("Hi", None, None),
            chunk("", Some("stop"), None),
            chunk("", None, Some((12, 1))),
            StreamItem::Done,
        ];
        for split in [CHAT.len(), 5, 1] {
            assert_eq!(items(CHAT, split), want, "split {split}");
        }
    }

    #[test]
    fn reasoning_content_is_kept_apart_from_the_answer() {
        let e = SseEvent {
            event: None,
            data: r#"{"choices":[{"delta":{"reasoning_content":"hmm"},"finish_reason":null}]}"#.into(),
        };
        assert_eq!(interpret(&e), StreamItem::Chunk(Chunk { reasoning: "hmm".into(), ..Chunk::default() }));
    }

    #[test]
    fn error_payloads_and_error_events_are_errors() {
        let vllm = "data: {\"error\":{\"object\":\"error\",\"message\":\"out of memory\",\"type\":\"InternalServerError\",\"code\":500}}\n\n";
        assert_eq!(items(vllm, 3), vec![StreamItem::Error("out of memory".into())]);
        let named = "event: error\ndata: {\"message\":\"overloaded\"}\n\n";
        assert_eq!(items(named, 100), vec![StreamItem::Error("overloaded".into())]);
        let plain = "event: error\ndata: engine died\n\n";
        assert_eq!(items(plain, 100), vec![StreamItem::Error("engine died".into())]);
        let string = "data: {\"error\":\"bad model\"}\n\n";
        assert_eq!(items(string, 100), vec![StreamItem::Error("bad model".into())]);
        match &items("data: {not json\n\n", 100)[..] {
            [StreamItem::Error(m)] => assert!(m.starts_with("invalid JSON"), "{m}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn multi_line_data_joins_and_a_final_event_without_blank_line_is_kept() {
        let mut p = SseParser::new();
        assert_eq!(
            p.push(b"id: 1\ndata: a\ndata:b\n\n"),
            vec![SseEvent { event: None, data: "a\nb".into() }]
        );
        assert!(p.push(b"data: [DONE]").is_empty());
        assert_eq!(p.finish(), Some(SseEvent { event: None, data: "[DONE]".into() }));
        assert_eq!(p.finish(), None);
    }

    #[test]
    fn blank_lines_without_data_dispatch_nothing() {
        let mut p = SseParser::new();
        assert!(p.push(b"\n\n: ping\n\nevent: x\n\n").is_empty());
        // The dangling `event:` was dropped with its empty event, not carried to the next one.
        assert_eq!(p.push(b"data: 1\n\n"), vec![SseEvent { event: None, data: "1".into() }]);
    }

    #[test]
    fn null_usage_and_null_error_are_ignored() {
        let e =
            SseEvent { event: None, data: r#"{"error":null,"usage":null,"choices":[{"text":"x"}]}"#.into() };
        assert_eq!(interpret(&e), chunk("x", None, None));
    }

    #[test]
    fn clip_cuts_long_text_on_a_char_boundary() {
        assert_eq!(clip("short"), "short");
        let long = "é".repeat(400);
        let c = clip(&long);
        assert_eq!(c.chars().count(), 301);
        assert!(c.ends_with('…'));
    }
}

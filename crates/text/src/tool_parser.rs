//! Tool calls in model output: finds the calls a model wrote in its own markup (Hermes
//! `<tool_call>` blocks, Llama 3 JSON, Mistral `[TOOL_CALLS]`, or our grammar-forced generic JSON)
//! and separates them from the ordinary reply text, both for a whole output
//! ([`parse_tool_calls`]) and while it streams ([`ToolCallStreamParser`]).
//!
//! There is one parser: [`parse_tool_calls`] is the stream parser fed the whole text as a single
//! delta, and the stream parser only emits what no later text can change, so both agree exactly
//! however the text is split. Malformed markup never fails: it stays in the content as written.
//!
//! Content rule: the content is all text outside recognized calls (markup included when it is
//! malformed), concatenated, with leading and trailing whitespace (`char::is_whitespace`) removed.
//! Whitespace between a call's start tag and its JSON, and between its JSON and its end tag, is
//! part of the call. Arguments are compact JSON with object keys in the order the model wrote
//! them. (serde_json's `Value` is not used for them: whether it keeps key order depends on its
//! `preserve_order` feature, which is off when this crate builds alone and on in a build that
//! includes llguidance.)

use crate::tool_json::{
    decode_string_prefix, parse_arguments, parse_call, parse_call_array, parse_generic, response_prefix_len,
    GenericReply, JsonScan, StringEnd,
};

const HERMES_OPEN: &str = "<tool_call>";
const HERMES_CLOSE: &str = "</tool_call>";
const PYTHON_TAG: &str = "<|python_tag|>";
const MISTRAL_TAG: &str = "[TOOL_CALLS]";
const MISTRAL_ARGS: &str = "[ARGS]";

/// The markup a model uses for tool calls (`--tool-call-parser`; the `value(help)`s are the
/// flag's documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "snake_case")]
pub enum ToolCallFormat {
    /// `<tool_call>{"name": …, "arguments": {…}}</tool_call>` blocks (Hermes, Qwen2.5/3, SmolLM3).
    #[cfg_attr(
        feature = "clap",
        value(help = "`<tool_call>{\"name\", \"arguments\"}</tool_call>` (Qwen 2.5/3, Hermes, SmolLM3)")
    )]
    Hermes,
    /// The whole output is `[<|python_tag|>]{"name": …, "parameters": {…}}`, `;`-separated.
    #[cfg_attr(
        feature = "clap",
        value(
            name = "llama3_json",
            help = "`{\"name\", \"parameters\"}`, optionally after `<|python_tag|>` (Llama 3.1+)"
        )
    )]
    Llama3Json,
    /// `[TOOL_CALLS]` then a JSON array of calls, or `name{args}` / `name[ARGS]{args}`.
    #[cfg_attr(feature = "clap", value(help = "`[TOOL_CALLS][{\"name\", \"arguments\"}]` (Mistral)"))]
    Mistral,
    /// One JSON object: `{"tool_calls": […]}`, `{"tool_call": {…}}` or `{"response": "…"}`.
    #[cfg_attr(
        feature = "clap",
        value(
            help = "One JSON object, `{\"tool_calls\": [...]}` or `{\"response\": ...}`, taught by a system prompt (models whose template knows no tools)"
        )
    )]
    Generic,
}

impl ToolCallFormat {
    /// Every format's name, as [`Self::from_name`] accepts them.
    pub const NAMES: &'static [&'static str] = &["hermes", "llama3_json", "mistral", "generic"];

    /// The format called `name` (one of [`Self::NAMES`]).
    pub fn from_name(name: &str) -> Option<Self> {
        [Self::Hermes, Self::Llama3Json, Self::Mistral, Self::Generic].into_iter().find(|f| f.name() == name)
    }

    /// This format's name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Hermes => "hermes",
            Self::Llama3Json => "llama3_json",
            Self::Mistral => "mistral",
            Self::Generic => "generic",
        }
    }

    /// Guesses the format from a chat template's source. `None` when the template never uses a
    /// `tools` variable (it cannot show the model any tools) or when its markup is none of the
    /// known ones; callers then fall back to [`Self::Generic`].
    pub fn detect(chat_template: &str) -> Option<Self> {
        if !mentions_identifier(chat_template, "tools") {
            return None;
        }
        let has = |s: &str| chat_template.contains(s);
        if has(HERMES_OPEN) {
            Some(Self::Hermes)
        } else if has(MISTRAL_TAG) {
            Some(Self::Mistral)
        } else if has(PYTHON_TAG) || (has("\"parameters\"") && (has("<|eot_id|>") || has("ipython"))) {
            Some(Self::Llama3Json)
        } else {
            None
        }
    }

    /// The tag that opens markup in the middle of ordinary text, for formats that have one.
    fn inline_tag(self) -> Option<&'static str> {
        match self {
            Self::Hermes => Some(HERMES_OPEN),
            Self::Mistral => Some(MISTRAL_TAG),
            Self::Llama3Json | Self::Generic => None,
        }
    }
}

/// Whether `ident` occurs in `text` as a whole identifier (not inside a longer name).
fn mentions_identifier(text: &str, ident: &str) -> bool {
    let is_ident = |c: char| c.is_alphanumeric() || c == '_';
    text.match_indices(ident).any(|(at, _)| {
        !text[..at].chars().next_back().is_some_and(is_ident)
            && !text[at + ident.len()..].chars().next().is_some_and(is_ident)
    })
}

/// One tool call found in the output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedToolCall {
    pub name: String,
    /// Compact JSON text of the arguments object (`{}` when the model gave none).
    pub arguments: String,
}

/// A whole output split into reply text and tool calls.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ParsedOutput {
    pub content: String,
    pub tool_calls: Vec<ParsedToolCall>,
}

/// Splits a complete output into content and tool calls (see the module docs for the rules).
pub fn parse_tool_calls(format: ToolCallFormat, text: &str) -> ParsedOutput {
    let mut parser = ToolCallStreamParser::new(format);
    let mut events = parser.push(text);
    events.extend(parser.finish());
    collect_events(events)
}

/// Folds stream events back into a [`ParsedOutput`].
fn collect_events(events: Vec<ToolStreamEvent>) -> ParsedOutput {
    let mut out = ParsedOutput::default();
    for event in events {
        match event {
            ToolStreamEvent::Content(text) => out.content.push_str(&text),
            ToolStreamEvent::CallStart { name, .. } => {
                out.tool_calls.push(ParsedToolCall { name, arguments: String::new() })
            }
            ToolStreamEvent::CallArguments { index, fragment } => {
                if let Some(call) = out.tool_calls.get_mut(index) {
                    call.arguments.push_str(&fragment);
                }
            }
        }
    }
    out
}

/// What the stream parser is sure of so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolStreamEvent {
    /// Reply text (already trimmed per the content rule).
    Content(String),
    /// Call number `index` (0-based within the output) begins.
    CallStart { index: usize, name: String },
    /// The next piece of call `index`'s compact arguments JSON.
    CallArguments { index: usize, fragment: String },
}

/// Separates tool calls from content while the output streams in.
#[derive(Debug)]
pub struct ToolCallStreamParser {
    format: ToolCallFormat,
    /// Text received but not yet turned into events.
    buffer: String,
    state: State,
    sink: Sink,
}

/// Where the parser is. Positions are byte offsets into the parser's buffer, which is not
/// consumed while a state that holds positions waits for more text.
#[derive(Debug)]
enum State {
    /// Ordinary text that may contain the format's inline tag.
    Text,
    /// Everything from here on is content.
    PlainText,
    /// The buffer starts with `<tool_call>`.
    HermesOpened,
    HermesObject(JsonScan),
    /// Right after a call's JSON: `</tool_call>` or another call's JSON may follow.
    HermesAfterCall,
    /// The buffer starts with `[TOOL_CALLS]`.
    MistralTagged,
    MistralArray(JsonScan),
    /// A `name{…}` call whose name starts at `name_start` (text before it was a tag).
    MistralName {
        name_start: usize,
    },
    MistralArgs {
        name_start: usize,
        name_end: usize,
        scan: JsonScan,
    },
    /// Right after a call: another call may follow, with or without `[TOOL_CALLS]`.
    MistralAfterCall,
    /// Llama 3 / generic output before its first non-whitespace character.
    Leading,
    /// Llama 3 output that is calls so far; `cursor` is where the next call may start.
    Llama3Calls {
        cursor: usize,
        scan: Option<JsonScan>,
        calls: Vec<ParsedToolCall>,
        tagged: bool,
    },
    /// The buffer starts with `{`: is it `{"response": "…`?
    GenericProbe,
    GenericObject(JsonScan),
    /// Inside the `response` string, which streams out as content.
    GenericResponse,
    /// After the `response` string: an optional `}` closes the object.
    GenericResponseEnd,
}

impl ToolCallStreamParser {
    pub fn new(format: ToolCallFormat) -> Self {
        let state = if format.inline_tag().is_some() { State::Text } else { State::Leading };
        Self { format, buffer: String::new(), state, sink: Sink::default() }
    }

    /// Feeds the next text delta; returns the events that no later text can change.
    pub fn push(&mut self, delta: &str) -> Vec<ToolStreamEvent> {
        self.buffer.push_str(delta);
        while self.step(false) {}
        std::mem::take(&mut self.sink.events)
    }

    /// Ends the output: resolves everything held back (an unfinished call is content) and resets
    /// the parser for a new output.
    pub fn finish(&mut self) -> Vec<ToolStreamEvent> {
        while self.step(true) {}
        let events = std::mem::take(&mut self.sink.events);
        *self = Self::new(self.format);
        events
    }

    /// Makes one decision about the start of the buffer; false when more text is needed (or, at
    /// the end, when nothing is left). Every true return consumed text or changed state.
    fn step(&mut self, at_end: bool) -> bool {
        let buf = self.buffer.as_str();
        let sink = &mut self.sink;
        let (consumed, next) = match &mut self.state {
            State::Text => {
                let Some(tag) = self.format.inline_tag() else {
                    // Not reached: formats without an inline tag start in `Leading`.
                    self.state = State::PlainText;
                    return true;
                };
                if let Some(at) = buf.find(tag) {
                    sink.content(&buf[..at]);
                    let opened = match self.format {
                        ToolCallFormat::Hermes => State::HermesOpened,
                        _ => State::MistralTagged,
                    };
                    (at, Some(opened))
                } else {
                    let certain = buf.len() - if at_end { 0 } else { partial_tag_len(buf, tag) };
                    if certain == 0 {
                        return false;
                    }
                    sink.content(&buf[..certain]);
                    (certain, None)
                }
            }
            State::PlainText if buf.is_empty() => return false,
            State::PlainText => {
                sink.content(buf);
                (buf.len(), None)
            }
            State::HermesOpened => {
                let rest = buf[HERMES_OPEN.len()..].trim_start();
                match rest.chars().next() {
                    None if !at_end => return false,
                    Some('{') => (0, Some(State::HermesObject(JsonScan::at(buf.len() - rest.len())))),
                    _ => {
                        sink.content(HERMES_OPEN);
                        (HERMES_OPEN.len(), Some(State::Text))
                    }
                }
            }
            State::HermesObject(scan) => match scan.advance(buf) {
                Some(end) => match parse_call(&buf[scan.start..end], false) {
                    Some(call) => {
                        sink.call(call);
                        (end, Some(State::HermesAfterCall))
                    }
                    None => sink.malformed(&buf[..end], State::Text),
                },
                None if at_end => sink.malformed(buf, State::Text),
                None => return false,
            },
            State::HermesAfterCall => {
                let rest = buf.trim_start();
                if rest.starts_with(HERMES_CLOSE) {
                    (buf.len() - rest.len() + HERMES_CLOSE.len(), Some(State::Text))
                } else if rest.starts_with('{') {
                    // Some models put several calls in one block.
                    (0, Some(State::HermesObject(JsonScan::at(buf.len() - rest.len()))))
                } else if !at_end && HERMES_CLOSE.starts_with(rest) {
                    return false;
                } else {
                    (0, Some(State::Text))
                }
            }
            State::MistralTagged => {
                let rest = buf[MISTRAL_TAG.len()..].trim_start();
                let start = buf.len() - rest.len();
                match rest.chars().next() {
                    None if !at_end => return false,
                    Some('[') => (0, Some(State::MistralArray(JsonScan::at(start)))),
                    Some(c) if is_name_char(c) => (0, Some(State::MistralName { name_start: start })),
                    _ => {
                        sink.content(MISTRAL_TAG);
                        (MISTRAL_TAG.len(), Some(State::Text))
                    }
                }
            }
            State::MistralArray(scan) => match scan.advance(buf) {
                Some(end) => match parse_call_array(&buf[scan.start..end]) {
                    Some(calls) => {
                        calls.into_iter().for_each(|call| sink.call(call));
                        (end, Some(State::MistralAfterCall))
                    }
                    None => sink.malformed(&buf[..end], State::Text),
                },
                None if at_end => sink.malformed(buf, State::Text),
                None => return false,
            },
            State::MistralName { name_start } => {
                let name_start = *name_start;
                let tail = &buf[name_start..];
                let name_end = name_start + tail.find(|c| !is_name_char(c)).unwrap_or(tail.len());
                let after = &buf[name_end..];
                let after_args = after.strip_prefix(MISTRAL_ARGS).map(str::trim_start);
                let object_at = match after_args {
                    Some(rest) if rest.starts_with('{') => Some(buf.len() - rest.len()),
                    None if after.starts_with('{') => Some(name_end),
                    _ => None,
                };
                match object_at {
                    Some(at) => {
                        (0, Some(State::MistralArgs { name_start, name_end, scan: JsonScan::at(at) }))
                    }
                    None if !at_end && (after_args == Some("") || MISTRAL_ARGS.starts_with(after)) => {
                        return false;
                    }
                    None => sink.malformed(&buf[..name_end], State::Text),
                }
            }
            State::MistralArgs { name_start, name_end, scan } => match scan.advance(buf) {
                Some(end) => match parse_arguments(&buf[scan.start..end]) {
                    Some(arguments) => {
                        sink.call(ParsedToolCall { name: buf[*name_start..*name_end].to_owned(), arguments });
                        (end, Some(State::MistralAfterCall))
                    }
                    None => sink.malformed(&buf[..*name_end], State::Text),
                },
                None if at_end => sink.malformed(&buf[..*name_end], State::Text),
                None => return false,
            },
            State::MistralAfterCall => {
                let whitespace = buf.len() - buf.trim_start().len();
                match buf.chars().next() {
                    _ if whitespace > 0 => {
                        sink.content(&buf[..whitespace]);
                        (whitespace, None)
                    }
                    None if !at_end => return false,
                    Some(c) if is_name_char(c) => (0, Some(State::MistralName { name_start: 0 })),
                    _ if buf.starts_with(MISTRAL_TAG) => (0, Some(State::MistralTagged)),
                    _ if !at_end && MISTRAL_TAG.starts_with(buf) => return false,
                    _ => (0, Some(State::Text)),
                }
            }
            State::Leading => {
                let rest = buf.trim_start();
                let start = buf.len() - rest.len();
                match self.format {
                    _ if rest.is_empty() && !at_end => return false,
                    ToolCallFormat::Llama3Json if rest.starts_with(PYTHON_TAG) || rest.starts_with('{') => {
                        let tagged = rest.starts_with(PYTHON_TAG);
                        let cursor = if tagged { start + PYTHON_TAG.len() } else { start };
                        (0, Some(State::Llama3Calls { cursor, scan: None, calls: Vec::new(), tagged }))
                    }
                    ToolCallFormat::Llama3Json if !at_end && PYTHON_TAG.starts_with(rest) => return false,
                    ToolCallFormat::Generic if rest.starts_with('{') => {
                        sink.content(&buf[..start]);
                        (start, Some(State::GenericProbe))
                    }
                    _ => (0, Some(State::PlainText)),
                }
            }
            State::Llama3Calls { cursor, scan, calls, tagged } => loop {
                if let Some(object) = scan {
                    let Some(end) = object.advance(buf) else {
                        if at_end {
                            break sink.malformed(buf, State::PlainText);
                        }
                        return false;
                    };
                    // A bare object must name its arguments to count as a call, not as a reply.
                    match parse_call(&buf[object.start..end], !*tagged) {
                        Some(call) => calls.push(call),
                        None => break sink.malformed(buf, State::PlainText),
                    }
                    *cursor = end;
                    *scan = None;
                }
                let rest = buf[*cursor..].trim_start_matches(|c: char| c.is_whitespace() || c == ';');
                if rest.starts_with('{') {
                    *scan = Some(JsonScan::at(buf.len() - rest.len()));
                } else if !rest.is_empty() || (at_end && calls.is_empty()) {
                    break sink.malformed(buf, State::PlainText);
                } else if at_end {
                    std::mem::take(calls).into_iter().for_each(|call| sink.call(call));
                    break (buf.len(), Some(State::PlainText));
                } else {
                    return false;
                }
            },
            State::GenericProbe => match response_prefix_len(buf) {
                Some(Some(len)) => (len, Some(State::GenericResponse)),
                Some(None) if !at_end => return false,
                _ => (0, Some(State::GenericObject(JsonScan::at(0)))),
            },
            State::GenericObject(scan) => match scan.advance(buf) {
                Some(end) => {
                    match parse_generic(&buf[..end]) {
                        Some(GenericReply::Calls(calls)) => {
                            calls.into_iter().for_each(|call| sink.call(call))
                        }
                        Some(GenericReply::Response(text)) => sink.content(&text),
                        None => sink.content(&buf[..end]),
                    }
                    (end, Some(State::PlainText))
                }
                None if at_end => sink.malformed(buf, State::PlainText),
                None => return false,
            },
            State::GenericResponse => {
                let (decoded, consumed, string_end) = decode_string_prefix(buf);
                sink.content(&decoded);
                match string_end {
                    StringEnd::Closed => (consumed, Some(State::GenericResponseEnd)),
                    // A bad escape ends the decoding: the rest stays content as written.
                    StringEnd::Malformed => (consumed, Some(State::PlainText)),
                    StringEnd::Open if at_end => (consumed, Some(State::PlainText)),
                    StringEnd::Open if consumed == 0 => return false,
                    StringEnd::Open => (consumed, None),
                }
            }
            State::GenericResponseEnd => {
                let rest = buf.trim_start();
                match rest.chars().next() {
                    None if !at_end => return false,
                    None => (buf.len(), Some(State::PlainText)),
                    Some('}') => (buf.len() - rest.len() + 1, Some(State::PlainText)),
                    Some(_) => (0, Some(State::PlainText)),
                }
            }
        };
        self.buffer.drain(..consumed);
        if let Some(next) = next {
            self.state = next;
        }
        true
    }
}

/// Collects events, trimming content on the way.
#[derive(Debug, Default)]
struct Sink {
    events: Vec<ToolStreamEvent>,
    trim: TrimmedStream,
    next_index: usize,
}

impl Sink {
    fn content(&mut self, text: &str) {
        let text = self.trim.push(text);
        if text.is_empty() {
            return;
        }
        match self.events.last_mut() {
            Some(ToolStreamEvent::Content(last)) => last.push_str(&text),
            _ => self.events.push(ToolStreamEvent::Content(text)),
        }
    }

    fn call(&mut self, call: ParsedToolCall) {
        let index = self.next_index;
        self.next_index += 1;
        self.events.push(ToolStreamEvent::CallStart { index, name: call.name });
        self.events.push(ToolStreamEvent::CallArguments { index, fragment: call.arguments });
    }

    /// Markup that turned out not to be a call: `text` is content as written, then `next`.
    fn malformed(&mut self, text: &str, next: State) -> (usize, Option<State>) {
        self.content(text);
        (text.len(), Some(next))
    }
}

/// Streams text with its leading (and, if asked, trailing) whitespace removed: leading
/// whitespace is dropped until the first other character, and trailing whitespace is held back
/// until more text follows it, so it is dropped when nothing does.
#[derive(Debug, Clone)]
pub(crate) struct TrimmedStream {
    trim_end: bool,
    started: bool,
    held_whitespace: String,
}

impl Default for TrimmedStream {
    fn default() -> Self {
        Self::new(true)
    }
}

impl TrimmedStream {
    pub(crate) fn new(trim_end: bool) -> Self {
        Self { trim_end, started: false, held_whitespace: String::new() }
    }

    /// The part of `text` that is certain to be in the trimmed result, in order.
    pub(crate) fn push(&mut self, text: &str) -> String {
        let text = if self.started { text } else { text.trim_start() };
        if text.is_empty() {
            return String::new();
        }
        self.started = true;
        let body_len = if self.trim_end { text.trim_end().len() } else { text.len() };
        if body_len == 0 {
            self.held_whitespace.push_str(text);
            return String::new();
        }
        let mut out = std::mem::take(&mut self.held_whitespace);
        out.push_str(&text[..body_len]);
        self.held_whitespace.push_str(&text[body_len..]);
        out
    }
}

/// Length of the longest proper prefix of `tag` that `text` ends with (text to hold back).
pub(crate) fn partial_tag_len(text: &str, tag: &str) -> usize {
    (1..tag.len().min(text.len() + 1)).rev().find(|&n| text.ends_with(&tag[..n])).unwrap_or(0)
}

fn is_name_char(c: char) -> bool {
    c.is_alphanumeric() || matches!(c, '_' | '-' | '.')
}

#[cfg(test)]
#[path = "tool_parser_tests.rs"]
pub(crate) mod tests;

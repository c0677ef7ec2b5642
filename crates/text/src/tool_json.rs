//! JSON helpers for the tool-call parser: a resumable scan for where a JSON object or array ends,
//! the `{"response": "` prefix of the generic format, incremental decoding of a JSON string body,
//! and the call objects the formats write, with their arguments rewritten as compact JSON that
//! keeps object keys in the order the model wrote them (serde_json's `Value` does so only with its
//! `preserve_order` feature, which depends on the build).

use std::fmt;

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use crate::tool_parser::ParsedToolCall;

/// Finds where a JSON object or array ends by matching brackets outside strings; resumable, so
/// each byte is looked at once however the text arrives. Validity is checked afterwards.
#[derive(Debug, Clone)]
pub(crate) struct JsonScan {
    /// Offset of the opening bracket.
    pub(crate) start: usize,
    pos: usize,
    depth: usize,
    in_string: bool,
    escaped: bool,
}

impl JsonScan {
    /// A scan of the value whose opening bracket is at `start`.
    pub(crate) fn at(start: usize) -> Self {
        Self { start, pos: start, depth: 0, in_string: false, escaped: false }
    }

    /// Scans on through `buf`; the end offset (exclusive) once the brackets balance.
    pub(crate) fn advance(&mut self, buf: &str) -> Option<usize> {
        // Only ASCII bytes matter, and those never occur inside a multi-byte UTF-8 character.
        for &byte in &buf.as_bytes()[self.pos..] {
            self.pos += 1;
            if self.in_string {
                match byte {
                    _ if self.escaped => self.escaped = false,
                    b'\\' => self.escaped = true,
                    b'"' => self.in_string = false,
                    _ => {}
                }
                continue;
            }
            match byte {
                b'"' => self.in_string = true,
                b'{' | b'[' => self.depth += 1,
                b'}' | b']' => {
                    self.depth = self.depth.saturating_sub(1);
                    if self.depth == 0 {
                        return Some(self.pos);
                    }
                }
                _ => {}
            }
        }
        None
    }
}

/// `Some(Some(len))` when `buf` starts with `{"response": "` (any whitespace between tokens),
/// `len` bytes long; `Some(None)` when it might still; `None` when it cannot.
pub(crate) fn response_prefix_len(buf: &str) -> Option<Option<usize>> {
    let mut rest = buf;
    for token in ["{", "\"response\"", ":", "\""] {
        rest = rest.trim_start();
        if let Some(after) = rest.strip_prefix(token) {
            rest = after;
        } else if token.starts_with(rest) {
            return Some(None);
        } else {
            return None;
        }
    }
    Some(Some(buf.len() - rest.len()))
}

pub(crate) enum StringEnd {
    Open,
    Closed,
    Malformed,
}

/// Decodes the start of a JSON string body: the decoded text, the bytes consumed (an escape cut
/// off by the end of `buf` is left unconsumed; the closing quote is consumed), and why it stopped.
pub(crate) fn decode_string_prefix(buf: &str) -> (String, usize, StringEnd) {
    let mut decoded = String::new();
    let mut at = 0;
    while let Some(c) = buf[at..].chars().next() {
        match c {
            '"' => return (decoded, at + 1, StringEnd::Closed),
            '\\' => match decode_escape(&buf[at..]) {
                Escape::Char(c, len) => {
                    decoded.push(c);
                    at += len;
                }
                Escape::Incomplete => return (decoded, at, StringEnd::Open),
                Escape::Invalid => return (decoded, at, StringEnd::Malformed),
            },
            c => {
                decoded.push(c);
                at += c.len_utf8();
            }
        }
    }
    (decoded, at, StringEnd::Open)
}

enum Escape {
    Char(char, usize),
    Incomplete,
    Invalid,
}

/// Decodes the escape sequence at the start of `text` (which starts with a backslash).
fn decode_escape(text: &str) -> Escape {
    let simple = match text.as_bytes().get(1) {
        None => return Escape::Incomplete,
        Some(b'u') => return decode_unicode_escape(text),
        Some(b'"') => '"',
        Some(b'\\') => '\\',
        Some(b'/') => '/',
        Some(b'b') => '\u{8}',
        Some(b'f') => '\u{c}',
        Some(b'n') => '\n',
        Some(b'r') => '\r',
        Some(b't') => '\t',
        Some(_) => return Escape::Invalid,
    };
    Escape::Char(simple, 2)
}

/// Decodes `\uXXXX`, or a `\uXXXX\uXXXX` surrogate pair, at the start of `text`.
fn decode_unicode_escape(text: &str) -> Escape {
    // What is there must fit `\uXXXX\uXXXX` so far; a prefix of it may still become valid.
    let fits = |len: usize| {
        text.bytes().take(len).enumerate().all(|(i, b)| match i % 6 {
            0 => b == b'\\',
            1 => b == b'u',
            _ => b.is_ascii_hexdigit(),
        })
    };
    let unit = |at: usize| text.get(at + 2..at + 6).and_then(|h| u32::from_str_radix(h, 16).ok());
    if !fits(6) {
        return Escape::Invalid;
    }
    let Some(first) = unit(0) else { return Escape::Incomplete };
    if !(0xD800..0xDC00).contains(&first) {
        return char::from_u32(first).map_or(Escape::Invalid, |c| Escape::Char(c, 6));
    }
    if !fits(12) {
        return Escape::Invalid;
    }
    match unit(6) {
        None => Escape::Incomplete,
        Some(low @ 0xDC00..0xE000) => char::from_u32(0x10000 + ((first - 0xD800) << 10) + (low - 0xDC00))
            .map_or(Escape::Invalid, |c| Escape::Char(c, 12)),
        Some(_) => Escape::Invalid,
    }
}

/// A JSON value rewritten compactly, with object keys in the order they were written.
enum CompactJson {
    /// Compact text of an object.
    Object(String),
    /// A string's decoded value.
    String(String),
    /// Compact text of any other value.
    Other(String),
}

impl CompactJson {
    fn write_to(self, out: &mut String) {
        match self {
            Self::Object(text) | Self::Other(text) => out.push_str(&text),
            Self::String(value) => out.push_str(&json_string(&value)),
        }
    }

    /// The compact text of an arguments object, given as an object or as a string holding one.
    fn into_arguments(self) -> Option<String> {
        match self {
            Self::Object(text) => Some(text),
            Self::String(inner) => match serde_json::from_str(&inner).ok()? {
                Self::Object(text) => Some(text),
                _ => None,
            },
            Self::Other(_) => None,
        }
    }
}

fn json_string(value: &str) -> String {
    serde_json::to_string(value).unwrap_or_default()
}

impl<'de> Deserialize<'de> for CompactJson {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(CompactVisitor)
    }
}

struct CompactVisitor;

impl<'de> Visitor<'de> for CompactVisitor {
    type Value = CompactJson;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_unit<E>(self) -> Result<CompactJson, E> {
        Ok(CompactJson::Other("null".to_owned()))
    }

    fn visit_bool<E>(self, v: bool) -> Result<CompactJson, E> {
        Ok(CompactJson::Other(v.to_string()))
    }

    fn visit_i64<E>(self, v: i64) -> Result<CompactJson, E> {
        Ok(CompactJson::Other(v.to_string()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<CompactJson, E> {
        Ok(CompactJson::Other(v.to_string()))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<CompactJson, E> {
        serde_json::to_string(&v).map(CompactJson::Other).map_err(E::custom)
    }

    fn visit_str<E>(self, v: &str) -> Result<CompactJson, E> {
        Ok(CompactJson::String(v.to_owned()))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<CompactJson, A::Error> {
        let mut text = String::from("[");
        while let Some(item) = seq.next_element::<CompactJson>()? {
            if text.len() > 1 {
                text.push(',');
            }
            item.write_to(&mut text);
        }
        text.push(']');
        Ok(CompactJson::Other(text))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<CompactJson, A::Error> {
        let mut text = String::from("{");
        while let Some((key, value)) = map.next_entry::<String, CompactJson>()? {
            if text.len() > 1 {
                text.push(',');
            }
            text.push_str(&json_string(&key));
            text.push(':');
            value.write_to(&mut text);
        }
        text.push('}');
        Ok(CompactJson::Object(text))
    }
}

/// A call object as the formats write it; other keys are ignored.
#[derive(Deserialize)]
struct CallJson {
    name: String,
    arguments: Option<CompactJson>,
    /// Llama 3's name for the arguments.
    parameters: Option<CompactJson>,
}

impl CallJson {
    /// The call, if the name is not empty and the arguments are an object (missing or `null`
    /// arguments are `{}` unless `require_arguments`).
    fn into_call(self, require_arguments: bool) -> Option<ParsedToolCall> {
        let arguments = match self.arguments.or(self.parameters) {
            Some(arguments) => arguments.into_arguments()?,
            None if !require_arguments => "{}".to_owned(),
            None => return None,
        };
        (!self.name.is_empty()).then_some(ParsedToolCall { name: self.name, arguments })
    }
}

/// The compact text of an arguments object written on its own (Mistral's `name{…}` calls).
pub(crate) fn parse_arguments(text: &str) -> Option<String> {
    serde_json::from_str::<CompactJson>(text).ok().and_then(CompactJson::into_arguments)
}

pub(crate) fn parse_call(text: &str, require_arguments: bool) -> Option<ParsedToolCall> {
    serde_json::from_str::<CallJson>(text).ok()?.into_call(require_arguments)
}

pub(crate) fn parse_call_array(text: &str) -> Option<Vec<ParsedToolCall>> {
    let calls: Vec<CallJson> = serde_json::from_str(text).ok()?;
    calls.into_iter().map(|call| call.into_call(false)).collect()
}

/// The generic format's object: `tool_calls`, else `tool_call`, else `response` decides.
#[derive(Deserialize)]
struct GenericJson {
    tool_calls: Option<Vec<CallJson>>,
    tool_call: Option<CallJson>,
    response: Option<String>,
}

pub(crate) enum GenericReply {
    Calls(Vec<ParsedToolCall>),
    Response(String),
}

pub(crate) fn parse_generic(text: &str) -> Option<GenericReply> {
    let reply: GenericJson = serde_json::from_str(text).ok()?;
    if let Some(calls) = reply.tool_calls {
        calls.into_iter().map(|call| call.into_call(false)).collect::<Option<_>>().map(GenericReply::Calls)
    } else if let Some(call) = reply.tool_call {
        call.into_call(false).map(|call| GenericReply::Calls(vec![call]))
    } else {
        reply.response.map(GenericReply::Response)
    }
}

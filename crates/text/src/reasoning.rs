//! Reasoning ("thinking") in model output: separates the `<think>…</think>` part that reasoning
//! models write before their reply, for a whole output ([`split_reasoning`]) or while it streams
//! ([`ReasoningSplitter`]). The content it returns is what tool-call parsing should see.
//!
//! Whitespace rule (the same whole or streamed): the reasoning has leading and trailing whitespace
//! removed, and the content has leading whitespace removed (its trailing whitespace is kept, so
//! content streams without waiting). [`split_reasoning`] is the splitter fed a single delta.

use crate::tool_parser::{partial_tag_len, TrimmedStream};

const THINK_OPEN: &str = "<think>";
const THINK_CLOSE: &str = "</think>";

/// How a model family marks its reasoning (`--reasoning-parser`; the `value(help)`s are the
/// flag's documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "snake_case")]
pub enum ReasoningFormat {
    /// DeepSeek-R1 style: the output is reasoning until `</think>`, whether or not it (or the
    /// prompt) opened with `<think>`; without `</think>` it is all reasoning.
    #[cfg_attr(
        feature = "clap",
        value(
            name = "deepseek_r1",
            help = "`<think>...</think>`; the opening tag may come from the template (DeepSeek-R1)"
        )
    )]
    #[serde(rename = "deepseek_r1")]
    DeepSeekR1,
    /// Qwen3 style: reasoning only when the output starts with `<think>` or the prompt opened
    /// one; otherwise thinking was switched off and everything is content.
    #[cfg_attr(
        feature = "clap",
        value(help = "`<think>...</think>` when the output opens it (Qwen3; thinking can be switched off)")
    )]
    Qwen3,
}

impl ReasoningFormat {
    /// Every format's name, as [`Self::from_name`] accepts them.
    pub const NAMES: &'static [&'static str] = &["deepseek_r1", "qwen3"];

    /// The format called `name` (one of [`Self::NAMES`]).
    pub fn from_name(name: &str) -> Option<Self> {
        [Self::DeepSeekR1, Self::Qwen3].into_iter().find(|f| f.name() == name)
    }

    /// This format's name.
    pub fn name(self) -> &'static str {
        match self {
            Self::DeepSeekR1 => "deepseek_r1",
            Self::Qwen3 => "qwen3",
        }
    }

    /// The tag that ends the reasoning.
    pub fn end_tag(self) -> &'static str {
        THINK_CLOSE
    }
}

/// Text that became certain with one push: reasoning and content, either possibly empty.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReasoningDelta {
    pub reasoning: String,
    pub content: String,
}

impl ReasoningDelta {
    pub fn is_empty(&self) -> bool {
        self.reasoning.is_empty() && self.content.is_empty()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Nothing but whitespace (or part of `<think>`) seen yet.
    Start,
    Reasoning,
    Content,
}

/// Splits streamed output into reasoning and content.
#[derive(Debug, Clone)]
pub struct ReasoningSplitter {
    format: ReasoningFormat,
    prompt_opened_thinking: bool,
    phase: Phase,
    /// Text received but not yet classified.
    buffer: String,
    reasoning: TrimmedStream,
    content: TrimmedStream,
}

impl ReasoningSplitter {
    /// `prompt_opened_thinking`: the rendered prompt ends with an open `<think>` (templates that
    /// pre-fill it), so the output starts inside the reasoning.
    pub fn new(format: ReasoningFormat, prompt_opened_thinking: bool) -> Self {
        Self {
            format,
            prompt_opened_thinking,
            phase: Phase::Start,
            buffer: String::new(),
            reasoning: TrimmedStream::new(true),
            content: TrimmedStream::new(false),
        }
    }

    /// Feeds the next text delta; returns what is certain now. A partial `<think>` or `</think>`
    /// at the end is held back.
    pub fn push(&mut self, delta: &str) -> ReasoningDelta {
        self.buffer.push_str(delta);
        self.drain(false)
    }

    /// Ends the output: releases what was held back and resets for a new output.
    pub fn finish(&mut self) -> ReasoningDelta {
        let delta = self.drain(true);
        *self = Self::new(self.format, self.prompt_opened_thinking);
        delta
    }

    /// Whether text pushed now would count as reasoning (for Qwen3 without an opened prompt, not
    /// before `<think>` has been seen).
    pub fn in_reasoning(&self) -> bool {
        match self.phase {
            Phase::Start => self.reasoning_by_default(),
            Phase::Reasoning => true,
            Phase::Content => false,
        }
    }

    /// Whether output that does not open with `<think>` starts inside the reasoning.
    fn reasoning_by_default(&self) -> bool {
        self.format == ReasoningFormat::DeepSeekR1 || self.prompt_opened_thinking
    }

    fn drain(&mut self, at_end: bool) -> ReasoningDelta {
        let mut out = ReasoningDelta::default();
        loop {
            match self.phase {
                Phase::Start => {
                    let rest = self.buffer.trim_start();
                    if let Some(after) = rest.strip_prefix(THINK_OPEN) {
                        let consumed = self.buffer.len() - after.len();
                        self.buffer.drain(..consumed);
                        self.phase = Phase::Reasoning;
                    } else if !at_end && THINK_OPEN.starts_with(rest) {
                        return out;
                    } else {
                        self.phase =
                            if self.reasoning_by_default() { Phase::Reasoning } else { Phase::Content };
                    }
                }
                Phase::Reasoning => {
                    if let Some(at) = self.buffer.find(THINK_CLOSE) {
                        out.reasoning.push_str(&self.reasoning.push(&self.buffer[..at]));
                        self.buffer.drain(..at + THINK_CLOSE.len());
                        self.phase = Phase::Content;
                        continue;
                    }
                    let held = if at_end { 0 } else { partial_tag_len(&self.buffer, THINK_CLOSE) };
                    let certain = self.buffer.len() - held;
                    out.reasoning.push_str(&self.reasoning.push(&self.buffer[..certain]));
                    self.buffer.drain(..certain);
                    return out;
                }
                Phase::Content => {
                    out.content.push_str(&self.content.push(&self.buffer));
                    self.buffer.clear();
                    return out;
                }
            }
        }
    }
}

/// Splits a complete output into reasoning (`None` when there is none, or it is empty) and
/// content, by the same rules as [`ReasoningSplitter`].
pub fn split_reasoning(
    format: ReasoningFormat,
    prompt_opened_thinking: bool,
    text: &str,
) -> (Option<String>, String) {
    let mut splitter = ReasoningSplitter::new(format, prompt_opened_thinking);
    let mut whole = splitter.push(text);
    let rest = splitter.finish();
    whole.reasoning.push_str(&rest.reasoning);
    whole.content.push_str(&rest.content);
    ((!whole.reasoning.is_empty()).then_some(whole.reasoning), whole.content)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tool_parser::tests::{delta_splits, markup_soup};
    use ReasoningFormat::{DeepSeekR1, Qwen3};

    fn split(format: ReasoningFormat, opened: bool, text: &str) -> (Option<String>, String) {
        split_reasoning(format, opened, text)
    }

    fn some(text: &str) -> Option<String> {
        Some(text.to_owned())
    }

    #[test]
    fn names_round_trip() {
        for name in ReasoningFormat::NAMES {
            assert_eq!(ReasoningFormat::from_name(name).map(ReasoningFormat::name), Some(*name));
        }
        assert_eq!(ReasoningFormat::from_name("o1"), None);
        assert_eq!(Qwen3.end_tag(), "</think>");
    }

    #[test]
    fn deepseek_r1_with_and_without_open_tag() {
        let recorded = "<think>\nThe user asks 2+2. That is 4.\n</think>\n\nThe answer is **4**.";
        let expected = (some("The user asks 2+2. That is 4."), "The answer is **4**.".to_owned());
        assert_eq!(split(DeepSeekR1, false, recorded), expected);
        // Templates that pre-fill `<think>\n` leave the model to write only the rest.
        let prefilled = "The user asks 2+2. That is 4.\n</think>\n\nThe answer is **4**.";
        assert_eq!(split(DeepSeekR1, true, prefilled), expected);
        assert_eq!(split(DeepSeekR1, false, prefilled), expected);
    }

    #[test]
    fn deepseek_r1_without_end_tag_is_all_reasoning() {
        assert_eq!(
            split(DeepSeekR1, false, "<think>Let me count: 1, 2, 3"),
            (some("Let me count: 1, 2, 3"), String::new())
        );
        assert_eq!(split(DeepSeekR1, false, "Hello there"), (some("Hello there"), String::new()));
        assert_eq!(split(DeepSeekR1, false, ""), (None, String::new()));
    }

    #[test]
    fn qwen3_thinking_on_and_off() {
        let thinking = "<think>\nOkay, the user says hi.\n</think>\n\nHello! How can I help?";
        assert_eq!(
            split(Qwen3, false, thinking),
            (some("Okay, the user says hi."), "Hello! How can I help?".to_owned())
        );
        // enable_thinking=false: the template closes an empty think block in the prompt.
        assert_eq!(
            split(Qwen3, false, "Hello! How can I help?"),
            (None, "Hello! How can I help?".to_owned())
        );
        assert_eq!(
            split(Qwen3, true, "Plan: greet.\n</think>\n\nHi!"),
            (some("Plan: greet."), "Hi!".to_owned())
        );
        assert_eq!(split(Qwen3, true, "Plan: greet, then"), (some("Plan: greet, then"), String::new()));
        // A later think block is not reasoning when the output did not start with one.
        let late = "Sure. <think>hmm</think> done";
        assert_eq!(split(Qwen3, false, late), (None, late.to_owned()));
        assert_eq!(split(Qwen3, false, "  \n<think>a</think>b"), (some("a"), "b".to_owned()));
    }

    #[test]
    fn whitespace_rule() {
        let (reasoning, content) =
            split(DeepSeekR1, false, "<think>\n\n  step one\n\nstep two \n</think>\n\n Answer  \n");
        assert_eq!(reasoning, some("step one\n\nstep two"));
        assert_eq!(content, "Answer  \n");
        assert_eq!(split(Qwen3, false, "<think>\n\n</think>\n\nHi"), (None, "Hi".to_owned()));
    }

    #[test]
    fn streaming_holds_partial_tags_only() {
        let mut splitter = ReasoningSplitter::new(Qwen3, false);
        assert!(!splitter.in_reasoning());
        assert_eq!(splitter.push("<thi"), ReasoningDelta::default());
        assert_eq!(
            splitter.push("nk>Let me"),
            ReasoningDelta { reasoning: "Let me".into(), content: String::new() }
        );
        assert!(splitter.in_reasoning());
        assert_eq!(splitter.push(" think</thi").reasoning, " think");
        assert_eq!(splitter.push("nk>\n\n").reasoning, "");
        assert!(!splitter.in_reasoning());
        assert_eq!(splitter.push("Answer").content, "Answer");
        assert!(splitter.finish().is_empty());
        // Not a tag after all: the held text is reasoning.
        let mut splitter = ReasoningSplitter::new(DeepSeekR1, false);
        assert!(splitter.in_reasoning());
        assert_eq!(splitter.push("a </th").reasoning, "a");
        assert_eq!(splitter.push("is").reasoning, " </this");
        assert_eq!(splitter.finish(), ReasoningDelta::default());
    }

    #[test]
    fn streamed_equals_whole_for_every_split() {
        let soup = markup_soup();
        let samples = [
            "<think>\nI should call the weather tool.\n</think>\n\nIt is sunny in Paris.",
            "<think></think>Direct answer",
            "  <think>\n  unicode: 日本語 🤔 </think>  réponse",
            "reasoning with < and </ and </thinking> inside</think>content </think> kept",
            "no tags at all\n",
            "<think>unterminated reasoning </thi",
            "<thin",
            "\n\n",
            "",
        ];
        for (format, opened) in [(DeepSeekR1, false), (DeepSeekR1, true), (Qwen3, false), (Qwen3, true)] {
            for text in samples.into_iter().chain(soup.iter().map(String::as_str)) {
                let expected = split(format, opened, text);
                for deltas in delta_splits(text) {
                    let mut splitter = ReasoningSplitter::new(format, opened);
                    let (mut reasoning, mut content) = (String::new(), String::new());
                    let mut outputs: Vec<ReasoningDelta> = deltas.iter().map(|d| splitter.push(d)).collect();
                    outputs.push(splitter.finish());
                    for delta in outputs {
                        reasoning.push_str(&delta.reasoning);
                        content.push_str(&delta.content);
                    }
                    let got = ((!reasoning.is_empty()).then_some(reasoning), content);
                    assert_eq!(got, expected, "{format:?} opened={opened} {text:?} split as {deltas:?}");
                }
            }
        }
    }
}

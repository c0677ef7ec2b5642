//! `pagoda-text`: everything between text and token ids for the Pagoda server.
//!
//! - [`Tokenizer`]: loads a tokenizer from GGUF metadata ([`Tokenizer::from_gguf`]: byte-level
//!   BPE or SentencePiece BPE) or a Hugging Face directory ([`Tokenizer::from_dir`]); encodes,
//!   decodes, and knows BOS/EOS ids and the chat template.
//! - [`IncrementalDetokenizer`]: turns generated ids into text deltas for streaming, never
//!   splitting a UTF-8 character.
//! - [`StopMatcher`]: finds stop strings across delta boundaries.
//! - [`ChatTemplate`]: renders chat messages with a Hugging Face-style Jinja template.
//! - [`GgufMetadata`]: reads the metadata section of a GGUF file.
//! - [`parse_tool_calls`] / [`ToolCallStreamParser`]: find tool calls in model output, whole or
//!   streamed, in the model's own markup ([`ToolCallFormat`]).
//! - [`split_reasoning`] / [`ReasoningSplitter`]: separate `<think>…</think>` reasoning from the
//!   reply, whole or streamed.

pub mod byte_level;
pub mod chat_template;
pub mod detokenizer;
pub mod encode_bounded;
pub mod gguf_meta;
pub mod reasoning;
pub mod stop;
mod template_funcs;
pub mod tokenizer;
mod tokenizer_gguf;
mod tokenizer_hf;
mod tokenizer_spm;
mod tool_json;
pub mod tool_parser;

pub use chat_template::{ChatMessage, ChatTemplate, ChatTemplateError};
pub use detokenizer::{IncrementalDetokenizer, TokenDecoder};
pub use encode_bounded::BoundedEncodeError;
pub use gguf_meta::{GgufError, GgufMetadata, MetaValue};
pub use reasoning::{split_reasoning, ReasoningDelta, ReasoningFormat, ReasoningSplitter};
pub use stop::{StopMatcher, StopOutcome, StopStrings};
pub use tokenizer::{Tokenizer, TokenizerError};
pub use tokenizer_gguf::SUPPORTED_PRE;
pub use tool_parser::{
    parse_tool_calls, ParsedOutput, ParsedToolCall, ToolCallFormat, ToolCallStreamParser, ToolStreamEvent,
};

// The server shares these across threads (behind `Arc`s); keep that a compile-time guarantee.
const _: () = {
    const fn shareable<T: Send + Sync>() {}
    shareable::<Tokenizer>();
    shareable::<ChatTemplate>();
    shareable::<GgufMetadata>();
    shareable::<IncrementalDetokenizer>();
    shareable::<StopMatcher>();
};

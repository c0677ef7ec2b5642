//! The model's tokenizer: text to token ids and back, plus what the server needs to know about
//! the vocabulary (BOS/EOS ids, the end-of-sequence id set, the chat template).
//!
//! It wraps a `tokenizers::Tokenizer`, built either from a GGUF file's metadata
//! ([`Tokenizer::from_gguf`], see `tokenizer_gguf.rs` for byte-level BPE and `tokenizer_spm.rs`
//! for SentencePiece vocabularies) or from a Hugging Face model directory
//! ([`Tokenizer::from_dir`], see `tokenizer_hf.rs`).
//!
//! Bytes without a token: a byte-level vocabulary may lack some of the 256 byte tokens (SmolLM2
//! lacks 21, e.g. `\x04` and the never-valid UTF-8 bytes `0xC0`, `0xF5..=0xFF`). Hugging Face's
//! tokenizer silently drops such bytes when encoding, and so do we, deliberately: the model was
//! trained and evaluated with that tokenizer, so its ids are the ones the model expects, and the
//! dropped bytes are control characters or code points the model never saw. Only the missing
//! byte goes: in a character like U+50000 (lead byte `0xF1`, missing) the continuation bytes stay
//! and decode as U+FFFD, again as in Hugging Face. Nothing panics on such text (encode, decode,
//! streaming). The affected byte values are listed by [`Tokenizer::missing_byte_tokens`] for
//! anyone who wants to warn.

use std::collections::BTreeSet;
use std::path::PathBuf;

use tokenizers::processors::template::{SpecialToken, TemplateProcessing};
use tokenizers::processors::PostProcessorWrapper;

use crate::byte_level;
use crate::detokenizer::TokenDecoder;
use crate::gguf_meta::GgufError;

/// Why a tokenizer could not be loaded or could not encode.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error(
        "{path}: tokenizer model {model:?} is not supported (supported: \"gpt2\", byte-level BPE; \"llama\", SentencePiece BPE)"
    )]
    UnsupportedModel { path: PathBuf, model: String },
    #[error(
        "{path}: pre-tokenizer {pre:?} is not supported; supported: {}",
        crate::tokenizer_gguf::SUPPORTED_PRE.join(", ")
    )]
    UnsupportedPreTokenizer { path: PathBuf, pre: String },
    #[error("{path}: invalid vocabulary: {what}")]
    InvalidVocab { path: PathBuf, what: String },
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: invalid JSON: {source}")]
    Json { path: PathBuf, source: serde_json::Error },
    #[error("{path}: {what}")]
    Load { path: PathBuf, what: String },
    #[error("encoding failed: {0}")]
    Encode(String),
    #[error("decoding failed: {0}")]
    Decode(String),
}

/// How a vocabulary spells token text, which decides how [`Tokenizer::token_bytes`] reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TokenSpelling {
    /// GPT-2 byte-level alphabet (`Ġ` for space).
    ByteLevel,
    /// Sentencepiece: `▁` for space and `<0xNN>` byte tokens.
    Metaspace,
    /// Tokens are their text.
    Plain,
}

/// Special-token texts that end a turn or a document in common chat models. A special token with
/// one of these texts stops generation even when the model names another token as its EOS
/// (SmolLM2 declares `<|im_end|>`, but may also close with `<|endoftext|>`).
const END_MARKERS: &[&str] = &[
    "<|im_end|>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end|>",
    "<|eot|>",
    "<end_of_turn>",
    "<EOT>",
];

/// Everything besides the `tokenizers::Tokenizer` that the constructors work out.
pub(crate) struct Parts {
    pub bos_id: Option<u32>,
    pub eos_id: Option<u32>,
    /// Further ids that end generation (EOT/EOM, generation config lists).
    pub extra_eos_ids: Vec<u32>,
    pub add_bos: bool,
    pub chat_template: Option<String>,
    pub spelling: TokenSpelling,
}

/// A loaded tokenizer. Cheap to share behind an `Arc`; all methods take `&self`.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    bos_id: Option<u32>,
    eos_id: Option<u32>,
    eos_ids: Vec<u32>,
    add_bos: bool,
    bos_token: Option<String>,
    eos_token: Option<String>,
    chat_template: Option<String>,
    spelling: TokenSpelling,
    missing_bytes: Vec<u8>,
    vocab_size: usize,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("bos", &self.bos_token)
            .field("eos", &self.eos_token)
            .field("eos_ids", &self.eos_ids)
            .field("add_bos", &self.add_bos)
            .finish_non_exhaustive()
    }
}

impl Tokenizer {
    pub(crate) fn assemble(inner: tokenizers::Tokenizer, parts: Parts) -> Self {
        let added = inner.get_added_tokens_decoder();
        let mut eos_ids: BTreeSet<u32> = parts.extra_eos_ids.into_iter().collect();
        eos_ids.extend(parts.eos_id);
        eos_ids.extend(
            added
                .iter()
                .filter(|(_, tok)| tok.special && END_MARKERS.contains(&tok.content.as_str()))
                .map(|(id, _)| *id),
        );
        let missing_bytes = match parts.spelling {
            TokenSpelling::ByteLevel => (0..=255u8)
                .filter(|&b| inner.token_to_id(&byte_level::byte_to_char(b).to_string()).is_none())
                .collect(),
            _ => Vec::new(),
        };
        // Highest id + 1, not the number of distinct strings: a vocabulary with duplicate
        // spellings still has a logit row for every id.
        let vocab_size = inner.get_vocab(true).values().max().map_or(0, |&max| max as usize + 1);
        Self {
            vocab_size,
            bos_token: parts.bos_id.and_then(|id| inner.id_to_token(id)),
            eos_token: parts.eos_id.and_then(|id| inner.id_to_token(id)),
            bos_id: parts.bos_id,
            eos_id: parts.eos_id,
            eos_ids: eos_ids.into_iter().collect(),
            add_bos: parts.add_bos,
            chat_template: parts.chat_template,
            spelling: parts.spelling,
            missing_bytes,
            inner,
        }
    }

    /// Token ids for `text`. Special tokens written in the text (e.g. `<|im_start|>`) are matched
    /// whole. With `add_special_tokens`, the model's BOS is prepended when the model asks for one
    /// ([`Tokenizer::add_bos`]).
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, TokenizerError> {
        let encoding = self
            .inner
            .encode_fast(text, add_special_tokens)
            .map_err(|e| TokenizerError::Encode(e.to_string()))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Token ids for `text` with the special tokens the post-processor adds (BERT's `[CLS]` and
    /// `[SEP]`), at most `max_len` of them: the text's own tokens are cut at the end to leave
    /// room for the special ones, as sentence-transformers truncates an input. The second value
    /// says whether anything was cut.
    pub fn encode_truncated(&self, text: &str, max_len: usize) -> Result<(Vec<u32>, bool), TokenizerError> {
        let encode_err = |e: tokenizers::Error| TokenizerError::Encode(e.to_string());
        let mut encoding = self.inner.encode_fast(text, false).map_err(encode_err)?;
        let added =
            self.inner.get_post_processor().map_or(0, |p| tokenizers::PostProcessor::added_tokens(p, false));
        let room = max_len.saturating_sub(added);
        let cut = encoding.len() > room;
        if cut {
            encoding.truncate(room, 0, tokenizers::TruncationDirection::Right);
        }
        let encoding = self.inner.post_process(encoding, None, true).map_err(encode_err)?;
        Ok((encoding.get_ids().to_vec(), cut))
    }

    /// Token ids for a text pair (a cross-encoder's query and document) with the special tokens
    /// the post-processor adds (`[CLS] first [SEP] second [SEP]`), at most `max_len` of them:
    /// the longer text loses a token at its end until both fit, as `transformers` truncates a
    /// pair by default (`longest_first`). The second value is where the second text's tokens
    /// start (the first token of type 1), `None` when the post-processor marks no types.
    pub fn encode_pair_truncated(
        &self,
        first: &str,
        second: &str,
        max_len: usize,
    ) -> Result<(Vec<u32>, Option<usize>), TokenizerError> {
        use tokenizers::utils::truncation::{truncate_encodings, TruncationParams, TruncationStrategy};
        let encode_err = |e: tokenizers::Error| TokenizerError::Encode(e.to_string());
        let first = self.inner.encode_fast(first, false).map_err(encode_err)?;
        let second = self.inner.encode_fast(second, false).map_err(encode_err)?;
        let added =
            self.inner.get_post_processor().map_or(0, |p| tokenizers::PostProcessor::added_tokens(p, true));
        let room = max_len.saturating_sub(added);
        let (first, second) = if first.len() + second.len() > room {
            let params = TruncationParams {
                max_length: room,
                strategy: TruncationStrategy::LongestFirst,
                ..TruncationParams::default()
            };
            truncate_encodings(first, Some(second), &params).map_err(encode_err)?
        } else {
            (first, Some(second))
        };
        let encoding = self.inner.post_process(first, second, true).map_err(encode_err)?;
        let second_start = encoding.get_type_ids().iter().position(|&t| t == 1);
        Ok((encoding.get_ids().to_vec(), second_start))
    }

    /// Text for `ids`; ids outside the vocabulary are ignored, and bytes that do not form valid
    /// UTF-8 become U+FFFD.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, TokenizerError> {
        self.inner.decode(ids, skip_special_tokens).map_err(|e| TokenizerError::Decode(e.to_string()))
    }

    /// The raw bytes token `id` stands for (byte-level and `<0xNN>` spellings undone); `None` for
    /// ids outside the vocabulary.
    pub fn token_bytes(&self, id: u32) -> Option<Vec<u8>> {
        let token = self.inner.id_to_token(id)?;
        Some(match self.spelling {
            TokenSpelling::ByteLevel => byte_level::decode_token(&token),
            TokenSpelling::Metaspace => match parse_byte_token(&token) {
                Some(b) => vec![b],
                None => token.replace('\u{2581}', " ").into_bytes(),
            },
            TokenSpelling::Plain => token.into_bytes(),
        })
    }

    /// The text of token `id` for display (e.g. in logprobs): `" world"` for `Ġworld`. A token
    /// that holds only part of a UTF-8 character shows U+FFFD; ids outside the vocabulary give an
    /// empty string.
    pub fn token_text(&self, id: u32) -> String {
        self.token_bytes(id).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default()
    }

    /// Number of ids (highest id + 1), added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// The vocabulary's spelling of token `id`.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The id of a token given in the vocabulary's spelling (`"Ġworld"`, `"<|im_end|>"`).
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The beginning-of-sequence token id, if the model has one.
    pub fn bos_id(&self) -> Option<u32> {
        self.bos_id
    }

    /// The declared end-of-sequence token id, if any.
    pub fn eos_id(&self) -> Option<u32> {
        self.eos_id
    }

    /// Every id that ends generation: the EOS id, end-of-turn / end-of-message ids the model
    /// declares, and special tokens whose text is a well-known end marker. Sorted, no duplicates.
    pub fn eos_token_ids(&self) -> &[u32] {
        &self.eos_ids
    }

    /// Whether `id` ends generation.
    pub fn is_eos(&self, id: u32) -> bool {
        self.eos_ids.binary_search(&id).is_ok()
    }

    /// Whether `encode(.., add_special_tokens = true)` prepends BOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// The BOS token's text (e.g. `"<|im_start|>"`), for chat templates.
    pub fn bos_token(&self) -> Option<&str> {
        self.bos_token.as_deref()
    }

    /// The EOS token's text (e.g. `"<|im_end|>"`), for chat templates.
    pub fn eos_token(&self) -> Option<&str> {
        self.eos_token.as_deref()
    }

    /// The chat template source shipped with the model, if any.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// Byte values that no token spells (byte-level vocabularies only). Text containing them
    /// encodes without them; see the module docs.
    pub fn missing_byte_tokens(&self) -> &[u8] {
        &self.missing_bytes
    }

    /// The underlying `tokenizers` tokenizer.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}

impl TokenDecoder for Tokenizer {
    fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> String {
        // The decoders used here (byte-level, sentencepiece) cannot fail; should a custom
        // tokenizer.json's decoder fail, the stream shows nothing for these ids rather than
        // ending the request.
        Tokenizer::decode(self, ids, skip_special_tokens).unwrap_or_default()
    }
}

/// A post-processor that wraps every sequence in `bos` / `eos` (each `(spelling, id)`), or
/// `None` when neither is wanted.
pub(crate) fn special_post_processor(
    bos: Option<(&str, u32)>,
    eos: Option<(&str, u32)>,
) -> Result<Option<PostProcessorWrapper>, String> {
    if bos.is_none() && eos.is_none() {
        return Ok(None);
    }
    let err = |e: String| format!("special-token template: {e}");
    let mut special = Vec::new();
    // Template pieces are parsed from strings, so the tokens go by fixed names.
    for (name, token) in [("[BOS]", bos), ("[EOS]", eos)] {
        if let Some((text, id)) = token {
            let t = SpecialToken::new(name.into(), vec![id], vec![text.to_owned()])
                .map_err(|e| err(e.to_string()))?;
            special.push(t);
        }
    }
    let b = if bos.is_some() { "[BOS] " } else { "" };
    let e = if eos.is_some() { " [EOS]" } else { "" };
    let e1 = if eos.is_some() { " [EOS]:1" } else { "" };
    let b1 = if bos.is_some() { "[BOS]:1 " } else { "" };
    let processing = TemplateProcessing::builder()
        .try_single(format!("{b}$A{e}"))
        .and_then(|t| t.try_pair(format!("{b}$A{e} {b1}$B:1{e1}")))
        .map_err(err)?
        .special_tokens(special)
        .build()
        .map_err(|e| err(e.to_string()))?;
    Ok(Some(PostProcessorWrapper::Template(processing)))
}

/// `<0xNN>` → `NN`, the sentencepiece spelling of a raw byte token.
fn parse_byte_token(token: &str) -> Option<u8> {
    let hex = token.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_tokens_parse() {
        assert_eq!(parse_byte_token("<0x0A>"), Some(b'\n'));
        assert_eq!(parse_byte_token("<0xff>"), Some(0xFF));
        assert_eq!(parse_byte_token("<0x1>"), None);
        assert_eq!(parse_byte_token("<0xZZ>"), None);
        assert_eq!(parse_byte_token("hello"), None);
    }
}

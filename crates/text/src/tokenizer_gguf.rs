//! Building a [`Tokenizer`] from a GGUF file's tokenizer metadata.
//!
//! [`Tokenizer::from_gguf_metadata`] dispatches on `tokenizer.ggml.model`: `"llama"`
//! (SentencePiece BPE: Llama 2, Mistral, Gemma) is built in `tokenizer_spm.rs`; any model other
//! than that and `"gpt2"` is an error ([`TokenizerError::UnsupportedModel`]).
//!
//! `"gpt2"` (byte-level BPE) is built here, with the pre-tokenizers named by
//! `tokenizer.ggml.pre` that are listed in [`SUPPORTED_PRE`]. Each is set up the way the model's
//! own Hugging Face `tokenizer.json` does it, so ids match Hugging Face's:
//!
//! | `pre` | normalizer | pre-tokenizer |
//! |---|---|---|
//! | `smollm` | none | `Digits(individual)`, then GPT-2 `ByteLevel` regex |
//! | `gpt-2`, `default`, absent | none | GPT-2 `ByteLevel` regex |
//! | `llama-bpe`, `llama3`, `llama-v3` | none | Llama-3 split regex, `ByteLevel` (no regex); BPE ignores merges for whole-vocab words |
//! | `qwen2` | NFC | Qwen2 split regex, `ByteLevel` (no regex) |
//!
//! Any other `pre` is an error ([`TokenizerError::UnsupportedPreTokenizer`]) rather than a guess:
//! a wrong split regex gives plausible but different ids, which would silently degrade the model.
//!
//! Token types (`tokenizer.ggml.token_type`): control (3) tokens become special added tokens and
//! user-defined (4) ones plain added tokens, both matched whole in the input text. Following
//! Hugging Face's GGUF loader, a token spelled with characters outside the byte-level alphabet is
//! looked up by its byte-level spelling, and a control token spelled that way is not added.

use std::path::Path;

use tokenizers::decoders::DecoderWrapper;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::{NormalizerWrapper, NFC};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{AddedToken, SplitDelimiterBehavior};

use crate::byte_level;
use crate::gguf_meta::{GgufError, GgufMetadata};
use crate::tokenizer::{special_post_processor, Parts, TokenSpelling, Tokenizer, TokenizerError};

/// `tokenizer.ggml.pre` values this loader understands.
pub const SUPPORTED_PRE: &[&str] =
    &["default", "gpt-2", "smollm", "llama-bpe", "llama3", "llama-v3", "qwen2"];

/// Llama 3's split: case-insensitive contractions, letters with one leading non-letter, numbers
/// in groups of up to three digits, punctuation runs, newlines, spaces.
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Qwen2's split: as Llama 3's, but every digit on its own.
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

pub(crate) const TOKEN_TYPE_CONTROL: i32 = 3;
pub(crate) const TOKEN_TYPE_USER_DEFINED: i32 = 4;

/// How the text is prepared before BPE.
struct PreSetup {
    normalizer: Option<NormalizerWrapper>,
    pre_tokenizer: PreTokenizerWrapper,
    ignore_merges: bool,
}

impl Tokenizer {
    /// Loads the tokenizer described by the metadata of the GGUF file at `path`.
    pub fn from_gguf(path: impl AsRef<Path>) -> Result<Self, TokenizerError> {
        let meta = GgufMetadata::read(path.as_ref())?;
        Self::from_gguf_metadata(&meta)
    }

    /// Builds the tokenizer from already-read GGUF metadata.
    pub fn from_gguf_metadata(meta: &GgufMetadata) -> Result<Self, TokenizerError> {
        match meta.get_str("tokenizer.ggml.model")? {
            "gpt2" => Self::byte_level_bpe(meta),
            "llama" => crate::tokenizer_spm::sentencepiece_bpe(meta),
            model => Err(TokenizerError::UnsupportedModel {
                path: meta.path().to_path_buf(),
                model: model.to_owned(),
            }),
        }
    }

    /// A `tokenizer.ggml.model = "gpt2"` vocabulary: byte-level BPE with the file's merges.
    fn byte_level_bpe(meta: &GgufMetadata) -> Result<Self, TokenizerError> {
        let path = meta.path();
        let invalid = |what: String| invalid_vocab(meta, what);

        let pre = optional(meta.get_str("tokenizer.ggml.pre"))?.unwrap_or("default");
        let setup = pre_setup(pre).ok_or_else(|| TokenizerError::UnsupportedPreTokenizer {
            path: path.to_path_buf(),
            pre: pre.to_owned(),
        })?;

        let tokens = meta.get_str_array("tokenizer.ggml.tokens")?;
        let n_tokens = token_count(meta, &tokens)?;
        let token_types = token_types(meta, tokens.len())?;

        // Later duplicates win, as in Hugging Face's loader.
        let mut vocab = Vocab::default();
        for (id, token) in (0..n_tokens).zip(&tokens) {
            vocab.insert(vocab_spelling(token), id);
        }

        let merges = meta
            .get_str_array("tokenizer.ggml.merges")?
            .into_iter()
            .map(|m| {
                m.split_once(' ')
                    .map(|(a, b)| (a.to_owned(), b.to_owned()))
                    .ok_or_else(|| invalid(format!("merge {m:?} is not two tokens")))
            })
            .collect::<Result<Vec<_>, _>>()?;

        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .ignore_merges(setup.ignore_merges)
            .build()
            .map_err(|e| invalid(e.to_string()))?;

        let mut inner = tokenizers::Tokenizer::new(bpe);
        inner.with_normalizer(setup.normalizer);
        inner.with_pre_tokenizer(Some(setup.pre_tokenizer));
        inner.with_decoder(Some(DecoderWrapper::ByteLevel(ByteLevel::default())));

        if let Some(types) = &token_types {
            let added = |wanted: i32, special: bool| -> Vec<AddedToken> {
                tokens
                    .iter()
                    .zip(types)
                    // A byte-level spelling is always a vocabulary key, so the token keeps its id.
                    .filter(|&(token, &ty)| ty == wanted && byte_level::is_byte_level(token))
                    .map(|(token, _)| AddedToken::from(*token, special).normalized(false))
                    .collect()
            };
            inner.add_special_tokens(&added(TOKEN_TYPE_CONTROL, true));
            inner.add_tokens(&added(TOKEN_TYPE_USER_DEFINED, false));
        }

        let SpecialIds { bos_id, eos_id, extra_eos_ids, .. } = special_ids(meta, n_tokens)?;
        // Absent means no BOS for byte-level BPE, as in Hugging Face's loader.
        let add_bos = optional(meta.get_bool("tokenizer.ggml.add_bos_token"))?.unwrap_or(false);
        if add_bos {
            let bos =
                bos_id.ok_or_else(|| invalid("add_bos_token is set but there is no bos_token_id".into()))?;
            let processor =
                special_post_processor(Some((tokens[bos as usize], bos)), None).map_err(invalid)?;
            inner.with_post_processor(processor);
        }
        let chat_template = optional(meta.get_str("tokenizer.chat_template"))?.map(str::to_owned);

        Ok(Tokenizer::assemble(
            inner,
            Parts {
                bos_id,
                eos_id,
                extra_eos_ids,
                add_bos,
                chat_template,
                spelling: TokenSpelling::ByteLevel,
            },
        ))
    }
}

/// BOS, EOS, unknown and padding ids named by the metadata, checked against the vocabulary.
pub(crate) struct SpecialIds {
    pub bos_id: Option<u32>,
    pub eos_id: Option<u32>,
    /// End-of-turn and end-of-message ids: they end generation too.
    pub extra_eos_ids: Vec<u32>,
    pub unk_id: Option<u32>,
    pub pad_id: Option<u32>,
}

/// Reads the `tokenizer.ggml.*_token_id` keys. A BOS, EOS, EOT or EOM id outside the
/// `n_tokens`-token vocabulary is an error; an unusable unknown or padding id (out of range,
/// negative) is ignored, as llama.cpp does, since files in the wild carry such placeholders.
pub(crate) fn special_ids(meta: &GgufMetadata, n_tokens: u32) -> Result<SpecialIds, TokenizerError> {
    let id_key = |key: &str| -> Result<Option<u32>, TokenizerError> {
        match optional(meta.get_u32(key))? {
            Some(id) if id >= n_tokens => {
                Err(invalid_vocab(meta, format!("{key} = {id} is outside the {n_tokens}-token vocabulary")))
            }
            id => Ok(id),
        }
    };
    let lenient = |key: &str| meta.get_u32(key).ok().filter(|&id| id < n_tokens);
    let mut extra_eos_ids = Vec::new();
    for key in ["tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"] {
        extra_eos_ids.extend(id_key(key)?);
    }
    Ok(SpecialIds {
        bos_id: id_key("tokenizer.ggml.bos_token_id")?,
        eos_id: id_key("tokenizer.ggml.eos_token_id")?,
        extra_eos_ids,
        unk_id: lenient("tokenizer.ggml.unknown_token_id"),
        pad_id: lenient("tokenizer.ggml.padding_token_id"),
    })
}

/// The number of tokens as an id bound.
pub(crate) fn token_count(meta: &GgufMetadata, tokens: &[&str]) -> Result<u32, TokenizerError> {
    u32::try_from(tokens.len())
        .map_err(|_| invalid_vocab(meta, format!("{} tokens is too many", tokens.len())))
}

/// `tokenizer.ggml.token_type`, if present, checked to have one type per token.
pub(crate) fn token_types(meta: &GgufMetadata, n_tokens: usize) -> Result<Option<Vec<i32>>, TokenizerError> {
    let types = optional(meta.get_i32_array("tokenizer.ggml.token_type"))?;
    if let Some(types) = &types {
        if types.len() != n_tokens {
            return Err(invalid_vocab(meta, format!("{} token types for {n_tokens} tokens", types.len())));
        }
    }
    Ok(types)
}

/// [`TokenizerError::InvalidVocab`] for this file.
pub(crate) fn invalid_vocab(meta: &GgufMetadata, what: String) -> TokenizerError {
    TokenizerError::InvalidVocab { path: meta.path().to_path_buf(), what }
}

/// The normalizer, pre-tokenizer and BPE option for a `tokenizer.ggml.pre` value.
fn pre_setup(pre: &str) -> Option<PreSetup> {
    // GPT-2's regex lives inside ByteLevel (use_regex = true); the split-regex variants use
    // ByteLevel only for the byte mapping.
    let gpt2 = || PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, true));
    let split_then_bytes = |regex: &str| -> Option<PreTokenizerWrapper> {
        let split =
            Split::new(SplitPattern::Regex(regex.to_owned()), SplitDelimiterBehavior::Isolated, false)
                .ok()?;
        Some(PreTokenizerWrapper::Sequence(Sequence::new(vec![
            PreTokenizerWrapper::Split(split),
            PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, false)),
        ])))
    };
    Some(match pre {
        "default" | "gpt-2" => PreSetup { normalizer: None, pre_tokenizer: gpt2(), ignore_merges: false },
        "smollm" => PreSetup {
            normalizer: None,
            pre_tokenizer: PreTokenizerWrapper::Sequence(Sequence::new(vec![
                PreTokenizerWrapper::Digits(Digits::new(true)),
                gpt2(),
            ])),
            ignore_merges: false,
        },
        "llama-bpe" | "llama3" | "llama-v3" => {
            PreSetup { normalizer: None, pre_tokenizer: split_then_bytes(LLAMA3_SPLIT)?, ignore_merges: true }
        }
        "qwen2" => PreSetup {
            normalizer: Some(NormalizerWrapper::NFC(NFC)),
            pre_tokenizer: split_then_bytes(QWEN2_SPLIT)?,
            ignore_merges: false,
        },
        _ => return None,
    })
}

/// The key under which a GGUF token is looked up: its own spelling when it is written in the
/// byte-level alphabet, otherwise the byte-level spelling of its UTF-8 bytes.
fn vocab_spelling(token: &str) -> String {
    if byte_level::is_byte_level(token) {
        token.to_owned()
    } else {
        byte_level::encode_bytes(token.as_bytes())
    }
}

/// `Ok(None)` for a missing key, so optional metadata reads stay one line.
pub(crate) fn optional<T>(result: Result<T, GgufError>) -> Result<Option<T>, GgufError> {
    match result {
        Ok(v) => Ok(Some(v)),
        Err(GgufError::MissingKey { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_supported_pre_builds() {
        for pre in SUPPORTED_PRE {
            assert!(pre_setup(pre).is_some(), "{pre}");
        }
        assert!(pre_setup("deepseek-llm").is_none());
    }

    #[test]
    fn plain_text_tokens_get_byte_level_keys() {
        assert_eq!(vocab_spelling("Ġhi"), "Ġhi");
        assert_eq!(vocab_spelling("a b"), "aĠb");
        assert_eq!(vocab_spelling("\n"), "Ċ");
    }
}

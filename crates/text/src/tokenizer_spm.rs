//! Building a [`Tokenizer`] from a GGUF vocabulary with `tokenizer.ggml.model = "llama"`:
//! SentencePiece BPE with byte fallback, as used by Llama 2, Mistral and Gemma 1-3.
//!
//! Such a file stores pieces (`tokenizer.ggml.tokens`), their scores and their types, but no
//! merge list. The tokenizer is a Hugging Face BPE model set up the way Hugging Face's own
//! conversion of such a vocabulary does it (transformers' GGUF loader, Llama 2's and Gemma's
//! `tokenizer.json`), so that ids match Hugging Face's:
//!
//! - Merges: every way of cutting a piece into two pieces of the vocabulary is a merge. They are
//!   ranked best first by the merged piece's score (higher first), then by the longer left part,
//!   then by the longer right part; remaining ties keep vocabulary order (and, within one piece,
//!   the order of the parts' ids). For Gemma (`general.architecture` starting with `gemma`) the
//!   scores do not follow the merge order, the piece order does, so a lower id ranks first, as
//!   in transformers. A file without scores is ranked by piece order too.
//! - Gemma files spell whitespace-run pieces with real spaces (`"  "`), although the text they
//!   match has been normalized to `"▁▁"`; they are respelled with `▁` so merges can reach them.
//! - Normalizer: `" "` becomes `"▁"`; with `tokenizer.ggml.add_space_prefix` (llama.cpp's
//!   default when the key is absent) a `"▁"` is prepended to each stretch of text between added
//!   tokens, as in Llama 2's `tokenizer.json` and llama.cpp. No pre-tokenizer: each stretch is
//!   one BPE word.
//! - Characters without a piece become their UTF-8 bytes as `<0xNN>` pieces (type 6); a byte
//!   without one becomes the unknown piece (`tokenizer.ggml.unknown_token_id`, else the first
//!   piece of type unknown), consecutive unknowns fused into one.
//! - Decoder: `"▁"` to `" "`, `<0xNN>` pieces to bytes, fused, and with a space prefix the one
//!   leading space removed.
//! - Token types: control (3) and unknown (2) pieces, and the BOS/EOS/unknown/padding pieces,
//!   are special added tokens; user-defined (4) pieces are plain added tokens. Both are matched
//!   whole in the raw text (not normalized), before the normalizer runs. A user-defined piece
//!   that was respelled (Gemma's space runs) is not added: merges produce it.
//! - `tokenizer.ggml.add_bos_token` defaults to true when there is a BOS id (llama.cpp and
//!   transformers do the same for this model type); `tokenizer.ggml.add_eos_token`, default
//!   false, appends EOS.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};

use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::decoders::DecoderWrapper;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::{NormalizerWrapper, Prepend, Replace};
use tokenizers::AddedToken;

use crate::gguf_meta::GgufMetadata;
use crate::tokenizer::{special_post_processor, Parts, TokenSpelling, Tokenizer, TokenizerError};
use crate::tokenizer_gguf::{
    invalid_vocab, optional, special_ids, token_count, token_types, SpecialIds, TOKEN_TYPE_CONTROL,
    TOKEN_TYPE_USER_DEFINED,
};

const TOKEN_TYPE_UNKNOWN: i32 = 2;

/// SentencePiece's visible space.
const SPACE_MARK: &str = "\u{2581}";

/// A `tokenizer.ggml.model = "llama"` vocabulary; see the module docs.
pub(crate) fn sentencepiece_bpe(meta: &GgufMetadata) -> Result<Tokenizer, TokenizerError> {
    let invalid = |what: String| invalid_vocab(meta, what);
    let raw_tokens = meta.get_str_array("tokenizer.ggml.tokens")?;
    let n_tokens = token_count(meta, &raw_tokens)?;
    let types = token_types(meta, raw_tokens.len())?;
    let gemma = optional(meta.architecture())?.is_some_and(|arch| arch.starts_with("gemma"));

    let tokens: Vec<Cow<'_, str>> =
        raw_tokens.iter().map(|&t| if gemma { respell_spaces(t) } else { Cow::Borrowed(t) }).collect();
    let tokens: Vec<&str> = tokens.iter().map(|t| t.as_ref()).collect();
    let scores = if gemma { None } else { optional(meta.get_f64_array("tokenizer.ggml.scores"))? };
    if let Some(scores) = &scores {
        if scores.len() != tokens.len() {
            return Err(invalid(format!("{} scores for {} tokens", scores.len(), tokens.len())));
        }
    }
    let merges = derive_merges(&tokens, scores.as_deref());

    // Later duplicates win, as in Hugging Face's loader.
    let mut vocab = Vocab::default();
    for (id, token) in (0..n_tokens).zip(&tokens) {
        vocab.insert((*token).to_owned(), id);
    }

    let SpecialIds { bos_id, eos_id, extra_eos_ids, unk_id, pad_id } = special_ids(meta, n_tokens)?;
    let type_of = |id: usize| types.as_ref().map_or(1, |t| t[id]);
    let unk_id = unk_id.or_else(|| (0..n_tokens).find(|&id| type_of(id as usize) == TOKEN_TYPE_UNKNOWN));

    let mut builder = BPE::builder().vocab_and_merges(vocab, merges).byte_fallback(true).fuse_unk(true);
    if let Some(unk) = unk_id {
        builder = builder.unk_token(tokens[unk as usize].to_owned());
    }
    let bpe = builder.build().map_err(|e| invalid(e.to_string()))?;

    let add_space_prefix = optional(meta.get_bool("tokenizer.ggml.add_space_prefix"))?.unwrap_or(true);
    let mut inner = tokenizers::Tokenizer::new(bpe);
    inner.with_normalizer(Some(normalizer(add_space_prefix)));
    inner.with_decoder(Some(decoder(add_space_prefix)));

    // Special: control and unknown pieces, and the pieces the metadata names.
    let named = [bos_id, eos_id, unk_id, pad_id];
    let special: Vec<AddedToken> = (0..raw_tokens.len())
        .filter(|&id| {
            matches!(type_of(id), TOKEN_TYPE_CONTROL | TOKEN_TYPE_UNKNOWN) || named.contains(&Some(id as u32))
        })
        .map(|id| AddedToken::from(tokens[id], true).normalized(false))
        .collect();
    inner.add_special_tokens(&special);
    // User-defined pieces keep the file's spelling, so a respelled one (now `▁▁`) would not be a
    // vocabulary key and would get a new id: it is left to the merges, as in transformers.
    let user_defined: Vec<AddedToken> = (0..raw_tokens.len())
        .filter(|&id| type_of(id) == TOKEN_TYPE_USER_DEFINED && raw_tokens[id] == tokens[id])
        .map(|id| AddedToken::from(raw_tokens[id], false).normalized(false))
        .collect();
    inner.add_tokens(&user_defined);

    // Absent means BOS if there is one.
    let add_bos = optional(meta.get_bool("tokenizer.ggml.add_bos_token"))?.unwrap_or(bos_id.is_some());
    let add_eos = optional(meta.get_bool("tokenizer.ggml.add_eos_token"))?.unwrap_or(false);
    let wrap = |wanted: bool, id: Option<u32>, what: &str| -> Result<Option<(&str, u32)>, TokenizerError> {
        match (wanted, id) {
            (false, _) => Ok(None),
            (true, Some(id)) => Ok(Some((tokens[id as usize], id))),
            (true, None) => Err(invalid(format!("add_{what}_token is set but there is no {what}_token_id"))),
        }
    };
    let processor = special_post_processor(wrap(add_bos, bos_id, "bos")?, wrap(add_eos, eos_id, "eos")?)
        .map_err(invalid)?;
    inner.with_post_processor(processor);
    let chat_template = optional(meta.get_str("tokenizer.chat_template"))?.map(str::to_owned);

    Ok(Tokenizer::assemble(
        inner,
        Parts { bos_id, eos_id, extra_eos_ids, add_bos, chat_template, spelling: TokenSpelling::Metaspace },
    ))
}

/// `" "` to `"▁"`, after prepending `"▁"` when the vocabulary wants a space prefix.
fn normalizer(add_space_prefix: bool) -> NormalizerWrapper {
    // Replacing a literal string cannot fail to compile.
    let replace = Replace::new(" ", SPACE_MARK).expect("a literal pattern compiles");
    if add_space_prefix {
        NormalizerWrapper::Sequence(tokenizers::normalizers::Sequence::new(vec![
            NormalizerWrapper::Prepend(Prepend::new(SPACE_MARK.to_owned())),
            NormalizerWrapper::Replace(replace),
        ]))
    } else {
        NormalizerWrapper::Replace(replace)
    }
}

/// `"▁"` to `" "`, byte pieces to bytes, fused; then the prefix space removed if one was added.
fn decoder(add_space_prefix: bool) -> DecoderWrapper {
    let replace = Replace::new(SPACE_MARK, " ").expect("a literal pattern compiles");
    let mut steps = vec![
        DecoderWrapper::Replace(replace),
        DecoderWrapper::ByteFallback(ByteFallback::new()),
        DecoderWrapper::Fuse(Fuse::new()),
    ];
    if add_space_prefix {
        steps.push(DecoderWrapper::Strip(Strip::new(' ', 1, 0)));
    }
    DecoderWrapper::Sequence(DecoderSequence::new(steps))
}

/// Gemma's spelling fix: a piece of whitespace that contains a real space stands for that many
/// `▁`s (the text it matches has its spaces normalized), so it is spelled that way.
fn respell_spaces(token: &str) -> Cow<'_, str> {
    if token.contains(' ') && token.chars().all(char::is_whitespace) {
        Cow::Owned(SPACE_MARK.repeat(token.chars().count()))
    } else {
        Cow::Borrowed(token)
    }
}

/// One candidate merge: `left + right` is a vocabulary piece.
struct Candidate<'a> {
    left: &'a str,
    right: &'a str,
    score: f64,
    left_chars: usize,
    right_chars: usize,
}

/// The merges a SentencePiece vocabulary implies, best first: each cut of a piece `tokens[id]`
/// into two vocabulary pieces, ranked by `scores[id]` (higher first; `-id` without scores), then
/// longer left part, then longer right part. Ties keep the order of first appearance of the
/// merged piece and, within one piece, the order of (left id, right id). With duplicate
/// spellings the last id and score count, as when a Python dict is built in id order.
pub(crate) fn derive_merges(tokens: &[&str], scores: Option<&[f64]>) -> Vec<(String, String)> {
    let mut last_id: HashMap<&str, usize> = HashMap::with_capacity(tokens.len());
    for (id, &token) in tokens.iter().enumerate() {
        last_id.insert(token, id);
    }
    let score_of = |id: usize| -> f64 {
        let score = scores.map_or(-(id as f64), |s| s[id]);
        // A total order for the sort: NaN ranks last, and -0.0 equals 0.0 as it does in Python.
        if score.is_nan() {
            f64::NEG_INFINITY
        } else {
            score + 0.0
        }
    };

    let mut merges: Vec<Candidate<'_>> = Vec::new();
    let mut local: Vec<(usize, usize, Candidate<'_>)> = Vec::new();
    let mut seen: HashSet<&str> = HashSet::with_capacity(tokens.len());
    for &token in tokens {
        if !seen.insert(token) {
            continue;
        }
        let score = score_of(last_id[token]);
        let total_chars = token.chars().count();
        local.clear();
        for (left_chars, (cut, _)) in token.char_indices().enumerate().skip(1) {
            let (left, right) = token.split_at(cut);
            if let (Some(&l), Some(&r)) = (last_id.get(left), last_id.get(right)) {
                let right_chars = total_chars - left_chars;
                local.push((l, r, Candidate { left, right, score, left_chars, right_chars }));
            }
        }
        local.sort_by_key(|&(l, r, _)| (l, r));
        merges.extend(local.drain(..).map(|(_, _, c)| c));
    }
    // Stable, so ties keep the order built above.
    merges.sort_by(|a, b| {
        b.score
            .total_cmp(&a.score)
            .then(b.left_chars.cmp(&a.left_chars))
            .then(b.right_chars.cmp(&a.right_chars))
    });
    merges.into_iter().map(|c| (c.left.to_owned(), c.right.to_owned())).collect()
}

#[cfg(test)]
#[path = "tokenizer_spm_tests.rs"]
mod tests;

//! Building a [`Tokenizer`] from a Hugging Face model directory.
//!
//! Padding and truncation that `tokenizer.json` sets are turned off. Files read:
//! - `tokenizer.json` (required): the tokenizer itself.
//! - `tokenizer_config.json` (optional): `chat_template` (a string, or a list of named templates
//!   of which `default` is used), `bos_token` / `eos_token` (a string or `{"content": ..}`),
//!   `add_bos_token` / `add_eos_token`. As in `transformers`, when either flag is given explicitly
//!   it decides what `encode(.., add_special_tokens = true)` adds, replacing the post-processor of
//!   `tokenizer.json`; otherwise that post-processor decides.
//! - `chat_template.jinja` (optional): takes precedence over the config's template, as in
//!   `transformers`.
//! - `generation_config.json` (optional): `eos_token_id` (one id or a list; all of them end
//!   generation) and `bos_token_id`, used where the tokenizer config names no token.

use std::path::{Path, PathBuf};

use serde_json::Value;
use tokenizers::decoders::DecoderWrapper;

use crate::tokenizer::{special_post_processor, Parts, TokenSpelling, Tokenizer, TokenizerError};

impl Tokenizer {
    /// Loads the tokenizer of the Hugging Face model directory `dir`.
    pub fn from_dir(dir: impl AsRef<Path>) -> Result<Self, TokenizerError> {
        let dir = dir.as_ref();
        let json_path = dir.join("tokenizer.json");
        if !json_path.is_file() {
            return Err(TokenizerError::Load {
                path: json_path,
                what: "not found (a Hugging Face model directory needs a tokenizer.json)".into(),
            });
        }
        let mut inner = tokenizers::Tokenizer::from_file(&json_path)
            .map_err(|e| TokenizerError::Load { path: json_path.clone(), what: e.to_string() })?;
        // A tokenizer.json may pad and truncate every encoding to a fixed length (BERT
        // checkpoints pad to 128): ids are the text's own, and limits are the caller's
        // ([`Tokenizer::encode_truncated`]).
        inner.with_padding(None);
        inner
            .with_truncation(None)
            .map_err(|e| TokenizerError::Load { path: json_path.clone(), what: e.to_string() })?;

        let config_path = dir.join("tokenizer_config.json");
        let config = read_json(&config_path)?.unwrap_or(Value::Null);
        let generation = read_json(&dir.join("generation_config.json"))?.unwrap_or(Value::Null);

        let named_id = |key: &str| -> Option<u32> {
            special_token_text(&config[key]).and_then(|t| inner.token_to_id(t))
        };
        let gen_eos = ids_of(&generation["eos_token_id"]);
        let bos_id = named_id("bos_token").or_else(|| ids_of(&generation["bos_token_id"]).first().copied());
        let eos_id = named_id("eos_token").or_else(|| gen_eos.first().copied());

        let add_bos = match (config["add_bos_token"].as_bool(), config["add_eos_token"].as_bool()) {
            (None, None) => {
                // The post-processor of tokenizer.json decides; see what it does to empty text.
                let ids = inner
                    .encode_fast("", true)
                    .map_err(|e| TokenizerError::Load { path: json_path.clone(), what: e.to_string() })?;
                bos_id.is_some() && ids.get_ids().first().copied() == bos_id
            }
            (add_bos, add_eos) => {
                let with_text = |wanted: Option<bool>, id: Option<u32>| {
                    let id = id.filter(|_| wanted == Some(true))?;
                    Some((inner.id_to_token(id)?, id))
                };
                let bos = with_text(add_bos, bos_id);
                let eos = with_text(add_eos, eos_id);
                let processor = special_post_processor(
                    bos.as_ref().map(|(t, id)| (t.as_str(), *id)),
                    eos.as_ref().map(|(t, id)| (t.as_str(), *id)),
                )
                .map_err(|what| TokenizerError::Load { path: config_path.clone(), what })?;
                inner.with_post_processor(processor);
                bos.is_some()
            }
        };

        let template_file = dir.join("chat_template.jinja");
        let chat_template = if template_file.is_file() {
            Some(
                std::fs::read_to_string(&template_file)
                    .map_err(|source| TokenizerError::Io { path: template_file, source })?,
            )
        } else {
            chat_template_of(&config["chat_template"])
        };

        let spelling = spelling_of(inner.get_decoder());
        Ok(Tokenizer::assemble(
            inner,
            Parts { bos_id, eos_id, extra_eos_ids: gen_eos, add_bos, chat_template, spelling },
        ))
    }
}

/// The parsed JSON file at `path`, or `None` if there is no such file.
fn read_json(path: &Path) -> Result<Option<Value>, TokenizerError> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(TokenizerError::Io { path: PathBuf::from(path), source }),
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|source| TokenizerError::Json { path: PathBuf::from(path), source })
}

/// A special token as `tokenizer_config.json` writes it: `"<s>"` or `{"content": "<s>", ..}`.
fn special_token_text(value: &Value) -> Option<&str> {
    value.as_str().or_else(|| value.get("content").and_then(Value::as_str))
}

/// One id or a list of ids; anything else (or ids that do not fit `u32`) gives none.
fn ids_of(value: &Value) -> Vec<u32> {
    let one = |v: &Value| v.as_u64().and_then(|id| u32::try_from(id).ok());
    match value {
        Value::Array(items) => items.iter().filter_map(one).collect(),
        other => one(other).into_iter().collect(),
    }
}

/// The template from `chat_template`: a string, or a list of `{name, template}` where the one
/// named `default` is used (the first one if none is).
fn chat_template_of(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Array(items) => items
            .iter()
            .find(|item| item.get("name").and_then(Value::as_str) == Some("default"))
            .or_else(|| items.first())
            .and_then(|item| item.get("template"))
            .and_then(Value::as_str)
            .map(str::to_owned),
        _ => None,
    }
}

/// How tokens are spelled, judged from the decoder that turns them back into text.
fn spelling_of(decoder: Option<&DecoderWrapper>) -> TokenSpelling {
    match decoder {
        Some(DecoderWrapper::ByteLevel(_)) => TokenSpelling::ByteLevel,
        Some(DecoderWrapper::Metaspace(_) | DecoderWrapper::ByteFallback(_) | DecoderWrapper::Replace(_)) => {
            TokenSpelling::Metaspace
        }
        Some(DecoderWrapper::Sequence(seq)) => seq
            .get_decoders()
            .iter()
            .map(|d| spelling_of(Some(d)))
            .find(|s| *s != TokenSpelling::Plain)
            .unwrap_or(TokenSpelling::Plain),
        _ => TokenSpelling::Plain,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn special_tokens_in_both_shapes() {
        assert_eq!(special_token_text(&json!("<s>")), Some("<s>"));
        assert_eq!(special_token_text(&json!({"content": "</s>", "lstrip": false})), Some("</s>"));
        assert_eq!(special_token_text(&json!(null)), None);
    }

    #[test]
    fn eos_ids_one_or_many() {
        assert_eq!(ids_of(&json!(2)), vec![2]);
        assert_eq!(ids_of(&json!([128001, 128008, 128009])), vec![128001, 128008, 128009]);
        assert_eq!(ids_of(&json!(null)), Vec::<u32>::new());
        assert_eq!(ids_of(&json!(-1)), Vec::<u32>::new());
    }

    #[test]
    fn chat_template_string_or_named_list() {
        assert_eq!(chat_template_of(&json!("{{x}}")), Some("{{x}}".into()));
        let list = json!([
            {"name": "tool_use", "template": "T"},
            {"name": "default", "template": "D"}
        ]);
        assert_eq!(chat_template_of(&list), Some("D".into()));
        assert_eq!(chat_template_of(&json!([{"name": "rag", "template": "R"}])), Some("R".into()));
        assert_eq!(chat_template_of(&json!(3)), None);
    }
}

//! A separate draft model for speculative decoding (`--draft-model`): loaded as the target was,
//! checked to be able to draft for it, and given a cache of the same blocks, whose pages take
//! their share of the KV budget.

use std::path::Path;

use candle_core::DType;
use pagoda_models::{
    load_model, DraftModel, KvCache, KvLayout, LoadOptions, Model, ModelConfig, ModelRunner,
};
use pagoda_text::Tokenizer;

use crate::load::{load_tokenizer, RuntimeError};
use crate::options::RuntimeOptions;

/// Gives `runner` the draft model with a cache of the same blocks; returns that cache's bytes.
pub(crate) fn attach_draft(
    runner: &mut ModelRunner,
    draft: Model,
    options: &RuntimeOptions,
    num_blocks: usize,
    max_model_len: usize,
) -> Result<u64, RuntimeError> {
    let path = options.draft_model.clone().unwrap_or_default();
    let config = draft.config().clone();
    if config.max_position_embeddings < max_model_len {
        return Err(RuntimeError::DraftIncompatible {
            path,
            reason: format!(
                "its {} positions are fewer than the server's max_model_len {max_model_len}",
                config.max_position_embeddings
            ),
        });
    }
    let dtype = options.kv_cache_dtype;
    let block_size = options.settings.block_size;
    let cache = KvCache::new(&config, num_blocks, block_size, dtype, &options.device)?;
    let bytes =
        num_blocks * KvLayout::for_config(&config).page_bytes(&config, block_size, dtype.size_in_bytes());
    runner
        .set_draft(DraftModel::new(draft, cache))
        .map_err(|e| RuntimeError::DraftIncompatible { path, reason: e.to_string() })?;
    Ok(bytes as u64)
}

/// The KV budget's part for the target's cache when a draft's cache takes a page of the same
/// blocks beside each of the target's.
pub(crate) fn target_share(
    bytes: u64,
    target: &ModelConfig,
    draft: Option<&ModelConfig>,
    block_size: usize,
    dtype: DType,
) -> u64 {
    let Some(draft) = draft else { return bytes };
    let page =
        |c: &ModelConfig| KvLayout::for_config(c).page_bytes(c, block_size, dtype.size_in_bytes()) as u128;
    (u128::from(bytes) * page(target) / (page(target) + page(draft))) as u64
}

/// Loads the draft model at `path` as the target was loaded, and checks that it can draft for
/// it: the same vocabulary (and tokenizer, where the draft carries one), every layer attending to
/// the whole context (one KV group, so the target's block tables page its cache), as the target.
pub(crate) fn load_draft(
    path: &Path,
    load: &LoadOptions,
    target: &ModelConfig,
    tokenizer: &Tokenizer,
) -> Result<Model, RuntimeError> {
    let refuse = |reason: String| RuntimeError::DraftIncompatible { path: path.to_path_buf(), reason };
    let draft = load_model(path, load)?.model;
    let config = draft.config();
    if config.vocab_size != target.vocab_size {
        return Err(refuse(format!(
            "its vocabulary of {} ids is not the target's {}",
            config.vocab_size, target.vocab_size
        )));
    }
    for (which, c) in [("the draft", config), ("the target", target)] {
        if KvLayout::for_config(c).num_groups() != 1 {
            return Err(refuse(format!(
                "{which} has sliding-window layers; a draft model needs both to attend to the whole context"
            )));
        }
    }
    // A draft without a tokenizer of its own (dummy weights) is taken at its vocabulary's word.
    if let Ok(theirs) = load_tokenizer(path) {
        let probe = "Speculative decoding: 12 drafts, 3.5 accepted; ok?";
        let same = theirs.vocab_size() == tokenizer.vocab_size()
            && theirs.eos_token() == tokenizer.eos_token()
            && theirs.encode(probe, false).ok() == tokenizer.encode(probe, false).ok();
        if !same {
            return Err(refuse("its tokenizer differs from the target's".into()));
        }
    }
    Ok(draft)
}

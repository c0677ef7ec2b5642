//! Engine sizing and limits ([`EngineConfig`]) and their validation.

use crate::kv_groups::KvGroups;
use crate::speculative::{SpeculativeConfig, SpeculativeConfigError, SpeculativeMethod};

/// Why an [`EngineConfig`] cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("{0} must be at least 1")]
    Zero(&'static str),
    #[error(
        "the KV cache holds {num_blocks} blocks of {block_size} tokens but one sequence of \
         max_model_len {max_model_len} tokens needs {needed}: lower max_model_len or give the \
         cache more memory"
    )]
    CacheTooSmall { needed: usize, num_blocks: usize, block_size: usize, max_model_len: usize },
    #[error(
        "max_num_batched_tokens ({budget}) must be at least max_num_seqs ({max_num_seqs}), \
         or some running sequences could not decode in a step"
    )]
    BudgetBelowSeqs { budget: usize, max_num_seqs: usize },
    #[error("block ids are u32: {0} blocks is too many")]
    TooManyBlocks(usize),
    #[error("block_size {config} does not match the executor's {executor}")]
    BlockSizeMismatch { config: usize, executor: usize },
    #[error("num_blocks {config} exceeds the {executor} blocks the executor allocated")]
    NumBlocksMismatch { config: usize, executor: usize },
    #[error("KV groups {config:?} do not match the executor's {executor:?}")]
    KvGroupsMismatch { config: Vec<Option<usize>>, executor: Vec<Option<usize>> },
    #[error("speculative decoding: {0}")]
    Speculative(#[from] SpeculativeConfigError),
    #[error("KV offload: {0}")]
    KvOffload(String),
    #[error("the engine is configured for images but its executor runs no vision encoder")]
    NoVisionEncoder,
}

/// Sizes and limits of one engine. `block_size` and `num_blocks` come from the executor (see
/// [`EngineConfig::for_executor`]); the rest are policy.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineConfig {
    /// Tokens per KV block.
    pub block_size: usize,
    /// KV blocks (pages, shared by all KV groups) available to the block manager.
    pub num_blocks: usize,
    /// How the executor's layers are grouped (sliding-window groups release what their windows
    /// no longer see); one full group by default.
    pub kv_groups: KvGroups,
    /// Token budget of one step (prefill chunks plus decodes).
    pub max_num_batched_tokens: usize,
    /// Most sequences running at once (and so in one step).
    pub max_num_seqs: usize,
    /// Longest sequence (prompt plus output) the model accepts.
    pub max_model_len: usize,
    /// Samples (a request counts its `n`) accepted but not yet started beyond which `submit`
    /// answers `Overloaded`.
    pub max_waiting_requests: usize,
    /// Reuse KV blocks of identical prompt prefixes across requests.
    pub enable_prefix_caching: bool,
    /// Speculative decoding (off when `None`).
    pub speculative: Option<SpeculativeConfig>,
    /// Most LoRA adapters whose sequences run at once (vLLM's `max_loras`); a sequence of
    /// another adapter waits. `None`: no limit.
    pub max_loras: Option<usize>,
    /// Report the prefix cache's changes to the observer ([`crate::CacheEvent`]), for KV-event
    /// publishers.
    pub kv_cache_events: bool,
    /// Offload tiers behind the prefix cache ([`crate::kv_tier`]); none when `None`.
    pub kv_offload: Option<crate::kv_tier::KvOffloadConfig>,
    /// The executor runs a vision encoder: requests may carry images
    /// ([`crate::Request::images`]); without it, a request with images is refused.
    pub images: bool,
}

impl EngineConfig {
    /// Defaults for a cache of `num_blocks` blocks of `block_size` tokens.
    pub fn new(block_size: usize, num_blocks: usize, max_model_len: usize) -> Self {
        Self {
            block_size,
            num_blocks,
            kv_groups: KvGroups::single(),
            max_num_batched_tokens: 2048,
            max_num_seqs: 256,
            max_model_len,
            max_waiting_requests: 1024,
            enable_prefix_caching: true,
            speculative: None,
            max_loras: None,
            kv_cache_events: false,
            kv_offload: None,
            images: false,
        }
    }

    /// Defaults sized from what the executor allocated.
    pub fn for_executor(executor: &dyn crate::ModelExecutor, max_model_len: usize) -> Self {
        Self {
            kv_groups: executor.kv_groups(),
            ..Self::new(executor.block_size(), executor.num_blocks(), max_model_len)
        }
    }

    /// Tokens the whole KV cache can hold in one full-attention group (all of it when there is
    /// one group; windowed groups hold less).
    pub fn cache_capacity_tokens(&self) -> usize {
        self.num_blocks.saturating_mul(self.block_size) / self.kv_groups.len().max(1)
    }

    /// Most blocks one sequence of `max_model_len` tokens holds at once.
    pub fn max_blocks_per_sequence(&self) -> usize {
        self.kv_groups.max_pages_for_sequence(
            self.max_model_len,
            self.max_num_batched_tokens,
            self.block_size,
        )
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let nonzero = [
            ("block_size", self.block_size),
            ("num_blocks", self.num_blocks),
            ("max_num_batched_tokens", self.max_num_batched_tokens),
            ("max_num_seqs", self.max_num_seqs),
            ("max_model_len", self.max_model_len),
            ("max_waiting_requests", self.max_waiting_requests),
        ];
        if let Some((name, _)) = nonzero.iter().find(|(_, v)| *v == 0) {
            return Err(ConfigError::Zero(name));
        }
        if self.max_num_batched_tokens < self.max_num_seqs {
            return Err(ConfigError::BudgetBelowSeqs {
                budget: self.max_num_batched_tokens,
                max_num_seqs: self.max_num_seqs,
            });
        }
        if let Some(spec) = &self.speculative {
            spec.validate()?;
        }
        if self.num_blocks >= u32::MAX as usize {
            return Err(ConfigError::TooManyBlocks(self.num_blocks));
        }
        // One sequence must always fit on its own, otherwise preemption could never make room
        // for it and the scheduler would spin.
        let needed = self.max_blocks_per_sequence();
        if needed > self.num_blocks {
            return Err(ConfigError::CacheTooSmall {
                needed,
                num_blocks: self.num_blocks,
                block_size: self.block_size,
                max_model_len: self.max_model_len,
            });
        }
        Ok(())
    }

    /// [`validate`](Self::validate) plus agreement with the executor's cache.
    pub fn validate_for(&self, executor: &dyn crate::ModelExecutor) -> Result<(), ConfigError> {
        self.validate()?;
        if self.block_size != executor.block_size() {
            return Err(ConfigError::BlockSizeMismatch {
                config: self.block_size,
                executor: executor.block_size(),
            });
        }
        if self.kv_groups != executor.kv_groups() {
            return Err(ConfigError::KvGroupsMismatch {
                config: self.kv_groups.windows().to_vec(),
                executor: executor.kv_groups().windows().to_vec(),
            });
        }
        match self.speculative.map(|s| s.method) {
            Some(SpeculativeMethod::DraftLayers { num_layers }) => match executor.num_layers() {
                None => return Err(SpeculativeConfigError::NoDraftLayers.into()),
                Some(layers) if num_layers >= layers => {
                    return Err(SpeculativeConfigError::DraftLayers { got: num_layers, layers }.into())
                }
                Some(_) => {}
            },
            Some(SpeculativeMethod::DraftModel) if !executor.has_draft_model() => {
                return Err(SpeculativeConfigError::NoDraftModel.into())
            }
            _ => {}
        }
        if self.images && !executor.takes_images() {
            return Err(ConfigError::NoVisionEncoder);
        }
        if self.num_blocks > executor.num_blocks() {
            return Err(ConfigError::NumBlocksMismatch {
                config: self.num_blocks,
                executor: executor.num_blocks(),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        assert_eq!(EngineConfig::new(16, 128, 2048).validate(), Ok(()));
    }

    #[test]
    fn zero_fields_are_named() {
        let mut c = EngineConfig::new(16, 128, 2048);
        c.max_num_seqs = 0;
        assert_eq!(c.validate(), Err(ConfigError::Zero("max_num_seqs")));
        let c = EngineConfig::new(0, 128, 2048);
        assert_eq!(c.validate(), Err(ConfigError::Zero("block_size")));
    }

    #[test]
    fn budget_must_cover_one_token_per_sequence() {
        let mut c = EngineConfig::new(16, 128, 2048);
        c.max_num_batched_tokens = 100;
        assert_eq!(c.validate(), Err(ConfigError::BudgetBelowSeqs { budget: 100, max_num_seqs: 256 }));
    }

    #[test]
    fn cache_must_hold_one_full_sequence() {
        let c = EngineConfig::new(16, 127, 2048);
        let err = c.validate().unwrap_err();
        assert!(matches!(err, ConfigError::CacheTooSmall { needed: 128, .. }));
        assert!(err.to_string().contains("max_model_len 2048 tokens needs 128"), "{err}");
    }

    #[test]
    fn windowed_groups_need_only_their_window_per_sequence() {
        // A full group and a windowed one of 64 tokens: 128 + (64 + 16) / 16 + 1 blocks.
        let mut c = EngineConfig::new(16, 134, 2048);
        c.max_num_batched_tokens = 256;
        c.max_num_seqs = 16;
        c.kv_groups = KvGroups::new(vec![None, Some(64)]).unwrap();
        assert!(matches!(c.validate(), Err(ConfigError::CacheTooSmall { needed: 149, .. })));
        c.max_num_batched_tokens = 16;
        assert_eq!(c.validate(), Ok(()));
    }
}

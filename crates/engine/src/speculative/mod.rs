//! Speculative decoding, the vLLM v1 way: a running sequence that is decoding may carry up to
//! `k` proposed tokens into a step. They count against the step's token budget like any other
//! token, the executor computes logits at all `k + 1` positions in the same varlen batch, and
//! [`verify`] keeps the proposals the target model would have drawn itself, plus the one token
//! it draws after them. Rejected proposals' KV slots are simply not counted as computed, and the
//! blocks allocated only for them go back to the pool.
//!
//! - [`SpeculativeConfig`]: the method and its limits (`--speculative-config`).
//! - [`Proposer`]: the one interface of every source of proposals (propose after step N, verified
//!   at step N + 1), with four implementations: [`ngram`] looks the sequence's last tokens up
//!   in its own history (prompt lookup); [`suffix`] also in a frequency trie of recent
//!   requests' outputs; with [`SpeculativeMethod::DraftLayers`] or
//!   [`SpeculativeMethod::DraftModel`] the executor's drafters (in `pagoda-models`: the
//!   target's first layers, or a separate model) draft at the end of a step, after the tokens it
//!   kept ([`propose_after_step`]), and return them with the step's output; the scheduler
//!   verifies them in the next step like any other proposal. Under a grammar the executor
//!   drafts each position under its mask ([`DraftChain`]). [`proposer`] says why the
//!   model-free proposers are still called by the scheduler.
//! - [`Proposers`]: the engine's model-free proposers, looked up by the [`ProposerKind`] a
//!   request picks, with the server's method as the default.
//! - [`SpecDecodeStats`]: drafts, draft tokens and accepted tokens per position, for metrics.

pub mod draft_chain;
pub mod ngram;
pub mod proposer;
pub mod proposers;
pub mod suffix;
pub mod verify;

pub use draft_chain::DraftChain;
pub use ngram::NgramProposer;
pub use proposer::{propose_after_step, ProposeSeq, Proposer};
pub use proposers::{ModelFreeProposer, ProposerKind, Proposers};
pub use suffix::SuffixProposer;
pub use verify::{kept, position_requests, try_verify, verify};

/// Most tokens one step may propose for a sequence (the per-position acceptance counters are
/// a fixed array).
pub const MAX_SPECULATIVE_TOKENS: usize = 16;

/// The n-gram lookup window where none is configured: ours (vLLM takes 5..=5 when neither
/// bound is given).
pub const DEFAULT_PROMPT_LOOKUP_MIN: usize = 2;
pub const DEFAULT_PROMPT_LOOKUP_MAX: usize = 4;

/// How proposals are made.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SpeculativeMethod {
    /// Prompt lookup: the most recent earlier occurrence of the sequence's last `n` tokens
    /// (`n` from `prompt_lookup_max` down to `prompt_lookup_min`) proposes what followed it.
    Ngram { prompt_lookup_min: usize, prompt_lookup_max: usize },
    /// Suffix decoding over the outputs of the last `max_cached_requests` requests (substrings
    /// of up to `max_tree_depth` tokens) and the sequence itself; a proposal is at most
    /// `max_spec_factor` times as long as its match and stops where its probability falls
    /// below `min_token_prob`.
    Suffix { max_tree_depth: usize, max_cached_requests: usize, max_spec_factor: f32, min_token_prob: f32 },
    /// Self-speculative (LayerSkip-style): the executor drafts greedily with the target's first
    /// `num_layers` layers, its final norm and its head, `k` passes of one token, writing those
    /// layers' KV into the very slots the next step's verification overwrites.
    DraftLayers { num_layers: usize },
    /// A separate draft model held by the executor (same vocabulary, its own KV cache paged by
    /// the target's block tables): `k` greedy one-token passes per step.
    DraftModel,
}

impl SpeculativeMethod {
    /// Whether the executor makes the proposals (they come back with each step's output).
    pub fn drafts_in_executor(&self) -> bool {
        matches!(self, Self::DraftLayers { .. } | Self::DraftModel)
    }
}

/// The next proposal's length after `accepted` of `proposed` held: twice as long after a whole
/// success, one past the accepted prefix otherwise (so a sequence whose text proposals miss
/// verifies one position, not `k`).
pub fn next_draft_budget(proposed: usize, accepted: usize) -> usize {
    if accepted >= proposed {
        (2 * proposed).min(MAX_SPECULATIVE_TOKENS)
    } else {
        accepted + 1
    }
}

/// `--speculative-config`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SpeculativeConfig {
    pub method: SpeculativeMethod,
    /// Most tokens proposed per sequence and step.
    pub num_speculative_tokens: usize,
    /// Steps with more running sequences than this propose nothing: verifying costs compute
    /// that a large batch no longer has spare (decode stops being memory-bound).
    pub disable_by_batch_size: usize,
}

/// Why a [`SpeculativeConfig`] cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpeculativeConfigError {
    #[error("num_speculative_tokens must be in [1, {MAX_SPECULATIVE_TOKENS}], got {0}")]
    NumTokens(usize),
    #[error("prompt_lookup_min ({min}) must be at least 1 and at most prompt_lookup_max ({max})")]
    Lookup { min: usize, max: usize },
    #[error("{name} must be {expected}")]
    Suffix { name: &'static str, expected: &'static str },
    #[error("num_draft_layers must be at least 1 and below the model's {layers} layers, got {got}")]
    DraftLayers { got: usize, layers: usize },
    #[error("the executor cannot draft with its own layers")]
    NoDraftLayers,
    #[error("the executor holds no draft model")]
    NoDraftModel,
}

impl SpeculativeConfig {
    /// Prompt lookup with the default lookup window.
    pub fn ngram(num_speculative_tokens: usize) -> Self {
        Self {
            method: SpeculativeMethod::Ngram {
                prompt_lookup_min: DEFAULT_PROMPT_LOOKUP_MIN,
                prompt_lookup_max: DEFAULT_PROMPT_LOOKUP_MAX,
            },
            num_speculative_tokens,
            disable_by_batch_size: usize::MAX,
        }
    }

    /// Suffix decoding with vLLM's defaults, except a depth of 32 and 256 cached requests.
    pub fn suffix(num_speculative_tokens: usize) -> Self {
        Self {
            method: SpeculativeMethod::Suffix {
                max_tree_depth: 32,
                max_cached_requests: 256,
                max_spec_factor: 1.0,
                min_token_prob: 0.1,
            },
            num_speculative_tokens,
            disable_by_batch_size: usize::MAX,
        }
    }

    pub fn validate(&self) -> Result<(), SpeculativeConfigError> {
        if !(1..=MAX_SPECULATIVE_TOKENS).contains(&self.num_speculative_tokens) {
            return Err(SpeculativeConfigError::NumTokens(self.num_speculative_tokens));
        }
        match self.method {
            SpeculativeMethod::Ngram { prompt_lookup_min: min, prompt_lookup_max: max } => {
                if min == 0 || min > max {
                    return Err(SpeculativeConfigError::Lookup { min, max });
                }
            }
            SpeculativeMethod::Suffix { max_tree_depth, max_spec_factor, min_token_prob, .. } => {
                let bad = |name, expected| Err(SpeculativeConfigError::Suffix { name, expected });
                if !(4..=256).contains(&max_tree_depth) {
                    return bad("suffix_decoding_max_tree_depth", "in [4, 256]");
                }
                if !(max_spec_factor > 0.0 && max_spec_factor.is_finite()) {
                    return bad("suffix_decoding_max_spec_factor", "a positive number");
                }
                if !(0.0..=1.0).contains(&min_token_prob) {
                    return bad("suffix_decoding_min_token_prob", "in [0, 1]");
                }
            }
            SpeculativeMethod::DraftLayers { num_layers } => {
                if num_layers == 0 {
                    return Err(SpeculativeConfigError::DraftLayers { got: 0, layers: 0 });
                }
            }
            SpeculativeMethod::DraftModel => {}
        }
        Ok(())
    }
}

/// What speculation did in one step (or in total).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpecDecodeStats {
    /// Sequences that carried at least one proposed token.
    pub num_drafts: u64,
    pub num_draft_tokens: u64,
    pub num_accepted_tokens: u64,
    /// How often the proposal at each position was accepted.
    pub accepted_per_position: [u64; MAX_SPECULATIVE_TOKENS],
}

impl SpecDecodeStats {
    /// Counts one verified proposal of `proposed` tokens of which the first `accepted` held.
    pub fn record(&mut self, proposed: usize, accepted: usize) {
        if proposed == 0 {
            return;
        }
        self.num_drafts += 1;
        self.num_draft_tokens += proposed as u64;
        self.num_accepted_tokens += accepted as u64;
        for slot in &mut self.accepted_per_position[..accepted.min(MAX_SPECULATIVE_TOKENS)] {
            *slot += 1;
        }
    }

    pub fn add(&mut self, other: &Self) {
        self.num_drafts += other.num_drafts;
        self.num_draft_tokens += other.num_draft_tokens;
        self.num_accepted_tokens += other.num_accepted_tokens;
        for (a, b) in self.accepted_per_position.iter_mut().zip(&other.accepted_per_position) {
            *a += b;
        }
    }

    /// Accepted over proposed tokens.
    pub fn acceptance_rate(&self) -> f64 {
        self.num_accepted_tokens as f64 / self.num_draft_tokens.max(1) as f64
    }

    /// Tokens produced per verified proposal: the accepted ones plus the one drawn after them.
    pub fn mean_acceptance_length(&self) -> f64 {
        1.0 + self.num_accepted_tokens as f64 / self.num_drafts.max(1) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_limits_are_named() {
        assert_eq!(SpeculativeConfig::ngram(4).validate(), Ok(()));
        assert_eq!(SpeculativeConfig::ngram(0).validate(), Err(SpeculativeConfigError::NumTokens(0)));
        assert_eq!(SpeculativeConfig::ngram(17).validate(), Err(SpeculativeConfigError::NumTokens(17)));
        let c = SpeculativeConfig {
            method: SpeculativeMethod::Ngram { prompt_lookup_min: 3, prompt_lookup_max: 2 },
            ..SpeculativeConfig::ngram(4)
        };
        assert_eq!(c.validate(), Err(SpeculativeConfigError::Lookup { min: 3, max: 2 }));
        assert_eq!(SpeculativeConfig::suffix(8).validate(), Ok(()));
        let mut c = SpeculativeConfig::suffix(8);
        if let SpeculativeMethod::Suffix { min_token_prob, .. } = &mut c.method {
            *min_token_prob = 1.5;
        }
        assert!(c.validate().unwrap_err().to_string().contains("suffix_decoding_min_token_prob"));
    }

    #[test]
    fn stats_count_positions_and_lengths() {
        let mut s = SpecDecodeStats::default();
        s.record(4, 2);
        s.record(3, 0);
        s.record(0, 0);
        s.record(2, 2);
        assert_eq!((s.num_drafts, s.num_draft_tokens, s.num_accepted_tokens), (3, 9, 4));
        assert_eq!(&s.accepted_per_position[..4], &[2, 2, 0, 0]);
        assert!((s.acceptance_rate() - 4.0 / 9.0).abs() < 1e-12);
        assert!((s.mean_acceptance_length() - (1.0 + 4.0 / 3.0)).abs() < 1e-12);
        let mut total = SpecDecodeStats::default();
        total.add(&s);
        total.add(&s);
        assert_eq!((total.num_drafts, total.accepted_per_position[1]), (6, 4));
    }
}

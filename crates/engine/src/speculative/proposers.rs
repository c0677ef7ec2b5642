//! The proposers one engine holds, looked up by the [`ProposerKind`] a sequence asks for.
//! `--speculative-config` names the default method; a request may pick another (the server's
//! `speculative_method` extension field). The model-free proposers ([`Proposer`]s proposing
//! from the sequence's tokens) cost nothing to keep beside the default: prompt lookup has no
//! state, and the suffix trie is built when the first request that wants it arrives, caching
//! every output that finishes from then on. The executor's drafters (a draft model, or the
//! target's first layers) are [`Proposer`]s too, held by the executor where the server loaded
//! them: their proposals, made after the last step, come back with its output.

use std::convert::Infallible;

use super::{
    NgramProposer, ProposeSeq, Proposer, SpeculativeConfig, SpeculativeMethod, SuffixProposer,
    DEFAULT_PROMPT_LOOKUP_MAX, DEFAULT_PROMPT_LOOKUP_MIN,
};

/// A proposer the engine holds (one that cannot fail).
pub type ModelFreeProposer = dyn Proposer<Error = Infallible>;

/// Where a sequence's proposals come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProposerKind {
    /// Prompt lookup in the sequence's own tokens ([`super::ngram`]).
    Ngram,
    /// Suffix decoding over recent outputs and the sequence itself ([`super::suffix`]).
    Suffix,
    /// The executor drafts them at the end of each step (a separate draft model, or the
    /// target's first layers); they come back with the step's output.
    Executor,
}

impl ProposerKind {
    /// The proposer a configured method uses.
    pub fn of(method: &SpeculativeMethod) -> Self {
        match method {
            SpeculativeMethod::Ngram { .. } => Self::Ngram,
            SpeculativeMethod::Suffix { .. } => Self::Suffix,
            SpeculativeMethod::DraftLayers { .. } | SpeculativeMethod::DraftModel => Self::Executor,
        }
    }

    /// vLLM's name of the method.
    pub fn name(self) -> &'static str {
        match self {
            Self::Ngram => "ngram",
            Self::Suffix => "suffix",
            Self::Executor => "draft_model",
        }
    }
}

/// The proposers of one engine (see the module docs).
#[derive(Debug, Clone)]
pub struct Proposers {
    default: ProposerKind,
    ngram: NgramProposer,
    /// Built on first use unless it is the default.
    suffix: Option<SuffixProposer>,
    /// The suffix trie's limits: the configured ones, or the defaults of
    /// [`SpeculativeConfig::suffix`] when another method is configured.
    suffix_method: SpeculativeMethod,
}

impl Proposers {
    pub fn new(config: &SpeculativeConfig) -> Self {
        // The configured method's settings, else the defaults.
        let ngram = match config.method {
            SpeculativeMethod::Ngram { prompt_lookup_min, prompt_lookup_max } => {
                NgramProposer::new(prompt_lookup_min, prompt_lookup_max)
            }
            _ => NgramProposer::new(DEFAULT_PROMPT_LOOKUP_MIN, DEFAULT_PROMPT_LOOKUP_MAX),
        };
        let suffix_method = match config.method {
            SpeculativeMethod::Suffix { .. } => config.method,
            _ => SpeculativeConfig::suffix(1).method,
        };
        let default = ProposerKind::of(&config.method);
        let mut proposers = Self { default, ngram, suffix: None, suffix_method };
        proposers.prepare(default);
        proposers
    }

    /// The server's method: what a request that names none uses.
    pub fn default_kind(&self) -> ProposerKind {
        self.default
    }

    /// Builds `kind`'s state if it has none yet (a request that wants it arrived).
    pub fn prepare(&mut self, kind: ProposerKind) {
        if kind != ProposerKind::Suffix || self.suffix.is_some() {
            return;
        }
        if let SpeculativeMethod::Suffix {
            max_tree_depth,
            max_cached_requests,
            max_spec_factor,
            min_token_prob,
        } = self.suffix_method
        {
            self.suffix = Some(SuffixProposer::new(
                max_tree_depth,
                max_cached_requests,
                max_spec_factor,
                min_token_prob,
            ));
        }
    }

    /// The engine's proposer of `kind`: `None` for [`ProposerKind::Executor`] (the executor
    /// holds its drafters) and for the suffix trie before a request wanted it.
    pub fn get(&self, kind: ProposerKind) -> Option<&ModelFreeProposer> {
        match kind {
            ProposerKind::Ngram => Some(&self.ngram),
            ProposerKind::Suffix => self.suffix.as_ref().map(|s| s as &ModelFreeProposer),
            ProposerKind::Executor => None,
        }
    }

    /// A sequence finished normally with `output`: every proposer held learns from it (the
    /// suffix trie, once built, caches it).
    pub fn record_output(&mut self, output: &[u32]) {
        let suffix = self.suffix.as_mut().map(|s| s as &mut ModelFreeProposer);
        for proposer in std::iter::once(&mut self.ngram as &mut ModelFreeProposer).chain(suffix) {
            proposer.record_output(output);
        }
    }

    /// Appends to `out` at most `max_tokens` proposed continuations of `tokens` (prompt then
    /// output so far) from `kind`. The executor's proposals are not made here: its drafter made
    /// them after the last step, and the scheduler keeps those it returned (`drafted`).
    pub fn propose(
        &self,
        kind: ProposerKind,
        tokens: &[u32],
        drafted: &[u32],
        max_tokens: usize,
        out: &mut Vec<u32>,
    ) {
        match self.get(kind) {
            Some(proposer) => {
                let seq = ProposeSeq::whole(tokens, max_tokens);
                let Ok(()) = proposer.propose(&mut [seq], std::slice::from_mut(out));
            }
            None if kind == ProposerKind::Executor => out.extend(drafted.iter().take(max_tokens)),
            // `prepare` builds the trie when a request that wants it is added.
            None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_may_pick_a_model_free_proposer_beside_the_default() {
        let mut p = Proposers::new(&SpeculativeConfig::ngram(4));
        assert_eq!(p.default_kind(), ProposerKind::Ngram);
        // An earlier output the sequence itself does not contain: only the trie knows it.
        let tokens = [1, 2, 3, 4];
        let mut out = Vec::new();
        p.propose(ProposerKind::Suffix, &tokens, &[], 4, &mut out);
        assert!(out.is_empty(), "no trie before a request wants one");
        p.prepare(ProposerKind::Suffix);
        p.record_output(&[3, 4, 5, 6, 7, 8]);
        p.propose(ProposerKind::Suffix, &tokens, &[], 4, &mut out);
        assert_eq!(out, [5, 6]);
        out.clear();
        p.propose(p.default_kind(), &tokens, &[], 4, &mut out);
        assert!(out.is_empty(), "prompt lookup finds no earlier [3, 4] in the sequence");
        p.propose(p.default_kind(), &[7, 3, 4, 9, 3, 4], &[], 2, &mut out);
        assert_eq!(out, [9, 3]);
    }

    #[test]
    fn the_executors_proposals_are_those_it_returned() {
        let config =
            SpeculativeConfig { method: SpeculativeMethod::DraftModel, ..SpeculativeConfig::ngram(4) };
        let p = Proposers::new(&config);
        assert_eq!(p.default_kind(), ProposerKind::Executor);
        let mut out = vec![9];
        p.propose(p.default_kind(), &[1, 2], &[4, 3, 8, 1], 3, &mut out);
        assert_eq!(out, [9, 4, 3, 8]);
        out.clear();
        p.propose(ProposerKind::Ngram, &[5, 6, 7, 5, 6], &[4, 3], 3, &mut out);
        assert_eq!(out, [7, 5, 6]);
        assert_eq!(
            ProposerKind::of(&SpeculativeMethod::DraftLayers { num_layers: 2 }),
            ProposerKind::Executor
        );
        assert_eq!(ProposerKind::Executor.name(), "draft_model");
    }
}

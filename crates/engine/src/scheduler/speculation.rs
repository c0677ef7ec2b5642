//! Speculative decoding as the scheduler sees it: the engine's model-free proposers, what
//! verification accepted in the last step, and how many tokens a decoding sequence may propose
//! (its draft budget cut to the server's and the request's caps, to `max_tokens`,
//! `max_model_len` and `min_tokens`, and to what its grammar accepts). Every proposer is a
//! [`Proposer`](crate::speculative::Proposer) looked up by the sequence's
//! [`ProposerKind`]; the n-gram and suffix ones are asked here, while the step is built, because
//! only here are the whole sequence and the exact room the step leaves it known (see
//! [`crate::speculative::proposer`]). The executor's drafters propose at the end of a step and
//! their proposals arrive with its output, kept on the sequence ([`SeqEntry::proposals`]).

use crate::config::EngineConfig;
use crate::constraint::{SeqConstraint, TokenConstraint};
use crate::executor::ExecutorDraft;
use crate::speculative::{next_draft_budget, ProposerKind, Proposers, SpecDecodeStats, SpeculativeMethod};

use super::SeqEntry;

/// The engine's proposers, when speculation is configured, and the last step's verification.
#[derive(Debug)]
pub(crate) struct Speculation {
    proposers: Option<Proposers>,
    /// What verification accepted in the last `update`.
    last_stats: SpecDecodeStats,
}

impl Speculation {
    pub fn new(config: &EngineConfig) -> Self {
        Self {
            proposers: config.speculative.as_ref().map(Proposers::new),
            last_stats: SpecDecodeStats::default(),
        }
    }

    /// A request naming `kind` arrived: its proposer's state is built if it has none yet.
    pub fn prepare(&mut self, kind: Option<ProposerKind>) {
        if let (Some(proposers), Some(kind)) = (&mut self.proposers, kind) {
            proposers.prepare(kind);
        }
    }

    /// A sequence ended with `output`: the suffix proposer learns from it.
    pub fn record_output(&mut self, output: &[u32]) {
        if let Some(proposers) = &mut self.proposers {
            proposers.record_output(output);
        }
    }

    /// The server's default proposer while speculation is on with `running` sequences running:
    /// verification is compute a large batch no longer has to spare.
    pub fn active(&self, config: &EngineConfig, running: usize) -> Option<ProposerKind> {
        let spec = config.speculative.as_ref()?;
        let proposers = self.proposers.as_ref()?;
        (running <= spec.disable_by_batch_size).then(|| proposers.default_kind())
    }

    /// Appends to `drafts` what decoding sequence `e` proposes after its last token, at most
    /// `room` tokens and no more than its limits allow; `default` is the server's proposer
    /// (from [`Self::active`]). Proposals stop before the first token its grammar refuses.
    pub fn propose(
        &self,
        e: &SeqEntry,
        default: ProposerKind,
        config: &EngineConfig,
        room: usize,
        drafts: &mut Vec<u32>,
    ) {
        let Some(proposers) = &self.proposers else { return };
        let limit = draft_limit(e, config).min(room);
        let kind = e.shared.speculative_method.unwrap_or(default);
        proposers.propose(kind, &e.seq.token_ids, &e.proposals, limit, drafts);
        if let Some(SeqConstraint(grammar)) = &e.constraint {
            cut_to_grammar(&**grammar, &e.shared.stop.eos_token_ids, drafts);
        }
    }

    /// Starts a step's accounting afresh.
    pub fn reset_stats(&mut self) {
        self.last_stats = SpecDecodeStats::default();
    }

    /// Verification of `proposed` tokens accepted `accepted` of them.
    pub fn record(&mut self, proposed: usize, accepted: usize) {
        self.last_stats.record(proposed, accepted);
    }

    /// Proposals verified by the last `update`.
    pub fn last_stats(&self) -> &SpecDecodeStats {
        &self.last_stats
    }
}

/// What the executor drafts with after a step, when the configured method is the executor's.
pub(super) fn executor_draft(config: &EngineConfig) -> Option<ExecutorDraft> {
    match config.speculative.map(|s| s.method) {
        Some(SpeculativeMethod::DraftLayers { num_layers }) => Some(ExecutorDraft::Layers(num_layers)),
        Some(SpeculativeMethod::DraftModel) => Some(ExecutorDraft::Model),
        _ => None,
    }
}

/// Most tokens a decoding sequence may propose: at most its request's own cap; a verified step
/// yields up to one more token than it proposed, which must stay within `max_tokens` and
/// `max_model_len`; while `min_tokens` is not reached, every verified position must be one
/// where the end-of-sequence bans hold (the sample request carries one ban list).
fn draft_limit(e: &SeqEntry, config: &EngineConfig) -> usize {
    if e.fork_into > 1 {
        return 0;
    }
    let output = e.seq.output_len();
    let limit = proposal_cap(e, config, e.draft_budget, 0);
    let min_tokens = e.shared.stop.min_tokens;
    if output < min_tokens {
        limit.min(min_tokens - output - 1)
    } else {
        limit
    }
}

/// A bound on [`draft_limit`] at the sequence's next step, which has at least one more output
/// token and a draft budget updated from this step's `proposed` tokens: how many tokens the
/// executor drafts after this step (the next step cuts them to its own limit).
pub(super) fn next_draft_limit(e: &SeqEntry, config: &EngineConfig, proposed: usize) -> usize {
    let budget = match proposed {
        0 => e.draft_budget,
        // Every proposal holding gives the longest next budget.
        _ => next_draft_budget(proposed, proposed),
    };
    proposal_cap(e, config, budget, 1)
}

/// The caps on a proposal made `ahead` tokens after the sequence's current end: the server's
/// and the request's, the draft budget, and room for one more token than it proposes within
/// `max_tokens` and `max_model_len`.
fn proposal_cap(e: &SeqEntry, config: &EngineConfig, budget: usize, ahead: usize) -> usize {
    let Some(spec) = &config.speculative else { return 0 };
    // A beam's next token is chosen among its siblings', never verified alone.
    if e.shared.beam.is_some() {
        return 0;
    }
    spec.num_speculative_tokens
        .min(e.shared.max_speculative_tokens.unwrap_or(usize::MAX))
        .min(budget)
        .min(e.shared.max_tokens.saturating_sub(e.seq.output_len() + 1 + ahead))
        .min(config.max_model_len.saturating_sub(e.seq.len() + 1 + ahead))
}

/// Cuts proposals at the first token the grammar would refuse (or an end-of-sequence id, which
/// the grammar never takes): verifying past it could only reject.
fn cut_to_grammar(grammar: &dyn TokenConstraint, eos: &[u32], drafts: &mut Vec<u32>) {
    if drafts.is_empty() {
        return;
    }
    let mut state = grammar.fork();
    let valid = drafts.iter().take_while(|&&t| !eos.contains(&t) && state.accept_token(t).is_ok()).count();
    drafts.truncate(valid);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::constraint::{ConstraintError, TokenMask};
    use crate::speculative::SpeculativeConfig;

    /// Tokens below 10.
    #[derive(Clone)]
    struct Digits;

    impl TokenConstraint for Digits {
        fn compute_mask(&mut self) -> Result<TokenMask, ConstraintError> {
            let mut mask = TokenMask::new(16);
            (0..10).for_each(|t| mask.allow(t));
            Ok(mask)
        }
        fn accept_token(&mut self, token: u32) -> Result<(), ConstraintError> {
            if token < 10 {
                Ok(())
            } else {
                Err(ConstraintError(format!("{token} refused")))
            }
        }
        fn is_finished(&self) -> bool {
            false
        }
        fn fork(&self) -> Box<dyn TokenConstraint> {
            Box::new(self.clone())
        }
    }

    #[test]
    fn proposals_stop_at_the_first_refused_or_ending_token() {
        let mut drafts = vec![1, 2, 12, 3];
        cut_to_grammar(&Digits, &[9], &mut drafts);
        assert_eq!(drafts, [1, 2]);
        let mut drafts = vec![4, 9, 5];
        cut_to_grammar(&Digits, &[9], &mut drafts);
        assert_eq!(drafts, [4], "the grammar never takes end-of-sequence");
    }

    #[test]
    fn speculation_turns_off_past_its_batch_size() {
        let mut config = EngineConfig::new(4, 64, 256);
        assert_eq!(Speculation::new(&config).active(&config, 1), None, "not configured");
        config.speculative =
            Some(SpeculativeConfig { disable_by_batch_size: 2, ..SpeculativeConfig::suffix(4) });
        let speculation = Speculation::new(&config);
        assert_eq!(speculation.active(&config, 2), Some(ProposerKind::Suffix));
        assert_eq!(speculation.active(&config, 3), None);
        assert_eq!(executor_draft(&config), None);
    }

    #[test]
    fn the_last_step_stats_start_afresh() {
        let mut speculation = Speculation::new(&EngineConfig::new(4, 64, 256));
        speculation.record(4, 2);
        assert_eq!(speculation.last_stats().num_draft_tokens, 4);
        speculation.reset_stats();
        assert_eq!(*speculation.last_stats(), SpecDecodeStats::default());
    }
}

//! The one interface every source of speculative proposals implements: a [`Proposer`] proposes
//! after step N the tokens that step N + 1 verifies ([`super::verify`]). Four implement it:
//! [`NgramProposer`](super::NgramProposer) (prompt lookup), [`SuffixProposer`](super::SuffixProposer)
//! (a trie of recent outputs), and, in `pagoda-models`, the self-drafter (the target's first
//! layers) and the draft-model drafter. A request picks one by [`ProposerKind`]
//! ([`super::Proposers`] holds the engine's model-free ones; an executor holds its drafters).
//!
//! Where each is called differs, on purpose. The model-free proposers are called by the
//! scheduler while it builds step N + 1, one sequence at a time, from the whole sequence (which
//! only the scheduler keeps) and with the exact room the step's token budget and free blocks
//! leave it; a model's drafter is called by the executor at the end of step N, over every
//! sequence of the step at once (one forward pass per drafted position, and a draft model
//! must see every kept token to keep its cache in step), with an upper bound that the next step
//! cuts to its own limit. Both see the sequence as it stands after step N, so both are
//! "proposals after step N". Moving prompt lookup into the executor would change what is
//! proposed (it would lose the budget and block cuts, and would propose after a prompt's last
//! chunk, which drafting must not), so the call sites stay and the interface is what is shared.
//!
//! [`propose_after_step`] is how an executor runs its drafter: it turns the step's batch and
//! sampled tokens into one [`ProposeSeq`] per scheduled sequence and stores the proposals on the
//! step's output, for the scheduler to verify next step.

use std::borrow::Cow;
use std::convert::Infallible;

use super::{DraftChain, NgramProposer, ProposerKind, SuffixProposer};
use crate::executor::{ExecutorError, SampledToken, ScheduledBatch, SeqId};

/// One sequence as a proposer sees it after step N.
pub struct ProposeSeq<'a> {
    /// The sequence's tokens from position `start_pos` through the last one known. The
    /// scheduler gives the whole sequence; the executor gives the tokens step N computed and
    /// kept (its own and the accepted proposals), then the token it drew.
    pub tokens: Cow<'a, [u32]>,
    /// The position of `tokens[0]`; everything before it is in the KV cache.
    pub start_pos: usize,
    /// Whether the last of `tokens` is the token step N drew: no KV cache holds it yet, and the
    /// proposals follow it. False for a prefill chunk that sampled nothing.
    pub drawn: bool,
    /// Most tokens to propose.
    pub max_tokens: usize,
    /// The step's sequence, where the executor proposes: a drafter pages its passes by this
    /// sequence's block tables. `None` where the scheduler proposes from the tokens alone.
    pub seq_id: Option<SeqId>,
    /// Under structured output, the grammar past the tokens step N kept: a drafter may draw
    /// each proposal under its position's mask. The scheduler cuts every proposal to the
    /// grammar afterwards anyway.
    pub grammar: Option<DraftChain>,
}

impl<'a> ProposeSeq<'a> {
    /// A whole sequence, its last token the one the last step drew (how the scheduler asks).
    pub fn whole(tokens: &'a [u32], max_tokens: usize) -> Self {
        Self {
            tokens: Cow::Borrowed(tokens),
            start_pos: 0,
            drawn: !tokens.is_empty(),
            max_tokens,
            seq_id: None,
            grammar: None,
        }
    }

    /// The tokens before the drawn one, which the target computed: all of `tokens` when none
    /// was drawn.
    pub fn computed(&self) -> &[u32] {
        &self.tokens[..self.tokens.len() - usize::from(self.drawn)]
    }

    /// The drawn token, which proposals follow.
    pub fn drawn_token(&self) -> Option<u32> {
        self.tokens.last().copied().filter(|_| self.drawn)
    }

    /// The position of the drawn token (the first position no cache holds).
    pub fn drawn_pos(&self) -> usize {
        self.start_pos + self.computed().len()
    }
}

/// A source of speculative proposals (see the module docs).
///
/// `propose` takes `&self`: what one sequence is proposed must not depend on which sequences
/// were proposed for before it (the scheduler asks them one at a time, in its own order). What
/// a proposer learns between steps comes through [`record_output`](Self::record_output).
pub trait Proposer {
    /// How proposing fails: never for the model-free proposers; as the executor's step fails
    /// for a model's drafter (the engine then fails the step, or only one sequence's request).
    type Error;

    /// The request's choice that selects this proposer.
    fn kind(&self) -> ProposerKind;

    /// Appends to `out[i]` at most `seqs[i].max_tokens` tokens proposed to follow `seqs[i]`
    /// (`out` and `seqs` are as long). An executor passes every sequence of the step, those
    /// with nothing to propose with `max_tokens` 0, so that a drafter with a cache of its own
    /// computes every kept token.
    fn propose(&self, seqs: &mut [ProposeSeq<'_>], out: &mut [Vec<u32>]) -> Result<(), Self::Error>;

    /// A sequence finished normally with `output`; nothing by default.
    fn record_output(&mut self, output: &[u32]) {
        let _ = output;
    }
}

impl Proposer for NgramProposer {
    type Error = Infallible;

    fn kind(&self) -> ProposerKind {
        ProposerKind::Ngram
    }

    fn propose(&self, seqs: &mut [ProposeSeq<'_>], out: &mut [Vec<u32>]) -> Result<(), Infallible> {
        for (seq, out) in seqs.iter().zip(out) {
            NgramProposer::propose(self, &seq.tokens, seq.max_tokens, out);
        }
        Ok(())
    }
}

impl Proposer for SuffixProposer {
    type Error = Infallible;

    fn kind(&self) -> ProposerKind {
        ProposerKind::Suffix
    }

    fn propose(&self, seqs: &mut [ProposeSeq<'_>], out: &mut [Vec<u32>]) -> Result<(), Infallible> {
        for (seq, out) in seqs.iter().zip(out) {
            SuffixProposer::propose(self, &seq.tokens, seq.max_tokens, out);
        }
        Ok(())
    }

    fn record_output(&mut self, output: &[u32]) {
        SuffixProposer::record_output(self, output);
    }
}

/// Runs an executor's `proposer` at the end of a step over `batch`, whose sampled tokens are
/// `sampled` (one entry per sequence that sampled, in batch order): each sequence that drew a
/// token asks for at most [`num_to_draft_after`](crate::ScheduledSeq::num_to_draft_after) what it
/// accepted, and gets the proposals as its entry's [`SampledToken::proposals`].
pub fn propose_after_step<P>(
    proposer: &P,
    batch: &ScheduledBatch,
    sampled: &mut [SampledToken],
) -> Result<(), ExecutorError>
where
    P: Proposer<Error = ExecutorError> + ?Sized,
{
    let (mut seqs, entries) = step_seqs(batch, sampled);
    if seqs.is_empty() {
        return Ok(());
    }
    let mut out = vec![Vec::new(); seqs.len()];
    proposer.propose(&mut seqs, &mut out)?;
    for (entry, proposals) in entries.into_iter().zip(out) {
        if let Some(entry) = entry.and_then(|i| sampled.get_mut(i)) {
            entry.proposals = proposals;
        }
    }
    Ok(())
}

/// The step's sequences as proposers see them after it, each with its entry in `sampled`
/// (`None` for a sequence that sampled nothing).
fn step_seqs<'b>(
    batch: &'b ScheduledBatch,
    sampled: &[SampledToken],
) -> (Vec<ProposeSeq<'b>>, Vec<Option<usize>>) {
    let mut seqs = Vec::with_capacity(batch.seqs.len());
    let mut entries = Vec::with_capacity(batch.seqs.len());
    let mut next = 0;
    for s in &batch.seqs {
        let entry = s.sample.is_some().then(|| {
            next += 1;
            next - 1
        });
        let kept = entry.and_then(|i| sampled.get(i)).map(|t| t.token_ids.as_slice());
        // The step's tokens the target computed and keeps: its own, then the accepted
        // proposals; the drawn token comes after them.
        let own = s.q_len() - s.num_draft_tokens;
        let seq = match kept.and_then(<[u32]>::split_last) {
            Some((&drawn, accepted)) => {
                let mut tokens = Vec::with_capacity(own + accepted.len() + 1);
                tokens.extend_from_slice(&s.token_ids[..own + accepted.len()]);
                tokens.push(drawn);
                let max_tokens = s.num_to_draft_after(accepted.len());
                let grammar = match (max_tokens, &s.sample, kept) {
                    (1.., Some(req), Some(kept)) => DraftChain::after(req, kept),
                    _ => None,
                };
                ProposeSeq {
                    tokens: Cow::Owned(tokens),
                    start_pos: s.start_pos,
                    drawn: true,
                    max_tokens,
                    seq_id: Some(s.seq_id),
                    grammar,
                }
            }
            None => ProposeSeq {
                tokens: Cow::Borrowed(&s.token_ids),
                start_pos: s.start_pos,
                drawn: false,
                max_tokens: 0,
                seq_id: Some(s.seq_id),
                grammar: None,
            },
        };
        seqs.push(seq);
        entries.push(entry);
    }
    (seqs, entries)
}

#[cfg(test)]
#[path = "proposer_tests.rs"]
mod tests;

//! Structured output with proposals the executor drafts (a draft model, or the target's first
//! layers) at the end of a step. Each draft is the drafter's greedy token under its position's
//! grammar mask, so a proposal leaves the grammar only where the grammar itself fails, and the
//! next step's verification (under the masks the scheduler computes along every proposal) does
//! not lose it to a token the grammar forbids.
//!
//! The chain starts from the grammar at the step's first sampled position
//! ([`SampleRequest::draft_grammar`]), walks past the tokens the step kept, then gives one mask
//! per draft. Masks here only steer the guesses: a grammar that fails leaves the rest of the
//! drafts unmasked, and the verification decides.

use std::sync::Arc;

use crate::constraint::{guarded_mask, TokenConstraint, TokenMask};
use crate::executor::SampleRequest;

/// The grammar walked along one sequence's kept tokens and drafts (see the module docs).
pub struct DraftChain {
    /// `None` once a token was one the grammar refuses, or its matcher failed.
    state: Option<Box<dyn TokenConstraint>>,
    eos_token_ids: Arc<[u32]>,
}

impl DraftChain {
    /// The chain of a request that carries a draft grammar, past the step's `kept` tokens;
    /// `None` for any other request.
    pub fn after(req: &SampleRequest, kept: &[u32]) -> Option<Self> {
        let grammar = req.draft_grammar.as_ref()?;
        let mut chain =
            Self { state: Some(grammar.fork()), eos_token_ids: Arc::clone(&grammar.eos_token_ids) };
        for &token in kept {
            chain.push(token);
        }
        Some(chain)
    }

    /// The mask of the position the next draft is for; `None` (draft unmasked) once the grammar
    /// refused a token or failed.
    pub fn next_mask(&mut self) -> Option<TokenMask> {
        let mask = guarded_mask(&mut **self.state.as_mut()?).ok();
        if mask.is_none() {
            self.state = None;
        }
        mask
    }

    /// Takes `token` at the next position. An end-of-sequence id leaves the grammar where it
    /// is, as the engine does.
    pub fn push(&mut self, token: u32) {
        if self.eos_token_ids.contains(&token) {
            return;
        }
        if let Some(state) = self.state.as_mut() {
            if state.accept_token(token).is_err() {
                self.state = None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::constraint::{ConstraintError, DraftGrammar};

    const VOCAB: usize = 8;
    const EOS: u32 = 7;

    /// Even tokens, at most three.
    #[derive(Clone)]
    struct Evens(usize);

    impl TokenConstraint for Evens {
        fn compute_mask(&mut self) -> Result<TokenMask, ConstraintError> {
            let mut mask = TokenMask::new(VOCAB);
            if self.0 < 3 {
                (0..VOCAB as u32).step_by(2).for_each(|t| mask.allow(t));
            }
            mask.allow(EOS);
            Ok(mask)
        }
        fn accept_token(&mut self, token: u32) -> Result<(), ConstraintError> {
            if token % 2 == 1 || self.0 >= 3 {
                return Err(ConstraintError(format!("{token} refused")));
            }
            self.0 += 1;
            Ok(())
        }
        fn is_finished(&self) -> bool {
            self.0 >= 3
        }
        fn fork(&self) -> Box<dyn TokenConstraint> {
            Box::new(self.clone())
        }
    }

    fn request() -> SampleRequest {
        SampleRequest {
            draft_grammar: Some(DraftGrammar::new(Box::new(Evens(0)), &[EOS])),
            ..SampleRequest::greedy()
        }
    }

    fn allowed(mask: Option<TokenMask>) -> Vec<u32> {
        mask.map(|m| (0..VOCAB as u32).filter(|&t| m.allows(t)).collect()).unwrap_or_default()
    }

    #[test]
    fn masks_follow_the_kept_tokens_and_the_drafts() {
        let req = request();
        // Kept: 2, then an end-of-sequence id the grammar does not see.
        let mut chain = DraftChain::after(&req, &[2, EOS]).unwrap();
        assert_eq!(allowed(chain.next_mask()), [0, 2, 4, 6, 7]);
        chain.push(4);
        assert_eq!(allowed(chain.next_mask()), [0, 2, 4, 6, 7]);
        chain.push(6);
        // Three taken: the grammar is complete and allows only the end.
        assert_eq!(allowed(chain.next_mask()), [EOS]);
        assert!(DraftChain::after(&SampleRequest::greedy(), &[2]).is_none());
    }

    #[test]
    fn a_refused_token_leaves_the_drafts_unmasked() {
        let mut chain = DraftChain::after(&request(), &[3]).unwrap();
        assert!(chain.next_mask().is_none());
        let mut chain = DraftChain::after(&request(), &[0]).unwrap();
        chain.push(5);
        chain.push(2);
        assert!(chain.next_mask().is_none(), "the walk does not resume after a refusal");
    }
}

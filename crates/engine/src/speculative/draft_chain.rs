//! Structured output with proposals the executor drafts itself (a draft model, or the target's
//! first layers). The scheduler cannot cut those drafts to the grammar or compute their
//! verification masks, since it does not know them; the executor does both as it drafts:
//! - the draft at each position is the draft model's greedy token under that position's grammar
//!   mask, so a draft leaves the grammar only where the grammar itself fails;
//! - each position's mask is the grammar advanced past the drafts before it, the very mask the
//!   verification then draws that position under (what the scheduler's mask jobs give n-gram
//!   proposals).
//!
//! Position 0's mask is the sequence's own (`allowed`, from the engine's mask worker). The
//! executor computes one more per draft, so `draft_masks` ends up as long as the drafts.

use std::sync::Arc;

use crate::constraint::{guarded_mask, MaskSlot, TokenConstraint, TokenMask};
use crate::executor::SampleRequest;

/// The grammar walked along one sequence's drafts (see the module docs).
pub struct DraftChain {
    /// `None` once a draft was one the grammar refuses.
    state: Option<Box<dyn TokenConstraint>>,
    eos_token_ids: Arc<[u32]>,
    /// Position 0's mask.
    first: Arc<MaskSlot>,
    /// `masks[i]`: the mask of the position after `i + 1` drafts.
    masks: Vec<Arc<MaskSlot>>,
}

impl DraftChain {
    /// The chain of a request that carries a draft grammar (and with it its own mask); `None`
    /// for any other.
    pub fn new(req: &SampleRequest) -> Option<Self> {
        let grammar = req.draft_grammar.as_ref()?;
        let first = Arc::clone(req.allowed.as_ref()?);
        Some(Self {
            state: Some(grammar.fork()),
            eos_token_ids: Arc::clone(&grammar.eos_token_ids),
            first,
            masks: Vec::new(),
        })
    }

    /// The mask of the position the next draft is for: apply it to the draft's logits.
    pub fn next_mask(&self) -> &Arc<MaskSlot> {
        self.masks.last().unwrap_or(&self.first)
    }

    /// Takes `token` as the draft at [`next_mask`](Self::next_mask)'s position and computes the
    /// mask of the position after it.
    /// - An end-of-sequence id leaves the grammar where it is, as the engine does.
    /// - After a draft the grammar refuses, every later position allows every token: the
    ///   verification, drawing that draft's position under a mask without it, rejects it, so
    ///   later draws are never kept (a GPU sampler still draws them).
    /// - A matcher that fails gives an error mask, which fails the sequence if the verification
    ///   gets there, as it would without speculation.
    pub fn push(&mut self, token: u32) {
        let previous = Arc::clone(self.next_mask());
        let eos = self.eos_token_ids.contains(&token);
        let taken = match self.state.as_mut() {
            Some(_) if eos => Some(previous.clone()),
            Some(state) => state.accept_token(token).is_ok().then(|| {
                let slot = MaskSlot::new();
                slot.fill(guarded_mask(&mut **state));
                slot
            }),
            None => None,
        };
        let next = taken.unwrap_or_else(|| {
            self.state = None;
            let vocab = previous.with_mask(TokenMask::len).unwrap_or(0);
            MaskSlot::ready(TokenMask::all(vocab))
        });
        self.masks.push(next);
    }

    /// Hands the verification masks to `req`: one per draft pushed.
    pub fn finish(self, req: &mut SampleRequest) {
        req.draft_masks = self.masks;
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
        let mut first = Evens(0);
        SampleRequest {
            allowed: Some(MaskSlot::ready(first.compute_mask().unwrap())),
            draft_grammar: Some(DraftGrammar::new(Box::new(Evens(0)), &[EOS])),
            ..SampleRequest::greedy()
        }
    }

    fn allowed(slot: &MaskSlot) -> Vec<u32> {
        slot.with_mask(|m| (0..VOCAB as u32).filter(|&t| m.allows(t)).collect()).unwrap()
    }

    #[test]
    fn masks_follow_the_drafts_and_open_up_after_a_refused_one() {
        let mut req = request();
        let mut chain = DraftChain::new(&req).unwrap();
        assert_eq!(allowed(chain.next_mask()), [0, 2, 4, 6, 7]);
        for token in [2, EOS, 4, 3, 6] {
            chain.push(token);
        }
        chain.finish(&mut req);
        let masks: Vec<Vec<u32>> = req.draft_masks.iter().map(|s| allowed(s)).collect();
        assert_eq!(
            masks,
            [
                vec![0, 2, 4, 6, 7],        // after 2
                vec![0, 2, 4, 6, 7],        // after end-of-sequence: the grammar did not move
                vec![0, 2, 4, 6, 7],        // after 4: two taken
                (0..8).collect::<Vec<_>>(), // after 3, which the grammar refuses: anything
                (0..8).collect::<Vec<_>>(),
            ]
        );
    }

    #[test]
    fn a_complete_grammar_allows_only_end_of_sequence_and_a_request_without_one_has_no_chain() {
        let mut req = request();
        let mut chain = DraftChain::new(&req).unwrap();
        for token in [0, 2, 4] {
            chain.push(token);
        }
        chain.finish(&mut req);
        assert_eq!(allowed(&req.draft_masks[2]), [EOS]);
        assert!(DraftChain::new(&SampleRequest::greedy()).is_none());
    }
}

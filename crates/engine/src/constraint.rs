//! Constrained decoding as the engine sees it: a per-sequence [`TokenConstraint`] (a grammar
//! matcher, implemented outside the engine) that says which tokens may come next, and the
//! plumbing that computes its [`TokenMask`] while the model runs.
//!
//! Each step, the engine takes the constraints of the sequences that sample, hands them to a
//! worker thread and attaches an empty [`MaskSlot`] to each one's `SampleRequest`. The worker
//! fills the slots while the executor runs the forward pass; the sampler waits on its slot only
//! once it has the logits (vLLM v1 and SGLang overlap the same way). After the step, the engine
//! puts the constraints back and advances each by its sampled token.
//!
//! The matcher consumes output tokens only, so preemption (recompute keeps the output) and prefix
//! caching (prompt tokens) leave its state right; each of `n` samples gets its own fork.

use std::sync::{Arc, Condvar, Mutex};

use crate::executor::SeqId;

/// Why a constraint could not compute a mask or take a token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ConstraintError(pub String);

/// The grammar state of one sequence. Implementations must be cheap to [`fork`](Self::fork)
/// before any token was consumed (one per sample of a request).
pub trait TokenConstraint: Send {
    /// The tokens allowed next. End-of-sequence ids are in it only where the grammar may end.
    fn compute_mask(&mut self) -> Result<TokenMask, ConstraintError>;

    /// Advances past a sampled token.
    fn accept_token(&mut self, token: u32) -> Result<(), ConstraintError>;

    /// The grammar is complete and nothing but end-of-sequence could follow.
    fn is_finished(&self) -> bool;

    /// An independent copy in the same state.
    fn fork(&self) -> Box<dyn TokenConstraint>;
}

/// A request's constraint, carried by [`Request`](crate::Request): cloned by forking.
pub struct SeqConstraint(pub Box<dyn TokenConstraint>);

impl SeqConstraint {
    pub fn new(constraint: impl TokenConstraint + 'static) -> Self {
        Self(Box::new(constraint))
    }
}

impl Clone for SeqConstraint {
    fn clone(&self) -> Self {
        Self(self.0.fork())
    }
}

impl std::fmt::Debug for SeqConstraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SeqConstraint")
    }
}

/// A set of allowed token ids over `0..len`, one bit each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenMask {
    words: Vec<u32>,
    len: usize,
}

impl TokenMask {
    /// A mask over `len` ids with none allowed.
    pub fn new(len: usize) -> Self {
        Self { words: vec![0; len.div_ceil(32)], len }
    }

    /// A mask over `len` ids with all allowed.
    pub fn all(len: usize) -> Self {
        let mut mask = Self { words: vec![u32::MAX; len.div_ceil(32)], len };
        mask.clear_tail();
        mask
    }

    /// A mask over `len` ids from 32-bit words in [`words`](Self::words)' layout; missing words
    /// allow nothing and bits past `len` are dropped.
    pub fn from_words(words: &[u32], len: usize) -> Self {
        let mut mask = Self::new(len);
        let n = mask.words.len().min(words.len());
        mask.words[..n].copy_from_slice(&words[..n]);
        mask.clear_tail();
        mask
    }

    fn clear_tail(&mut self) {
        let used = self.len % 32;
        if used != 0 {
            if let Some(last) = self.words.last_mut() {
                *last &= (1u32 << used) - 1;
            }
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Allows `id`; ids past the end are ignored.
    pub fn allow(&mut self, id: u32) {
        if (id as usize) < self.len {
            self.words[id as usize / 32] |= 1 << (id % 32);
        }
    }

    pub fn allows(&self, id: u32) -> bool {
        (id as usize) < self.len && self.words[id as usize / 32] & (1 << (id % 32)) != 0
    }

    /// The 32-bit words, bit `i % 32` of word `i / 32` for id `i` (bits past `len` are clear).
    pub fn words(&self) -> &[u32] {
        &self.words
    }

    pub fn count_allowed(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// Sets every logit the mask does not allow to -inf (logits past the mask too: a model may
    /// pad its vocabulary beyond the tokenizer's).
    pub fn apply(&self, logits: &mut [f32]) {
        for (w, chunk) in logits.chunks_mut(32).enumerate() {
            let word = self.words.get(w).copied().unwrap_or(0);
            if word == u32::MAX {
                continue;
            }
            for (bit, l) in chunk.iter_mut().enumerate() {
                if word & (1 << bit) == 0 {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
    }
}

/// One sequence's mask for one step, filled by the mask worker and read by the sampler.
#[derive(Debug, Default)]
pub struct MaskSlot {
    value: Mutex<Option<Result<TokenMask, ConstraintError>>>,
    ready: Condvar,
}

impl MaskSlot {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// A slot that is already filled (tests, executors driven by hand).
    pub fn ready(mask: TokenMask) -> Arc<Self> {
        let slot = Self::new();
        slot.fill(Ok(mask));
        slot
    }

    /// Stores the result; the first one wins (a slot filled with an error before the worker
    /// runs keeps it).
    pub fn fill(&self, result: Result<TokenMask, ConstraintError>) {
        let mut value = self.value.lock().unwrap_or_else(|p| p.into_inner());
        if value.is_none() {
            *value = Some(result);
            self.ready.notify_all();
        }
    }

    /// Waits until the mask is computed and runs `f` on it.
    pub fn with_mask<T>(&self, f: impl FnOnce(&TokenMask) -> T) -> Result<T, ConstraintError> {
        let mut value = self.value.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            match &*value {
                Some(Ok(mask)) => return Ok(f(mask)),
                Some(Err(e)) => return Err(e.clone()),
                None => value = self.ready.wait(value).unwrap_or_else(|p| p.into_inner()),
            }
        }
    }
}

/// One mask to compute this step.
pub(crate) struct MaskJob {
    pub seq_id: SeqId,
    pub constraint: Box<dyn TokenConstraint>,
    pub slot: Arc<MaskSlot>,
    /// The sequence's own grammar state (given back after the step), not a fork advanced past
    /// proposals.
    pub restore: bool,
}

/// Fills every job's slot, in order. Whatever happens (an error, a panic in the matcher), every
/// slot ends up filled, so no sampler waits forever.
pub(crate) fn compute_masks(jobs: &mut [MaskJob]) {
    for job in jobs.iter_mut() {
        job.slot.fill(guarded_mask(&mut *job.constraint));
    }
}

/// `constraint`'s mask, with a panic in the matcher and a mask that allows nothing as errors.
pub(crate) fn guarded_mask(constraint: &mut dyn TokenConstraint) -> Result<TokenMask, ConstraintError> {
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| constraint.compute_mask()))
        .unwrap_or_else(|_| Err(ConstraintError("the grammar matcher panicked".into())));
    result.and_then(|mask| {
        if mask.count_allowed() == 0 {
            Err(ConstraintError("the grammar allows no token here".into()))
        } else {
            Ok(mask)
        }
    })
}

/// A sequence's grammar handed to an executor that drafts its own proposals
/// ([`SampleRequest::draft_grammar`](crate::SampleRequest::draft_grammar)): the state at the
/// step's first sampled position, for the executor to walk past the tokens it keeps and mask
/// its drafts with ([`DraftChain`](crate::speculative::DraftChain)). Behind a lock only so that sample
/// requests stay `Sync`; the executor walks forks of it, so a retried step starts over.
#[derive(Clone)]
pub struct DraftGrammar {
    state: Arc<Mutex<Box<dyn TokenConstraint>>>,
    /// End-of-sequence ids, which the engine never feeds to the grammar.
    pub(crate) eos_token_ids: Arc<[u32]>,
}

impl DraftGrammar {
    pub fn new(state: Box<dyn TokenConstraint>, eos_token_ids: &[u32]) -> Self {
        Self { state: Arc::new(Mutex::new(state)), eos_token_ids: Arc::from(eos_token_ids) }
    }

    /// A copy of the grammar state.
    pub(crate) fn fork(&self) -> Box<dyn TokenConstraint> {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).fork()
    }
}

impl std::fmt::Debug for DraftGrammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DraftGrammar")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mask_bits_and_apply() {
        let mut m = TokenMask::new(70);
        for id in [0, 31, 32, 69, 70, 1000] {
            m.allow(id);
        }
        assert_eq!(m.count_allowed(), 4);
        assert!(m.allows(31) && m.allows(69) && !m.allows(70) && !m.allows(1));
        // Logits longer than the mask (a padded vocabulary) lose their tail.
        let mut logits = vec![1.0f32; 100];
        m.apply(&mut logits);
        let kept: Vec<usize> = (0..100).filter(|&i| logits[i] == 1.0).collect();
        assert_eq!(kept, vec![0, 31, 32, 69]);
        assert_eq!(TokenMask::all(70).count_allowed(), 70);
        let from = TokenMask::from_words(&[u32::MAX, u32::MAX, u32::MAX], 40);
        assert_eq!((from.count_allowed(), from.allows(39), from.allows(40)), (40, true, false));
        assert_eq!(TokenMask::from_words(&[1], 64).count_allowed(), 1);
    }

    #[test]
    fn a_slot_hands_its_value_to_a_waiting_reader() {
        let slot = MaskSlot::new();
        let reader = {
            let slot = Arc::clone(&slot);
            std::thread::spawn(move || slot.with_mask(|m| m.count_allowed()))
        };
        std::thread::sleep(std::time::Duration::from_millis(20));
        let mut m = TokenMask::new(8);
        m.allow(3);
        slot.fill(Ok(m));
        slot.fill(Err(ConstraintError("ignored: the first result wins".into())));
        assert_eq!(reader.join().unwrap(), Ok(1));
    }

    struct Panicky;
    impl TokenConstraint for Panicky {
        fn compute_mask(&mut self) -> Result<TokenMask, ConstraintError> {
            panic!("matcher bug")
        }
        fn accept_token(&mut self, _: u32) -> Result<(), ConstraintError> {
            Ok(())
        }
        fn is_finished(&self) -> bool {
            false
        }
        fn fork(&self) -> Box<dyn TokenConstraint> {
            Box::new(Panicky)
        }
    }

    #[test]
    fn a_panicking_or_empty_matcher_still_fills_its_slot() {
        struct Empty;
        impl TokenConstraint for Empty {
            fn compute_mask(&mut self) -> Result<TokenMask, ConstraintError> {
                Ok(TokenMask::new(16))
            }
            fn accept_token(&mut self, _: u32) -> Result<(), ConstraintError> {
                Ok(())
            }
            fn is_finished(&self) -> bool {
                false
            }
            fn fork(&self) -> Box<dyn TokenConstraint> {
                Box::new(Empty)
            }
        }
        let mut jobs = vec![
            MaskJob { seq_id: 1, constraint: Box::new(Panicky), slot: MaskSlot::new(), restore: true },
            MaskJob { seq_id: 2, constraint: Box::new(Empty), slot: MaskSlot::new(), restore: true },
        ];
        compute_masks(&mut jobs);
        assert!(jobs[0].slot.with_mask(|_| ()).unwrap_err().0.contains("panicked"));
        assert!(jobs[1].slot.with_mask(|_| ()).unwrap_err().0.contains("no token"));
    }
}

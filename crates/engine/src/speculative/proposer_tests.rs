//! The [`Proposer`] contract: the engine's proposers propose within the limit they are given
//! through the trait exactly as they do directly, and an executor's drafter sees each step's
//! sequences as they stand after it and hands its proposals to the right output entries.

use std::cell::RefCell;

use super::*;
use crate::block_tables::BlockTableUpdate;
use crate::executor::{SampleRequest, ScheduledSeq};
use crate::speculative::{SpeculativeConfig, SpeculativeMethod};

/// A period-3 sequence: prompt lookup and the suffix trie always find a continuation.
fn periodic() -> Vec<u32> {
    (0..30).map(|i| [4, 7, 9][i % 3]).collect()
}

fn model_free() -> Vec<Box<ModelFree>> {
    let mut suffix = match SpeculativeConfig::suffix(1).method {
        SpeculativeMethod::Suffix {
            max_tree_depth,
            max_cached_requests,
            max_spec_factor,
            min_token_prob,
        } => SuffixProposer::new(max_tree_depth, max_cached_requests, max_spec_factor, min_token_prob),
        _ => unreachable!("the suffix defaults are suffix decoding"),
    };
    Proposer::record_output(&mut suffix, &[9, 4, 7, 9, 4, 7, 9, 4, 7, 9, 4, 7]);
    vec![Box::new(NgramProposer::new(2, 4)), Box::new(suffix)]
}

type ModelFree = dyn Proposer<Error = Infallible>;

#[test]
fn the_engines_proposers_stay_within_the_limit_and_append() {
    let tokens = periodic();
    for proposer in model_free() {
        for max_tokens in 0..=16 {
            let mut out = vec![vec![1, 2]];
            let Ok(()) = proposer.propose(&mut [ProposeSeq::whole(&tokens, max_tokens)], &mut out);
            let kind = proposer.kind();
            assert_eq!(&out[0][..2], [1, 2], "{kind:?} appends");
            let proposed = &out[0][2..];
            assert!(proposed.len() <= max_tokens, "{kind:?}: {} > {max_tokens}", proposed.len());
            assert!(max_tokens == 0 || !proposed.is_empty(), "{kind:?} finds the period");
            // Whatever it proposes continues the period.
            let expected = (tokens.len()..).map(|i| [4, 7, 9][i % 3]);
            assert!(proposed.iter().copied().eq(expected.take(proposed.len())), "{kind:?}: {proposed:?}");
        }
    }
}

#[test]
fn the_trait_proposes_what_the_proposers_do_directly() {
    let tokens: Vec<u32> = vec![3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 1, 4, 1, 5];
    let ngram = NgramProposer::new(2, 4);
    let (mut direct, mut through) = (Vec::new(), vec![Vec::new()]);
    ngram.propose(&tokens, 5, &mut direct);
    let Ok(()) = Proposer::propose(&ngram, &mut [ProposeSeq::whole(&tokens, 5)], &mut through);
    assert_eq!((through[0].as_slice(), direct.as_slice()), (&[9, 2, 6, 5, 3][..], &[9, 2, 6, 5, 3][..]));
    assert_eq!(ngram.kind(), ProposerKind::Ngram);
}

/// What a drafter saw of one sequence: id, tokens, start, drawn, drawn position, limit.
type Seen = (Option<SeqId>, Vec<u32>, usize, bool, usize, usize);

/// A drafter that records what it was asked and proposes `max_tokens` copies of the drawn
/// token, or fails.
struct Recorder {
    seen: RefCell<Vec<Seen>>,
    fail: bool,
}

impl Proposer for Recorder {
    type Error = ExecutorError;

    fn kind(&self) -> ProposerKind {
        ProposerKind::Executor
    }

    fn propose(&self, seqs: &mut [ProposeSeq<'_>], out: &mut [Vec<u32>]) -> Result<(), ExecutorError> {
        if self.fail {
            return Err(ExecutorError::Execution("drafting failed".into()));
        }
        for (seq, out) in seqs.iter().zip(out) {
            self.seen.borrow_mut().push((
                seq.seq_id,
                seq.tokens.to_vec(),
                seq.start_pos,
                seq.drawn,
                seq.drawn_pos(),
                seq.max_tokens,
            ));
            out.extend(seq.drawn_token().into_iter().cycle().take(seq.max_tokens));
        }
        Ok(())
    }
}

fn sampled(seq_id: SeqId, token_ids: Vec<u32>) -> SampledToken {
    SampledToken { seq_id, token_ids, logprobs: None, proposals: Vec::new() }
}

/// A prefill chunk that samples nothing, a decode that verified two proposals (one held) and
/// may draft four, and a prompt's last chunk that drafts nothing.
fn step() -> (ScheduledBatch, Vec<SampledToken>) {
    let chunk = ScheduledSeq::chunk(1, vec![10, 11, 12], 0, BlockTableUpdate::default());
    let decode = ScheduledSeq {
        sample: Some(SampleRequest::greedy()),
        num_draft_tokens: 2,
        num_to_draft: 4,
        ..ScheduledSeq::chunk(2, vec![20, 21, 22], 7, BlockTableUpdate::default())
    };
    let last_chunk = ScheduledSeq {
        sample: Some(SampleRequest::greedy()),
        ..ScheduledSeq::chunk(3, vec![30, 31], 4, BlockTableUpdate::default())
    };
    let batch = ScheduledBatch { seqs: vec![chunk, decode, last_chunk], ..ScheduledBatch::default() };
    (batch, vec![sampled(2, vec![21, 40]), sampled(3, vec![50])])
}

#[test]
fn a_drafter_sees_every_sequence_after_the_step_and_its_proposals_land_on_their_entries() {
    let (batch, mut output) = step();
    let drafter = Recorder { seen: RefCell::new(Vec::new()), fail: false };
    propose_after_step(&drafter, &batch, &mut output).unwrap();
    let seen = drafter.seen.into_inner();
    // The decode kept its own token and the accepted proposal, then drew 40 at position 9;
    // after one of two proposals held it asks for one past the accepted (2, under its 4).
    assert_eq!(
        seen,
        [
            (Some(1), vec![10, 11, 12], 0, false, 3, 0),
            (Some(2), vec![20, 21, 40], 7, true, 9, 2),
            (Some(3), vec![30, 31, 50], 4, true, 6, 0),
        ]
    );
    assert_eq!((output[0].proposals.as_slice(), output[1].proposals.as_slice()), (&[40, 40][..], &[][..]));
}

#[test]
fn a_failed_drafter_fails_the_step_and_proposes_nothing() {
    let (batch, mut output) = step();
    let drafter = Recorder { seen: RefCell::new(Vec::new()), fail: true };
    let err = propose_after_step(&drafter, &batch, &mut output).unwrap_err();
    assert!(err.to_string().contains("drafting failed"), "{err}");
    assert!(output.iter().all(|t| t.proposals.is_empty()));
}

#[test]
fn the_scheduler_asks_with_the_whole_sequence() {
    let tokens = [5, 6, 7];
    let seq = ProposeSeq::whole(&tokens, 3);
    assert_eq!(
        (seq.computed(), seq.drawn_token(), seq.drawn_pos(), seq.seq_id),
        (&[5, 6][..], Some(7), 2, None)
    );
    assert!(ProposeSeq::whole(&[], 3).drawn_token().is_none());
}

//! Beam search's own state and decisions ([`crate::request::BeamSearch`]), apart from the
//! sequences that carry it: each beam's score and candidates ([`Beam`]), a round's selection
//! ([`select_round`]) and the final ranking of hypotheses ([`best_hypotheses`]). The scheduler
//! side (`fanout.rs`) turns the chosen continuations into sequences: kept, forked or dropped.
//!
//! A step that samples a beam records its top `2 * width` next tokens instead of appending one.
//! Once every live beam of the request holds its candidates, the round picks the `width` best
//! continuations by cumulative logprob; a candidate that ends the sequence (end-of-sequence or
//! a stop id, once past `min_tokens`) becomes a finished hypothesis instead. The request's `n`
//! best hypotheses by [`BeamSearch::score`] are its result.

use crate::event::{FinishReason, StopReason};
use crate::executor::{TokenLogprob, TopLogprobs};
use crate::request::{BeamSearch, StopConditions};

/// One beam's search state.
#[derive(Debug, Clone, Default)]
pub(crate) struct Beam {
    /// Sum of the logprobs of the beam's output tokens.
    cum_logprob: f64,
    /// The logprob of each output token.
    logprobs: Vec<TopLogprobs>,
    /// The last step's most likely next tokens, until the round's selection.
    candidates: Option<Vec<TokenLogprob>>,
    /// Sequence slots held for beams the last round did not fill.
    reserve: usize,
}

impl Beam {
    /// The first beam of a search `width` wide: it holds the slots of all of them.
    pub fn first(width: usize) -> Self {
        Self { reserve: width - 1, ..Default::default() }
    }

    /// Sequence slots the beam holds for the search's beams the last round did not fill.
    pub fn reserve(&self) -> usize {
        self.reserve
    }

    /// The beam goes into a new round holding `reserve` extra slots.
    pub fn start_round(&mut self, reserve: usize) {
        self.candidates = None;
        self.reserve = reserve;
    }

    /// Drops this round's candidates: the beam's recompute (after a preemption) brings them
    /// again, with its siblings'.
    pub fn forget_candidates(&mut self) {
        self.candidates = None;
    }

    /// Keeps a step's output (the top tokens of its last position) for the round's selection.
    pub fn record_candidates(&mut self, logprobs: Option<Vec<TopLogprobs>>) {
        let top = logprobs.and_then(|mut l| l.pop()).map(|l| l.top).unwrap_or_default();
        self.candidates = Some(top);
    }

    /// Whether the beam holds its candidates for this round.
    pub fn is_ready(&self) -> bool {
        self.candidates.is_some()
    }

    /// Takes the round's chosen token: the beam goes on with it.
    pub fn extend(&mut self, chosen: &Continuation) {
        self.cum_logprob = chosen.cum_logprob;
        self.logprobs.push(TopLogprobs { sampled: chosen.token, top: Vec::new() });
    }

    /// The beam as a hypothesis cut at the length limit: `output` its tokens, `len` the
    /// sequence's length (prompt and output).
    pub fn into_hypothesis(self, search: &BeamSearch, output: &[u32], len: usize) -> Hypothesis {
        Hypothesis {
            token_ids: output.to_vec(),
            score: search.score(self.cum_logprob, len),
            logprobs: self.logprobs,
            reason: FinishReason::Length,
        }
    }
}

/// A finished hypothesis of a beam search.
#[derive(Debug, Clone)]
pub(crate) struct Hypothesis {
    pub token_ids: Vec<u32>,
    pub logprobs: Vec<TopLogprobs>,
    pub score: f64,
    pub reason: FinishReason,
}

/// A continuation chosen in a round: beam `parent` (an index into the round's beams) followed
/// by `token`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Continuation {
    pub parent: usize,
    pub token: TokenLogprob,
    pub cum_logprob: f64,
}

/// What a round needs of one live beam: its state, its output tokens and its sequence's length.
pub(crate) struct RoundBeam<'a> {
    pub beam: &'a Beam,
    pub output: &'a [u32],
    pub len: usize,
}

/// One round: the `width` best continuations of `beams` (every one holding its candidates), best
/// first, and the hypotheses that the candidates ending the sequence finished.
pub(crate) fn select_round(
    search: &BeamSearch,
    stop: &StopConditions,
    beams: &[RoundBeam<'_>],
) -> (Vec<Continuation>, Vec<Hypothesis>) {
    let ends = |token: u32| {
        (!stop.ignore_eos && stop.eos_token_ids.contains(&token))
            .then_some(StopReason::Eos(token))
            .or_else(|| stop.stop_token_ids.contains(&token).then_some(StopReason::StopTokenId(token)))
    };
    let mut continuations = Vec::new();
    let mut finished = Vec::new();
    for (parent, b) in beams.iter().enumerate() {
        let output_len = b.output.len() + 1;
        for &token in b.beam.candidates.as_deref().unwrap_or_default() {
            let cum_logprob = b.beam.cum_logprob + f64::from(token.logprob);
            match ends(token.token_id) {
                // An ending token before `min_tokens` is not a continuation at all.
                Some(_) if output_len <= stop.min_tokens => {}
                Some(reason) => {
                    let (mut token_ids, mut logprobs) = (b.output.to_vec(), b.beam.logprobs.clone());
                    token_ids.push(token.token_id);
                    logprobs.push(TopLogprobs { sampled: token, top: Vec::new() });
                    finished.push(Hypothesis {
                        token_ids,
                        logprobs,
                        score: search.score(cum_logprob, b.len),
                        reason: FinishReason::Stop(reason),
                    });
                }
                None => continuations.push(Continuation { parent, token, cum_logprob }),
            }
        }
    }
    // Equal lengths: the best scores are the best cumulative logprobs. Stable, so ties keep
    // beam order, then each beam's candidate order.
    continuations.sort_by(|a, b| b.cum_logprob.total_cmp(&a.cum_logprob));
    continuations.truncate(search.width);
    (continuations, finished)
}

/// The `n` best of `hypotheses` by score, best first; when there are fewer, empty ones at the
/// length limit make up the count.
pub(crate) fn best_hypotheses(mut hypotheses: Vec<Hypothesis>, n: usize) -> impl Iterator<Item = Hypothesis> {
    hypotheses.sort_by(|a, b| b.score.total_cmp(&a.score));
    let mut best = hypotheses.into_iter();
    (0..n).map(move |_| {
        best.next().unwrap_or(Hypothesis {
            token_ids: Vec::new(),
            logprobs: Vec::new(),
            score: f64::NEG_INFINITY,
            reason: FinishReason::Length,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const EOS: u32 = 0;

    fn beam(cum_logprob: f64, candidates: &[(u32, f32)]) -> Beam {
        let candidates = candidates.iter().map(|&(token_id, logprob)| TokenLogprob { token_id, logprob });
        Beam { cum_logprob, candidates: Some(candidates.collect()), ..Default::default() }
    }

    fn stop(min_tokens: usize) -> StopConditions {
        StopConditions { eos_token_ids: vec![EOS], min_tokens, ..Default::default() }
    }

    fn chosen(continuations: &[Continuation]) -> Vec<(usize, u32)> {
        continuations.iter().map(|c| (c.parent, c.token.token_id)).collect()
    }

    #[test]
    fn the_best_cumulative_logprobs_go_on_ties_in_beam_order() {
        let search = BeamSearch { width: 3, length_penalty: 1.0 };
        let (a, b) = (beam(-1.0, &[(5, -0.5), (6, -2.0)]), beam(-0.5, &[(7, -1.0), (8, -3.0)]));
        let beams =
            [RoundBeam { beam: &a, output: &[1], len: 4 }, RoundBeam { beam: &b, output: &[2], len: 4 }];
        let (next, finished) = select_round(&search, &stop(0), &beams);
        // -1.5 (a+5), -1.5 (b+7), then -3.0 (a+6) over -3.5 (b+8).
        assert_eq!(chosen(&next), [(0, 5), (1, 7), (0, 6)]);
        assert!(finished.is_empty());
    }

    #[test]
    fn an_ending_candidate_finishes_a_hypothesis_once_past_min_tokens() {
        let search = BeamSearch { width: 2, length_penalty: 1.0 };
        let a = beam(-1.0, &[(EOS, -0.25), (5, -1.0)]);
        let beams = [RoundBeam { beam: &a, output: &[3, 4], len: 6 }];
        let (next, finished) = select_round(&search, &stop(3), &beams);
        assert_eq!(chosen(&next), [(0, 5)], "too early to end");
        assert!(finished.is_empty());
        let (next, finished) = select_round(&search, &stop(2), &beams);
        assert_eq!(chosen(&next), [(0, 5)]);
        let h = &finished[0];
        assert_eq!((h.token_ids.as_slice(), h.logprobs.len()), (&[3, 4, EOS][..], 1));
        assert_eq!(h.score, -1.25 / 6.0, "the length leaves the ending token out");
        assert_eq!(h.reason, FinishReason::Stop(StopReason::Eos(EOS)));
    }

    #[test]
    fn the_n_best_hypotheses_come_padded() {
        let h = |score: f64| Hypothesis {
            token_ids: vec![1],
            logprobs: Vec::new(),
            score,
            reason: FinishReason::Stop(StopReason::Eos(EOS)),
        };
        let best: Vec<f64> = best_hypotheses(vec![h(-3.0), h(-1.0), h(-2.0)], 2).map(|h| h.score).collect();
        assert_eq!(best, [-1.0, -2.0]);
        let padded: Vec<_> = best_hypotheses(vec![h(-3.0)], 2).collect();
        assert_eq!((padded[1].token_ids.len(), &padded[1].reason), (0, &FinishReason::Length));
    }

    #[test]
    fn a_beam_goes_on_with_its_chosen_token() {
        let search = BeamSearch { width: 1, length_penalty: 0.0 };
        let mut a = beam(-1.0, &[(5, -0.5)]);
        let beams = [RoundBeam { beam: &a, output: &[], len: 2 }];
        let (next, _) = select_round(&search, &stop(0), &beams);
        a.extend(&next[0]);
        assert_eq!((a.cum_logprob, a.logprobs[0].sampled.token_id), (-1.5, 5));
        a.record_candidates(None);
        assert!(a.is_ready() && a.candidates.as_ref().is_some_and(Vec::is_empty));
        let h = a.into_hypothesis(&search, &[5], 3);
        assert_eq!((h.score, h.reason), (-1.5, FinishReason::Length));
    }
}

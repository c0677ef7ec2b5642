//! The CPU sampler: draws one token from one row of logits (`&mut [f32]`, processed in place)
//! for a [`SampleRequest`]. Used by the model runner on the CPU path and by the fake executor.
//!
//! Processing order (as in vLLM): the grammar's token mask (structured output), logit bias,
//! banned ids, repetition / frequency / presence penalties, then either argmax (temperature 0) or
//! temperature, min-p, top-k, top-p and a draw.
//!
//! The draw is stateless: its uniform number depends only on `(seed, output_index)`, so a
//! sequence gets the same token whatever else is in the batch and however often it was
//! preempted and recomputed.
//!
//! Logprobs are those of the *raw* model distribution (log-softmax of the logits as they came
//! in, before bias, penalties, temperature and filtering), like vLLM's default; under a grammar,
//! of the masked distribution, as in vLLM v1 where the mask is applied before the sampler.

use std::cell::RefCell;

use crate::executor::{SampleRequest, TokenLogprob, TopLogprobs};
use crate::rng::uniform;
use crate::sampling::SamplingParams;

/// Why no token could be drawn.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SampleError {
    #[error("the logits row is empty")]
    EmptyLogits,
    #[error("no token can be sampled: every logit is -inf or NaN after bans and logit bias")]
    NoCandidate,
    #[error("structured output: {0}")]
    Constraint(String),
}

/// Reusable scratch space, so sampling a row allocates nothing in the common case.
#[derive(Debug, Default)]
pub struct Sampler {
    raw: Vec<f32>,
    candidates: Vec<(f32, u32)>,
    ids: Vec<u32>,
}

thread_local! {
    static SAMPLER: RefCell<Sampler> = RefCell::new(Sampler::new());
}

/// Samples one token from `logits` (modified in place). Infallible for the caller's
/// convenience: when [`try_sample`] would fail it returns token 0 without logprobs; use
/// [`try_sample`] to detect that.
pub fn sample(logits: &mut [f32], req: &SampleRequest) -> (u32, Option<TopLogprobs>) {
    try_sample(logits, req).unwrap_or((0, None))
}

/// Samples one token from `logits` (modified in place) with a thread-local [`Sampler`].
pub fn try_sample(
    logits: &mut [f32],
    req: &SampleRequest,
) -> Result<(u32, Option<TopLogprobs>), SampleError> {
    with_thread_sampler(|s| s.sample(logits, req))
}

/// Runs `f` with the calling thread's [`Sampler`].
pub fn with_thread_sampler<T>(f: impl FnOnce(&mut Sampler) -> T) -> T {
    SAMPLER.with(|s| f(&mut s.borrow_mut()))
}

/// Orders candidates by score, highest first, then by id so ties are deterministic.
fn by_score_desc(a: &(f32, u32), b: &(f32, u32)) -> std::cmp::Ordering {
    b.0.total_cmp(&a.0).then(a.1.cmp(&b.1))
}

impl Sampler {
    pub fn new() -> Self {
        Self::default()
    }

    /// Processes `logits` in place and draws one token; see the module docs for the order.
    pub fn sample(
        &mut self,
        logits: &mut [f32],
        req: &SampleRequest,
    ) -> Result<(u32, Option<TopLogprobs>), SampleError> {
        if logits.is_empty() {
            return Err(SampleError::EmptyLogits);
        }
        let p = &*req.params;
        if let Some(slot) = &req.allowed {
            slot.with_mask(|mask| mask.apply(logits)).map_err(|e| SampleError::Constraint(e.0))?;
        }
        if p.logprobs.is_some() {
            self.raw.clear();
            self.raw.extend_from_slice(logits);
        }
        // NaN would poison every comparison below; it can never be the best choice anyway.
        for l in logits.iter_mut() {
            if l.is_nan() {
                *l = f32::NEG_INFINITY;
            }
        }
        for (&id, &bias) in &p.logit_bias {
            if let Some(l) = logits.get_mut(id as usize) {
                *l += bias;
            }
        }
        for &id in &req.banned_token_ids {
            if let Some(l) = logits.get_mut(id as usize) {
                *l = f32::NEG_INFINITY;
            }
        }
        if p.needs_history() {
            if let Some(history) = &req.history {
                self.apply_penalties(logits, history, req.prompt_len, p);
            }
        }
        let token = if p.is_greedy() {
            argmax(logits).ok_or(SampleError::NoCandidate)?
        } else {
            self.draw(logits, p, req.seed, req.output_index as u64)?
        };
        let logprobs = p.logprobs.map(|k| self.raw_logprobs(token, k));
        Ok((token, logprobs))
    }

    /// Repetition penalty over prompt and output; frequency and presence over the output only.
    fn apply_penalties(
        &mut self,
        logits: &mut [f32],
        history: &[u32],
        prompt_len: usize,
        p: &SamplingParams,
    ) {
        let vocab = logits.len();
        if p.repetition_penalty != 1.0 {
            self.ids.clear();
            self.ids.extend(history.iter().copied().filter(|&t| (t as usize) < vocab));
            self.ids.sort_unstable();
            self.ids.dedup();
            for &t in &self.ids {
                let l = &mut logits[t as usize];
                *l = if *l > 0.0 { *l / p.repetition_penalty } else { *l * p.repetition_penalty };
            }
        }
        if p.frequency_penalty != 0.0 || p.presence_penalty != 0.0 {
            let output = &history[prompt_len.min(history.len())..];
            self.ids.clear();
            self.ids.extend(output.iter().copied().filter(|&t| (t as usize) < vocab));
            self.ids.sort_unstable();
            for run in self.ids.chunk_by(|a, b| a == b) {
                let l = &mut logits[run[0] as usize];
                *l -= p.frequency_penalty * run.len() as f32 + p.presence_penalty;
            }
        }
    }

    /// Temperature, min-p, top-k, top-p, then one seeded draw.
    fn draw(
        &mut self,
        logits: &[f32],
        p: &SamplingParams,
        seed: u64,
        counter: u64,
    ) -> Result<u32, SampleError> {
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        if max == f32::NEG_INFINITY {
            return Err(SampleError::NoCandidate);
        }
        if max == f32::INFINITY {
            // A +inf bias forces the token.
            return argmax(logits).ok_or(SampleError::NoCandidate);
        }
        let inv_t = 1.0 / p.temperature;
        // Scores are log-probabilities relative to the most likely token, so min-p keeps
        // `p_i >= min_p * p_max`, i.e. `score >= ln(min_p)`.
        let floor = if p.min_p > 0.0 { p.min_p.ln() } else { f32::NEG_INFINITY };
        self.candidates.clear();
        for (i, &l) in logits.iter().enumerate() {
            if l > f32::NEG_INFINITY {
                let score = (l - max) * inv_t;
                if score >= floor {
                    self.candidates.push((score, i as u32));
                }
            }
        }
        let cand = &mut self.candidates;
        let k = p.top_k;
        let mut sorted = false;
        if k > 0 && k < cand.len() {
            cand.select_nth_unstable_by(k - 1, by_score_desc);
            cand.truncate(k);
            cand.sort_unstable_by(by_score_desc);
            sorted = true;
        }
        if p.top_p < 1.0 {
            if !sorted {
                cand.sort_unstable_by(by_score_desc);
            }
            let total: f64 = cand.iter().map(|c| f64::from(c.0).exp()).sum();
            let target = f64::from(p.top_p) * total;
            let mut acc = 0.0;
            // Keep the smallest prefix whose mass reaches top_p (at least one token).
            let mut keep = cand.len();
            for (i, c) in cand.iter().enumerate() {
                acc += f64::from(c.0).exp();
                if acc >= target {
                    keep = i + 1;
                    break;
                }
            }
            cand.truncate(keep);
        }
        let total: f64 = cand.iter().map(|c| f64::from(c.0).exp()).sum();
        let target = uniform(seed, counter) * total;
        let mut acc = 0.0;
        for c in cand.iter() {
            acc += f64::from(c.0).exp();
            if acc > target {
                return Ok(c.1);
            }
        }
        // Rounding left `target` at the very top of the mass: the last candidate owns it.
        cand.last().map(|c| c.1).ok_or(SampleError::NoCandidate)
    }

    /// Logprob of `token` and the `k` most likely tokens under `logits` as they are (a prompt
    /// token's, which nothing but the model decided).
    pub fn token_logprobs(&mut self, logits: &[f32], token: u32, k: usize) -> TopLogprobs {
        self.raw.clear();
        self.raw.extend_from_slice(logits);
        self.raw_logprobs(token, k)
    }

    /// Logprob of `token` and the `k` most likely tokens under the raw distribution.
    fn raw_logprobs(&mut self, token: u32, k: usize) -> TopLogprobs {
        let raw = &self.raw;
        let clean = |l: f32| if l.is_nan() { f32::NEG_INFINITY } else { l };
        let max = raw.iter().copied().map(clean).fold(f32::NEG_INFINITY, f32::max);
        let lse = if max.is_finite() {
            let sum: f64 = raw.iter().map(|&l| f64::from(clean(l) - max).exp()).sum();
            f64::from(max) + sum.ln()
        } else {
            f64::from(max)
        };
        let logprob = |l: f32| {
            let l = clean(l);
            if l == f32::NEG_INFINITY || !lse.is_finite() {
                f32::NEG_INFINITY
            } else {
                (f64::from(l) - lse) as f32
            }
        };
        let sampled = TokenLogprob {
            token_id: token,
            logprob: raw.get(token as usize).map_or(f32::NEG_INFINITY, |&l| logprob(l)),
        };
        let cand = &mut self.candidates;
        cand.clear();
        cand.extend(raw.iter().enumerate().map(|(i, &l)| (clean(l), i as u32)));
        let k = k.min(cand.len());
        if k < cand.len() && k > 0 {
            cand.select_nth_unstable_by(k - 1, by_score_desc);
        }
        cand.truncate(k);
        cand.sort_unstable_by(by_score_desc);
        let top = cand.iter().map(|&(l, id)| TokenLogprob { token_id: id, logprob: logprob(l) }).collect();
        TopLogprobs { sampled, top }
    }
}

/// First index of the largest value; `None` when every value is -inf (NaN never wins).
///
/// Sixteen independent lanes, each keeping its first maximum, so the loop compiles to vector
/// compares and blends (a 262k-entry vocabulary made the one-at-a-time loop a tenth of a
/// 32-stream step); the lanes then combine to the highest value at the lowest index.
fn argmax(logits: &[f32]) -> Option<u32> {
    const LANES: usize = 16;
    let mut best = [f32::NEG_INFINITY; LANES];
    let mut at = [u32::MAX; LANES];
    let chunks = logits.chunks_exact(LANES);
    let tail_start = logits.len() - chunks.remainder().len();
    for (c, chunk) in chunks.enumerate() {
        for j in 0..LANES {
            let better = chunk[j] > best[j];
            best[j] = if better { chunk[j] } else { best[j] };
            at[j] = if better { (c * LANES + j) as u32 } else { at[j] };
        }
    }
    let mut winner: Option<(f32, u32)> = None;
    let lanes = best.into_iter().zip(at).filter(|&(_, i)| i != u32::MAX);
    let tail = logits[tail_start..]
        .iter()
        .enumerate()
        .filter(|&(_, &l)| l > f32::NEG_INFINITY)
        .map(|(i, &l)| (l, (tail_start + i) as u32));
    for (value, index) in lanes.chain(tail) {
        if winner.is_none_or(|(v, i)| value > v || (value == v && index < i)) {
            winner = Some((value, index));
        }
    }
    winner.map(|(_, index)| index)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Arc;

    use super::*;

    fn req(params: SamplingParams, seed: u64, index: usize) -> SampleRequest {
        SampleRequest {
            params: Arc::new(params),
            seed,
            output_index: index,
            history: None,
            prompt_len: 0,
            banned_token_ids: Vec::new(),
            allowed: None,
            draft_masks: Vec::new(),
            draft_grammar: None,
        }
    }

    fn temp(t: f32) -> SamplingParams {
        SamplingParams { temperature: t, ..Default::default() }
    }

    fn draw(logits: &[f32], r: &SampleRequest) -> u32 {
        try_sample(&mut logits.to_vec(), r).unwrap().0
    }

    #[test]
    fn subnormal_temperatures_are_greedy() {
        let logits = [0.5, 3.0, -1.0, 2.9];
        for t in [1e-45, 1e-38, 1e-6] {
            for i in 0..20 {
                let p = SamplingParams { min_p: 0.1, top_p: 0.5, ..temp(t) };
                assert_eq!(draw(&logits, &req(p, 7, i)), 1, "temperature {t}");
            }
        }
    }

    fn softmax(logits: &[f32], t: f32) -> Vec<f64> {
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let e: Vec<f64> = logits.iter().map(|&l| f64::from((l - max) / t).exp()).collect();
        let s: f64 = e.iter().sum();
        e.iter().map(|x| x / s).collect()
    }

    fn frequencies(logits: &[f32], params: SamplingParams, draws: usize) -> Vec<f64> {
        let mut counts = vec![0usize; logits.len()];
        for i in 0..draws {
            counts[draw(logits, &req(params.clone(), 1234, i)) as usize] += 1;
        }
        counts.iter().map(|&c| c as f64 / draws as f64).collect()
    }

    const LOGITS: [f32; 5] = [1.0, 2.5, 0.3, -1.0, 2.0];

    #[test]
    fn greedy_is_argmax_with_bias_and_bans() {
        let g = SamplingParams::default();
        assert_eq!(draw(&LOGITS, &req(g.clone(), 0, 0)), 1);
        let mut r = req(g.clone(), 0, 0);
        r.banned_token_ids = vec![1];
        assert_eq!(draw(&LOGITS, &r), 4);
        let biased = SamplingParams { logit_bias: HashMap::from([(3, 10.0), (99, 5.0)]), ..g };
        assert_eq!(draw(&LOGITS, &req(biased, 0, 0)), 3);
    }

    #[test]
    fn top_k_one_equals_greedy() {
        let mut state = 9u64;
        for i in 0..200 {
            let logits: Vec<f32> = (0..50)
                .map(|_| {
                    state = crate::rng::mix64(state);
                    (state % 1000) as f32 / 100.0
                })
                .collect();
            let greedy = draw(&logits, &req(SamplingParams::default(), 0, 0));
            let p = SamplingParams { temperature: 1.3, top_k: 1, ..Default::default() };
            assert_eq!(draw(&logits, &req(p, i, i as usize)), greedy);
        }
    }

    #[test]
    fn frequencies_match_softmax() {
        for t in [1.0f32, 0.5] {
            let freq = frequencies(&LOGITS, temp(t), 40_000);
            for (f, p) in freq.iter().zip(softmax(&LOGITS, t)) {
                assert!((f - p).abs() < 0.01, "t={t}: {freq:?} vs softmax");
            }
        }
    }

    #[test]
    fn top_p_keeps_only_the_nucleus() {
        // Probabilities 0.5, 0.3, 0.15, 0.05: top_p 0.75 keeps the first two.
        let logits: Vec<f32> = [0.5f32, 0.3, 0.15, 0.05].iter().map(|p| p.ln()).collect();
        let p = SamplingParams { temperature: 1.0, top_p: 0.75, ..Default::default() };
        let freq = frequencies(&logits, p, 20_000);
        assert_eq!(freq[2] + freq[3], 0.0);
        assert!((freq[0] - 0.625).abs() < 0.015, "{freq:?}");
    }

    #[test]
    fn top_k_and_min_p_filter() {
        let p = SamplingParams { temperature: 1.0, top_k: 2, ..Default::default() };
        let freq = frequencies(&LOGITS, p, 5_000);
        assert!(freq[1] > 0.0 && freq[4] > 0.0);
        assert_eq!(freq[0] + freq[2] + freq[3], 0.0);
        // min_p 0.5: keep tokens at least half as likely as the best (2.5 and 2.0: e^-0.5 > 0.5).
        let p = SamplingParams { temperature: 1.0, min_p: 0.5, ..Default::default() };
        let freq = frequencies(&LOGITS, p, 5_000);
        assert_eq!(freq[0] + freq[2] + freq[3], 0.0);
        assert!(freq[4] > 0.3);
    }

    #[test]
    fn seeded_draws_are_reproducible_and_vary_with_seed_and_index() {
        let logits = [0.0f32; 64];
        let p = temp(1.0);
        let a: Vec<u32> = (0..32).map(|i| draw(&logits, &req(p.clone(), 7, i))).collect();
        let b: Vec<u32> = (0..32).map(|i| draw(&logits, &req(p.clone(), 7, i))).collect();
        let c: Vec<u32> = (0..32).map(|i| draw(&logits, &req(p.clone(), 8, i))).collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert!(a.iter().collect::<std::collections::HashSet<_>>().len() > 10);
    }

    #[test]
    fn penalties_use_history() {
        // Token 1 leads 2.5 vs 2.0; it occurred in the prompt only.
        let mut r = req(SamplingParams { repetition_penalty: 2.0, ..Default::default() }, 0, 0);
        r.history = Some(Arc::from(vec![1u32, 3]));
        r.prompt_len = 2;
        assert_eq!(draw(&LOGITS, &r), 4);
        // Frequency penalty ignores the prompt ...
        let mut r = req(SamplingParams { frequency_penalty: 1.0, ..Default::default() }, 0, 0);
        r.history = Some(Arc::from(vec![1u32, 1, 4]));
        r.prompt_len = 2;
        assert_eq!(draw(&LOGITS, &r), 1);
        // ... and counts each output occurrence.
        r.history = Some(Arc::from(vec![1u32, 1]));
        r.prompt_len = 0;
        assert_eq!(draw(&LOGITS, &r), 4);
        let mut r = req(SamplingParams { presence_penalty: 0.6, ..Default::default() }, 0, 0);
        r.history = Some(Arc::from(vec![1u32]));
        assert_eq!(draw(&LOGITS, &r), 4);
    }

    #[test]
    fn logprobs_are_of_the_raw_distribution() {
        let p = SamplingParams {
            temperature: 0.7,
            logprobs: Some(2),
            logit_bias: HashMap::from([(3, 50.0)]),
            ..Default::default()
        };
        let (token, lp) = try_sample(&mut LOGITS.to_vec(), &req(p, 3, 0)).unwrap();
        assert_eq!(token, 3);
        let lp = lp.unwrap();
        let raw = softmax(&LOGITS, 1.0);
        assert!((f64::from(lp.sampled.logprob) - raw[3].ln()).abs() < 1e-5);
        assert_eq!(lp.top.iter().map(|t| t.token_id).collect::<Vec<_>>(), vec![1, 4]);
        assert!((f64::from(lp.top[0].logprob) - raw[1].ln()).abs() < 1e-5);
        let p0 = SamplingParams { logprobs: Some(0), ..Default::default() };
        assert!(try_sample(&mut LOGITS.to_vec(), &req(p0, 0, 0)).unwrap().1.unwrap().top.is_empty());
    }

    #[test]
    fn argmax_is_the_first_maximum_in_every_lane_and_the_tail() {
        fn naive(xs: &[f32]) -> Option<u32> {
            let mut best = None;
            let mut best_val = f32::NEG_INFINITY;
            for (i, &l) in xs.iter().enumerate() {
                if l > best_val {
                    (best_val, best) = (l, Some(i as u32));
                }
            }
            best
        }
        let mut rng = 7u64;
        for len in [0usize, 1, 15, 16, 17, 33, 100, 1000] {
            for _ in 0..50 {
                let xs: Vec<f32> = (0..len)
                    .map(|_| {
                        rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                        // Few distinct values, so ties across lanes and the tail are common.
                        match (rng >> 33) % 7 {
                            0 => f32::NEG_INFINITY,
                            1 => f32::NAN,
                            k => k as f32,
                        }
                    })
                    .collect();
                assert_eq!(argmax(&xs), naive(&xs), "{xs:?}");
            }
        }
        assert_eq!(argmax(&[f32::NEG_INFINITY; 40]), None);
        assert_eq!(argmax(&[f32::NAN; 20]), None);
    }

    #[test]
    fn degenerate_rows_are_errors_not_panics() {
        let g = req(SamplingParams::default(), 0, 0);
        assert_eq!(try_sample(&mut [], &g), Err(SampleError::EmptyLogits));
        let mut r = req(temp(1.0), 0, 0);
        r.banned_token_ids = vec![0, 1];
        assert_eq!(try_sample(&mut [1.0, f32::NAN], &r), Err(SampleError::NoCandidate));
        assert_eq!(try_sample(&mut [f32::NAN, 1.0], &g), Ok((1, None)));
        assert_eq!(sample(&mut [], &g), (0, None));
    }
}

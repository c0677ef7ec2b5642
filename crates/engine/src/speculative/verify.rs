//! Verification of proposed tokens against the target model's logits.
//!
//! Proposals here are single tokens (a point-mass draft distribution `q`). Rejection sampling
//! against such a `q` accepts draft `x` with probability `min(1, p(x) / q(x)) = p(x)` and, on
//! rejection, draws from `p` with `x` removed. Drawing `y ~ p` with the sampler and accepting
//! exactly when `y == x` does both at once: `x` comes out with probability `p(x)`, and any
//! `y != x` with probability `p(y)`. So each position is drawn by the ordinary sampler, with the
//! request advanced past the accepted drafts (`output_index + i`, the drafts appended to the
//! history for penalties), and verification stops at the first draw that differs from the
//! draft. Because the sampler's draw is a function of `(seed, output_index)`, a sequence gets the
//! very tokens it would have got without speculation, greedy or seeded, whatever was proposed,
//! given the same logits. (The model computes a verification step's positions together, so its
//! logits can differ from one-token steps in the last bits, as with any change of batch: the
//! logprobs show it, and a near-tie could flip.)

use crate::executor::{SampleRequest, TopLogprobs};
use crate::sampler::{with_thread_sampler, SampleError, Sampler};

/// The tokens a verified step produced: the accepted drafts then the drawn token.
pub type Verified = (Vec<u32>, Option<Vec<TopLogprobs>>);

/// Verifies `drafts`: `rows` yields the target's logits after the context, then after each
/// draft in turn (`drafts.len() + 1` rows; only as many as needed are taken). Returns the
/// accepted drafts followed by the token drawn at the first position whose draw differed (or
/// after the last draft), with their logprobs when asked for.
pub fn verify<R: AsMut<[f32]>>(
    sampler: &mut Sampler,
    rows: impl IntoIterator<Item = R>,
    req: &SampleRequest,
    drafts: &[u32],
) -> Result<Verified, SampleError> {
    check_masks(req, drafts)?;
    let mut tokens = Vec::with_capacity(drafts.len() + 1);
    let mut logprobs = req.params.logprobs.map(|_| Vec::with_capacity(drafts.len() + 1));
    let mut rows = rows.into_iter();
    for i in 0..=drafts.len() {
        let mut row = rows.next().ok_or(SampleError::EmptyLogits)?;
        let (token, lp) = if i == 0 {
            sampler.sample(row.as_mut(), req)?
        } else {
            sampler.sample(row.as_mut(), &advanced(req, &drafts[..i]))?
        };
        tokens.push(token);
        if let (Some(all), Some(lp)) = (logprobs.as_mut(), lp) {
            all.push(lp);
        }
        if drafts.get(i) != Some(&token) {
            break;
        }
    }
    Ok((tokens, logprobs))
}

/// The request of each position of a verification, for a sampler that draws them all at once
/// (the GPU's): `drafts.len() + 1` requests, the `i`-th for the position after `i` drafts, as
/// [`verify`] draws it. With [`kept`] on the tokens drawn, this gives exactly [`verify`]'s
/// tokens: each draw depends only on its own request and row.
pub fn position_requests(req: &SampleRequest, drafts: &[u32]) -> Result<Vec<SampleRequest>, SampleError> {
    check_masks(req, drafts)?;
    Ok((0..=drafts.len()).map(|i| if i == 0 { req.clone() } else { advanced(req, &drafts[..i]) }).collect())
}

/// How many of `drawn` (one token per position of [`position_requests`]) a verification keeps:
/// the drafts up to and including the first position whose draw differs from its draft.
pub fn kept(drawn: &[u32], drafts: &[u32]) -> usize {
    drawn.iter().zip(drafts).take_while(|(d, p)| d == p).count() + 1
}

fn check_masks(req: &SampleRequest, drafts: &[u32]) -> Result<(), SampleError> {
    if req.allowed.is_some() && req.draft_masks.len() < drafts.len() {
        return Err(SampleError::Constraint("no grammar mask for a proposed token's position".into()));
    }
    Ok(())
}

/// [`verify`] with the calling thread's sampler.
pub fn try_verify<R: AsMut<[f32]>>(
    rows: impl IntoIterator<Item = R>,
    req: &SampleRequest,
    drafts: &[u32],
) -> Result<Verified, SampleError> {
    with_thread_sampler(|s| verify(s, rows, req, drafts))
}

/// The request for the position after `accepted` (at least one) more tokens.
fn advanced(req: &SampleRequest, accepted: &[u32]) -> SampleRequest {
    let history = req.history.as_ref().map(|h| {
        let mut extended = Vec::with_capacity(h.len() + accepted.len());
        extended.extend_from_slice(h);
        extended.extend_from_slice(accepted);
        extended.into()
    });
    SampleRequest {
        output_index: req.output_index + accepted.len(),
        history,
        allowed: req.draft_masks.get(accepted.len() - 1).cloned(),
        draft_masks: Vec::new(),
        draft_grammar: None,
        ..req.clone()
    }
}

#[cfg(test)]
#[path = "verify_tests.rs"]
mod tests;

//! The device sampler's input: a batch of [`SampleRequest`]s flattened into plain arrays that a
//! GPU kernel (kernels/sampling.cu) reads, so that only token ids and requested logprobs come
//! back to the host.
//!
//! Everything the CPU sampler (`sampler.rs`) decides on the host side is decided here the same
//! way: greediness, the min-p floor as `ln(min_p)` in f32, the seeded uniform of
//! `(seed, output_index)`, logit-bias ids inside the vocabulary, and the penalty entries (each
//! distinct id of the history with its count in the output). The kernel then applies them in
//! the CPU sampler's order and walks the candidates in its order (score descending, id
//! ascending), so both samplers draw the same token from the same logits.
//!
//! Building a plan waits for each row's grammar mask, as the CPU sampler does.

use crate::executor::SampleRequest;
use crate::rng::uniform;
use crate::sampler::SampleError;

/// One row's parameters, laid out as `struct SampleRow` in kernels/sampling.cu (80 bytes;
/// [`DeviceSamplingPlan::row_bytes`] writes them so). Ranges index the plan's shared arrays as
/// `start..end`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct DeviceSampleRow {
    /// The draw's uniform number in `[0, 1)`.
    pub uniform: f64,
    pub temperature: f32,
    pub top_p: f32,
    /// Candidates keep `score >= score_floor` (`ln(min_p)`, or -inf without min-p).
    pub score_floor: f32,
    pub repetition_penalty: f32,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    /// 0 disables top-k.
    pub top_k: u32,
    /// Top logprobs wanted; -1 for none.
    pub num_logprobs: i32,
    pub bias_start: u32,
    pub bias_end: u32,
    pub banned_start: u32,
    pub banned_end: u32,
    pub penalty_start: u32,
    pub penalty_end: u32,
    pub mask_start: u32,
    pub mask_len: u32,
    /// [`DeviceSampleRow::GREEDY`] | [`DeviceSampleRow::MASKED`].
    pub flags: u32,
    pub reserved: u32,
}

impl DeviceSampleRow {
    /// Argmax instead of a draw.
    pub const GREEDY: u32 = 1;
    /// The row has a grammar mask (`mask_start..mask_start + mask_len` of the mask words).
    pub const MASKED: u32 = 2;
}

/// A batch's rows and the arrays their ranges point into.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeviceSamplingPlan {
    pub rows: Vec<DeviceSampleRow>,
    pub bias_ids: Vec<u32>,
    pub bias_values: Vec<f32>,
    pub banned_ids: Vec<u32>,
    /// Distinct ids of the history (prompt and output) that are inside the vocabulary.
    pub penalty_ids: Vec<u32>,
    /// How often each of `penalty_ids` occurs in the output.
    pub penalty_counts: Vec<u32>,
    /// Grammar masks, one bit per token id (set = allowed); ids past a row's words are refused.
    pub mask_words: Vec<u32>,
    /// The largest `num_logprobs` of any row: the stride of the top-logprob outputs.
    pub max_logprobs: usize,
}

impl DeviceSamplingPlan {
    /// Flattens `requests` for a vocabulary of `vocab` ids.
    pub fn build<'a>(
        requests: impl IntoIterator<Item = &'a SampleRequest>,
        vocab: usize,
    ) -> Result<Self, SampleError> {
        if vocab == 0 {
            return Err(SampleError::EmptyLogits);
        }
        let mut plan = Self::default();
        for req in requests {
            plan.push(req, vocab)?;
        }
        Ok(plan)
    }

    /// Whether every row is a plain argmax (no mask, bias, bans, penalties or logprobs), which
    /// the kernel answers with one read of the logits.
    pub fn all_plain_greedy(&self) -> bool {
        self.rows.iter().all(|r| {
            r.flags == DeviceSampleRow::GREEDY
                && r.num_logprobs < 0
                && r.bias_start == r.bias_end
                && r.banned_start == r.banned_end
                && r.penalty_start == r.penalty_end
        })
    }

    /// The rows as the kernel reads them: each record's fields in order, little-endian, 80
    /// bytes a row.
    pub fn row_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.rows.len() * std::mem::size_of::<DeviceSampleRow>());
        for r in &self.rows {
            out.extend_from_slice(&r.uniform.to_le_bytes());
            for f in [
                r.temperature,
                r.top_p,
                r.score_floor,
                r.repetition_penalty,
                r.presence_penalty,
                r.frequency_penalty,
            ] {
                out.extend_from_slice(&f.to_le_bytes());
            }
            out.extend_from_slice(&r.top_k.to_le_bytes());
            out.extend_from_slice(&r.num_logprobs.to_le_bytes());
            for u in [
                r.bias_start,
                r.bias_end,
                r.banned_start,
                r.banned_end,
                r.penalty_start,
                r.penalty_end,
                r.mask_start,
                r.mask_len,
                r.flags,
                r.reserved,
            ] {
                out.extend_from_slice(&u.to_le_bytes());
            }
        }
        out
    }

    fn push(&mut self, req: &SampleRequest, vocab: usize) -> Result<(), SampleError> {
        let p = &*req.params;
        let len = |v: usize| u32::try_from(v).expect("device sampling arrays beyond 2^32 entries");
        let mut row = DeviceSampleRow {
            uniform: uniform(req.seed, req.output_index as u64),
            temperature: p.temperature,
            top_p: p.top_p,
            score_floor: if p.min_p > 0.0 { p.min_p.ln() } else { f32::NEG_INFINITY },
            repetition_penalty: p.repetition_penalty,
            presence_penalty: p.presence_penalty,
            frequency_penalty: p.frequency_penalty,
            top_k: u32::try_from(p.top_k).unwrap_or(u32::MAX),
            num_logprobs: p.logprobs.map_or(-1, |k| k.min(vocab) as i32),
            flags: if p.is_greedy() { DeviceSampleRow::GREEDY } else { 0 },
            ..Default::default()
        };
        row.bias_start = len(self.bias_ids.len());
        // Sorted by id so a plan does not depend on the map's iteration order.
        let mut bias: Vec<(u32, f32)> =
            p.logit_bias.iter().filter(|(&id, _)| (id as usize) < vocab).map(|(&id, &b)| (id, b)).collect();
        bias.sort_unstable_by_key(|&(id, _)| id);
        for (id, b) in bias {
            self.bias_ids.push(id);
            self.bias_values.push(b);
        }
        row.bias_end = len(self.bias_ids.len());
        row.banned_start = len(self.banned_ids.len());
        self.banned_ids.extend(req.banned_token_ids.iter().copied().filter(|&id| (id as usize) < vocab));
        row.banned_end = len(self.banned_ids.len());
        row.penalty_start = len(self.penalty_ids.len());
        if p.needs_history() {
            if let Some(history) = &req.history {
                self.push_penalty_entries(history, req.prompt_len, vocab);
            }
        }
        row.penalty_end = len(self.penalty_ids.len());
        if let Some(slot) = &req.allowed {
            let words =
                slot.with_mask(|mask| mask.words().to_vec()).map_err(|e| SampleError::Constraint(e.0))?;
            row.mask_start = len(self.mask_words.len());
            row.mask_len = len(words.len());
            row.flags |= DeviceSampleRow::MASKED;
            self.mask_words.extend(words);
        }
        if row.num_logprobs >= 0 {
            self.max_logprobs = self.max_logprobs.max(row.num_logprobs as usize);
        }
        self.rows.push(row);
        Ok(())
    }

    /// Each distinct in-vocabulary id of `history`, with its count in the output part.
    fn push_penalty_entries(&mut self, history: &[u32], prompt_len: usize, vocab: usize) {
        let prompt_len = prompt_len.min(history.len());
        let mut ids: Vec<(u32, bool)> = history
            .iter()
            .enumerate()
            .filter(|&(_, &t)| (t as usize) < vocab)
            .map(|(i, &t)| (t, i >= prompt_len))
            .collect();
        ids.sort_unstable_by_key(|&(t, _)| t);
        for run in ids.chunk_by(|a, b| a.0 == b.0) {
            self.penalty_ids.push(run[0].0);
            self.penalty_counts.push(run.iter().filter(|e| e.1).count() as u32);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Arc;

    use super::*;
    use crate::constraint::{MaskSlot, TokenMask};
    use crate::sampling::SamplingParams;

    #[test]
    fn row_layout_matches_the_kernel() {
        // kernels/sampling.cu reads these offsets.
        assert_eq!(std::mem::size_of::<DeviceSampleRow>(), 80);
        assert_eq!(std::mem::offset_of!(DeviceSampleRow, temperature), 8);
        assert_eq!(std::mem::offset_of!(DeviceSampleRow, top_k), 32);
        assert_eq!(std::mem::offset_of!(DeviceSampleRow, bias_start), 40);
        assert_eq!(std::mem::offset_of!(DeviceSampleRow, mask_start), 64);
        assert_eq!(std::mem::offset_of!(DeviceSampleRow, flags), 72);
        let row = DeviceSampleRow { uniform: 0.5, top_k: 7, mask_start: 9, flags: 3, ..Default::default() };
        let plan = DeviceSamplingPlan { rows: vec![row, row], ..Default::default() };
        let bytes = plan.row_bytes();
        assert_eq!(bytes.len(), 160);
        let word = |at: usize| u32::from_le_bytes(bytes[80 + at..84 + at].try_into().unwrap());
        assert_eq!(f64::from_le_bytes(bytes[80..88].try_into().unwrap()), 0.5);
        assert_eq!((word(32), word(64), word(72)), (7, 9, 3));
    }

    #[test]
    fn plan_flattens_what_the_cpu_sampler_decides() {
        let params = SamplingParams {
            temperature: 0.7,
            min_p: 0.1,
            top_k: 5,
            frequency_penalty: 0.5,
            logit_bias: HashMap::from([(9, 1.0), (2, -1.0), (500, 3.0)]),
            logprobs: Some(3),
            ..Default::default()
        };
        let slot = MaskSlot::new();
        let mut mask = TokenMask::new(40);
        mask.allow(4);
        slot.fill(Ok(mask));
        let req = SampleRequest {
            params: Arc::new(params),
            seed: 11,
            output_index: 4,
            history: Some(Arc::from(vec![7, 3, 7, 3, 3, 900].as_slice())),
            prompt_len: 2,
            banned_token_ids: vec![1, 600],
            allowed: Some(slot),
            draft_masks: Vec::new(),
            draft_grammar: None,
        };
        let plan = DeviceSamplingPlan::build([&req, &SampleRequest::greedy()], 40).unwrap();
        let row = plan.rows[0];
        assert_eq!(row.uniform, uniform(11, 4));
        assert_eq!(row.score_floor, 0.1f32.ln());
        assert_eq!((row.top_k, row.num_logprobs, row.flags), (5, 3, DeviceSampleRow::MASKED));
        assert_eq!(
            (plan.bias_ids.as_slice(), plan.bias_values.as_slice()),
            ([2, 9].as_slice(), [-1.0, 1.0].as_slice())
        );
        assert_eq!(plan.banned_ids, vec![1]);
        // 3 twice and 7 once in the output (positions 2..), 900 outside the vocabulary.
        assert_eq!(
            (plan.penalty_ids.as_slice(), plan.penalty_counts.as_slice()),
            ([3, 7].as_slice(), [2, 1].as_slice())
        );
        assert_eq!((row.mask_start, row.mask_len), (0, 2));
        assert_eq!(plan.mask_words, vec![1 << 4, 0]);
        assert_eq!(plan.max_logprobs, 3);
        let greedy = plan.rows[1];
        assert_eq!(greedy.flags, DeviceSampleRow::GREEDY);
        assert_eq!((greedy.bias_start, greedy.bias_end, greedy.num_logprobs), (2, 2, -1));
        assert!(!plan.all_plain_greedy());
        assert!(DeviceSamplingPlan::build([&SampleRequest::greedy()], 40).unwrap().all_plain_greedy());
        assert_eq!(DeviceSamplingPlan::build([&req], 0), Err(SampleError::EmptyLogits));
    }
}

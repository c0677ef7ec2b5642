//! The CPU attention's running softmax state per query row, and how the key splits of a query
//! are folded into it (see [`crate::attention_plan::KEY_SPLIT`]).
//!
//! Each split is softmaxed on its own (its max, its sum of exponentials, its unnormalized
//! `P V`); a query folds its splits strictly in key order, with one function, whether the splits
//! came from one work item or from several run on different threads. So the plan may split the
//! keys of a long decode over the threads without changing a bit of any query.

use crate::attention_plan::Item;
use crate::simd::scale;

/// Softmax state of an item's query rows: per row the max score, the sum of exponentials
/// relative to it, and the unnormalized output (`head_dim` values per row).
pub(crate) struct RowStates {
    pub max: Vec<f32>,
    pub sum: Vec<f32>,
    pub out: Vec<f32>,
}

impl RowStates {
    /// `rows` rows that have seen no key yet.
    pub(crate) fn empty(rows: usize, head_dim: usize) -> Self {
        Self { max: vec![f32::NEG_INFINITY; rows], sum: vec![0.0; rows], out: vec![0.0; rows * head_dim] }
    }

    /// Folds one split's rows (`max`, `sum`, `out`, same layout) into these, after every split
    /// folded so far.
    pub(crate) fn fold(&mut self, max: &[f32], sum: &[f32], out: &[f32]) {
        let hd = if self.max.is_empty() { 0 } else { self.out.len() / self.max.len() };
        for (r, (&m, &s)) in max.iter().zip(sum).enumerate() {
            fold_row(
                &mut self.max[r],
                &mut self.sum[r],
                &mut self.out[r * hd..(r + 1) * hd],
                m,
                s,
                &out[r * hd..(r + 1) * hd],
            );
        }
    }
}

/// One row: a split that saw no key leaves the state as it is; the first one that did becomes
/// the state; later ones are rescaled to the larger max and added.
#[inline]
fn fold_row(
    max: &mut f32,
    sum: &mut f32,
    out: &mut [f32],
    split_max: f32,
    split_sum: f32,
    split_out: &[f32],
) {
    if split_max == f32::NEG_INFINITY {
        return;
    }
    if *max == f32::NEG_INFINITY {
        *max = split_max;
        *sum = split_sum;
        out.copy_from_slice(split_out);
        return;
    }
    let new_max = max.max(split_max);
    let (a, b) = ((*max - new_max).exp(), (split_max - new_max).exp());
    *sum = *sum * a + split_sum * b;
    for (o, s) in out.iter_mut().zip(split_out) {
        *o = *o * a + *s * b;
    }
    *max = new_max;
}

/// Folds the items of each (sequence, kv heads, token tile) in key order, normalizes every row
/// (times `v_scale`) and writes it into `output`, `[num_tokens, q_heads, head_dim]`.
/// `query_start(seq)` is the sequence's first row in `output`.
pub(crate) fn gather(
    mut results: Vec<(Item, RowStates)>,
    output: &mut [f32],
    q_heads: usize,
    group: usize,
    head_dim: usize,
    v_scale: f32,
    query_start: impl Fn(usize) -> usize,
) {
    results.sort_by_key(|(it, _)| (it.seq, it.kv0, it.t0, it.s0));
    let mut results = results.into_iter().peekable();
    while let Some((item, mut state)) = results.next() {
        while let Some((_, next)) =
            results.next_if(|(next, _)| (next.seq, next.kv0, next.t0) == (item.seq, item.kv0, item.t0))
        {
            state.fold(&next.max, &next.sum, &next.out);
        }
        for (r, s) in state.sum.iter().enumerate() {
            // Every row sees at least its own position, so the sum is positive.
            scale(&mut state.out[r * head_dim..(r + 1) * head_dim], v_scale / s);
        }
        let width = (item.kv1 - item.kv0) * group * head_dim;
        for (ti, rows) in state.out.chunks_exact(width).enumerate() {
            let dst = ((query_start(item.seq) + item.t0 + ti) * q_heads + item.kv0 * group) * head_dim;
            output[dst..dst + width].copy_from_slice(rows);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Folding splits gives the softmax-weighted sum of all keys, and a split that saw nothing
    /// changes no bit.
    #[test]
    fn folded_splits_equal_one_softmax() {
        let scores = [0.3f32, -1.2, 2.5, 0.0, 1.1, -0.4];
        let values = [1.0f32, 2.0, -1.0, 0.5, 3.0, -2.0];
        let split = |keys: std::ops::Range<usize>| {
            let m = keys.clone().map(|j| scores[j]).fold(f32::NEG_INFINITY, f32::max);
            let s: f32 = keys.clone().map(|j| (scores[j] - m).exp()).sum();
            let o: f32 = keys.map(|j| (scores[j] - m).exp() * values[j]).sum();
            (m, s, o)
        };
        let mut state = RowStates::empty(1, 1);
        for keys in [0..2, 2..2, 2..5, 5..6] {
            let (m, s, o) = split(keys);
            state.fold(&[m], &[s], &[o]);
        }
        let total: f64 = scores.iter().map(|&x| (x as f64).exp()).sum();
        let want: f64 =
            scores.iter().zip(values).map(|(&x, v)| (x as f64).exp() * v as f64).sum::<f64>() / total;
        let got = state.out[0] / state.sum[0];
        assert!((got as f64 - want).abs() < 1e-6, "{got} vs {want}");

        let before = (state.max[0].to_bits(), state.sum[0].to_bits(), state.out[0].to_bits());
        state.fold(&[f32::NEG_INFINITY], &[0.0], &[0.0]);
        assert_eq!(before, (state.max[0].to_bits(), state.sum[0].to_bits(), state.out[0].to_bits()));
    }
}

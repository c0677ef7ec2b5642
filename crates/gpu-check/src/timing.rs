//! Arithmetic of the timing section: how many bytes a paged decode attention must read, how
//! many FLOPs a causal attention does, and robust summaries of repeated measurements.

/// Median of `samples` (sorted in place); 0 for none.
pub fn median(samples: &mut [f64]) -> f64 {
    if samples.is_empty() {
        return 0.0;
    }
    samples.sort_by(|a, b| a.total_cmp(b));
    let mid = samples.len() / 2;
    if samples.len() % 2 == 1 {
        samples[mid]
    } else {
        (samples[mid - 1] + samples[mid]) / 2.0
    }
}

/// Shape of one attention call being timed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionShape {
    pub batch: usize,
    /// New tokens per sequence (1 for decode).
    pub q_len: usize,
    /// Context per sequence after the step.
    pub context: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub dtype_bytes: usize,
}

impl AttentionShape {
    /// Bytes a paged attention call must move at least: every cached K and V row once, the
    /// queries once and the output once.
    pub fn min_bytes(&self) -> f64 {
        let kv = 2 * self.batch * self.context * self.kv_heads * self.head_dim;
        let q_and_out = 2 * self.batch * self.q_len * self.q_heads * self.head_dim;
        ((kv + q_and_out) * self.dtype_bytes) as f64
    }

    /// FLOPs of causal attention: each query at position p scores p + 1 keys (2 * head_dim
    /// FLOPs each) and sums as many value rows (2 * head_dim more).
    pub fn causal_flops(&self) -> f64 {
        let first = self.context - self.q_len;
        // Sum of (p + 1) for p in first..context.
        let visible: f64 = (first + 1..=self.context).map(|k| k as f64).sum();
        4.0 * self.head_dim as f64 * self.q_heads as f64 * self.batch as f64 * visible
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(&mut []), 0.0);
    }

    #[test]
    fn decode_bytes_are_dominated_by_the_cache() {
        // Llama-3.1-8B decode, batch 64 x 4k, bf16: 64 * 4096 * 8 * 128 * 2 (K, V) * 2 bytes.
        let s = AttentionShape {
            batch: 64,
            q_len: 1,
            context: 4096,
            q_heads: 32,
            kv_heads: 8,
            head_dim: 128,
            dtype_bytes: 2,
        };
        let cache = 64.0 * 4096.0 * 8.0 * 128.0 * 4.0;
        assert_eq!(s.min_bytes(), cache + 2.0 * 64.0 * 32.0 * 128.0 * 2.0);
    }

    #[test]
    fn causal_flops_count_the_triangle() {
        let s = AttentionShape {
            batch: 1,
            q_len: 4,
            context: 4,
            q_heads: 1,
            kv_heads: 1,
            head_dim: 1,
            dtype_bytes: 2,
        };
        assert_eq!(s.causal_flops(), 4.0 * (1 + 2 + 3 + 4) as f64);
        // A chunk on a cached prefix sees the prefix too.
        let s = AttentionShape { q_len: 2, context: 10, ..s };
        assert_eq!(s.causal_flops(), 4.0 * (9 + 10) as f64);
        // 4k prefill, 32 heads of 128: about 2 * L^2 * D * H.
        let s = AttentionShape {
            batch: 1,
            q_len: 4096,
            context: 4096,
            q_heads: 32,
            kv_heads: 8,
            head_dim: 128,
            dtype_bytes: 2,
        };
        let approx = 2.0 * 4096f64.powi(2) * 128.0 * 32.0;
        assert!((s.causal_flops() / approx - 1.0).abs() < 1e-3);
    }
}

//! Stateless 64-bit mixing (the splitmix64 finalizer), shared by everything in the engine that
//! needs a reproducible pseudo-random number or hash: prefix-cache block hashes, per-sample seeds
//! and the sampler's draws.
//!
//! Nothing here keeps state: a value depends only on its inputs, which is what makes a sampled
//! token independent of batch composition and of preemption.

const GOLDEN_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// The splitmix64 output function: a bijection on `u64` with good avalanche.
#[inline]
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Mixes `value` into `state`; order-sensitive, so it can chain a sequence of values.
#[inline]
pub fn combine(state: u64, value: u64) -> u64 {
    mix64(state.wrapping_add(GOLDEN_GAMMA) ^ mix64(value.wrapping_add(GOLDEN_GAMMA)))
}

/// Seed of sample `index` of a request seeded with `request_seed`, so the `n` samples of one
/// request draw independently but reproducibly.
#[inline]
pub fn sample_seed(request_seed: u64, index: usize) -> u64 {
    combine(request_seed, index as u64)
}

/// The `counter`-th uniform draw in `[0, 1)` of the stream named by `seed`.
#[inline]
pub fn uniform(seed: u64, counter: u64) -> f64 {
    // 53 random bits fill an f64 mantissa exactly.
    (combine(seed, counter) >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_is_in_range_and_roughly_flat() {
        let mut buckets = [0usize; 10];
        let draws = 100_000;
        for i in 0..draws {
            let u = uniform(42, i);
            assert!((0.0..1.0).contains(&u));
            buckets[(u * 10.0) as usize] += 1;
        }
        for b in buckets {
            let share = b as f64 / draws as f64;
            assert!((share - 0.1).abs() < 0.01, "bucket share {share}");
        }
    }

    #[test]
    fn draws_depend_only_on_inputs() {
        assert_eq!(uniform(7, 3), uniform(7, 3));
        assert_ne!(uniform(7, 3), uniform(7, 4));
        assert_ne!(uniform(7, 3), uniform(8, 3));
        assert_ne!(sample_seed(1, 0), sample_seed(1, 1));
    }

    #[test]
    fn combine_is_order_sensitive() {
        assert_ne!(combine(combine(0, 1), 2), combine(combine(0, 2), 1));
    }
}

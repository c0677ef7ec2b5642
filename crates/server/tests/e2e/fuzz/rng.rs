//! The fuzz suite's random numbers: SplitMix64, seeded per case, so that every case is a pure
//! function of `(seed, index)` on every machine.

use serde_json::{json, Value};

/// SplitMix64: tiny, and the same sequence everywhere.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// The generator of case `index` under `seed`.
    pub fn for_case(seed: u64, index: usize) -> Rng {
        let mut rng = Rng(seed ^ (index as u64).wrapping_mul(0xA076_1D64_78BD_642F));
        rng.next_u64();
        rng
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: i64, hi: i64) -> i64 {
        lo + self.below((hi - lo + 1) as u64) as i64
    }

    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }

    /// One of `items`, each as likely as its weight.
    pub fn weighted<T: Copy>(&mut self, items: &[(T, u64)]) -> T {
        let mut slot = self.below(items.iter().map(|(_, w)| w).sum());
        for &(item, weight) in items {
            if slot < weight {
                return item;
            }
            slot -= weight;
        }
        unreachable!("the slot is below the total weight")
    }

    /// A number with two decimals in `[lo, hi]` (hundredths).
    pub fn hundredths(&mut self, lo: i64, hi: i64) -> Value {
        json!(self.range(lo, hi) as f64 / 100.0)
    }
}

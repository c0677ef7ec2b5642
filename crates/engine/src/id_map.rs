//! `HashMap`s keyed by sequence and request ids with a cheap multiplicative hash: the scheduler
//! looks ids up several times per sequence per step, and SipHash's DoS resistance buys nothing
//! for ids the engine assigns or the server generates.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Fibonacci hashing of one `u64` (the only thing these maps hash).
#[derive(Debug, Default, Clone, Copy)]
pub struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Not used by u64 keys; kept correct for any other key type.
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_u64(&mut self, n: u64) {
        // The high bits of the product are well mixed; hashbrown uses the top 7 bits as tags and
        // the low bits as the bucket index, so fold them down.
        let p = (self.0 ^ n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = p ^ (p >> 32);
    }
}

pub type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequential_ids_spread_over_buckets() {
        let mut low = std::collections::HashSet::new();
        for id in 0u64..1024 {
            let mut h = IdHasher::default();
            h.write_u64(id);
            low.insert(h.finish() & 1023);
        }
        assert!(low.len() > 600, "only {} distinct low-bit buckets", low.len());
        let mut m: IdMap<u64, u64> = IdMap::default();
        for i in 0..1000 {
            m.insert(i, i * 2);
        }
        assert!((0..1000).all(|i| m[&i] == i * 2));
    }
}

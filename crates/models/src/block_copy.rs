//! Copy-on-write of KV pages: copies pages `src -> dst` of a cache tensor (dimension 0 is the
//! page) touching those pages alone, so that a fork costs what its pages cost, whatever the
//! size of the cache.
//!
//! A request forking into `n` samples copies its shared partial last page once per sample, into
//! pages the pool hands out one after another; a beam search copies a few scattered pages. So
//! the pairs of a step are grouped into runs of consecutive destinations, each either from
//! consecutive sources or all from one source, and a run costs a few copies whatever its length
//! (on a GPU every copy is a launch). Only contiguous copies and `slice_set` are used: candle
//! copies every dtype that way on every device (its strided CUDA copy lacks f8e4m3).
//!
//! Every source page is read before any page is written, which is what copying the pairs one by
//! one gives unless a pair reads a page that an earlier pair wrote; such a list (the block
//! manager never makes one: a page copied into is fresh, so nobody shares it in that step) is
//! copied pair by pair.

use std::collections::HashSet;

use candle_core::{Result, Tensor};

/// Pages `dst..dst + len` take pages `src..src + len`, or page `src` each when `repeat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Run {
    src: usize,
    dst: usize,
    len: usize,
    repeat: bool,
}

/// How to carry out a list of page copies on each cache tensor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum BlockCopyPlan {
    Runs(Vec<Run>),
    /// Pair by pair, in the given order (some pair reads a page an earlier one writes).
    InOrder(Vec<(usize, usize)>),
}

impl BlockCopyPlan {
    pub(crate) fn new(pairs: &[(u32, u32)]) -> Self {
        let pairs: Vec<(usize, usize)> = pairs.iter().map(|&(s, d)| (s as usize, d as usize)).collect();
        let mut written = HashSet::with_capacity(pairs.len());
        let reads_a_write = pairs.iter().any(|&(src, dst)| {
            let hit = written.contains(&src);
            written.insert(dst);
            hit
        });
        if reads_a_write {
            return Self::InOrder(pairs);
        }
        let mut sorted = pairs;
        // Stable: of two pairs writing one page, the later is still written last.
        sorted.sort_by_key(|&(_, dst)| dst);
        let mut runs: Vec<Run> = Vec::new();
        for (src, dst) in sorted {
            if let Some(r) = runs.last_mut() {
                if dst == r.dst + r.len {
                    let same = src == r.src && (r.len == 1 || r.repeat);
                    let next = src == r.src + r.len && !r.repeat;
                    if same || next {
                        r.repeat = same;
                        r.len += 1;
                        continue;
                    }
                }
            }
            runs.push(Run { src, dst, len: 1, repeat: false });
        }
        Self::Runs(runs)
    }

    /// Copies the pages of `cache` (contiguous, pages along dimension 0).
    pub(crate) fn apply(&self, cache: &Tensor) -> Result<()> {
        match self {
            Self::InOrder(pairs) => {
                for &(src, dst) in pairs {
                    cache.slice_set(&cache.narrow(0, src, 1)?.force_contiguous()?, 0, dst)?;
                }
            }
            Self::Runs(runs) => {
                // The sources first: one page for a repeated one, the whole range otherwise.
                let sources = runs
                    .iter()
                    .map(|r| cache.narrow(0, r.src, if r.repeat { 1 } else { r.len })?.force_contiguous())
                    .collect::<Result<Vec<_>>>()?;
                for (r, source) in runs.iter().zip(sources) {
                    cache.slice_set(&source, 0, r.dst)?;
                    // A repeated page is doubled from what this run has written so far.
                    let mut done = if r.repeat { 1 } else { r.len };
                    while done < r.len {
                        let k = done.min(r.len - done);
                        cache.slice_set(&cache.narrow(0, r.dst, k)?.force_contiguous()?, 0, r.dst + done)?;
                        done += k;
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};

    fn run(src: usize, dst: usize, len: usize, repeat: bool) -> Run {
        Run { src, dst, len, repeat }
    }

    #[test]
    fn a_fork_is_one_repeated_run_and_scattered_pairs_stay_apart() {
        let fork: Vec<(u32, u32)> = (0..63).map(|i| (7, 100 + i)).collect();
        assert_eq!(BlockCopyPlan::new(&fork), BlockCopyPlan::Runs(vec![run(7, 100, 63, true)]));
        let moved = [(12, 40), (10, 38), (11, 39), (3, 9), (5, 20)];
        assert_eq!(
            BlockCopyPlan::new(&moved),
            BlockCopyPlan::Runs(vec![run(3, 9, 1, false), run(5, 20, 1, false), run(10, 38, 3, false)])
        );
        // A repeated source then another: two runs.
        let mixed = [(4, 1), (4, 2), (5, 3), (6, 4)];
        assert_eq!(
            BlockCopyPlan::new(&mixed),
            BlockCopyPlan::Runs(vec![run(4, 1, 2, true), run(5, 3, 2, false)])
        );
        // Page 2 is written, then read: pair by pair.
        assert_eq!(BlockCopyPlan::new(&[(1, 2), (2, 3)]), BlockCopyPlan::InOrder(vec![(1, 2), (2, 3)]));
        assert_eq!(BlockCopyPlan::new(&[]), BlockCopyPlan::Runs(vec![]));
    }

    /// Page `b` of a fresh test tensor holds `b` in every element.
    fn pages(num: usize, dtype: DType) -> Tensor {
        let values: Vec<f32> = (0..num).flat_map(|b| [b as f32; 6]).collect();
        Tensor::from_vec(values, (num, 2, 3), &Device::Cpu).unwrap().to_dtype(dtype).unwrap()
    }

    fn page_values(t: &Tensor) -> Vec<Vec<f32>> {
        t.to_dtype(DType::F32).unwrap().flatten_from(1).unwrap().to_vec2().unwrap()
    }

    #[test]
    fn copies_as_if_pair_by_pair_and_leaves_other_pages_alone() {
        let lists: [&[(u32, u32)]; 6] = [
            &[(3, 20), (3, 21), (3, 22), (3, 23), (3, 24), (3, 25), (3, 26)],
            &[(9, 30), (10, 31), (11, 32), (1, 5)],
            &[(2, 8), (2, 8), (6, 8)],
            &[(5, 6), (6, 7), (7, 8)],
            &[(8, 2), (2, 8)],
            &[(0, 39), (39, 0), (17, 16), (16, 17), (4, 12), (4, 13), (5, 14)],
        ];
        for dtype in [DType::F32, DType::BF16, DType::F8E4M3] {
            for pairs in lists {
                let t = pages(40, dtype);
                let mut want = page_values(&t);
                for &(s, d) in pairs {
                    want[d as usize] = want[s as usize].clone();
                }
                BlockCopyPlan::new(pairs).apply(&t).unwrap();
                assert_eq!(page_values(&t), want, "{dtype:?} {pairs:?}");
            }
        }
    }
}

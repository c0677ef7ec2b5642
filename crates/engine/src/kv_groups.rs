//! KV cache groups: how the block manager sees a model whose layers do not all attend to the
//! whole context.
//!
//! The executor splits its layers into groups of equal layer count (full-attention layers in
//! some, sliding-window layers in others) that share one pool of equal-sized pages: a page holds
//! `block_size` tokens of K and V for one group's layers. Every sequence has one block table per
//! group. A windowed group only keeps the pages its future queries can see; earlier entries
//! become [`NULL_BLOCK`], which the attention kernel never reads. With no windowed layers there is
//! one full group and everything is as with a single block table.

/// Block-table entry of a page released (or never allocated) because no future query of the
/// sequence can see it. The same value as `pagoda_ops::NULL_BLOCK`.
pub const NULL_BLOCK: u32 = u32::MAX;

/// Why a group layout cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KvGroupsError {
    #[error("a KV cache needs at least one group")]
    NoGroups,
    #[error("KV group {0} has a sliding window of 0 positions")]
    ZeroWindow(usize),
}

/// The sliding window of each KV group (`None`: full attention), in group order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvGroups {
    windows: Vec<Option<usize>>,
}

impl Default for KvGroups {
    fn default() -> Self {
        Self::single()
    }
}

impl KvGroups {
    /// One full-attention group: every layer shares one block table.
    pub fn single() -> Self {
        Self { windows: vec![None] }
    }

    pub fn new(windows: Vec<Option<usize>>) -> Result<Self, KvGroupsError> {
        if windows.is_empty() {
            return Err(KvGroupsError::NoGroups);
        }
        if let Some(g) = windows.iter().position(|w| *w == Some(0)) {
            return Err(KvGroupsError::ZeroWindow(g));
        }
        Ok(Self { windows })
    }

    pub fn len(&self) -> usize {
        self.windows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.windows.is_empty()
    }

    pub fn windows(&self) -> &[Option<usize>] {
        &self.windows
    }

    pub fn window(&self, group: usize) -> Option<usize> {
        self.windows[group]
    }

    /// Whether some group frees pages outside its window.
    pub fn is_hybrid(&self) -> bool {
        self.windows.iter().any(Option::is_some)
    }

    /// First block that group `group` must hold for queries at positions `>= pos`: a query at
    /// `p` reads keys from `p + 1 - window` on, and later queries read no earlier ones.
    pub fn first_needed_block(&self, group: usize, pos: usize, block_size: usize) -> usize {
        match self.windows[group] {
            None => 0,
            Some(w) => (pos + 1).saturating_sub(w) / block_size,
        }
    }

    /// Most pages one sequence of up to `len` tokens holds at once, computed in steps of at most
    /// `chunk` tokens: all of its blocks in a full group, in a windowed group the window plus the
    /// step's tokens (and a block of misalignment at either end).
    pub fn max_pages_for_sequence(&self, len: usize, chunk: usize, block_size: usize) -> usize {
        let all = len.div_ceil(block_size);
        self.windows
            .iter()
            .map(|w| match w {
                None => all,
                Some(w) => ((w + chunk).div_ceil(block_size) + 1).min(all),
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windowed_groups_need_only_their_window() {
        let g = KvGroups::new(vec![None, Some(8), Some(8)]).unwrap();
        assert!(g.is_hybrid() && !KvGroups::single().is_hybrid());
        // A query at 20 reads keys 13..=20: blocks of 4 from 3 on.
        assert_eq!(g.first_needed_block(1, 20, 4), 3);
        assert_eq!(g.first_needed_block(0, 20, 4), 0);
        assert_eq!(g.first_needed_block(1, 5, 4), 0);
        // 100 tokens in blocks of 4, steps of 4: 25 + 2 * (3 + 1).
        assert_eq!(g.max_pages_for_sequence(100, 4, 4), 25 + 8);
        assert_eq!(KvGroups::single().max_pages_for_sequence(100, 4, 4), 25);
        assert_eq!(KvGroups::new(vec![]), Err(KvGroupsError::NoGroups));
        assert_eq!(KvGroups::new(vec![None, Some(0)]), Err(KvGroupsError::ZeroWindow(1)));
    }
}

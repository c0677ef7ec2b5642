//! Suffix decoding: proposals from a frequency trie of the outputs of recent requests, beside a
//! longest-match lookup in the sequence's own tokens. Agent loops, code edits and templated
//! answers repeat what earlier answers said; the trie finds the longest suffix of the current
//! sequence that occurred in them and proposes the most frequent continuation, for as long as
//! that continuation stays likely (its empirical probability above `min_token_prob`) and no
//! longer than `max_spec_factor` times the match it rests on.
//!
//! The trie holds every substring of up to `max_depth` tokens of the cached outputs with its
//! count, as first-child / next-sibling nodes (16 bytes each). It keeps the last
//! `max_cached_requests` outputs: once twice that many were added it is rebuilt from the newest
//! half, so eviction costs nothing per request.

use std::collections::VecDeque;

use super::ngram::NgramProposer;

const NONE: u32 = u32::MAX;

#[derive(Debug, Clone, Copy)]
struct Node {
    token: u32,
    count: u32,
    first_child: u32,
    next_sibling: u32,
}

/// Every substring of up to `max_depth` tokens of the inserted sequences, with counts.
#[derive(Debug, Clone)]
struct SuffixTrie {
    nodes: Vec<Node>,
    max_depth: usize,
}

impl SuffixTrie {
    fn new(max_depth: usize) -> Self {
        let root = Node { token: NONE, count: 0, first_child: NONE, next_sibling: NONE };
        Self { nodes: vec![root], max_depth }
    }

    fn child(&self, node: u32, token: u32) -> Option<u32> {
        let mut c = self.nodes[node as usize].first_child;
        while c != NONE {
            let n = &self.nodes[c as usize];
            if n.token == token {
                return Some(c);
            }
            c = n.next_sibling;
        }
        None
    }

    fn child_or_insert(&mut self, node: u32, token: u32) -> u32 {
        if let Some(c) = self.child(node, token) {
            return c;
        }
        let id = self.nodes.len() as u32;
        let next_sibling = self.nodes[node as usize].first_child;
        self.nodes.push(Node { token, count: 0, first_child: NONE, next_sibling });
        self.nodes[node as usize].first_child = id;
        id
    }

    fn insert(&mut self, tokens: &[u32]) {
        for start in 0..tokens.len() {
            let mut node = 0;
            self.nodes[0].count += 1;
            for &t in &tokens[start..(start + self.max_depth).min(tokens.len())] {
                node = self.child_or_insert(node, t);
                self.nodes[node as usize].count += 1;
            }
        }
    }

    /// The node of the longest suffix of `context` (at most `max_match` tokens) found in the
    /// trie, with its length.
    fn longest_match(&self, context: &[u32], max_match: usize) -> Option<(u32, usize)> {
        for m in (1..=max_match.min(context.len())).rev() {
            let mut node = 0;
            let found = context[context.len() - m..].iter().all(|&t| match self.child(node, t) {
                Some(c) => {
                    node = c;
                    true
                }
                None => false,
            });
            if found {
                return Some((node, m));
            }
        }
        None
    }

    /// Follows the most frequent child from `node` while the path's probability stays at least
    /// `min_prob`, appending at most `limit` tokens.
    fn continue_from(&self, mut node: u32, limit: usize, min_prob: f32, out: &mut Vec<u32>) {
        let mut prob = 1.0f32;
        for _ in 0..limit {
            let parent = self.nodes[node as usize];
            let (mut best, mut c) = (NONE, parent.first_child);
            while c != NONE {
                let n = &self.nodes[c as usize];
                if best == NONE || n.count > self.nodes[best as usize].count {
                    best = c;
                }
                c = n.next_sibling;
            }
            if best == NONE {
                return;
            }
            prob *= self.nodes[best as usize].count as f32 / parent.count.max(1) as f32;
            if prob < min_prob {
                return;
            }
            out.push(self.nodes[best as usize].token);
            node = best;
        }
    }
}

/// See the module docs.
#[derive(Debug, Clone)]
pub struct SuffixProposer {
    trie: SuffixTrie,
    outputs: VecDeque<Vec<u32>>,
    max_cached_requests: usize,
    max_spec_factor: f32,
    min_token_prob: f32,
    own: NgramProposer,
}

impl SuffixProposer {
    pub fn new(
        max_depth: usize,
        max_cached_requests: usize,
        max_spec_factor: f32,
        min_token_prob: f32,
    ) -> Self {
        let max_depth = max_depth.max(2);
        Self {
            trie: SuffixTrie::new(max_depth),
            outputs: VecDeque::new(),
            max_cached_requests,
            max_spec_factor,
            min_token_prob,
            // Matches in the sequence itself: at least two tokens, at most half the depth.
            own: NgramProposer::new(2, max_depth / 2),
        }
    }

    /// Adds a finished request's output to the cache.
    pub fn record_output(&mut self, output: &[u32]) {
        if self.max_cached_requests == 0 || output.is_empty() {
            return;
        }
        self.outputs.push_back(output.to_vec());
        self.trie.insert(output);
        if self.outputs.len() >= 2 * self.max_cached_requests {
            let drop = self.outputs.len() - self.max_cached_requests;
            self.outputs.drain(..drop);
            self.trie = SuffixTrie::new(self.trie.max_depth);
            for o in &self.outputs {
                self.trie.insert(o);
            }
        }
    }

    /// Appends up to `max_tokens` proposed continuations of `tokens`: from the cached outputs
    /// or from the sequence itself, whichever rests on the longer match.
    pub fn propose(&self, tokens: &[u32], max_tokens: usize, out: &mut Vec<u32>) {
        if max_tokens == 0 {
            return;
        }
        // Leave room below the depth limit for the continuation.
        let max_match = self.trie.max_depth / 2;
        let cached = self.trie.longest_match(tokens, max_match);
        let own = self.own.find(tokens);
        match (cached, own) {
            (Some((node, m)), _) if m > own.map_or(0, |(_, n)| n) => {
                let limit = max_tokens.min(((m as f32 * self.max_spec_factor).ceil() as usize).max(1));
                self.trie.continue_from(node, limit, self.min_token_prob, out);
            }
            (_, Some(found)) => NgramProposer::copy_after(tokens, found, max_tokens, out),
            _ => {}
        }
    }

    /// Cached outputs and trie nodes (for tests and logs).
    pub fn cache_size(&self) -> (usize, usize) {
        (self.outputs.len(), self.trie.nodes.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn propose(p: &SuffixProposer, tokens: &[u32], k: usize) -> Vec<u32> {
        let mut out = Vec::new();
        p.propose(tokens, k, &mut out);
        out
    }

    #[test]
    fn trie_counts_substrings_and_continues_with_the_most_frequent() {
        let mut t = SuffixTrie::new(4);
        t.insert(&[1, 2, 3, 4, 1, 2, 5]);
        t.insert(&[1, 2, 3, 9]);
        let (node, m) = t.longest_match(&[7, 1, 2], 3).unwrap();
        assert_eq!(m, 2);
        // "1 2" occurred 3 times: twice followed by 3, once by 5.
        assert_eq!(t.nodes[node as usize].count, 3);
        let mut out = Vec::new();
        t.continue_from(node, 4, 0.1, &mut out);
        // 3 (2/3), then 4 or 9 (1/2 each, so 1/3 in all), then the depth limit of 4.
        assert_eq!(out.len(), 2);
        assert_eq!(out[0], 3);
        out.clear();
        t.continue_from(node, 4, 0.5, &mut out);
        assert_eq!(out, vec![3], "the second token's path probability 1/3 is below 0.5");
        assert!(t.longest_match(&[8, 8], 3).is_none());
    }

    #[test]
    fn cached_outputs_propose_for_other_requests() {
        let mut p = SuffixProposer::new(16, 4, 1.0, 0.1);
        let answer: Vec<u32> = (100..120).collect();
        p.record_output(&answer);
        // A new request whose output has begun like the cached answer.
        let tokens = [5, 6, 7, 100, 101, 102, 103];
        assert_eq!(propose(&p, &tokens, 4), vec![104, 105, 106, 107]);
        // max_spec_factor 1: a 2-token match proposes at most 2.
        assert_eq!(propose(&p, &[9, 9, 110, 111], 8), vec![112, 113]);
        // Nothing cached matches and the sequence never repeats: no proposal.
        assert!(propose(&p, &[1, 2, 3, 4], 4).is_empty());
    }

    #[test]
    fn the_sequence_itself_wins_on_a_longer_match() {
        let mut p = SuffixProposer::new(16, 4, 1.0, 0.1);
        p.record_output(&[3, 4, 50, 51]);
        // The cache matches "3 4" (2 tokens); the sequence itself matches "2 3 4" (3 tokens).
        assert_eq!(propose(&p, &[2, 3, 4, 8, 9, 2, 3, 4], 2), vec![8, 9]);
        assert_eq!(propose(&p, &[7, 3, 4], 2), vec![50, 51]);
    }

    #[test]
    fn the_cache_keeps_the_newest_outputs() {
        let mut p = SuffixProposer::new(8, 2, 2.0, 0.0);
        for i in 0..5u32 {
            p.record_output(&[1000 + i, 1, 2, 3]);
        }
        // 4 outputs trigger a rebuild from the newest 2; the fifth is added after.
        assert_eq!(p.cache_size().0, 3);
        assert_eq!(propose(&p, &[9, 1004], 3), vec![1, 2]);
        assert!(propose(&p, &[9, 1000], 3).is_empty(), "evicted");
    }
}

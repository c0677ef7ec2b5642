//! Prompt-lookup proposals: the text a model is asked to summarise, rewrite or edit reappears in
//! its output, so the tokens that followed an earlier occurrence of the sequence's last few
//! tokens are a good guess at what comes next. Costs a scan of the sequence, no model.

/// See the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NgramProposer {
    min_n: usize,
    max_n: usize,
}

impl NgramProposer {
    /// Matches suffixes of `min_n..=max_n` tokens (longest first).
    pub fn new(min_n: usize, max_n: usize) -> Self {
        let min_n = min_n.max(1);
        Self { min_n, max_n: max_n.max(min_n) }
    }

    /// The most recent earlier occurrence of the longest suffix of `tokens` (within
    /// `min_n..=max_n`) with at least one token after it: its start and length.
    pub(crate) fn find(&self, tokens: &[u32]) -> Option<(usize, usize)> {
        let len = tokens.len();
        for n in (self.min_n..=self.max_n.min(len.saturating_sub(1))).rev() {
            let suffix = &tokens[len - n..];
            // An occurrence starting at `j` must leave at least one token after it before the
            // suffix itself begins to be useful; the most recent one is the most local guess.
            let last_start = len - n - 1;
            let found =
                (0..=last_start).rev().find(|&j| tokens[j] == suffix[0] && tokens[j..j + n] == *suffix);
            if let Some(j) = found {
                return Some((j, n));
            }
        }
        None
    }

    /// Appends to `out` the `max_tokens` tokens that followed the most recent earlier
    /// occurrence of the longest matching suffix of `tokens`; nothing when no suffix of at
    /// least `min_n` tokens occurs earlier. A continuation that runs into the end of `tokens`
    /// goes on with what it has proposed itself (as an overlapping LZ77 copy does), so a period
    /// of `p` tokens keeps proposing itself instead of stopping after `p`.
    pub fn propose(&self, tokens: &[u32], max_tokens: usize, out: &mut Vec<u32>) {
        if max_tokens == 0 {
            return;
        }
        if let Some(found) = self.find(tokens) {
            Self::copy_after(tokens, found, max_tokens, out);
        }
    }

    /// Appends the `max_tokens` tokens after the occurrence `(j, n)` that [`find`](Self::find)
    /// returned.
    pub(crate) fn copy_after(tokens: &[u32], (j, n): (usize, usize), max_tokens: usize, out: &mut Vec<u32>) {
        let len = tokens.len();
        let first = out.len();
        for from in j + n..j + n + max_tokens {
            // `from - len < from - (j + n)`: the proposal read here is already made.
            let t = if from < len { tokens[from] } else { out[first + from - len] };
            out.push(t);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn propose(p: &NgramProposer, tokens: &[u32], k: usize) -> Vec<u32> {
        let mut out = Vec::new();
        p.propose(tokens, k, &mut out);
        out
    }

    #[test]
    fn proposes_what_followed_the_most_recent_match() {
        let p = NgramProposer::new(2, 3);
        // "1 2" occurs at 0 and at 4; the later one is followed by 9 9.
        let tokens = [1, 2, 3, 4, 1, 2, 9, 9, 7, 1, 2];
        assert_eq!(propose(&p, &tokens, 3), vec![9, 9, 7]);
        // Past the end, the copy goes on with its own proposals: 9 9 7 1 2 9.
        assert_eq!(propose(&p, &tokens, 6), vec![9, 9, 7, 1, 2, 9]);
        assert_eq!(propose(&p, &tokens, 1), vec![9]);
        assert_eq!(propose(&p, &tokens, 0), Vec::<u32>::new());
    }

    #[test]
    fn longer_suffixes_win_and_short_ones_are_ignored() {
        let p = NgramProposer::new(2, 3);
        // "5 1 2" matches at 0 (followed by 3); "1 2" alone would match at 6 (followed by 8).
        let tokens = [5, 1, 2, 3, 0, 0, 1, 2, 8, 5, 1, 2];
        assert_eq!(propose(&p, &tokens, 2), vec![3, 0]);
        // Only the single last token repeats: below prompt_lookup_min.
        assert_eq!(propose(&p, &[7, 1, 8, 9, 1], 4), Vec::<u32>::new());
        assert_eq!(propose(&NgramProposer::new(1, 1), &[7, 1, 8, 9, 1], 4), vec![8, 9, 1, 8]);
    }

    #[test]
    fn continuations_past_the_end_repeat_the_period() {
        let p = NgramProposer::new(2, 4);
        // A run of one token: "4 4 4 4" matches one step back and copies itself on.
        assert_eq!(propose(&p, &[4, 4, 4, 4, 4], 5), vec![4; 5]);
        // Period 3: "1 2 3 1" matches three back; the copy continues the cycle.
        assert_eq!(propose(&p, &[9, 1, 2, 3, 1, 2, 3, 1], 7), vec![2, 3, 1, 2, 3, 1, 2]);
        assert_eq!(propose(&p, &[1, 2], 4), Vec::<u32>::new());
        assert_eq!(propose(&p, &[], 4), Vec::<u32>::new());
        assert_eq!(propose(&p, &[3], 4), Vec::<u32>::new());
    }
}

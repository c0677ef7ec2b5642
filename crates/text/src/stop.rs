//! Stop-string matching over streamed text.
//!
//! Generated text arrives in deltas whose boundaries have nothing to do with where a stop string
//! starts, so a stop string can be split across several deltas. [`StopMatcher`] releases text only
//! once no stop string can begin inside it, holds back the longest tail that is still a prefix of
//! some stop string, and on a match returns the text before the stop string and drops the rest.

/// What [`StopMatcher::push`] decided about the text seen so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StopOutcome {
    /// Text that is safe to send to the client now.
    pub emit: String,
    /// Index (into the list given to [`StopMatcher::new`]) of the stop string that matched.
    pub stopped: Option<usize>,
}

/// Finds the first occurrence of any of a set of stop strings in streamed text.
#[derive(Debug, Clone, Default)]
pub struct StopMatcher {
    /// `(index in the caller's list, stop string)`, empty strings left out.
    stops: Vec<(usize, String)>,
    /// Text received but not yet released: a tail that may still grow into a stop string.
    held: String,
    /// The stop string that matched, once one has.
    matched: Option<usize>,
}

impl StopMatcher {
    /// A matcher for `stops`. Empty strings are ignored (they would match everywhere); the indices
    /// reported in [`StopOutcome::stopped`] still refer to positions in `stops`.
    pub fn new(stops: Vec<String>) -> Self {
        let stops = stops.into_iter().enumerate().filter(|(_, s)| !s.is_empty()).collect();
        Self { stops, held: String::new(), matched: None }
    }

    /// Whether there is any stop string to look for.
    pub fn is_empty(&self) -> bool {
        self.stops.is_empty()
    }

    /// Whether a stop string has matched; once it has, every later push returns nothing to emit
    /// and reports the same index again.
    pub fn is_stopped(&self) -> bool {
        self.matched.is_some()
    }

    /// Feeds the next piece of generated text.
    pub fn push(&mut self, delta: &str) -> StopOutcome {
        if let Some(index) = self.matched {
            return StopOutcome { emit: String::new(), stopped: Some(index) };
        }
        if self.stops.is_empty() {
            return StopOutcome { emit: delta.to_owned(), stopped: None };
        }
        self.held.push_str(delta);

        // A match can only start inside `held`: everything released earlier was checked to hold
        // no prefix of any stop string that could still be completed.
        if let Some((start, index)) = self.earliest_match() {
            self.held.truncate(start);
            self.matched = Some(index);
            return StopOutcome { emit: std::mem::take(&mut self.held), stopped: Some(index) };
        }

        let keep = self.longest_partial_suffix();
        let emit = self.held[..self.held.len() - keep].to_owned();
        self.held.drain(..self.held.len() - keep);
        StopOutcome { emit, stopped: None }
    }

    /// Releases the held-back text when the sequence ends for a reason other than a stop string.
    /// Returns nothing once a stop string has matched.
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// `(byte offset in held, caller index)` of the leftmost occurrence of any stop string; on a
    /// tie the stop string listed first wins.
    fn earliest_match(&self) -> Option<(usize, usize)> {
        self.stops
            .iter()
            .filter_map(|(index, stop)| self.held.find(stop.as_str()).map(|pos| (pos, *index)))
            .min()
    }

    /// Length in bytes of the longest suffix of `held` that is a proper prefix of a stop string.
    fn longest_partial_suffix(&self) -> usize {
        let mut best = 0;
        for (_, stop) in &self.stops {
            // Only lengths on char boundaries of both strings can be equal byte sequences.
            let longest = (stop.len() - 1).min(self.held.len());
            for len in (best + 1..=longest).rev() {
                if !stop.is_char_boundary(len) {
                    continue;
                }
                if self.held.ends_with(&stop[..len]) {
                    best = len;
                    break;
                }
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matcher(stops: &[&str]) -> StopMatcher {
        StopMatcher::new(stops.iter().map(|s| s.to_string()).collect())
    }

    /// Feeds `deltas` and returns everything emitted plus the stop index, flushing at the end
    /// when no stop matched.
    fn run(m: &mut StopMatcher, deltas: &[&str]) -> (String, Option<usize>) {
        let mut out = String::new();
        for d in deltas {
            let o = m.push(d);
            out.push_str(&o.emit);
            if o.stopped.is_some() {
                return (out, o.stopped);
            }
        }
        out.push_str(&m.flush());
        (out, None)
    }

    #[test]
    fn no_stops_passes_text_through() {
        let mut m = matcher(&[]);
        assert!(m.is_empty());
        let o = m.push("hello");
        assert_eq!(o.emit, "hello");
        assert_eq!(o.stopped, None);
        assert_eq!(m.flush(), "");
    }

    #[test]
    fn stop_within_one_delta() {
        let mut m = matcher(&["END"]);
        let o = m.push("abcENDdef");
        assert_eq!(o.emit, "abc");
        assert_eq!(o.stopped, Some(0));
        assert!(m.is_stopped());
        assert_eq!(m.flush(), "");
    }

    #[test]
    fn stop_split_across_deltas() {
        let mut m = matcher(&["</end>"]);
        let a = m.push("hello </");
        assert_eq!(a.emit, "hello ");
        assert_eq!(a.stopped, None);
        let b = m.push("en");
        assert_eq!(b.emit, "");
        let c = m.push("d> trailing");
        assert_eq!(c.emit, "");
        assert_eq!(c.stopped, Some(0));
    }

    #[test]
    fn partial_prefix_released_when_it_diverges() {
        let mut m = matcher(&["STOP"]);
        assert_eq!(m.push("ab ST").emit, "ab ");
        assert_eq!(m.push("O").emit, "");
        let o = m.push("X and more");
        assert_eq!(o.emit, "STOX and more");
        assert_eq!(o.stopped, None);
    }

    #[test]
    fn held_text_returned_by_flush() {
        let mut m = matcher(&["STOP"]);
        assert_eq!(m.push("tail ST").emit, "tail ");
        assert_eq!(m.flush(), "ST");
        assert_eq!(m.flush(), "");
    }

    #[test]
    fn empty_stop_strings_are_ignored_and_indices_kept() {
        let mut m = matcher(&["", "xyz"]);
        assert!(!m.is_empty());
        let o = m.push("12xyz");
        assert_eq!(o.emit, "12");
        assert_eq!(o.stopped, Some(1));
    }

    #[test]
    fn earliest_match_wins_over_list_order() {
        let mut m = matcher(&["world", "lo"]);
        let o = m.push("hello world");
        assert_eq!(o.emit, "hel");
        assert_eq!(o.stopped, Some(1));
    }

    #[test]
    fn tie_on_start_prefers_first_listed() {
        let mut m = matcher(&["abc", "ab"]);
        // "ab" completes first while "abc" is still only a prefix: the match is reported as soon
        // as a full stop string is present.
        let o = m.push("xab");
        assert_eq!(o.emit, "x");
        assert_eq!(o.stopped, Some(1));
        let mut m = matcher(&["ab", "abc"]);
        let o = m.push("xabc");
        assert_eq!(o.stopped, Some(0));
    }

    #[test]
    fn overlapping_self_prefix() {
        // "aab" after "aaa...": the held tail must be the longest partial match, not the first.
        let mut m = matcher(&["aab"]);
        let (out, stop) = run(&mut m, &["a", "a", "a", "b", "zzz"]);
        assert_eq!(out, "a");
        assert_eq!(stop, Some(0));
    }

    #[test]
    fn multibyte_stop_strings_and_text() {
        let mut m = matcher(&["終わり", "🛑"]);
        let (out, stop) = run(&mut m, &["こんに", "ちは終", "わ", "り!"]);
        assert_eq!(out, "こんにちは");
        assert_eq!(stop, Some(0));

        let mut m = matcher(&["🛑"]);
        let (out, stop) = run(&mut m, &["é", "ü", "🛑x"]);
        assert_eq!(out, "éü");
        assert_eq!(stop, Some(0));
    }

    #[test]
    fn pushes_after_stop_emit_nothing() {
        let mut m = matcher(&["\n\n"]);
        let o = m.push("para\n");
        assert_eq!(o.emit, "para");
        let o = m.push("\nnext");
        assert_eq!(o.emit, "");
        assert_eq!(o.stopped, Some(0));
        let o = m.push("more");
        assert_eq!(o.emit, "");
        assert_eq!(o.stopped, Some(0));
    }

    #[test]
    fn concatenation_matches_reference_for_every_split() {
        // For every way of cutting the text into two deltas, the result must equal what a plain
        // search over the whole text gives.
        let text = "say: the end is near, the END.";
        let stops = ["END", "end is", "near,"];
        let first = stops.iter().enumerate().filter_map(|(i, s)| text.find(s).map(|p| (p, i))).min().unwrap();
        for cut in 0..=text.len() {
            let mut m = matcher(&stops);
            let (out, stop) = run(&mut m, &[&text[..cut], &text[cut..]]);
            assert_eq!(out, &text[..first.0], "cut at {cut}");
            assert_eq!(stop, Some(first.1), "cut at {cut}");
        }
    }

    #[test]
    fn no_match_releases_everything() {
        let text = "nothing to see here";
        for cut in 0..=text.len() {
            let mut m = matcher(&["xyz", "here!"]);
            let (out, stop) = run(&mut m, &[&text[..cut], &text[cut..]]);
            assert_eq!(out, text);
            assert_eq!(stop, None);
        }
    }
}

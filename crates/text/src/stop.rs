//! Stop-string matching over streamed text.
//!
//! Generated text arrives in deltas whose boundaries have nothing to do with where a stop string
//! starts, so a stop string can be split across several deltas. [`StopMatcher`] releases text only
//! once no stop string can begin inside it, holds back the longest tail that is still a prefix of
//! some stop string, and on a match returns the text before the stop string and drops the rest.
//!
//! A request's stop strings are compiled once into [`StopStrings`], an Aho-Corasick automaton that
//! all of the request's samples share. Each pushed byte costs one automaton step (amortized
//! constant) plus one visit per stop string ending there, so the cost of a token does not grow with
//! the total length of the stop strings, and what a matcher holds back is never longer than the
//! longest stop string.

use std::sync::Arc;

/// What [`StopMatcher::push`] decided about the text seen so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StopOutcome {
    /// Text that is safe to send to the client now.
    pub emit: String,
    /// Index (into the list given to [`StopStrings::new`]) of the stop string that matched.
    pub stopped: Option<usize>,
}

const ROOT: u32 = 0;

/// One state of the automaton: the text of the path from the root, `depth` bytes long.
#[derive(Debug, Default)]
struct Node {
    /// Sorted by byte.
    next: Vec<(u8, u32)>,
    /// The longest proper suffix of this node's text that is also a path from the root.
    fail: u32,
    depth: u32,
    /// The stop string that is exactly this node's text (the first listed, if repeated).
    terminal: Option<u32>,
    /// The nearest node on the fail chain (this one excluded) that is a stop string.
    dict: Option<u32>,
}

#[derive(Debug, Default)]
struct Compiled {
    strings: Vec<String>,
    nodes: Vec<Node>,
    total_bytes: usize,
    longest: usize,
}

/// A request's stop strings, compiled for matching; cheap to clone (shared).
#[derive(Clone, Default)]
pub struct StopStrings(Arc<Compiled>);

impl std::fmt::Debug for StopStrings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(&self.0.strings).finish()
    }
}

impl PartialEq for StopStrings {
    fn eq(&self, other: &Self) -> bool {
        self.0.strings == other.0.strings
    }
}

impl Eq for StopStrings {}

impl From<Vec<String>> for StopStrings {
    fn from(strings: Vec<String>) -> Self {
        Self::new(strings)
    }
}

impl StopStrings {
    /// Compiles `strings`. Empty strings are ignored (they would match everywhere); indices
    /// reported in [`StopOutcome::stopped`] still refer to positions in `strings`.
    pub fn new(strings: Vec<String>) -> Self {
        let mut nodes = vec![Node::default()];
        for (index, s) in strings.iter().enumerate() {
            if s.is_empty() {
                continue;
            }
            let mut at = ROOT;
            for &b in s.as_bytes() {
                at = match goto(&nodes, at, b) {
                    Some(n) => n,
                    None => {
                        let id = nodes.len() as u32;
                        let depth = nodes[at as usize].depth + 1;
                        nodes.push(Node { depth, ..Default::default() });
                        let next = &mut nodes[at as usize].next;
                        let pos = next.partition_point(|&(c, _)| c < b);
                        next.insert(pos, (b, id));
                        id
                    }
                };
            }
            nodes[at as usize].terminal.get_or_insert(index as u32);
        }
        // Fail and dictionary links, breadth first so that shallower nodes are done first.
        let mut queue = std::collections::VecDeque::from([ROOT]);
        while let Some(u) = queue.pop_front() {
            for i in 0..nodes[u as usize].next.len() {
                let (b, v) = nodes[u as usize].next[i];
                let fail = if u == ROOT {
                    ROOT
                } else {
                    let mut f = nodes[u as usize].fail;
                    loop {
                        if let Some(n) = goto(&nodes, f, b) {
                            break n;
                        }
                        if f == ROOT {
                            break ROOT;
                        }
                        f = nodes[f as usize].fail;
                    }
                };
                let f = &nodes[fail as usize];
                let dict = if f.terminal.is_some() { Some(fail) } else { f.dict };
                nodes[v as usize].fail = fail;
                nodes[v as usize].dict = dict;
                queue.push_back(v);
            }
        }
        let total_bytes = strings.iter().map(String::len).sum();
        let longest = strings.iter().map(String::len).max().unwrap_or(0);
        Self(Arc::new(Compiled { strings, nodes, total_bytes, longest }))
    }

    /// The strings as given.
    pub fn strings(&self) -> &[String] {
        &self.0.strings
    }

    /// The `index`-th string as given.
    pub fn get(&self, index: usize) -> Option<&str> {
        self.0.strings.get(index).map(String::as_str)
    }

    /// Whether there is no (non-empty) stop string to look for.
    pub fn is_empty(&self) -> bool {
        self.0.longest == 0
    }

    /// Sum of the strings' lengths in bytes.
    pub fn total_bytes(&self) -> usize {
        self.0.total_bytes
    }

    /// Length in bytes of the longest string.
    pub fn longest(&self) -> usize {
        self.0.longest
    }

    fn node(&self, id: u32) -> &Node {
        &self.0.nodes[id as usize]
    }

    /// The state after reading `b` in state `at`.
    fn step(&self, mut at: u32, b: u8) -> u32 {
        loop {
            if let Some(n) = goto(&self.0.nodes, at, b) {
                return n;
            }
            if at == ROOT {
                return ROOT;
            }
            at = self.node(at).fail;
        }
    }
}

fn goto(nodes: &[Node], at: u32, b: u8) -> Option<u32> {
    let next = &nodes[at as usize].next;
    next.binary_search_by_key(&b, |&(c, _)| c).ok().map(|i| next[i].1)
}

/// Finds the first occurrence of any of a request's stop strings in one sample's streamed text.
#[derive(Debug, Clone, Default)]
pub struct StopMatcher {
    stops: StopStrings,
    /// Automaton state after the text seen so far: its depth is the length of the longest tail
    /// of the text that may still grow into a stop string.
    state: u32,
    /// Text received but not yet released: exactly that tail, plus the latest delta.
    held: String,
    /// The stop string that matched, once one has.
    matched: Option<usize>,
}

impl StopMatcher {
    /// A matcher for `stops` (see [`StopStrings::new`]).
    pub fn new(stops: impl Into<StopStrings>) -> Self {
        Self { stops: stops.into(), state: ROOT, held: String::new(), matched: None }
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

    /// Bytes held back now (never more than the longest stop string minus one between pushes).
    pub fn held_len(&self) -> usize {
        self.held.len()
    }

    /// Feeds the next piece of generated text. Of the stop strings complete in the text held so
    /// far, the one starting first wins; on a tie, the one listed first.
    pub fn push(&mut self, delta: &str) -> StopOutcome {
        if let Some(index) = self.matched {
            return StopOutcome { emit: String::new(), stopped: Some(index) };
        }
        if self.stops.is_empty() {
            return StopOutcome { emit: delta.to_owned(), stopped: None };
        }
        let base = self.held.len();
        self.held.push_str(delta);
        // (start in `held`, index) of the best match so far.
        let mut best: Option<(usize, usize)> = None;
        for (k, &b) in delta.as_bytes().iter().enumerate() {
            let end = base + k + 1;
            self.state = self.stops.step(self.state, b);
            let node = self.stops.node(self.state);
            // No match still to come can start at or before the best one: stop reading.
            if best.is_some_and(|(start, _)| end - node.depth as usize > start) {
                break;
            }
            let mut at = if node.terminal.is_some() { Some(self.state) } else { node.dict };
            while let Some(id) = at {
                let m = self.stops.node(id);
                if let Some(index) = m.terminal {
                    let candidate = (end - m.depth as usize, index as usize);
                    best = Some(best.map_or(candidate, |b| b.min(candidate)));
                }
                at = m.dict;
            }
        }
        if let Some((start, index)) = best {
            self.held.truncate(start);
            self.matched = Some(index);
            return StopOutcome { emit: std::mem::take(&mut self.held), stopped: Some(index) };
        }
        // The tail that may still grow into a stop string starts where a stop string starts,
        // so it begins on a char boundary.
        let keep = self.stops.node(self.state).depth as usize;
        let emit = self.held[..self.held.len() - keep].to_owned();
        self.held.drain(..self.held.len() - keep);
        StopOutcome { emit, stopped: None }
    }

    /// Releases the held-back text when the sequence ends for a reason other than a stop string.
    /// Returns nothing once a stop string has matched.
    pub fn flush(&mut self) -> String {
        self.state = ROOT;
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matcher(stops: &[&str]) -> StopMatcher {
        StopMatcher::new(stops.iter().map(|s| s.to_string()).collect::<Vec<_>>())
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

    /// What `push` must do, the slow way: the leftmost complete match in the held text.
    fn reference(text: &str, stops: &[&str]) -> (String, Option<usize>) {
        let first = stops
            .iter()
            .enumerate()
            .filter(|(_, s)| !s.is_empty())
            .filter_map(|(i, s)| text.find(s).map(|p| (p, i)))
            .min();
        match first {
            Some((p, i)) => (text[..p].to_owned(), Some(i)),
            None => (text.to_owned(), None),
        }
    }

    /// A small xorshift generator: the cases are the same on every run.
    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: usize) -> usize {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 % n as u64) as usize
        }

        fn word(&mut self, alphabet: &[char], len: usize) -> String {
            (0..len).map(|_| alphabet[self.below(alphabet.len())]).collect()
        }
    }

    #[test]
    fn random_texts_and_stops_match_the_reference_in_one_delta() {
        // One delta holds everything: the leftmost complete match wins, as in the reference.
        let mut rng = Rng(0x2545_f491_4f6c_dd1d);
        let alphabet = ['a', 'b', 'c', 'é'];
        for _ in 0..3000 {
            let len = rng.below(24);
            let text = rng.word(&alphabet, len);
            let count = 1 + rng.below(4);
            let stops: Vec<String> = (0..count)
                .map(|_| {
                    let len = 1 + rng.below(4);
                    rng.word(&alphabet, len)
                })
                .collect();
            let refs: Vec<&str> = stops.iter().map(String::as_str).collect();
            let mut m = StopMatcher::new(stops.clone());
            let got = run(&mut m, &[&text]);
            assert_eq!(got, reference(&text, &refs), "text {text:?} stops {stops:?}");
        }
    }

    #[test]
    fn random_splits_never_release_a_stop_and_hold_back_little() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let alphabet = ['x', 'y', 'z'];
        for _ in 0..3000 {
            let len = rng.below(30);
            let text = rng.word(&alphabet, len);
            let count = 1 + rng.below(3);
            let stops: Vec<String> = (0..count)
                .map(|_| {
                    let len = 1 + rng.below(5);
                    rng.word(&alphabet, len)
                })
                .collect();
            let longest = stops.iter().map(String::len).max().unwrap();
            let mut m = StopMatcher::new(stops.clone());
            let mut out = String::new();
            let mut rest = text.as_str();
            let mut stopped = None;
            while !rest.is_empty() && stopped.is_none() {
                let cut = 1 + rng.below(rest.len());
                let o = m.push(&rest[..cut]);
                rest = &rest[cut..];
                out.push_str(&o.emit);
                stopped = o.stopped;
                if stopped.is_none() {
                    assert!(m.held_len() < longest, "held {} of {longest}", m.held_len());
                }
            }
            if stopped.is_none() {
                out.push_str(&m.flush());
            }
            // Whatever the splits, the output is a prefix of the text free of any stop string,
            // it ends exactly where the reported stop string starts, and without a stop the
            // whole text comes out.
            assert!(text.starts_with(&out), "{text:?} {out:?}");
            for s in &stops {
                assert!(!out.contains(s.as_str()), "released {s:?} in {out:?} of {text:?}");
            }
            match stopped {
                Some(i) => assert!(text[out.len()..].starts_with(stops[i].as_str())),
                None => assert_eq!(out, text),
            }
        }
    }

    #[test]
    fn shared_stop_strings_keep_their_list_and_sizes() {
        let stops = StopStrings::new(vec!["ab".into(), String::new(), "xyz".into()]);
        assert_eq!(stops.strings().len(), 3);
        assert_eq!(stops.get(2), Some("xyz"));
        assert_eq!((stops.total_bytes(), stops.longest()), (5, 3));
        assert!(StopStrings::new(vec![String::new()]).is_empty());
        let a = StopMatcher::new(stops.clone());
        assert!(!a.is_empty());
        assert_eq!(stops, StopStrings::from(vec!["ab".into(), String::new(), "xyz".into()]));
    }
}

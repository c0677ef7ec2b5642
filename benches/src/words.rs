//! Prompt text of a wanted token length.
//!
//! Without a tokenizer ([`TextSynth::approximate`]) a prompt of `n` tokens is `n` random words
//! from [`WORDS`], common English words that are one token each (with their leading space) in
//! GPT-2/Llama-3-style BPE vocabularies such as SmolLM2's; the length is then approximate (and
//! counted as one token per word). With a tokenizer ([`TextSynth::exact`]) the same kind of text
//! is trimmed or extended until the tokenizer counts exactly `n` tokens (special tokens such as
//! a BOS the server adds are not counted).

use std::sync::Arc;

use anyhow::Context;
use pagoda_text::Tokenizer;
use rand::rngs::StdRng;
use rand::Rng;

/// Words prompts are made of; each is a single token with a leading space in SmolLM2's vocabulary.
#[rustfmt::skip]
pub const WORDS: &[&str] = &[
    "time", "year", "people", "way", "day", "man", "thing", "woman", "life", "child", "world", "school",
    "state", "family", "student", "group", "country", "problem", "hand", "part", "place", "case",
    "week", "company", "system", "program", "question", "work", "government", "number", "night",
    "point", "home", "water", "room", "mother", "area", "money", "story", "fact", "month", "lot",
    "right", "study", "book", "eye", "job", "word", "business", "issue", "side", "kind", "head",
    "house", "service", "friend", "father", "power", "hour", "game", "line", "end", "member", "law",
    "car", "city", "community", "name", "president", "team", "minute", "idea", "kid", "body",
    "information", "back", "parent", "face", "others", "level", "office", "door", "health", "person",
    "art", "war", "history", "party", "result", "change", "morning", "reason", "research", "girl",
    "guy", "moment", "air", "teacher", "force", "education", "foot", "boy", "age", "policy", "process",
    "music", "market", "sense", "nation", "plan", "college", "interest", "death", "experience",
    "effect", "use", "class", "control", "care", "field", "development", "role", "effort", "rate",
    "heart", "drug", "show", "leader", "light", "voice", "wife", "police", "mind", "price", "report",
    "decision", "son", "view", "relationship", "town", "road", "arm", "difference", "value", "building",
    "action", "model", "season", "society", "tax", "director", "position", "player", "record", "paper",
    "space", "ground", "form", "event", "official", "matter", "center", "couple", "site", "project",
    "activity", "star", "table", "need", "court", "oil", "situation", "cost", "industry", "figure",
    "street", "image", "phone", "data", "picture", "practice", "piece", "land", "product", "doctor",
    "wall", "patient", "worker", "news", "test", "movie", "north", "love", "support", "technology",
    "step", "baby", "computer", "type", "attention", "film", "tree", "source", "organization", "hair",
    "window", "evidence", "population", "truth", "song", "energy", "garden", "river", "bridge", "stone",
    "cloud", "summer", "winter", "spring", "autumn", "forest", "ocean", "island", "mountain", "valley",
    "village", "letter", "kitchen", "coffee", "bread", "apple", "orange", "green", "blue", "red",
    "yellow", "black", "white", "small", "large", "great", "little", "old", "new", "good", "bad",
    "high", "long", "young", "early", "late", "simple", "clear", "open", "strong", "short", "quick",
    "quiet", "bright", "dark", "warm", "cold", "happy", "free", "full", "easy", "hard", "real", "best",
    "sure", "able", "whole", "human", "local", "social", "public", "private", "general", "special",
    "common", "major", "national", "natural", "physical", "political", "economic", "final", "main",
    "certain", "recent", "personal", "federal", "similar", "ready", "likely", "possible", "different",
    "important", "available", "single", "modern", "central", "various", "medical", "poor", "past",
    "wide", "deep", "rich", "fast", "slow", "soft", "heavy", "fresh", "clean", "walk", "run", "talk",
    "read", "write", "sing", "play", "build", "grow", "think", "look", "move", "turn", "start", "stop",
    "keep", "hold", "bring", "carry", "follow", "learn", "teach", "watch", "listen", "speak", "close",
    "begin", "leave", "return", "travel", "visit", "wait", "stay", "rise", "fall",
];

/// Attempts of the exact fitter to land on the wanted length before it settles for the closest.
const MAX_FIT_STEPS: usize = 64;

/// Makes prompt text of a given length in tokens.
#[derive(Clone)]
pub struct TextSynth {
    tokenizer: Option<Arc<Tokenizer>>,
}

impl std::fmt::Debug for TextSynth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextSynth").field("exact", &self.is_exact()).finish()
    }
}

impl TextSynth {
    /// One word per token, no tokenizer: lengths are approximate.
    pub fn approximate() -> Self {
        Self { tokenizer: None }
    }

    /// Lengths counted by `tokenizer`, hence exact.
    pub fn exact(tokenizer: Arc<Tokenizer>) -> Self {
        Self { tokenizer: Some(tokenizer) }
    }

    pub fn is_exact(&self) -> bool {
        self.tokenizer.is_some()
    }

    /// Tokens in `text`: the tokenizer's count (without special tokens), or the word count.
    pub fn count(&self, text: &str) -> anyhow::Result<usize> {
        match &self.tokenizer {
            Some(t) => Ok(t.encode(text, false).context("tokenizing a prompt")?.len()),
            None => Ok(text.split_whitespace().count()),
        }
    }

    /// `prefix` followed by random words, `total` tokens in all (see the module doc for how
    /// exact that is). Returns the text and its length in tokens as counted by [`Self::count`].
    pub fn extend(&self, rng: &mut StdRng, prefix: &str, total: usize) -> anyhow::Result<(String, usize)> {
        let mut text = prefix.to_owned();
        let Some(tokenizer) = &self.tokenizer else {
            let have = self.count(prefix)?;
            for _ in have..total {
                push_word(&mut text, rng);
            }
            let n = self.count(&text)?;
            return Ok((text, n));
        };
        let floor = prefix.len();
        let mut n = self.count(&text)?;
        // Mostly one token per word: a round or two of appending, then single-word corrections.
        for _ in 0..MAX_FIT_STEPS {
            if n == total {
                return Ok((text, n));
            }
            if n < total {
                for _ in n..total {
                    push_word(&mut text, rng);
                }
            } else if !pop_word(&mut text, floor) {
                break;
            }
            n = self.count(&text)?;
        }
        // Words that are several tokens can keep the count oscillating: cut the ids instead.
        if n > total && total > 0 {
            let ids = tokenizer.encode(&text, false).context("tokenizing a prompt")?;
            let cut = tokenizer.decode(&ids[..total], false).context("detokenizing a prompt")?;
            if cut.starts_with(prefix) {
                let m = self.count(&cut)?;
                if m.abs_diff(total) < n.abs_diff(total) {
                    return Ok((cut, m));
                }
            }
        }
        Ok((text, n))
    }
}

fn push_word(text: &mut String, rng: &mut StdRng) {
    if !text.is_empty() {
        text.push(' ');
    }
    text.push_str(WORDS[rng.random_range(0..WORDS.len())]);
}

/// Removes the last word unless that would cut into the first `floor` bytes.
fn pop_word(text: &mut String, floor: usize) -> bool {
    match text.rfind(' ') {
        Some(i) if i >= floor => {
            text.truncate(i);
            true
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn approximate_text_has_one_word_per_token_after_the_prefix() {
        let synth = TextSynth::approximate();
        let mut rng = StdRng::seed_from_u64(3);
        let (text, n) = synth.extend(&mut rng, "", 50).unwrap();
        assert_eq!(n, 50);
        assert_eq!(text.split(' ').count(), 50);
        assert!(text.split(' ').all(|w| WORDS.contains(&w)));
        let (longer, m) = synth.extend(&mut rng, &text, 70).unwrap();
        assert_eq!(m, 70);
        assert!(longer.starts_with(&format!("{text} ")));
    }

    #[test]
    fn a_prefix_longer_than_the_target_is_kept_whole() {
        let synth = TextSynth::approximate();
        let mut rng = StdRng::seed_from_u64(3);
        let (text, n) = synth.extend(&mut rng, "one two three", 2).unwrap();
        assert_eq!((text.as_str(), n), ("one two three", 3));
    }

    #[test]
    fn pop_word_respects_the_floor() {
        let mut s = "keep this plus more".to_owned();
        // "keep this" is the 9-byte prefix: the words after it go, it stays.
        assert!(pop_word(&mut s, 9));
        assert_eq!(s, "keep this plus");
        assert!(pop_word(&mut s, 9));
        assert_eq!(s, "keep this");
        assert!(!pop_word(&mut s, 9));
        assert_eq!(s, "keep this");
    }

    #[test]
    fn words_are_distinct_single_words() {
        let mut seen = std::collections::HashSet::new();
        for w in WORDS {
            assert!(!w.is_empty() && w.chars().all(|c| c.is_ascii_lowercase()), "{w:?}");
            assert!(seen.insert(w), "duplicate {w:?}");
        }
        assert!(WORDS.len() >= 256);
    }
}

//! [`GrammarCompiler`]: compiles [`GrammarSpec`]s against the model's vocabulary, once per
//! distinct grammar. A repeated schema is a cache hit and costs a clone. A new one is checked
//! against [`crate::limits`], then compiled on a thread of its own with a [`COMPILE_STACK`]
//! stack, because llguidance compiles by recursion and the caller's stack (the server calls from
//! tokio's blocking pool, 2 MiB) is not ours to size; the caller waits for it.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use pagoda_text::Tokenizer;
use toktrie::TokEnv;

use crate::constraint::GrammarConstraint;
use crate::tok_env::PagodaTokEnv;
use crate::{limits, GrammarError, GrammarSpec};

/// Distinct grammars kept compiled.
const CACHE_CAPACITY: usize = 512;

/// The compile thread's stack. Measured with llguidance 1.9.1 (release build): the deepest
/// grammars [`crate::limits`] lets through (about 490 levels of nested arrays across chained
/// definitions) need 3 to 4 MiB; 64 MiB first overflows somewhere past 7,800 such levels or
/// 10,000 `$ref` links, 15 to 20 times the bounds. The memory is reserved; only what the
/// recursion touches is committed, and it is returned when the thread ends.
pub const COMPILE_STACK: usize = 64 << 20;

/// A compiled grammar, ready to hand out matchers in their start state.
#[derive(Clone)]
pub struct CompiledGrammar {
    /// Never advanced: every request clones it (clones share llguidance's lexer caches, so a
    /// repeated grammar also reuses the lexer states it has built).
    start: Arc<Mutex<Matcher>>,
    tok_env: TokEnv,
    /// How long compiling took (zero on a cache hit).
    pub compile_time: Duration,
    pub cache_hit: bool,
}

impl std::fmt::Debug for CompiledGrammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompiledGrammar")
            .field("compile_time", &self.compile_time)
            .field("cache_hit", &self.cache_hit)
            .finish_non_exhaustive()
    }
}

/// Two handles are equal when they share the compiled grammar.
impl PartialEq for CompiledGrammar {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.start, &other.start)
    }
}

impl CompiledGrammar {
    /// A matcher in the start state, as a constraint for one sequence.
    pub fn constraint(&self) -> GrammarConstraint {
        let matcher = self.start.lock().unwrap_or_else(|p| p.into_inner()).clone();
        GrammarConstraint::new(matcher, self.tok_env.clone())
    }
}

/// Compiled grammars by [`GrammarSpec::cache_key`], least recently used evicted first.
#[derive(Default)]
struct Cache {
    entries: HashMap<String, Arc<Mutex<Matcher>>>,
    order: VecDeque<String>,
}

impl Cache {
    fn get(&mut self, key: &str) -> Option<Arc<Mutex<Matcher>>> {
        let hit = self.entries.get(key).cloned()?;
        if let Some(pos) = self.order.iter().position(|k| k == key) {
            let k = self.order.remove(pos).unwrap_or_default();
            self.order.push_back(k);
        }
        Some(hit)
    }

    fn insert(&mut self, key: String, matcher: Arc<Mutex<Matcher>>) {
        if self.entries.insert(key.clone(), matcher).is_none() {
            self.order.push_back(key);
        }
        while self.order.len() > CACHE_CAPACITY {
            if let Some(old) = self.order.pop_front() {
                self.entries.remove(&old);
            }
        }
    }
}

/// See the module docs. One per model; shared by every request.
pub struct GrammarCompiler {
    factory: ParserFactory,
    cache: Mutex<Cache>,
}

impl GrammarCompiler {
    /// Builds the token trie and llguidance's factory for `tokenizer` (tens of milliseconds
    /// for a 50k vocabulary; do it once at start-up).
    pub fn new(tokenizer: Arc<Tokenizer>) -> Result<Self, GrammarError> {
        let env = PagodaTokEnv::new(tokenizer).into_tok_env();
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| GrammarError::Tokenizer(e.to_string()))?;
        // Errors come back to us as values; llguidance's own stderr logging stays quiet.
        factory.quiet();
        Ok(Self { factory, cache: Mutex::new(Cache::default()) })
    }

    /// The vocabulary size the masks cover.
    pub fn vocab_size(&self) -> usize {
        self.factory.tok_env().tok_trie().vocab_size()
    }

    /// Compiles `spec`, or takes it from the cache.
    pub fn compile(&self, spec: &GrammarSpec) -> Result<CompiledGrammar, GrammarError> {
        let key = spec.cache_key();
        if let Some(start) = self.cache.lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
            let tok_env = self.factory.tok_env().clone();
            return Ok(CompiledGrammar { start, tok_env, compile_time: Duration::ZERO, cache_hit: true });
        }
        let compiled = self.compile_uncached(spec)?;
        self.cache.lock().unwrap_or_else(|p| p.into_inner()).insert(key, Arc::clone(&compiled.start));
        Ok(compiled)
    }

    /// Compiles `spec` without reading or filling the cache, so every call pays the whole
    /// compile. For benchmarks and tools that measure compiling; requests go through
    /// [`Self::compile`].
    pub fn compile_uncached(&self, spec: &GrammarSpec) -> Result<CompiledGrammar, GrammarError> {
        let began = Instant::now();
        let grammar = spec.to_llguidance()?;
        for part in &grammar.grammars {
            if let Some(schema) = &part.json_schema {
                limits::check_schema(schema)?;
            }
            if let Some(lark) = &part.lark_grammar {
                limits::check_lark(lark)?;
            }
        }
        let matches_nothing = spec.matches_nothing();
        let matcher = std::thread::scope(|scope| {
            let compiling = std::thread::Builder::new()
                .name("pagoda-grammar".into())
                .stack_size(COMPILE_STACK)
                .spawn_scoped(scope, || self.matcher(grammar, matches_nothing))
                .map_err(|e| GrammarError::Compiler(format!("no thread to compile on: {e}")))?;
            compiling.join().unwrap_or_else(|_| Err(GrammarError::Compiler("it panicked".into())))
        })?;
        let compile_time = began.elapsed();
        let start = Arc::new(Mutex::new(matcher));
        let tok_env = self.factory.tok_env().clone();
        Ok(CompiledGrammar { start, tok_env, compile_time, cache_hit: false })
    }

    /// llguidance's parser for `grammar`, as a matcher in its start state. A grammar that
    /// compiles but allows no first token at all (a `$ref` to itself) would only fail at the
    /// first token, with llguidance's parser state as the message: its first mask is computed
    /// here, on a clone, and its failure is `matches_nothing`.
    fn matcher(&self, grammar: TopLevelGrammar, matches_nothing: &str) -> Result<Matcher, GrammarError> {
        let parser =
            self.factory.create_parser(grammar).map_err(|e| GrammarError::Invalid(clean(&e.to_string())))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(err) = matcher.get_error() {
            return Err(GrammarError::Invalid(clean(&err)));
        }
        let mut first = matcher.clone();
        match first.compute_mask_or_eos() {
            Ok(_) => Ok(matcher),
            // The stop reason leads llguidance's message: no token can start the output.
            Err(e) if e.to_string().starts_with("NoExtension") => {
                Err(GrammarError::Invalid(matches_nothing.to_owned()))
            }
            Err(e) => Err(GrammarError::Invalid(clean(&e.to_string()))),
        }
    }
}

/// The longest message a client gets from llguidance.
const MAX_MESSAGE: usize = 300;

/// llguidance's message for a client: its own lines (not the excerpts of the grammar it
/// quotes, the `^` markers under them, or the parser state it appends), long quotations cut
/// short, one line of at most [`MAX_MESSAGE`] bytes.
pub(crate) fn clean(message: &str) -> String {
    let message = message.split("<state>").next().unwrap_or_default();
    let mut line = String::new();
    for l in message.lines() {
        let excerpt = l.starts_with(char::is_whitespace) || l.trim().chars().all(|c| c == '^');
        if excerpt || l.trim().is_empty() {
            continue;
        }
        if !line.is_empty() {
            line.push_str(if line.ends_with(':') { " " } else { "; " });
        }
        line.push_str(&shorten_quotes(l.trim()));
    }
    if line.is_empty() {
        // Nothing but excerpts: the first of them is better than nothing.
        line = shorten_quotes(message.lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or("unknown"));
    }
    if line.len() > MAX_MESSAGE {
        let mut end = MAX_MESSAGE;
        while !line.is_char_boundary(end) {
            end -= 1;
        }
        line.truncate(end);
        line.push('…');
    }
    line
}

/// `text` with each quoted run of over 40 characters cut to its start and end.
fn shorten_quotes(text: &str) -> String {
    const KEEP: usize = 16;
    let parts: Vec<&str> = text.split('"').collect();
    let mut out = String::with_capacity(text.len().min(4 * MAX_MESSAGE));
    for (i, part) in parts.iter().enumerate() {
        if i > 0 {
            out.push('"');
        }
        let chars = part.chars().count();
        if i % 2 == 1 && chars > 40 {
            out.extend(part.chars().take(KEEP));
            out.push('…');
            out.extend(part.chars().skip(chars - KEEP));
        } else {
            out.push_str(part);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::clean;

    #[test]
    fn messages_keep_their_reasons_and_lose_excerpts_and_state() {
        let nested = "(".repeat(260);
        let regex = format!(
            "at 1(8): invalid regex \"{nested}x\" (in regex): regex parse error:\n    {nested}x\n    ^^^^\nerror: exceed the maximum number of nested parentheses/brackets (250)\n   1 | start: /{nested}x/\n          ^\n"
        );
        let cleaned = clean(&regex);
        assert!(cleaned.len() < 200, "{cleaned}");
        assert!(
            cleaned.ends_with(
                "regex parse error: error: exceed the maximum number of nested parentheses/brackets (250)"
            ),
            "{cleaned}"
        );
        let state = "NoExtensionBias\n<state>\nTokens: ⟦⟧\nParser: {\n  \"rows\": 1\n}\n</state><grammar>\n\n</grammar>";
        assert_eq!(clean(state), "NoExtensionBias");
        assert_eq!(clean("  indented only\n  ^^^"), "indented only");
        let long = "x".repeat(1000);
        assert!(clean(&long).len() <= 300 + '…'.len_utf8());
    }
}

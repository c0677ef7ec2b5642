//! [`GrammarCompiler`]: compiles [`GrammarSpec`]s against the model's vocabulary, once per
//! distinct grammar. Compiling runs on the caller's thread (the server calls it on the blocking
//! pool, never on the engine thread); a repeated schema is a cache hit and costs a clone.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use llguidance::{Matcher, ParserFactory};
use pagoda_text::Tokenizer;
use toktrie::TokEnv;

use crate::constraint::GrammarConstraint;
use crate::tok_env::PagodaTokEnv;
use crate::{GrammarError, GrammarSpec};

/// Distinct grammars kept compiled.
const CACHE_CAPACITY: usize = 512;

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
        let parser =
            self.factory.create_parser(grammar).map_err(|e| GrammarError::Invalid(clean(&e.to_string())))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(err) = matcher.get_error() {
            return Err(GrammarError::Invalid(clean(&err)));
        }
        let compile_time = began.elapsed();
        let start = Arc::new(Mutex::new(matcher));
        let tok_env = self.factory.tok_env().clone();
        Ok(CompiledGrammar { start, tok_env, compile_time, cache_hit: false })
    }
}

/// llguidance's messages, trimmed to one readable line for a client.
fn clean(message: &str) -> String {
    let line = message.lines().map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join("; ");
    const MAX: usize = 500;
    if line.len() > MAX {
        let mut end = MAX;
        while !line.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}…", &line[..end])
    } else {
        line
    }
}

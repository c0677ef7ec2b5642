//! [`Grammars`]: the structured-output grammar compiler, built on a thread of its own once the
//! tokenizer is loaded. Its token trie takes a second or two for a large vocabulary (Gemma's
//! 262k tokens), so serving does not wait for it; the first structured request does.

use std::sync::{Arc, OnceLock};
use std::time::Instant;

use pagoda_structured::GrammarCompiler;
use pagoda_text::Tokenizer;

/// A shared handle to the compiler, ready or being built.
#[derive(Clone)]
pub struct Grammars(Arc<Inner>);

struct Inner {
    /// `None` inside once building failed: the vocabulary cannot be used for grammars.
    compiler: OnceLock<Option<Arc<GrammarCompiler>>>,
    tokenizer: Option<Arc<Tokenizer>>,
}

impl Grammars {
    /// Starts building the compiler for `tokenizer` in the background.
    pub fn build_in_background(tokenizer: Arc<Tokenizer>) -> Self {
        let grammars = Self(Arc::new(Inner { compiler: OnceLock::new(), tokenizer: Some(tokenizer) }));
        let building = grammars.clone();
        std::thread::Builder::new()
            .name("pagoda-grammars".into())
            .spawn(move || building.get())
            .map(drop)
            // Without the thread, the first structured request builds it.
            .unwrap_or_else(|e| tracing::warn!(error = %e, "could not start the grammar thread"));
        grammars
    }

    /// No compiler (structured requests get a 400).
    pub fn unavailable() -> Self {
        Self(Arc::new(Inner { compiler: OnceLock::from(None), tokenizer: None }))
    }

    /// The compiler, waiting for it while it is being built (never on an async worker: call it
    /// from the blocking pool). `None` when it cannot be built.
    pub fn get(&self) -> Option<Arc<GrammarCompiler>> {
        self.0
            .compiler
            .get_or_init(|| {
                let started = Instant::now();
                let tokenizer = Arc::clone(self.0.tokenizer.as_ref()?);
                match GrammarCompiler::new(tokenizer) {
                    Ok(compiler) => {
                        tracing::info!(
                            seconds = format!("{:.2}", started.elapsed().as_secs_f64()),
                            vocab = compiler.vocab_size(),
                            "structured output ready"
                        );
                        Some(Arc::new(compiler))
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "structured output is not available");
                        None
                    }
                }
            })
            .clone()
    }
}

impl std::fmt::Debug for Grammars {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammars").field("ready", &self.0.compiler.get().is_some()).finish()
    }
}

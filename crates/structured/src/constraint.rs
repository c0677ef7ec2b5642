//! [`GrammarConstraint`]: one sequence's llguidance matcher as the engine's
//! [`TokenConstraint`], optionally held open until a reasoning section ends.

use llguidance::api::StopReason;
use llguidance::Matcher;
use pagoda_engine::{ConstraintError, TokenConstraint, TokenMask};
use toktrie::{TokEnv, TokTrie};

/// Lets every token through until the end of a reasoning section (`</think>`) has been
/// generated; the grammar applies to what follows, as in vLLM.
#[derive(Clone)]
struct ReasoningGate {
    end: Vec<u8>,
    /// The last bytes generated, enough to recognise `end` across token boundaries.
    tail: Vec<u8>,
}

impl ReasoningGate {
    /// Takes a token's bytes; true once `end` has appeared.
    fn push(&mut self, bytes: &[u8]) -> bool {
        self.tail.extend_from_slice(bytes);
        let found = self.tail.windows(self.end.len()).any(|w| w == self.end.as_slice());
        let keep = self.end.len().saturating_sub(1);
        if self.tail.len() > keep {
            self.tail.drain(..self.tail.len() - keep);
        }
        found
    }
}

/// See the module docs.
#[derive(Clone)]
pub struct GrammarConstraint {
    matcher: Matcher,
    tok_env: TokEnv,
    reasoning: Option<ReasoningGate>,
}

impl GrammarConstraint {
    pub(crate) fn new(matcher: Matcher, tok_env: TokEnv) -> Self {
        Self { matcher, tok_env, reasoning: None }
    }

    /// Applies the grammar only after `end_tag` (e.g. `</think>`) has been generated.
    pub fn after_reasoning(mut self, end_tag: &str) -> Self {
        if !end_tag.is_empty() {
            self.reasoning = Some(ReasoningGate { end: end_tag.as_bytes().to_vec(), tail: Vec::new() });
        }
        self
    }

    fn trie(&self) -> &TokTrie {
        self.tok_env.tok_trie()
    }

    /// llguidance's errors carry its parser state after the reason; the reason alone goes on.
    fn error(&self, what: &str, err: impl std::fmt::Display) -> ConstraintError {
        ConstraintError(format!("{what}: {}", crate::compiler::clean(&err.to_string())))
    }
}

impl TokenConstraint for GrammarConstraint {
    fn compute_mask(&mut self) -> Result<TokenMask, ConstraintError> {
        let vocab = self.trie().vocab_size();
        if self.reasoning.is_some() {
            return Ok(TokenMask::all(vocab));
        }
        let allowed = self.matcher.compute_mask_or_eos().map_err(|e| self.error("the grammar failed", e))?;
        Ok(TokenMask::from_words(allowed.as_slice(), vocab))
    }

    fn accept_token(&mut self, token: u32) -> Result<(), ConstraintError> {
        if let Some(gate) = &mut self.reasoning {
            let mut bytes = self.tok_env.tok_trie().token(token).to_vec();
            if bytes.first() == Some(&TokTrie::SPECIAL_TOKEN_MARKER) {
                bytes.remove(0);
            }
            if gate.push(&bytes) {
                self.reasoning = None;
            }
            return Ok(());
        }
        self.matcher
            .consume_token(token)
            .map_err(|e| self.error(&format!("token {token} does not fit the grammar"), e))?;
        match self.matcher.stop_reason() {
            StopReason::NotStopped
            | StopReason::NoExtension
            | StopReason::NoExtensionBias
            | StopReason::EndOfSentence => Ok(()),
            other => Err(self.error("the grammar stopped", other)),
        }
    }

    fn is_finished(&self) -> bool {
        self.reasoning.is_none() && self.matcher.is_stopped() && !self.matcher.is_error()
    }

    fn fork(&self) -> Box<dyn TokenConstraint> {
        Box::new(self.clone())
    }
}

//! Why a grammar could not be used.

use crate::limits::DepthError;

/// A grammar that cannot be compiled: the message names the reason and is meant for the client.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GrammarError {
    /// The grammar or schema is malformed or uses something llguidance does not support.
    #[error("{0}")]
    Invalid(String),
    /// The grammar nests or chains deeper than the compiler may follow ([`crate::limits`]).
    #[error(transparent)]
    TooDeep(#[from] DepthError),
    /// The vocabulary could not be turned into a token trie.
    #[error("the tokenizer cannot be used for structured output: {0}")]
    Tokenizer(String),
    /// The compiler could not run (its thread did not start, or it panicked): the server's
    /// fault, not the grammar's.
    #[error("the grammar compiler failed: {0}")]
    Compiler(String),
}

//! Why a grammar could not be used.

/// A grammar that cannot be compiled: the message names the reason and is meant for the client.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GrammarError {
    /// The grammar or schema is malformed or uses something llguidance does not support.
    #[error("{0}")]
    Invalid(String),
    /// The vocabulary could not be turned into a token trie.
    #[error("the tokenizer cannot be used for structured output: {0}")]
    Tokenizer(String),
}

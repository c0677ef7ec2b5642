//! `pagoda-structured`: structured output. Requests name a grammar ([`GrammarSpec`]: a JSON
//! schema, any JSON object, a regex, a choice, a Lark grammar); [`GrammarCompiler`] compiles it
//! with llguidance against the model's own vocabulary (`tok_env`) and caches it by its text; each
//! sequence gets a [`GrammarConstraint`], the engine's `TokenConstraint`, whose token masks the
//! engine computes while the model runs. Grammars deeper than [`limits`] allows are refused before
//! compiling.

mod compiler;
mod constraint;
mod error;
pub mod limits;
mod spec;
mod tok_env;

pub use compiler::{CompiledGrammar, GrammarCompiler, COMPILE_STACK};
pub use constraint::GrammarConstraint;
pub use error::GrammarError;
pub use limits::DepthError;
pub use spec::{GrammarSpec, StructuralTag, TagStructure};
pub use tok_env::PagodaTokEnv;

//! `pagoda-engine`: requests, sequences, the paged KV block manager with prefix caching, the
//! continuous-batching scheduler and the engine loop. Plain Rust: no tensors, no HTTP.
//!
//! The model side is reached only through [`ModelExecutor`], which takes one [`ScheduledBatch`]
//! per step and returns the sampled tokens.

pub mod executor;
pub mod sampling;

pub use executor::{
    ExecutorError, ModelExecutor, SampleRequest, SampledToken, ScheduledBatch, ScheduledSeq,
    SeqId, StepOutput, TokenLogprob, TopLogprobs,
};
pub use sampling::SamplingParams;

//! `pagoda-engine`: requests, sequences, the paged KV block manager with prefix caching, the
//! continuous-batching scheduler and the engine loop. Plain Rust: no tensors, no HTTP.
//!
//! The model side is reached only through [`ModelExecutor`], which takes one [`ScheduledBatch`]
//! per step and returns the sampled tokens ([`sampler`] is the CPU sampler it can use).
//!
//! - [`Engine::spawn`] starts the engine thread and returns an [`EngineHandle`];
//!   [`EngineHandle::submit`] takes a [`Request`] and returns a [`RequestStream`] of
//!   [`TokenEvent`]s.
//! - [`Scheduler`] (`schedule()` / `update()`) and [`block_manager::BlockManager`] never touch
//!   tensors or text; [`fake::FakeExecutor`] drives them in tests and benchmarks. A batch sends
//!   each sequence's block-table changes, which the executor applies to its
//!   [`BlockTableStore`] ([`block_tables`]).
//! - [`output`]: the output stage, on the caller's side of each stream: detokenizing and stop
//!   strings.
//! - [`constraint`]: structured output's per-sequence grammar state ([`TokenConstraint`]), whose
//!   token masks are computed while the model runs.
//! - [`speculative`]: proposals a decoding sequence carries into a step (n-gram, suffix, or the
//!   executor's own first layers), verified by the sampler's own draws; rejected KV rolls back.
//! - [`kv_transfer`]: prefill/decode disaggregation's engine side: a finished prefill's blocks
//!   held for a decode instance, received pages imported into the prefix cache.
//! - [`device_sampling`]: a batch's sampling requests flattened for the GPU sampler kernel, with
//!   the CPU sampler's semantics.

pub mod block_manager;
pub mod block_pool;
pub mod block_tables;
pub mod cache_events;
pub mod config;
pub mod constraint;
pub mod device_sampling;
pub mod engine;
pub mod event;
pub mod executor;
pub mod fake;
pub mod handle;
mod id_map;
pub mod kv_groups;
pub mod kv_tier;
pub mod kv_transfer;
pub mod multimodal;
mod outbox;
pub mod output;
pub mod request;
pub mod rng;
pub mod sampler;
pub mod sampling;
pub mod scheduler;
pub mod sequence;
pub mod sleep;
pub mod speculative;
pub mod stats;

pub use block_tables::{BlockTableStore, BlockTableUpdate};
pub use cache_events::CacheEvent;
pub use config::{ConfigError, EngineConfig};
pub use constraint::{ConstraintError, DraftGrammar, MaskSlot, SeqConstraint, TokenConstraint, TokenMask};
pub use engine::Engine;
pub use event::{FinishReason, RequestMetrics, RequestTimestamps, StopReason, TokenEvent, Usage};
pub use executor::{
    ExecutorDraft, ExecutorError, LoraId, ModelExecutor, PooledOutput, PreparedLora, PromptLogprobsOutput,
    PromptLogprobsRequest, SampleRequest, SampledToken, ScheduledBatch, ScheduledImages, ScheduledSeq, SeqId,
    StepOutput, TokenLogprob, TopLogprobs,
};
pub use handle::{EngineError, EngineHandle, FlushBusy, FlushError, RequestStream, Shutdown};
pub use kv_groups::{KvGroups, KvGroupsError, NULL_BLOCK};
pub use kv_transfer::{HeldExport, KvHold, KvPageLayout, KvPrefix, KvTransferError};
pub use multimodal::{
    split_placeholders, validate_images, EncoderCacheSnapshot, EncoderCacheStats, ImageHash, ImageInput,
    ImageRequestError, PixelTensor,
};
pub use pagoda_text::TokenDecoder;
pub use request::{BeamSearch, Request, RequestError, RequestId, StopConditions};
pub use sampling::{SamplingParams, SamplingParamsError};
pub use scheduler::{
    AddRequestError, HeldPrefix, ScheduleStats, Scheduler, StepEvents, TakeHeld, UpdateError,
};
pub use sequence::{SeqStatus, Sequence};
pub use sleep::{SleepError, SleepLevel};
pub use speculative::{SpecDecodeStats, SpeculativeConfig, SpeculativeMethod};
pub use stats::{EngineObserver, EngineStatsSnapshot, LoraActivity, NoopObserver, StepStats};

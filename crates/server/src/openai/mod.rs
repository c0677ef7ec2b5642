//! OpenAI (and vLLM-extension) wire types. They end at the HTTP layer: handlers validate them
//! into engine requests, and nothing here is seen by the engine.

pub mod chat;
pub mod common;
pub mod completions;
pub mod embeddings;
pub mod extensions;
pub mod fields;
pub mod lora;
pub mod models;
pub mod router_fields;
pub mod sampling;
pub mod score;
pub mod tokenize;
pub mod worker;

pub use chat::{
    ChatChoice, ChatChunkChoice, ChatCompletionChunk, ChatCompletionRequest, ChatCompletionResponse,
    ChatDelta, ChatLogprobs, ChatMessage, ChatTokenLogprob, ChatTopLogprob, ContentPart, FunctionCall,
    FunctionCallDelta, MessageContent, ResponseMessage, ToolCall, ToolCallDelta,
};
pub use common::{unix_now, ErrorDetail, ErrorResponse, OpenAiFields, StopSpec, StreamOptions, Usage};
pub use completions::{
    CompletionChoice, CompletionLogprobs, CompletionRequest, CompletionResponse, Prompt, PromptInput,
    PromptLogprob, PromptLogprobs,
};
pub use embeddings::{EmbeddingData, EmbeddingRequest, EmbeddingResponse, EmbeddingUsage, EmbeddingValues};
pub use extensions::VllmExtensions;
pub use lora::{LoadLoraAdapterRequest, UnloadLoraAdapterRequest};
pub use models::{ModelCard, ModelList, VersionResponse};
pub use sampling::{CommonParams, FinishReason, SpeculativeMethodParam, StopReason};
pub use score::{
    RerankDocument, RerankRequest, RerankResponse, RerankResult, RerankUsage, ScoreData, ScoreRequest,
    ScoreResponse, ScoreUsage, TextOrTexts,
};
pub use tokenize::{DetokenizeRequest, DetokenizeResponse, TokenizeRequest, TokenizeResponse};

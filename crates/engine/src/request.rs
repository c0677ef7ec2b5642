//! What a caller submits: [`Request`] (prompt token ids, sampling parameters, stop conditions,
//! limits) and its validation against the engine's limits.

use std::sync::Arc;
use std::time::Instant;

use pagoda_text::StopStrings;

use crate::config::EngineConfig;
use crate::constraint::SeqConstraint;
use crate::executor::LoraId;
use crate::kv_transfer::KvHold;
use crate::multimodal::ImageInput;
use crate::sampling::{SamplingParams, SamplingParamsError};
use crate::speculative::ProposerKind;

/// Caller-chosen id of a request; must be unique among the requests in flight.
pub type RequestId = u64;

/// When a sequence stops besides `max_tokens`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StopConditions {
    /// End-of-sequence ids of the model (from the tokenizer / generation config).
    pub eos_token_ids: Vec<u32>,
    /// Keep generating past an eos token (benchmarks).
    pub ignore_eos: bool,
    /// Extra ids that end the sequence; the id is kept in the token ids, its text is not emitted.
    pub stop_token_ids: Vec<u32>,
    /// Texts that end the sequence; the matched stop string is not part of the output text.
    /// Compiled once and shared by the request's samples (and by the prompts of one call).
    pub stop_strings: StopStrings,
    /// No eos, stop id or stop string can end the sequence before this many tokens.
    pub min_tokens: usize,
}

/// Beam search (vLLM's `use_beam_search`): at each step every beam offers its `2 * width` most
/// likely next tokens (raw logprobs), and the `width` best continuations by cumulative logprob
/// go on; a continuation that ends (end-of-sequence or a stop token id) is set aside as a
/// finished hypothesis, and at `max_tokens` the live beams are too. The request returns its
/// `n` best hypotheses by [`BeamSearch::score`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BeamSearch {
    /// Beams kept at each step (at least the request's `n`).
    pub width: usize,
    /// Scores divide the cumulative logprob by the hypothesis's length to this power.
    pub length_penalty: f32,
}

impl BeamSearch {
    /// vLLM's hypothesis score: the cumulative logprob over the length to the power
    /// `length_penalty`, the length counting the prompt and the output without a final
    /// end-of-sequence token.
    pub fn score(&self, cum_logprob: f64, length: usize) -> f64 {
        cum_logprob / (length.max(1) as f64).powf(f64::from(self.length_penalty))
    }
}

/// One generation request, already tokenized.
#[derive(Debug, Clone)]
pub struct Request {
    pub id: RequestId,
    pub prompt_token_ids: Vec<u32>,
    pub params: Arc<SamplingParams>,
    pub stop: StopConditions,
    /// `None`: up to `max_model_len - prompt_len`.
    pub max_tokens: Option<usize>,
    /// When the request reached the server; timestamps and queue-time metrics start here.
    pub arrival: Instant,
    /// Lower values are scheduled first and preempted last; equal priorities are served FIFO.
    pub priority: i32,
    /// Number of independent samples (OpenAI `n`); they share the prompt's KV blocks.
    pub n: usize,
    /// Leave special tokens out of the generated text.
    pub skip_special_tokens: bool,
    /// Requests submitted together (the prompts of one API call) share a group; admission shares
    /// sequence slots between groups. Defaults to the request's own id.
    pub group: u64,
    /// Structured output: the grammar that every sample's output must match (each sample gets
    /// its own fork of it).
    pub constraint: Option<SeqConstraint>,
    /// Most tokens speculative decoding may propose per step for this request, below the
    /// engine's own `num_speculative_tokens` (0: none); `None`: the engine's.
    pub max_speculative_tokens: Option<usize>,
    /// Where this request's proposals come from, when not the engine's default method. Model-free
    /// methods are always available with speculation on; [`ProposerKind::Executor`] only where the
    /// engine has a draft.
    pub speculative_method: Option<ProposerKind>,
    /// A pooling request (embeddings): its prompt is computed whole in one step and its pooled
    /// hidden state is its one result ([`crate::TokenEvent::pooled`]); nothing is sampled and
    /// its KV is not kept. One sample, no grammar, no speculation, no `max_tokens`.
    pub pool: bool,
    /// A pooling request over a text pair (a cross-encoder scores the pair): the index in
    /// `prompt_token_ids` of the second text's first token.
    pub second_segment: Option<usize>,
    /// The LoRA adapter the request runs with (the executor's id); `None`: the base model. Its
    /// KV is its own: the prefix cache never shares blocks between adapters.
    pub lora: Option<LoraId>,
    /// The logprobs of the prompt's tokens with this many alternatives each (vLLM's
    /// `prompt_logprobs`); the whole prompt is computed, prefix-cache hits or not.
    pub prompt_logprobs: Option<usize>,
    /// Search beams instead of sampling; `n` is then how many of the best hypotheses return.
    pub beam: Option<BeamSearch>,
    /// Prefill/decode disaggregation: hold the prompt's KV blocks for a decode instance once
    /// the request finishes ([`crate::kv_transfer`]). One sample, no beams.
    pub kv_hold: Option<KvHold>,
    /// The prompt's images in prompt order; their features replace the placeholder tokens at
    /// each image's `placeholder_positions`. Empty for a text-only prompt.
    pub images: Vec<ImageInput>,
}

impl Request {
    /// A request with default limits: one sample, priority 0, arrival now, no stop conditions.
    pub fn new(id: RequestId, prompt_token_ids: Vec<u32>, params: Arc<SamplingParams>) -> Self {
        Self {
            id,
            prompt_token_ids,
            params,
            stop: StopConditions::default(),
            max_tokens: None,
            arrival: Instant::now(),
            priority: 0,
            n: 1,
            skip_special_tokens: true,
            group: id,
            constraint: None,
            max_speculative_tokens: None,
            speculative_method: None,
            pool: false,
            second_segment: None,
            lora: None,
            prompt_logprobs: None,
            beam: None,
            kv_hold: None,
            images: Vec::new(),
        }
    }

    /// A pooling request for `prompt_token_ids` (see [`Request::pool`]).
    pub fn pooling(id: RequestId, prompt_token_ids: Vec<u32>) -> Self {
        Self { pool: true, ..Self::new(id, prompt_token_ids, Arc::new(SamplingParams::default())) }
    }

    /// A pooling request for a text pair: `prompt_token_ids` holds both texts, the second from
    /// `second_segment` on (see [`Request::second_segment`]).
    pub fn pooling_pair(id: RequestId, prompt_token_ids: Vec<u32>, second_segment: usize) -> Self {
        Self { second_segment: Some(second_segment), ..Self::pooling(id, prompt_token_ids) }
    }

    pub fn with_constraint(mut self, constraint: SeqConstraint) -> Self {
        self.constraint = Some(constraint);
        self
    }

    pub fn with_group(mut self, group: u64) -> Self {
        self.group = group;
        self
    }

    pub fn with_max_tokens(mut self, max_tokens: usize) -> Self {
        self.max_tokens = Some(max_tokens);
        self
    }

    pub fn with_stop(mut self, stop: StopConditions) -> Self {
        self.stop = stop;
        self
    }

    pub fn with_n(mut self, n: usize) -> Self {
        self.n = n;
        self
    }

    pub fn with_priority(mut self, priority: i32) -> Self {
        self.priority = priority;
        self
    }

    pub fn with_beam(mut self, beam: BeamSearch) -> Self {
        self.beam = Some(beam);
        self
    }

    pub fn with_arrival(mut self, arrival: Instant) -> Self {
        self.arrival = arrival;
        self
    }

    pub fn with_max_speculative_tokens(mut self, max: usize) -> Self {
        self.max_speculative_tokens = Some(max);
        self
    }

    pub fn with_speculative_method(mut self, kind: ProposerKind) -> Self {
        self.speculative_method = Some(kind);
        self
    }

    /// Checks the request against the engine's limits; returns the effective `max_tokens`.
    pub fn validate(&self, config: &EngineConfig) -> Result<usize, RequestError> {
        let prompt_len = self.prompt_token_ids.len();
        if prompt_len == 0 {
            return Err(RequestError::EmptyPrompt);
        }
        if !self.images.is_empty() {
            if !config.images {
                return Err(crate::multimodal::ImageRequestError::NoVisionEncoder.into());
            }
            crate::multimodal::validate_images(&self.images, prompt_len)?;
            // Transferred pages are keyed by their tokens alone on the decoding side.
            if self.kv_hold.is_some() {
                return Err(crate::multimodal::ImageRequestError::KvTransfer.into());
            }
        }
        if let Some(start) = self.second_segment {
            if !self.pool || start == 0 || start >= self.prompt_token_ids.len() {
                return Err(RequestError::SecondSegmentOutside {
                    start,
                    prompt_len: self.prompt_token_ids.len(),
                });
            }
        }
        if self.pool {
            return self.validate_pooling(config).map(|()| 0);
        }
        // The prompt must leave room for at least one generated token.
        if prompt_len >= config.max_model_len {
            return Err(RequestError::PromptTooLong { prompt_len, max_model_len: config.max_model_len });
        }
        let max_tokens = match self.max_tokens {
            Some(0) => return Err(RequestError::ZeroMaxTokens),
            Some(m) if prompt_len.saturating_add(m) > config.max_model_len => {
                return Err(RequestError::TooLong {
                    prompt_len,
                    max_tokens: m,
                    max_model_len: config.max_model_len,
                })
            }
            Some(m) => m,
            None => config.max_model_len - prompt_len,
        };
        if self.stop.min_tokens > max_tokens {
            return Err(RequestError::MinTokensAboveMax { min_tokens: self.stop.min_tokens, max_tokens });
        }
        if self.n == 0 {
            return Err(RequestError::ZeroSamples);
        }
        if self.n > config.max_num_seqs {
            return Err(RequestError::TooManySamples { n: self.n, max_num_seqs: config.max_num_seqs });
        }
        if let Some(kind) = self.speculative_method {
            match &config.speculative {
                None => return Err(RequestError::NoSpeculation { method: kind.name() }),
                Some(spec) if kind == ProposerKind::Executor && !spec.method.drafts_in_executor() => {
                    return Err(RequestError::NoDraft);
                }
                Some(_) => {}
            }
        }
        self.params.validate()?;
        if self.kv_hold.is_some() && (self.n != 1 || self.beam.is_some()) {
            return Err(RequestError::KvHoldSamples);
        }
        if let Some(beam) = self.beam {
            self.validate_beam(beam, max_tokens, config)?;
        }
        Ok(max_tokens)
    }
}

impl Request {
    /// Beam search keeps `width` beams (at least `n`, at most the engine's sequences) and
    /// scores the model's own distribution: nothing that reshapes or constrains sampling.
    fn validate_beam(
        &self,
        beam: BeamSearch,
        max_tokens: usize,
        config: &EngineConfig,
    ) -> Result<(), RequestError> {
        if beam.width < self.n || beam.width > config.max_num_seqs {
            let (width, n, max_num_seqs) = (beam.width, self.n, config.max_num_seqs);
            return Err(RequestError::BeamWidth { width, n, max_num_seqs });
        }
        // Every beam of a round must be in the cache at once, shared blocks or not.
        let per_beam = (self.prompt_token_ids.len() + max_tokens).div_ceil(config.block_size);
        let blocks = beam.width * per_beam * config.kv_groups.len().max(1);
        if blocks > config.num_blocks {
            return Err(RequestError::BeamTooLarge { blocks, num_blocks: config.num_blocks });
        }
        if !beam.length_penalty.is_finite() {
            return Err(RequestError::BeamUnsupported { what: "a non-finite length_penalty" });
        }
        let p = &self.params;
        let reshaping = [
            ("temperature", !p.is_greedy()),
            ("top_k", p.top_k != 0),
            ("top_p", p.top_p != 1.0),
            ("min_p", p.min_p != 0.0),
            ("repetition_penalty", p.repetition_penalty != 1.0),
            ("presence_penalty", p.presence_penalty != 0.0),
            ("frequency_penalty", p.frequency_penalty != 0.0),
            ("logit_bias", !p.logit_bias.is_empty()),
            ("grammar", self.constraint.is_some()),
            ("num_speculative_tokens", self.max_speculative_tokens.is_some_and(|k| k > 0)),
            ("speculative_method", self.speculative_method.is_some()),
            ("stop strings", !self.stop.stop_strings.is_empty()),
            ("prompt_logprobs", self.prompt_logprobs.is_some()),
        ];
        match reshaping.into_iter().find(|(_, set)| *set) {
            Some((what, _)) => Err(RequestError::BeamUnsupported { what }),
            None => Ok(()),
        }
    }

    /// A pooling request's limits: its input fits the context and one step's token budget
    /// (pooling sees the whole input at once), and it asks for nothing that generates.
    fn validate_pooling(&self, config: &EngineConfig) -> Result<(), RequestError> {
        let prompt_len = self.prompt_token_ids.len();
        if prompt_len > config.max_model_len {
            return Err(RequestError::PoolingTooLong { prompt_len, max_len: config.max_model_len });
        }
        if prompt_len > config.max_num_batched_tokens {
            return Err(RequestError::PoolingTooLong { prompt_len, max_len: config.max_num_batched_tokens });
        }
        let generating = [
            ("n", self.n != 1),
            ("max_tokens", self.max_tokens.is_some()),
            ("a grammar", self.constraint.is_some()),
            (
                "speculative decoding",
                self.max_speculative_tokens.is_some() || self.speculative_method.is_some(),
            ),
            ("prompt_logprobs", self.prompt_logprobs.is_some()),
            ("beam search", self.beam.is_some()),
            ("a KV transfer", self.kv_hold.is_some()),
        ];
        match generating.into_iter().find(|(_, set)| *set) {
            Some((what, _)) => Err(RequestError::PoolingGenerates { what }),
            None => Ok(()),
        }
    }
}

/// Why a request was refused before it was queued.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RequestError {
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error(
        "the prompt has {prompt_len} tokens; this model's maximum context length is {max_model_len} tokens"
    )]
    PromptTooLong { prompt_len: usize, max_model_len: usize },
    #[error(
        "this model's maximum context length is {max_model_len} tokens; the request asks for \
         {prompt_len} prompt tokens plus {max_tokens} completion tokens"
    )]
    TooLong { prompt_len: usize, max_tokens: usize, max_model_len: usize },
    #[error("max_tokens must be at least 1")]
    ZeroMaxTokens,
    #[error("min_tokens ({min_tokens}) is larger than max_tokens ({max_tokens})")]
    MinTokensAboveMax { min_tokens: usize, max_tokens: usize },
    #[error("n must be at least 1")]
    ZeroSamples,
    #[error("n = {n} exceeds the engine's limit of {max_num_seqs} concurrent sequences")]
    TooManySamples { n: usize, max_num_seqs: usize },
    #[error("speculative_method \"{method}\" needs speculative decoding, which this server runs without")]
    NoSpeculation { method: &'static str },
    #[error(
        "speculative_method \"draft_model\" needs a draft (a draft model or the target's first layers), \
         and this server has none; \"ngram\" and \"suffix\" are available"
    )]
    NoDraft,
    #[error("the input has {prompt_len} tokens; this model embeds at most {max_len} tokens at once")]
    PoolingTooLong { prompt_len: usize, max_len: usize },
    #[error(
        "a pair's second text must start inside a pooled input, after its first token (at {start} \
         of {prompt_len} tokens)"
    )]
    SecondSegmentOutside { start: usize, prompt_len: usize },
    #[error(
        "beam search needs a width (best_of, else n) of at least n = {n} and at most the engine's \
         {max_num_seqs} sequences; got {width}"
    )]
    BeamWidth { width: usize, n: usize, max_num_seqs: usize },
    #[error(
        "this beam search may need {blocks} KV cache blocks at once (every beam at full length), \
         more than the {num_blocks} the cache holds; set a lower max_tokens or a narrower width (best_of, n)"
    )]
    BeamTooLarge { blocks: usize, num_blocks: usize },
    #[error("beam search scores the model's own distribution, so it takes no {what}")]
    BeamUnsupported { what: &'static str },
    #[error("a prefill for remote decoding takes one sample (n = 1, no beam search)")]
    KvHoldSamples,
    #[error("a pooling request generates nothing, so it takes no {what}")]
    PoolingGenerates { what: &'static str },
    #[error(transparent)]
    Sampling(#[from] SamplingParamsError),
    /// The prompt's images cannot run (see [`crate::multimodal::validate_images`]).
    #[error(transparent)]
    Image(#[from] crate::multimodal::ImageRequestError),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::speculative::{SpeculativeConfig, SpeculativeMethod};

    fn config() -> EngineConfig {
        EngineConfig::new(16, 64, 100)
    }

    fn req(prompt_len: usize) -> Request {
        Request::new(1, vec![5; prompt_len], Arc::new(SamplingParams::default()))
    }

    #[test]
    fn max_tokens_defaults_to_the_rest_of_the_context() {
        assert_eq!(req(30).validate(&config()), Ok(70));
        assert_eq!(req(30).with_max_tokens(70).validate(&config()), Ok(70));
    }

    #[test]
    fn limits_are_enforced() {
        let c = config();
        assert_eq!(req(0).validate(&c), Err(RequestError::EmptyPrompt));
        assert!(matches!(req(100).validate(&c), Err(RequestError::PromptTooLong { .. })));
        assert!(matches!(req(30).with_max_tokens(71).validate(&c), Err(RequestError::TooLong { .. })));
        assert_eq!(req(30).with_max_tokens(0).validate(&c), Err(RequestError::ZeroMaxTokens));
        assert_eq!(req(3).with_n(0).validate(&c), Err(RequestError::ZeroSamples));
        assert!(matches!(req(3).with_n(257).validate(&c), Err(RequestError::TooManySamples { .. })));
        let stop = StopConditions { min_tokens: 9, ..Default::default() };
        assert!(matches!(
            req(3).with_max_tokens(8).with_stop(stop).validate(&c),
            Err(RequestError::MinTokensAboveMax { .. })
        ));
        let bad = SamplingParams { top_p: 0.0, ..Default::default() };
        let r = Request::new(1, vec![1], Arc::new(bad));
        assert!(matches!(r.validate(&c), Err(RequestError::Sampling(_))));
    }

    #[test]
    fn a_pooling_request_fits_one_step_and_generates_nothing() {
        let c = EngineConfig { max_num_batched_tokens: 64, ..EngineConfig::new(16, 64, 100) };
        let pool = |len| Request::pooling(1, vec![5; len]);
        assert_eq!(pool(64).validate(&c), Ok(0));
        // The whole context, with no room left for a token: pooling samples none.
        let wide = EngineConfig { max_num_batched_tokens: 100, ..c.clone() };
        assert_eq!(pool(100).validate(&wide), Ok(0));
        assert_eq!(
            pool(101).validate(&wide),
            Err(RequestError::PoolingTooLong { prompt_len: 101, max_len: 100 })
        );
        assert_eq!(pool(65).validate(&c), Err(RequestError::PoolingTooLong { prompt_len: 65, max_len: 64 }));
        assert_eq!(pool(0).validate(&c), Err(RequestError::EmptyPrompt));
        assert_eq!(Request::pooling_pair(1, vec![5; 4], 2).validate(&c), Ok(0));
        for start in [0, 4] {
            let outside = RequestError::SecondSegmentOutside { start, prompt_len: 4 };
            assert_eq!(Request::pooling_pair(1, vec![5; 4], start).validate(&c), Err(outside));
        }
        let generating =
            Request { second_segment: Some(1), ..Request::new(1, vec![5; 4], Default::default()) };
        assert!(matches!(generating.validate(&c), Err(RequestError::SecondSegmentOutside { .. })));
        assert_eq!(pool(3).with_n(2).validate(&c), Err(RequestError::PoolingGenerates { what: "n" }));
        assert_eq!(
            pool(3).with_max_tokens(2).validate(&c),
            Err(RequestError::PoolingGenerates { what: "max_tokens" })
        );
    }

    #[test]
    fn a_speculative_method_must_be_one_the_engine_has() {
        let plain = config();
        let ngram = EngineConfig { speculative: Some(SpeculativeConfig::ngram(4)), ..config() };
        let draft = EngineConfig {
            speculative: Some(SpeculativeConfig {
                method: SpeculativeMethod::DraftModel,
                ..SpeculativeConfig::ngram(4)
            }),
            ..config()
        };
        let suffix = req(3).with_speculative_method(ProposerKind::Suffix);
        let executor = req(3).with_speculative_method(ProposerKind::Executor);
        assert_eq!(suffix.validate(&plain), Err(RequestError::NoSpeculation { method: "suffix" }));
        assert_eq!(suffix.validate(&ngram), Ok(97));
        assert_eq!(suffix.validate(&draft), Ok(97));
        assert_eq!(executor.validate(&ngram), Err(RequestError::NoDraft));
        assert_eq!(executor.validate(&draft), Ok(97));
        assert_eq!(req(3).with_speculative_method(ProposerKind::Ngram).validate(&draft), Ok(97));
    }
}

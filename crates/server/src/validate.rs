//! Request validation: the shared generation parameters of a chat or completions request
//! ([`CommonParams`], still wire-shaped) become [`GenerationParams`], engine-shaped and in range,
//! or an [`InvalidParam`] naming the offending parameter. Also the context-length check, which
//! needs the prompt's token count.

use std::collections::HashMap;

use pagoda_engine::speculative::{ProposerKind, MAX_SPECULATIVE_TOKENS};
use pagoda_engine::{BeamSearch, SamplingParams};
use pagoda_text::StopStrings;

use crate::error::{ApiError, InvalidParam};
use crate::openai::{CommonParams, SpeculativeMethodParam};

/// Upper bound on `n`, as in OpenAI's API.
pub const MAX_N: u32 = 128;
/// Upper bound on the number of stop strings.
pub const MAX_STOP_STRINGS: usize = 16;
/// Upper bound on the stop strings' total length in bytes: they are held and matched for every
/// generated token, so their size is bounded like the prompt's.
pub const MAX_STOP_BYTES: usize = 4096;

/// What the server knows that the ranges depend on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub vocab_size: usize,
    pub max_model_len: usize,
    /// Most alternatives a request may ask for (`--max-logprobs`).
    pub max_logprobs: usize,
    /// Most sequences the engine runs at once: the widest beam search.
    pub max_num_seqs: usize,
    /// Requests' `priority` orders the queue (`--scheduling-policy priority`).
    pub priority_scheduling: bool,
}

/// Validated generation parameters, independent of the wire format.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerationParams {
    pub sampling: SamplingParams,
    pub n: usize,
    /// `None`: as many as the context allows (resolved once the prompt is tokenized).
    pub max_tokens: Option<usize>,
    pub max_tokens_param: &'static str,
    pub min_tokens: usize,
    /// The request's cap on speculative proposals per step; `None`: the server's.
    pub max_speculative_tokens: Option<usize>,
    /// The request's own proposer; `None`: the server's method. Whether the server has it is
    /// the engine's check.
    pub speculative_method: Option<ProposerKind>,
    /// Compiled once per call, shared by its prompts and samples.
    pub stop: StopStrings,
    pub stop_token_ids: Vec<u32>,
    pub ignore_eos: bool,
    pub skip_special_tokens: bool,
    /// The queue's order: lower first (0 unless the server schedules by priority).
    pub priority: i32,
    /// Structured output: the compiled grammar every choice must match.
    pub grammar: Option<pagoda_structured::CompiledGrammar>,
    /// The grammar applies only after this text (the end of the model's reasoning).
    pub grammar_after: Option<&'static str>,
    /// At most this much reasoning (Anthropic's `thinking.budget_tokens`).
    pub reasoning_budget: Option<std::sync::Arc<crate::reasoning_budget::BudgetSpec>>,
    /// Score the prompt's tokens with this many alternatives each (completions' `echo` with
    /// `logprobs`, or vLLM's `prompt_logprobs`).
    pub prompt_logprobs: Option<usize>,
    /// Beam search instead of sampling.
    pub beam: Option<BeamSearch>,
    /// The LoRA adapter the request's `model` named; `None`: the base model.
    pub lora: Option<pagoda_engine::LoraId>,
    /// Prefill/decode disaggregation: hold the prompt's KV, or fetch it first.
    pub kv_transfer: Option<pagoda_kv_transfer::Directive>,
}

fn check_range(param: &str, value: Option<f32>, lo: f32, hi: f32, lo_open: bool) -> Result<(), InvalidParam> {
    let Some(v) = value else { return Ok(()) };
    let above_lo = if lo_open { v > lo } else { v >= lo };
    if v.is_finite() && above_lo && v <= hi {
        Ok(())
    } else {
        let open = if lo_open { "(" } else { "[" };
        Err(InvalidParam::new(param, format!("{param} must be in {open}{lo}, {hi}], got {v}")))
    }
}

fn token_in_vocab(param: &str, id: u32, vocab_size: usize) -> Result<(), InvalidParam> {
    if (id as usize) < vocab_size {
        Ok(())
    } else {
        Err(InvalidParam::new(param, format!("token id {id} is outside the vocabulary (size {vocab_size})")))
    }
}

/// Checks ranges and types that serde could not, and converts to engine terms.
pub fn validate(params: CommonParams, limits: &Limits) -> Result<GenerationParams, InvalidParam> {
    check_range("temperature", params.temperature, 0.0, 2.0, false)?;
    check_range("top_p", params.top_p, 0.0, 1.0, true)?;
    check_range("min_p", params.min_p, 0.0, 1.0, false)?;
    check_range("presence_penalty", params.presence_penalty, -2.0, 2.0, false)?;
    check_range("frequency_penalty", params.frequency_penalty, -2.0, 2.0, false)?;
    check_range("repetition_penalty", params.repetition_penalty, 0.0, 2.0, true)?;

    let top_k = match params.top_k {
        None | Some(-1) | Some(0) => 0,
        Some(k) if k > 0 => k as usize,
        Some(k) => {
            return Err(InvalidParam::new(
                "top_k",
                format!("top_k must be -1 (disabled) or at least 0, got {k}"),
            ))
        }
    };

    let n = params.n.unwrap_or(1);
    if !(1..=MAX_N).contains(&n) {
        return Err(InvalidParam::new("n", format!("n must be in [1, {MAX_N}], got {n}")));
    }
    let beam = beam_search(&params, n, limits.max_num_seqs)?;

    let max_tokens_param = params.max_tokens_param;
    if let Some(0) = params.max_tokens {
        return Err(InvalidParam::new(
            max_tokens_param,
            format!("{max_tokens_param} must be at least 1, got 0"),
        ));
    }
    let min_tokens = params.min_tokens.unwrap_or(0);
    if let Some(max) = params.max_tokens {
        if min_tokens > max {
            return Err(InvalidParam::new(
                "min_tokens",
                format!("min_tokens ({min_tokens}) must not exceed {max_tokens_param} ({max})"),
            ));
        }
    }
    if let Some(k) = params.num_speculative_tokens.filter(|&k| k as usize > MAX_SPECULATIVE_TOKENS) {
        return Err(InvalidParam::new(
            "num_speculative_tokens",
            format!("num_speculative_tokens must be in [0, {MAX_SPECULATIVE_TOKENS}], got {k}"),
        ));
    }

    let stop = params.stop.map(|s| s.into_vec()).unwrap_or_default();
    if stop.len() > MAX_STOP_STRINGS {
        return Err(InvalidParam::new(
            "stop",
            format!("at most {MAX_STOP_STRINGS} stop strings are allowed, got {}", stop.len()),
        ));
    }
    if stop.iter().any(String::is_empty) {
        return Err(InvalidParam::new("stop", "stop strings must not be empty"));
    }
    let stop_bytes: usize = stop.iter().map(String::len).sum();
    if stop_bytes > MAX_STOP_BYTES {
        return Err(InvalidParam::new(
            "stop",
            format!(
                "the stop strings are {stop_bytes} bytes long in all; at most {MAX_STOP_BYTES} are allowed"
            ),
        ));
    }
    let stop_token_ids = params.stop_token_ids.unwrap_or_default();
    for &id in &stop_token_ids {
        token_in_vocab("stop_token_ids", id, limits.vocab_size)?;
    }

    let mut logit_bias = HashMap::new();
    for (key, bias) in params.logit_bias.unwrap_or_default() {
        let id: u32 = key.trim().parse().map_err(|_| {
            InvalidParam::new("logit_bias", format!("logit_bias keys must be token ids, got {key:?}"))
        })?;
        token_in_vocab("logit_bias", id, limits.vocab_size)?;
        if !(bias.is_finite() && (-100.0..=100.0).contains(&bias)) {
            return Err(InvalidParam::new(
                "logit_bias",
                format!("logit_bias values must be in [-100, 100], got {bias} for token {id}"),
            ));
        }
        logit_bias.insert(id, bias);
    }

    if let Some(k) = params.logprobs {
        if k as usize > limits.max_logprobs {
            return Err(InvalidParam::new(
                params.logprobs_param,
                format!("at most {} logprobs per token are available, got {k}", limits.max_logprobs),
            ));
        }
    }

    let priority = match params.priority {
        None | Some(0) => 0,
        Some(_) if !limits.priority_scheduling => {
            return Err(InvalidParam::new(
                "priority",
                "priority scheduling is not enabled: start the server with --scheduling-policy priority",
            ))
        }
        Some(p) => i32::try_from(p)
            .map_err(|_| InvalidParam::new("priority", format!("priority must fit in 32 bits, got {p}")))?,
    };

    let sampling = SamplingParams {
        // Beam search is deterministic: greedy unless told otherwise (and then refused).
        temperature: params.temperature.unwrap_or(if beam.is_some() { 0.0 } else { 1.0 }),
        top_k,
        top_p: params.top_p.unwrap_or(1.0),
        min_p: params.min_p.unwrap_or(0.0),
        repetition_penalty: params.repetition_penalty.unwrap_or(1.0),
        presence_penalty: params.presence_penalty.unwrap_or(0.0),
        frequency_penalty: params.frequency_penalty.unwrap_or(0.0),
        logit_bias,
        // A negative seed is as good as any other: reinterpret its bits.
        seed: params.seed.map(|s| s as u64),
        logprobs: params.logprobs.map(|k| k as usize),
    };
    Ok(GenerationParams {
        sampling,
        n: n as usize,
        max_tokens: params.max_tokens.map(|m| m as usize),
        max_tokens_param,
        min_tokens: min_tokens as usize,
        max_speculative_tokens: params.num_speculative_tokens.map(|k| k as usize),
        speculative_method: params.speculative_method.map(|m| match m {
            SpeculativeMethodParam::Ngram => ProposerKind::Ngram,
            SpeculativeMethodParam::Suffix => ProposerKind::Suffix,
            SpeculativeMethodParam::DraftModel => ProposerKind::Executor,
        }),
        stop: StopStrings::new(stop),
        stop_token_ids,
        ignore_eos: params.ignore_eos,
        skip_special_tokens: params.skip_special_tokens,
        priority,
        grammar: None,
        grammar_after: None,
        reasoning_budget: None,
        prompt_logprobs: None,
        beam,
        lora: None,
        kv_transfer: None,
    })
}

/// vLLM's beam search fields: with `use_beam_search`, the width (`best_of`, else `n`, at
/// least `n`) and `length_penalty`, and each token's logprob only, without alternatives (the
/// engine refuses what reshapes sampling, naming the field). Without it `best_of` must equal
/// `n` and `length_penalty` has nothing to apply to.
fn beam_search(
    params: &CommonParams,
    n: u32,
    max_num_seqs: usize,
) -> Result<Option<BeamSearch>, InvalidParam> {
    if !params.use_beam_search {
        if let Some(best_of) = params.best_of.filter(|&b| b != n) {
            return Err(InvalidParam::new(
                "best_of",
                format!("best_of ({best_of}) must equal n ({n}) unless use_beam_search is true"),
            ));
        }
        if params.length_penalty.is_some() {
            return Err(InvalidParam::new(
                "length_penalty",
                "length_penalty applies only with use_beam_search",
            ));
        }
        return Ok(None);
    }
    let width = params.best_of.unwrap_or(n);
    let width_param = if params.best_of.is_some() { "best_of" } else { "n" };
    if width < n {
        return Err(InvalidParam::new(
            "best_of",
            format!("best_of ({width}) is the number of beams and must be at least n ({n})"),
        ));
    }
    if width as usize > max_num_seqs {
        return Err(InvalidParam::new(
            width_param,
            format!("{width} beams are more than the {max_num_seqs} sequences this server runs at once"),
        ));
    }
    if params.logprobs.is_some_and(|k| k > 0) {
        return Err(InvalidParam::new(
            params.logprobs_param,
            "beam search gives each token's logprob without alternatives; ask for 0",
        ));
    }
    let length_penalty = params.length_penalty.unwrap_or(1.0);
    if !length_penalty.is_finite() {
        return Err(InvalidParam::new("length_penalty", "length_penalty must be a finite number"));
    }
    Ok(Some(BeamSearch { width: width as usize, length_penalty }))
}

/// The number of tokens to generate for a prompt of `prompt_tokens`: the requested
/// `max_tokens` if prompt plus completion fit in `max_model_len`, else an error saying both
/// numbers; without a request, whatever the context allows.
/// `prompt_param` names the prompt's parameter (`messages` or `prompt`) in the error.
pub fn resolve_max_tokens(
    prompt_tokens: usize,
    requested: Option<usize>,
    max_model_len: usize,
    prompt_param: &'static str,
) -> Result<usize, ApiError> {
    match requested {
        Some(max_tokens) if prompt_tokens + max_tokens > max_model_len => {
            Err(ApiError::ContextLengthExceeded { prompt_tokens, max_tokens, max_model_len })
        }
        Some(max_tokens) => Ok(max_tokens),
        None if prompt_tokens >= max_model_len => {
            Err(ApiError::PromptTooLong { prompt_tokens, max_model_len, param: prompt_param })
        }
        None => Ok(max_model_len - prompt_tokens),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::openai::StopSpec;

    const LIMITS: Limits = Limits {
        vocab_size: 1000,
        max_model_len: 2048,
        max_logprobs: 20,
        max_num_seqs: 64,
        priority_scheduling: false,
    };

    #[test]
    fn priority_needs_the_priority_policy() {
        let with = |p: i64| CommonParams { priority: Some(p), ..base() };
        assert_eq!(validate(with(0), &LIMITS).unwrap().priority, 0);
        assert_eq!(validate(with(-5), &LIMITS).unwrap_err().param.as_deref(), Some("priority"));
        let by_priority = Limits { priority_scheduling: true, ..LIMITS };
        assert_eq!(validate(with(-5), &by_priority).unwrap().priority, -5);
        let err = validate(with(1 << 40), &by_priority).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("priority"));
    }

    fn base() -> CommonParams {
        CommonParams {
            max_tokens_param: "max_tokens",
            logprobs_param: "logprobs",
            skip_special_tokens: true,
            ..Default::default()
        }
    }

    fn param_of(p: CommonParams) -> Option<String> {
        validate(p, &LIMITS).expect_err("should be invalid").param
    }

    #[test]
    fn defaults_are_openai_defaults() {
        let g = validate(base(), &LIMITS).unwrap();
        assert_eq!(g.sampling.temperature, 1.0);
        assert_eq!(g.sampling.top_p, 1.0);
        assert_eq!(g.n, 1);
        assert_eq!(g.max_tokens, None);
        assert!(g.stop.is_empty());
        assert_eq!(g.sampling.logprobs, None);
    }

    #[test]
    fn out_of_range_values_name_their_parameter() {
        let cases: Vec<(CommonParams, &str)> = vec![
            (CommonParams { temperature: Some(2.5), ..base() }, "temperature"),
            (CommonParams { temperature: Some(-0.1), ..base() }, "temperature"),
            (CommonParams { top_p: Some(0.0), ..base() }, "top_p"),
            (CommonParams { top_p: Some(1.01), ..base() }, "top_p"),
            (CommonParams { top_k: Some(-2), ..base() }, "top_k"),
            (CommonParams { min_p: Some(1.5), ..base() }, "min_p"),
            (CommonParams { n: Some(0), ..base() }, "n"),
            (CommonParams { n: Some(MAX_N + 1), ..base() }, "n"),
            (CommonParams { max_tokens: Some(0), ..base() }, "max_tokens"),
            (
                CommonParams { max_tokens: Some(0), max_tokens_param: "max_completion_tokens", ..base() },
                "max_completion_tokens",
            ),
            (CommonParams { presence_penalty: Some(3.0), ..base() }, "presence_penalty"),
            (CommonParams { frequency_penalty: Some(-2.5), ..base() }, "frequency_penalty"),
            (CommonParams { repetition_penalty: Some(0.0), ..base() }, "repetition_penalty"),
            (CommonParams { min_tokens: Some(10), max_tokens: Some(5), ..base() }, "min_tokens"),
            (CommonParams { stop: Some(StopSpec::One(String::new())), ..base() }, "stop"),
            (CommonParams { stop: Some(StopSpec::Many(vec!["x".into(); 17])), ..base() }, "stop"),
            (CommonParams { stop: Some(StopSpec::Many(vec!["y".repeat(1025); 4])), ..base() }, "stop"),
            (CommonParams { stop_token_ids: Some(vec![5, 1000]), ..base() }, "stop_token_ids"),
            (CommonParams { logit_bias: Some([("abc".into(), 1.0)].into()), ..base() }, "logit_bias"),
            (CommonParams { logit_bias: Some([("1000".into(), 1.0)].into()), ..base() }, "logit_bias"),
            (CommonParams { logit_bias: Some([("5".into(), 101.0)].into()), ..base() }, "logit_bias"),
            (CommonParams { logprobs: Some(21), ..base() }, "logprobs"),
            (CommonParams { num_speculative_tokens: Some(17), ..base() }, "num_speculative_tokens"),
        ];
        for (params, expected) in cases {
            let debug = format!("{params:?}");
            assert_eq!(param_of(params).as_deref(), Some(expected), "{debug}");
        }
    }

    #[test]
    fn chat_logprobs_error_names_top_logprobs() {
        let p = CommonParams { logprobs: Some(30), logprobs_param: "top_logprobs", ..base() };
        assert_eq!(param_of(p).as_deref(), Some("top_logprobs"));
    }

    #[test]
    fn valid_values_convert() {
        let p = CommonParams {
            temperature: Some(0.0),
            top_k: Some(-1),
            top_p: Some(0.5),
            n: Some(3),
            seed: Some(-1),
            stop: Some(StopSpec::One("\n".into())),
            logit_bias: Some([(" 7".into(), -100.0)].into()),
            logprobs: Some(5),
            max_tokens: Some(10),
            min_tokens: Some(10),
            num_speculative_tokens: Some(0),
            ..base()
        };
        let g = validate(p, &LIMITS).unwrap();
        assert_eq!(g.max_speculative_tokens, Some(0));
        assert_eq!(validate(base(), &LIMITS).unwrap().max_speculative_tokens, None);
        assert!(g.sampling.is_greedy());
        assert_eq!(g.sampling.top_k, 0);
        assert_eq!(g.sampling.seed, Some(u64::MAX));
        assert_eq!(g.sampling.logit_bias.get(&7), Some(&-100.0));
        assert_eq!(g.sampling.logprobs, Some(5));
        assert_eq!((g.n, g.max_tokens, g.min_tokens), (3, Some(10), 10));
        assert_eq!(g.stop.strings(), ["\n"]);
    }

    #[test]
    fn max_tokens_resolution() {
        assert_eq!(resolve_max_tokens(10, None, 100, "prompt").unwrap(), 90);
        assert_eq!(resolve_max_tokens(10, Some(90), 100, "prompt").unwrap(), 90);
        let err = resolve_max_tokens(10, Some(91), 100, "prompt").unwrap_err();
        assert_eq!(
            err,
            ApiError::ContextLengthExceeded { prompt_tokens: 10, max_tokens: 91, max_model_len: 100 }
        );
        let err = resolve_max_tokens(100, None, 100, "messages").unwrap_err();
        assert!(matches!(err, ApiError::PromptTooLong { .. }));
        assert_eq!(err.param(), Some("messages"));
    }
}

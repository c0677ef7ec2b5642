//! One chat turn, whichever API it arrived through. OpenAI's chat completions, Anthropic's
//! Messages and OpenAI's Responses each translate their request into a [`ChatTurn`] (checked
//! messages, template options, tools, a requested grammar and the sampling parameters) and run it
//! here: the tools' grammar, validation, grammar compilation, the chat template (or our generic
//! tool prompt), the reasoning split, and submission to the engine. Their outputs all come back
//! through [`crate::chat_output`], so every API shows the same reasoning, content and tool calls.

use std::time::Instant;

use pagoda_text::{ChatMessage, ToolCallFormat};

use crate::chat_output::ChoiceSplit;
use crate::error::ApiError;
use crate::openai::CommonParams;
use crate::prompt::{ChatOptions, TokenizedPrompt};
use crate::reasoning_budget::BudgetSpec;
use crate::state::AppState;
use crate::structured::RequestedGrammar;
use crate::submit::{submit, Submission};
use crate::tools::grammar::tool_grammar;
use crate::tools::messages::generic_conversation;
use crate::tools::ToolRequest;
use crate::validate::validate;

/// A chat request in the server's own terms.
#[derive(Debug, Clone)]
pub struct ChatTurn {
    /// Checked messages, as the template takes them (each image part left as the model's
    /// placeholder in the text).
    pub messages: Vec<ChatMessage>,
    /// The image parts, in prompt order (empty on a text-only model: it refuses them).
    pub images: Vec<crate::media::ImageRef>,
    pub options: ChatOptions,
    /// Active tools (a `none` choice is no tools).
    pub tools: Option<ToolRequest>,
    /// Structured output the request asks for; excludes `tools`.
    pub grammar: Option<RequestedGrammar>,
    pub params: CommonParams,
    /// The request field holding the conversation (`messages`, `input`), for errors.
    pub prompt_param: &'static str,
    /// A `max_tokens` beyond the context is cut to what the context leaves (Anthropic's
    /// clients ask for more than a small model's whole context), not refused.
    pub clamp_max_tokens: bool,
    /// The most tokens the model may reason for (needs the server's reasoning parser).
    pub reasoning_budget: Option<usize>,
    /// Score the rendered prompt's tokens with this many alternatives (vLLM's `prompt_logprobs`).
    pub prompt_logprobs: Option<usize>,
    /// The LoRA adapter the request's `model` named; `None`: the base model.
    pub lora: Option<pagoda_engine::LoraId>,
    /// Prefill/decode disaggregation (chat completions' `kv_transfer_params` or bootstrap fields).
    pub kv_transfer: Option<pagoda_kv_transfer::Directive>,
}

/// A turn admitted by the engine.
pub struct StartedTurn {
    pub submission: Submission,
    /// How each choice's text splits into reasoning, content and tool calls.
    pub split: ChoiceSplit,
    /// Whether `max_tokens` was cut to the context ([`ChatTurn::clamp_max_tokens`]).
    pub max_tokens_clamped: bool,
}

impl ChatTurn {
    /// The prompt the model sees: tools shown through the template, or written into the
    /// conversation for templates without tools.
    pub async fn render(&self, state: &AppState) -> Result<TokenizedPrompt, ApiError> {
        let (messages, options) = self.template_input(state);
        crate::media::build::chat(&state.media, &state.prompts, messages, options, &self.images, None)
            .await
            .map_err(|e| e.naming_prompt(self.prompt_param))
    }

    /// The number of tokens [`Self::render`] gives, even beyond the context (`count_tokens`).
    pub async fn count(&self, state: &AppState) -> Result<usize, ApiError> {
        let (messages, options) = self.template_input(state);
        let limit = Some(usize::MAX);
        let prompt =
            crate::media::build::chat(&state.media, &state.prompts, messages, options, &self.images, limit)
                .await?;
        Ok(prompt.token_ids.len())
    }

    /// The messages and options the template renders, with the tools in one or the other.
    fn template_input(&self, state: &AppState) -> (Vec<ChatMessage>, ChatOptions) {
        let mut messages = self.messages.clone();
        let mut options = self.options.clone();
        if let Some(t) = &self.tools {
            if state.tool_format == ToolCallFormat::Generic {
                messages = generic_conversation(messages, t);
            } else {
                options
                    .template_kwargs
                    .entry("tools")
                    .or_insert_with(|| serde_json::Value::Array(t.raw.clone()));
            }
        }
        (messages, options)
    }

    /// Validates, renders and submits the turn.
    pub async fn start(self, state: &AppState, arrival: Instant) -> Result<StartedTurn, ApiError> {
        if let (Some(_), Some(g)) = (&self.tools, &self.grammar) {
            let field = g.param.split('.').next().unwrap_or("response_format").to_owned();
            return Err(ApiError::invalid(
                field.clone(),
                format!("`{field}` cannot be combined with tools; set `tool_choice` to `none` to use it"),
            ));
        }
        let requested = match &self.tools {
            Some(t) => tool_grammar(state.tool_format, t)
                .map(|spec| RequestedGrammar { spec, param: "tools".into() }),
            None => self.grammar.clone(),
        };
        let mut params = validate(self.params.clone(), &state.limits)?;
        params.prompt_logprobs = self.prompt_logprobs;
        params.lora = self.lora;
        params.kv_transfer = self.kv_transfer.clone();
        if let Some(requested) = requested {
            params.grammar = Some(crate::structured::compile(state, requested).await?);
        }
        let prompt = self.render(state).await?;
        let room = state.limits.max_model_len.saturating_sub(prompt.token_ids.len());
        let max_tokens_clamped =
            self.clamp_max_tokens && room > 0 && params.max_tokens.is_some_and(|m| m > room);
        if max_tokens_clamped {
            params.max_tokens = Some(room);
        }
        // A reasoning model's prompt may open (or, with thinking switched off, close) the reasoning.
        let prompt_tail = prompt.text.trim_end();
        let reasoning = state.reasoning.map(|format| (format, prompt_tail.ends_with("<think>")));
        if let Some((format, _)) = reasoning {
            if !prompt_tail.ends_with(format.end_tag()) {
                params.grammar_after = Some(format.end_tag());
            }
        }
        if let (Some(budget), Some((format, opened))) = (self.reasoning_budget, reasoning) {
            let tokenizer = std::sync::Arc::clone(state.prompts.tokenizer());
            let end_ids = tokenizer
                .encode(format.end_tag(), false)
                .map_err(|e| ApiError::Internal(format!("tokenizing the reasoning end tag: {e}")))?;
            params.reasoning_budget = Some(std::sync::Arc::new(BudgetSpec {
                budget,
                format,
                prompt_opened: opened,
                end_ids,
                tokenizer,
                vocab_size: state.limits.vocab_size,
            }));
        }
        let split = ChoiceSplit { reasoning, tools: self.tools.as_ref().map(|_| state.tool_format) };
        let prompts = vec![prompt];
        crate::disaggregation::fetch_prompt_kv(state, &params, &prompts).await?;
        let submission = submit(state, prompts, &params, arrival, self.prompt_param)?;
        Ok(StartedTurn { submission, split, max_tokens_clamped })
    }
}

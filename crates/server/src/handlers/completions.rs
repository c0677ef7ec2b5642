//! `POST /v1/completions`: tokenize the prompt(s), generate, and answer with one
//! `text_completion` or a stream of them. Several prompts give `n` choices each, numbered
//! prompt by prompt.

use std::sync::Arc;

use axum::extract::State;
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::{self, BoxStream, StreamExt};
use pagoda_text::Tokenizer;

use super::generation::{Generation, GenerationErrors};
use super::{finish_reason, response_id};
use crate::error::ApiError;
use crate::logprobs::CompletionLogprobsBuilder;
use crate::openai::{
    unix_now, CompletionChoice, CompletionLogprobs, CompletionRequest, CompletionResponse, PromptLogprobs,
    Usage,
};
use crate::prompt::TokenizedPrompt;
use crate::sse;
use crate::state::SharedState;
use crate::submit::{failure, submit, ChoiceEvent, Submission};
use crate::validate::validate;

#[derive(Clone)]
struct Context {
    id: String,
    created: u64,
    model: String,
    tokenizer: Arc<Tokenizer>,
}

impl Context {
    fn response(&self, choices: Vec<CompletionChoice>, usage: Option<Usage>) -> CompletionResponse {
        CompletionResponse {
            id: self.id.clone(),
            object: "text_completion".to_owned(),
            created: self.created,
            model: self.model.clone(),
            choices,
            usage,
            kv_transfer_params: None,
        }
    }
}

/// Text completion (OpenAI legacy). With `stream: true` the response is `text/event-stream`:
/// one `text_completion` object per event, then `data: [DONE]`.
#[utoipa::path(
    post,
    path = "/v1/completions",
    tag = "openai",
    request_body = CompletionRequest,
    responses(
        (status = 200, description = "The completion (or, with stream=true, an SSE stream of text_completion objects)",
         body = CompletionResponse),
        GenerationErrors,
    ),
    security((), ("api_key" = []))
)]
pub async fn completions(
    State(state): State<SharedState>,
    Generation { req, arrival, model, lora }: Generation<CompletionRequest>,
) -> Result<Response, ApiError> {
    if req.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::invalid("suffix", "suffix is not supported"));
    }
    let echo = req.echo.unwrap_or(false);
    crate::openai::router_fields::check(&req.extensions.router_fields())?;
    let requested_grammar = req.extensions.grammar_fields().grammar()?;
    let mut params = validate(req.common(), &state.limits)?;
    params.lora = lora;
    params.kv_transfer = crate::disaggregation::directive_of(
        state.disaggregation.as_ref(),
        req.extensions.pd_fields(req.openai.stream),
        state.engine.next_request_id(),
    )?;
    let shown = Shown {
        echo,
        logprobs: params.sampling.logprobs.is_some(),
        prompt_logprobs: req.extensions.prompt_logprobs.is_some(),
    };
    if let Some(k) = req.extensions.prompt_logprobs.filter(|&k| k as usize > state.limits.max_logprobs) {
        return Err(ApiError::invalid(
            "prompt_logprobs",
            format!("at most {} logprobs per token are available, got {k}", state.limits.max_logprobs),
        ));
    }
    // The echoed prompt's logprobs come with as many alternatives as the completion's.
    params.prompt_logprobs =
        req.extensions.prompt_logprobs.map(|k| k as usize).or(params.sampling.logprobs.filter(|_| echo));
    if let Some(requested) = requested_grammar {
        params.grammar = Some(crate::structured::compile(&state, requested).await?);
    }
    let add_special_tokens = req.extensions.add_special_tokens.unwrap_or(true);
    let prompts = state.prompts.completion(req.prompt.into_inputs(), add_special_tokens).await?;
    crate::disaggregation::fetch_prompt_kv(&state, &params, &prompts).await?;
    let submission = submit(&state, prompts, &params, arrival, "prompt")?;
    let ctx = Context {
        id: response_id("cmpl"),
        created: unix_now(),
        model,
        tokenizer: Arc::clone(state.prompts.tokenizer()),
    };
    if req.openai.streams() {
        let include_usage = req.openai.include_usage();
        Ok(stream_response(state, ctx, submission, shown, include_usage))
    } else {
        let response = collect_response(&state, ctx, submission, shown).await?;
        Ok(Json(response).into_response())
    }
}

/// What a choice shows of its prompt.
#[derive(Debug, Clone, Copy)]
struct Shown {
    /// The prompt's text before the completion's (and, with `logprobs`, its tokens first).
    echo: bool,
    logprobs: bool,
    /// vLLM's `prompt_logprobs` field.
    prompt_logprobs: bool,
}

impl Shown {
    /// The `logprobs` and `prompt_logprobs` of a choice's prompt part, from the prompt's scores.
    fn prompt_parts(
        self,
        tokenizer: &Tokenizer,
        prompt_ids: &[u32],
        scored: &[pagoda_engine::TopLogprobs],
    ) -> (Option<CompletionLogprobs>, Option<PromptLogprobs>) {
        let logprobs = (self.echo && self.logprobs)
            .then(|| CompletionLogprobsBuilder::new("").push_prompt(tokenizer, prompt_ids, scored));
        let prompt = self.prompt_logprobs.then(|| crate::logprobs::prompt_logprobs(tokenizer, scored));
        (logprobs, prompt)
    }
}

async fn collect_response(
    state: &SharedState,
    ctx: Context,
    submission: Submission,
    shown: Shown,
) -> Result<CompletionResponse, ApiError> {
    let n = submission.n;
    let want_logprobs = submission.wants_logprobs;
    let kv_transfer_params = submission.kv_transfer_params.clone();
    let (prompts, mut collected) = submission.collect(state).await?;
    // One choice of each prompt carries its scores.
    let scores: Vec<Vec<pagoda_engine::TopLogprobs>> = collected
        .choices
        .chunks_mut(n)
        .map(|choices| choices.iter_mut().find_map(|c| c.prompt_logprobs.take()).unwrap_or_default())
        .collect();
    let choices = collected
        .choices
        .into_iter()
        .enumerate()
        .map(|(index, c)| {
            let prompt = &prompts[index / n];
            let prefix = if shown.echo { prompt.text.as_str() } else { "" };
            let (echoed, prompt_logprobs) =
                shown.prompt_parts(&ctx.tokenizer, &prompt.token_ids, &scores[index / n]);
            let logprobs = want_logprobs.then(|| {
                let mut all = echoed.unwrap_or_default();
                all.append(CompletionLogprobsBuilder::new(prefix).push(&ctx.tokenizer, &c.logprobs));
                all
            });
            let (finish, stop_reason) = match &c.finish {
                Some(r) => {
                    let (f, s) = finish_reason(r);
                    (Some(f), s)
                }
                None => (None, None),
            };
            CompletionChoice {
                index,
                text: format!("{prefix}{}", c.text),
                logprobs,
                finish_reason: finish,
                stop_reason,
                prompt_logprobs,
            }
        })
        .collect();
    let mut response =
        ctx.response(choices, Some(Usage::new(collected.prompt_tokens, collected.completion_tokens)));
    response.kv_transfer_params = kv_transfer_params;
    Ok(response)
}

struct StreamState {
    state: SharedState,
    ctx: Context,
    events: BoxStream<'static, ChoiceEvent>,
    include_usage: bool,
    want_logprobs: bool,
    shown: Shown,
    /// Choices per prompt.
    n: usize,
    /// Per prompt: its text and ids, and its scores once they arrive (with `shown` asking for
    /// them, a choice's prompt part waits for them: its first event).
    prompts: Vec<TokenizedPrompt>,
    scores: Vec<Option<Vec<pagoda_engine::TopLogprobs>>>,
    /// Per choice: whether its prompt part was sent.
    started: Vec<bool>,
    /// Per choice: text offsets for logprobs.
    offsets: Vec<CompletionLogprobsBuilder>,
    prompt_tokens: usize,
    completion_tokens: usize,
    done: bool,
}

impl StreamState {
    /// Whether a choice's prompt part waits for the prompt's scores.
    fn waits_for_scores(&self) -> bool {
        (self.shown.echo && self.shown.logprobs) || self.shown.prompt_logprobs
    }

    /// The chunk that opens `choice` with its prompt part, once its prompt's scores are in.
    fn prompt_part(&mut self, choice: usize) -> Option<Event> {
        let prompt = choice / self.n;
        let scored = self.scores.get(prompt)?.as_ref()?;
        if std::mem::replace(&mut self.started[choice], true) {
            return None;
        }
        let p = &self.prompts[prompt];
        let (logprobs, prompt_logprobs) = self.shown.prompt_parts(&self.ctx.tokenizer, &p.token_ids, scored);
        let text = if self.shown.echo { p.text.clone() } else { String::new() };
        let choice = CompletionChoice {
            index: choice,
            text,
            logprobs,
            finish_reason: None,
            stop_reason: None,
            prompt_logprobs,
        };
        Some(sse::json_event(&self.ctx.response(vec![choice], None)))
    }

    fn on_event(&mut self, ChoiceEvent { choice, mut event }: ChoiceEvent) -> Vec<Event> {
        if let Some(err) = event.finished.as_ref().and_then(|r| failure(&self.state, r)) {
            self.done = true;
            return vec![sse::error_event(&err), sse::done_event()];
        }
        let mut out = Vec::new();
        if self.waits_for_scores() {
            if let (Some(scored), Some(slot)) =
                (event.prompt_logprobs.take(), self.scores.get_mut(choice / self.n))
            {
                *slot = Some(scored);
            }
            out.extend(self.prompt_part(choice));
        }
        if let Some(usage) = event.usage {
            self.prompt_tokens += usage.prompt_tokens;
            self.completion_tokens += usage.completion_tokens;
        }
        let logprobs = match (&event.logprobs, self.want_logprobs, self.offsets.get_mut(choice)) {
            (Some(lp), true, Some(builder)) if !lp.is_empty() => Some(builder.push(&self.ctx.tokenizer, lp)),
            _ => None,
        };
        if event.text.is_empty() && logprobs.is_none() && event.finished.is_none() {
            return out;
        }
        let (finish, stop_reason) = match &event.finished {
            Some(r) => {
                let (f, s) = finish_reason(r);
                (Some(f), s)
            }
            None => (None, None),
        };
        let choice = CompletionChoice {
            index: choice,
            text: event.text,
            logprobs,
            finish_reason: finish,
            stop_reason,
            prompt_logprobs: None,
        };
        out.push(sse::json_event(&self.ctx.response(vec![choice], None)));
        out
    }

    fn on_end(&mut self) -> Vec<Event> {
        self.done = true;
        let mut out = Vec::with_capacity(2);
        if self.include_usage {
            let usage = Usage::new(self.prompt_tokens, self.completion_tokens);
            out.push(sse::json_event(&self.ctx.response(Vec::new(), Some(usage))));
        }
        out.push(sse::done_event());
        out
    }
}

fn stream_response(
    state: SharedState,
    ctx: Context,
    submission: Submission,
    shown: Shown,
    include_usage: bool,
) -> Response {
    let n = submission.n;
    let num_choices = submission.num_choices();
    let echo = shown.echo;
    // With echo, each choice starts with its prompt (at once, unless it waits for the prompt's
    // scores).
    let head: Vec<Event> = if echo && !shown.logprobs && !shown.prompt_logprobs {
        (0..num_choices)
            .map(|index| {
                let text = submission.prompts[index / n].text.clone();
                let choice = CompletionChoice {
                    index,
                    text,
                    logprobs: None,
                    finish_reason: None,
                    stop_reason: None,
                    prompt_logprobs: None,
                };
                sse::json_event(&ctx.response(vec![choice], None))
            })
            .collect()
    } else {
        Vec::new()
    };
    let offsets = (0..num_choices)
        .map(|index| {
            CompletionLogprobsBuilder::new(if echo { &submission.prompts[index / n].text } else { "" })
        })
        .collect();
    let num_prompts = submission.prompts.len();
    let st = StreamState {
        state,
        ctx,
        want_logprobs: submission.wants_logprobs,
        shown,
        n,
        prompts: submission.prompts.clone(),
        scores: vec![None; num_prompts],
        started: vec![false; num_choices],
        events: submission.events,
        include_usage,
        offsets,
        prompt_tokens: 0,
        completion_tokens: 0,
        done: false,
    };
    let body = stream::unfold(st, |mut st| async move {
        if st.done {
            return None;
        }
        let events = match st.events.next().await {
            Some(e) => st.on_event(e),
            None => st.on_end(),
        };
        Some((events, st))
    })
    .flat_map(stream::iter);
    sse::response(stream::iter(head).chain(body).map(Ok))
}

//! A response as it is generated: [`Responder`] turns the engine's events into the typed stream
//! events (each with its `sequence_number`) and keeps the response object up to date, so that a
//! streamed response, a background response and its polls all see the same events and output.
//! It holds no connection and no engine stream: the foreground stream drives it from the HTTP
//! body, a background response from its detached task ([`super::background`]).

use pagoda_engine::{FinishReason, Usage};
use pagoda_text::Tokenizer;
use serde_json::{json, Value};

use super::reply::OutputEvents;
use super::wire::{InputTokensDetails, OutputTokensDetails, ResponseObject, ResponseUsage};
use crate::chat_output::{ChoiceSplit, ChoiceText};
use crate::error::ApiError;
use crate::state::AppState;
use crate::submit::{failure, ChoiceEvent};

/// One typed stream event: its `type` and its whole JSON (`type` and `sequence_number` included).
#[derive(Debug, Clone, PartialEq)]
pub struct SeqEvent {
    pub sequence: u64,
    pub name: &'static str,
    pub data: Value,
}

/// What drives a response: the engine's events, and, when the server runs tools itself (MCP),
/// the items it makes between generations.
#[derive(Debug)]
pub enum Step {
    Engine(ChoiceEvent),
    /// Another generation starts, after the server ran tools: the model's text starts afresh
    /// and its usage adds to the earlier generations'.
    Round,
    /// An item the server made is added (`response.output_item.added`).
    ItemAdded(Value),
    /// An event of that item (by its id): the event's type and its fields besides `item_id`
    /// and `output_index`.
    ItemEvent(&'static str, String, Value),
    /// The item is finished (`response.output_item.done`), replacing the one of the same id.
    ItemDone(Value),
    /// The response fails (a later generation could not start).
    Failed(ApiError),
}

/// The status a finished generation gives the response.
pub fn status_of(finish: Option<&FinishReason>) -> &'static str {
    match finish {
        Some(FinishReason::Length) => "incomplete",
        _ => "completed",
    }
}

pub fn count_tokens(tokenizer: &Tokenizer, text: Option<&str>) -> usize {
    text.filter(|t| !t.is_empty()).map_or(0, |t| tokenizer.encode(t, false).map_or(0, |ids| ids.len()))
}

/// Completes `response`: its status, the reason when incomplete, and its usage.
pub fn finish(response: &mut ResponseObject, status: &str, usage: Usage, reasoning_tokens: usize) {
    response.status = status.to_owned();
    if status == "incomplete" {
        response.incomplete_details = Some(json!({"reason": "max_output_tokens"}));
    }
    response.usage = Some(ResponseUsage {
        input_tokens: usage.prompt_tokens,
        input_tokens_details: InputTokensDetails {
            cached_tokens: usage.cached_prompt_tokens,
            cache_write_tokens: 0,
        },
        output_tokens: usage.completion_tokens,
        output_tokens_details: OutputTokensDetails {
            reasoning_tokens: reasoning_tokens.min(usage.completion_tokens),
        },
        total_tokens: usage.prompt_tokens + usage.completion_tokens,
    });
}

/// A response between events.
pub struct Responder {
    response: ResponseObject,
    text: ChoiceText,
    split: ChoiceSplit,
    items: OutputEvents,
    /// The usage of the generations before the current one.
    earlier_usage: Usage,
    reasoning: String,
    usage: Usage,
    status: Option<&'static str>,
    sequence: u64,
    done: bool,
}

impl Responder {
    pub fn new(response: ResponseObject, split: ChoiceSplit, items: OutputEvents) -> Self {
        Self {
            response,
            text: ChoiceText::new(split),
            split,
            items,
            earlier_usage: Usage::default(),
            reasoning: String::new(),
            usage: Usage::default(),
            status: None,
            sequence: 0,
            done: false,
        }
    }

    /// Whether the response has ended (completed, incomplete, failed or cancelled).
    pub fn done(&self) -> bool {
        self.done
    }

    /// The response object: its output so far while it runs, its final state once done.
    pub fn snapshot(&self) -> ResponseObject {
        let mut response = self.response.clone();
        if !self.done {
            response.output = self.items.snapshot();
        }
        response
    }

    fn event(&mut self, name: &'static str, fields: Value) -> SeqEvent {
        let mut data = json!({"type": name});
        if let (Some(d), Value::Object(f)) = (data.as_object_mut(), fields) {
            d.extend(f);
            d.insert("sequence_number".into(), json!(self.sequence));
        }
        let sequence = self.sequence;
        self.sequence += 1;
        SeqEvent { sequence, name, data }
    }

    fn response_event(&mut self, name: &'static str) -> SeqEvent {
        let response = serde_json::to_value(&self.response).unwrap_or(Value::Null);
        self.event(name, json!({"response": response}))
    }

    /// Ends the response as `failed` with `e` (and the items made so far): its last event.
    fn fail(&mut self, e: &ApiError) -> SeqEvent {
        self.done = true;
        self.response.status = "failed".into();
        self.response.output = self.items.snapshot();
        let body = e.body().error;
        self.response.error = Some(json!({"code": body.code, "message": body.message}));
        self.response_event("response.failed")
    }

    /// `response.created`, then `response.in_progress` unless the response is `queued` (a
    /// background response: [`Responder::start`] sends it when generation starts).
    pub fn opening(&mut self) -> Vec<SeqEvent> {
        let mut out = vec![self.response_event("response.created")];
        if self.response.status == "in_progress" {
            out.push(self.response_event("response.in_progress"));
        }
        out
    }

    /// A queued response's `response.in_progress`, once the engine sends its first event.
    fn start(&mut self) -> Option<SeqEvent> {
        (self.response.status == "queued").then(|| {
            self.response.status = "in_progress".into();
            self.response_event("response.in_progress")
        })
    }

    pub fn on_event(&mut self, state: &AppState, ChoiceEvent { event, .. }: ChoiceEvent) -> Vec<SeqEvent> {
        let mut out: Vec<SeqEvent> = self.start().into_iter().collect();
        if let Some(reason) = &event.finished {
            let error = match failure(state, reason) {
                Some(e) => Some(e),
                None if *reason == FinishReason::Abort => Some(ApiError::ShuttingDown),
                None => None,
            };
            if let Some(e) = error {
                out.push(self.fail(&e));
                return out;
            }
        }
        if let Some(u) = event.usage {
            self.usage = u;
        }
        let last = event.finished.is_some();
        let piece = self.text.push(&event.text, last);
        self.reasoning.push_str(&piece.reasoning);
        let mut raw = self.items.push(piece);
        if last {
            let status = status_of(event.finished.as_ref());
            raw.extend(self.items.finish(status));
            self.status = Some(status);
        }
        out.extend(raw.into_iter().map(|(name, fields)| self.event(name, fields)));
        out
    }

    /// One step: an engine event, or one of the server's own (see [`Step`]).
    pub fn on_step(&mut self, state: &AppState, step: Step) -> Vec<SeqEvent> {
        let mut out: Vec<SeqEvent> = Vec::new();
        if !matches!(step, Step::Engine(_)) {
            out.extend(self.start());
        }
        match step {
            Step::Engine(e) => return self.on_event(state, e),
            Step::Round => {
                let u = std::mem::take(&mut self.usage);
                self.earlier_usage.prompt_tokens += u.prompt_tokens;
                self.earlier_usage.completion_tokens += u.completion_tokens;
                self.earlier_usage.cached_prompt_tokens += u.cached_prompt_tokens;
                self.text = ChoiceText::new(self.split);
                self.items.new_round();
                self.status = None;
            }
            Step::ItemAdded(item) => {
                let index = self.items.add_item(item.clone());
                out.push(
                    self.event("response.output_item.added", json!({"output_index": index, "item": item})),
                );
            }
            Step::ItemEvent(name, id, fields) => {
                let index = self.items.index_of(&id);
                let mut data = json!({"item_id": id, "output_index": index});
                if let (Some(d), Value::Object(f)) = (data.as_object_mut(), fields) {
                    d.extend(f);
                }
                out.push(self.event(name, data));
            }
            Step::ItemDone(item) => {
                let id = item["id"].as_str().unwrap_or_default().to_owned();
                let index = match self.items.index_of(&id) {
                    Some(index) => {
                        self.items.replace_item(index, item.clone());
                        index
                    }
                    None => self.items.add_item(item.clone()),
                };
                out.push(
                    self.event("response.output_item.done", json!({"output_index": index, "item": item})),
                );
            }
            Step::Failed(e) => out.push(self.fail(&e)),
        }
        out
    }

    /// The engine's events have ended: the response completes (or fails, when it never finished).
    pub fn on_end(&mut self, tokenizer: &Tokenizer) -> Vec<SeqEvent> {
        self.done = true;
        let Some(status) = self.status else {
            let e = ApiError::Internal("the response ended without finishing".into());
            self.response.status = "failed".into();
            self.response.output = self.items.snapshot();
            self.response.error = Some(json!({"code": "server_error", "message": e.to_string()}));
            return vec![self.response_event("response.failed")];
        };
        self.response.output = self.items.items().to_vec();
        let reasoning_tokens = count_tokens(tokenizer, Some(&self.reasoning));
        let e = self.earlier_usage;
        let usage = Usage {
            prompt_tokens: e.prompt_tokens + self.usage.prompt_tokens,
            completion_tokens: e.completion_tokens + self.usage.completion_tokens,
            cached_prompt_tokens: e.cached_prompt_tokens + self.usage.cached_prompt_tokens,
        };
        finish(&mut self.response, status, usage, reasoning_tokens);
        let name = if status == "incomplete" { "response.incomplete" } else { "response.completed" };
        vec![self.response_event(name)]
    }

    /// Cancels a running response: it keeps its output so far and sends no further event.
    pub fn cancel(&mut self) {
        if !self.done {
            self.done = true;
            self.response.output = self.items.snapshot();
            self.response.status = "cancelled".into();
        }
    }
}

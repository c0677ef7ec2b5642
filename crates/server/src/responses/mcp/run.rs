//! A response with `mcp` tools, as a stream of [`Step`]s for the same [`Responder`] as any
//! response (foreground, streamed or background): the servers' tools are listed (or taken from
//! the conversation's earlier listing), answered approval requests are run or refused, and
//! the model generates; when it calls MCP tools, the server calls them, adds `mcp_call` items,
//! gives the results back to the model and lets it go on, for at most [`MAX_ROUNDS`]
//! generations (see [`choice`] for the tool choice of each). A call that needs approval ends
//! the response with an `mcp_approval_request`.
//!
//! Everything that can refuse the request (its tools, its items, the first generation's
//! admission) happens in [`start`], before any output, so that it is an HTTP error; what fails
//! later (a hung MCP server, a later generation) ends up in an item or a failed response.
//!
//! [`Responder`]: crate::responses::stream::Responder

use std::time::Instant;

use futures_util::stream::{BoxStream, StreamExt};
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;

use super::approval::decisions;
use super::catalog::{Catalog, ToolInfo};
use super::choice::{self, MAX_ROUNDS};
use super::client::{call_tool, list_tools, Limits, McpError};
use super::items::{self, Call};
use super::spec::{servers, McpServer};
use crate::chat_output::{whole_message, ChoiceSplit};
use crate::conversation::{ChatTurn, StartedTurn};
use crate::error::ApiError;
use crate::responses::request::{chat_turn, ToolNamespaces};
use crate::responses::stream::Step;
use crate::responses::wire::ResponsesRequest;
use crate::state::SharedState;
use crate::submit::failure;

/// Whether the request has `mcp` tools (and so is served here).
pub fn has_mcp_tools(req: &ResponsesRequest) -> bool {
    req.tools
        .as_ref()
        .and_then(Value::as_array)
        .is_some_and(|tools| tools.iter().any(|t| t.get("type").and_then(Value::as_str) == Some("mcp")))
}

/// A started MCP response: its steps, how its text splits, its namespaces and the function
/// names whose calls the server runs (for the response's [`crate::responses::reply::OutputEvents`]).
pub struct Started {
    pub steps: BoxStream<'static, Step>,
    pub split: ChoiceSplit,
    pub namespaces: ToolNamespaces,
    pub held: Vec<String>,
}

/// A server's offered tools, and the result of listing them now (`None`: the conversation's
/// earlier listing was reused).
type Listing = (Vec<ToolInfo>, Option<Result<Vec<ToolInfo>, McpError>>);

/// What every generation of the response shares.
struct Plan {
    state: SharedState,
    req: ResponsesRequest,
    servers: Vec<McpServer>,
    catalog: Catalog,
    lora: Option<pagoda_engine::LoraId>,
    arrival: Instant,
    limits: Limits,
}

impl Plan {
    /// The request for generation `round` (0 first): its own tools and the offered MCP tools
    /// as function tools, and the round's tool choice ([`choice::for_round`]).
    fn request(&self, round: usize) -> ResponsesRequest {
        let mut req = self.req.clone();
        let mut tools: Vec<Value> = req
            .tools
            .as_ref()
            .and_then(Value::as_array)
            .map(|t| {
                t.iter().filter(|t| t.get("type").and_then(Value::as_str) != Some("mcp")).cloned().collect()
            })
            .unwrap_or_default();
        tools.extend(self.catalog.function_tools(&self.servers));
        req.tool_choice =
            choice::for_round(req.tool_choice.as_ref(), round, &self.catalog, !tools.is_empty());
        req.tools = Some(Value::Array(tools));
        req
    }

    /// The turn of generation `round` over `items` (the conversation and what the server
    /// added), `first_new` being this request's first item for error names.
    fn turn(
        &self,
        round: usize,
        items: &[Value],
        first_new: usize,
    ) -> Result<(ChatTurn, ToolNamespaces), ApiError> {
        let prompt = items::prompt_items(items, &self.catalog);
        // This request's first item in the prompt's items, for the names of bad items.
        let first_new = items::prompt_items(&items[..first_new.min(items.len())], &self.catalog).len();
        let (mut turn, namespaces) = chat_turn(&self.state, &self.request(round), &prompt, first_new)?;
        turn.lora = self.lora;
        Ok((turn, namespaces))
    }

    fn server(&self, label: &str) -> Option<&McpServer> {
        self.servers.iter().find(|s| s.label == label)
    }

    /// Runs `call` against its server, with the steps of its item.
    async fn run_call(&self, call: &Call, steps: &mut Vec<Step>) -> Value {
        steps.extend(items::call_started(call));
        let result = match (self.server(&call.label), serde_json::from_str::<Value>(&call.arguments)) {
            (None, _) => Err(McpError::Request(format!(
                "no `mcp` tool of this request has server_label `{}`",
                call.label
            ))),
            (Some(_), Ok(v)) if !v.is_object() => {
                Err(McpError::Request("the arguments are not a JSON object".into()))
            }
            (Some(_), Err(e)) => Err(McpError::Request(format!("the arguments are not JSON: {e}"))),
            (Some(server), Ok(v)) => {
                let args: Map<String, Value> = v.as_object().cloned().unwrap_or_default();
                call_tool(server, &call.name, args, self.limits).await
            }
        };
        let (done, item) = items::call_finished(call, &result);
        steps.extend(done);
        item
    }
}

/// Starts a response with `mcp` tools over the conversation's `items` (this request's from
/// `first_new` on). See the module docs.
pub async fn start(
    state: &SharedState,
    req: &ResponsesRequest,
    mut items: Vec<Value>,
    first_new: usize,
    lora: Option<pagoda_engine::LoraId>,
    arrival: Instant,
) -> Result<Started, ApiError> {
    let servers = servers(req.tools.as_ref(), &state.mcp_servers)?;
    let answers = decisions(&items, first_new)?;
    let limits = Limits { timeout: state.mcp_timeout, ..Limits::default() };
    let mut steps: Vec<Step> = Vec::new();
    // Each server's tools, listed once per conversation, all servers at once.
    let listings = servers.iter().map(|s| {
        let before = items::listed_before(&items, &s.label);
        async move {
            match before {
                Some(tools) => (tools, None),
                None => {
                    // The listing shows what the request offers (`allowed_tools`).
                    let result = list_tools(s, limits).await.map(|tools| {
                        tools.into_iter().filter(|t| s.offers(&t.name, t.read_only())).collect::<Vec<_>>()
                    });
                    let tools = result.clone().unwrap_or_default();
                    (tools, Some(result))
                }
            }
        }
    });
    let listed: Vec<Listing> = futures_util::future::join_all(listings).await;
    let failed: Vec<&str> = servers
        .iter()
        .zip(&listed)
        .filter(|(_, (_, result))| matches!(result, Some(Err(_))))
        .map(|(s, _)| s.label.as_str())
        .collect();
    for (server, (_, result)) in servers.iter().zip(&listed) {
        if let Some(result) = result {
            if let Err(e) = result {
                tracing::warn!(server = %server.url, error = %e, "listing an MCP server's tools failed");
            }
            let new_steps = items::listing_steps(&server.label, result);
            if let Some(Step::ItemDone(item)) = new_steps.last() {
                items.push(item.clone());
            }
            steps.extend(new_steps);
        }
    }
    let listed: Vec<Vec<ToolInfo>> = listed.into_iter().map(|(tools, _)| tools).collect();
    let own: Vec<String> = req
        .tools
        .as_ref()
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|t| t.get("name").and_then(Value::as_str).map(str::to_owned))
        .collect();
    let catalog = Catalog::new(&servers, &listed, &own);
    choice::check(req.tool_choice.as_ref(), &servers, &catalog, &failed)?;
    let plan = Plan { state: state.clone(), req: req.clone(), servers, catalog, lora, arrival, limits };
    // Answered approval requests: run the approved calls, show the refused ones as refused.
    for d in answers {
        if d.approve {
            let item = plan.run_call(&d.call, &mut steps).await;
            items.push(item);
        } else {
            let why = d.reason.map_or_else(String::new, |r| format!(": {r}"));
            let refused = format!("The user did not approve this call{why}");
            let c = &d.call;
            items.extend(items::as_function_call(
                &plan.catalog,
                &c.id,
                &c.label,
                &c.name,
                &c.arguments,
                &refused,
            ));
        }
    }
    let (turn, namespaces) = plan.turn(0, &items, first_new)?;
    let StartedTurn { submission, split, .. } = turn.start(state, arrival).await?;
    let held = plan.catalog.functions();
    let (tx, rx) = mpsc::channel::<Step>(64);
    tokio::spawn(drive(plan, items, first_new, steps, submission.events, split, tx));
    let steps =
        futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|s| (s, rx)) }).boxed();
    Ok(Started { steps, split, namespaces, held })
}

/// Sends `steps`; false when the reader is gone (the client left, or the run was cancelled).
async fn send_all(tx: &mpsc::Sender<Step>, steps: Vec<Step>) -> bool {
    for s in steps {
        if tx.send(s).await.is_err() {
            return false;
        }
    }
    true
}

/// The response's task: the first steps, then each generation, the MCP calls it makes and the
/// next generation, until the model answers without them. Dropping the engine's events (on
/// return) aborts a generation no one reads.
async fn drive(
    plan: Plan,
    mut items: Vec<Value>,
    first_new: usize,
    first_steps: Vec<Step>,
    mut events: BoxStream<'static, crate::submit::ChoiceEvent>,
    split: ChoiceSplit,
    tx: mpsc::Sender<Step>,
) {
    if !send_all(&tx, first_steps).await {
        return;
    }
    let mut round = 0;
    loop {
        let mut text = String::new();
        let mut finished_ok = false;
        while let Some(e) = events.next().await {
            text.push_str(&e.event.text);
            let end = e.event.finished.clone();
            if tx.send(Step::Engine(e)).await.is_err() {
                return;
            }
            if let Some(reason) = end {
                let failed =
                    failure(&plan.state, &reason).is_some() || reason == pagoda_engine::FinishReason::Abort;
                finished_ok = !failed && reason != pagoda_engine::FinishReason::Length;
                break;
            }
        }
        if !finished_ok || round + 1 >= MAX_ROUNDS {
            return;
        }
        let message = whole_message(split, &text);
        // Each MCP call, and whether its tool says it only reads (for `require_approval`).
        let calls: Vec<(Call, bool)> = message
            .tool_calls
            .iter()
            .filter_map(|c| {
                let offered = plan.catalog.by_function(&c.function.name)?;
                let call = Call {
                    id: items::new_id("mcp"),
                    label: offered.label.clone(),
                    name: offered.tool.name.clone(),
                    arguments: c.function.arguments.clone(),
                    approval_request_id: None,
                };
                Some((call, offered.tool.read_only()))
            })
            .collect();
        if calls.is_empty() {
            return;
        }
        // Calls of the client's own tools are the client's to answer: the response ends
        // after the server's calls.
        let own_calls = calls.len() < message.tool_calls.len();
        if let Some(content) = message.content.filter(|c| !c.trim().is_empty()) {
            items.push(json!({"type": "message", "role": "assistant", "content": content}));
        }
        let mut waiting = false;
        for (call, read_only) in &calls {
            let mut steps = Vec::new();
            if plan.server(&call.label).is_some_and(|s| s.approval.required(&call.name, *read_only)) {
                let request = Call { id: items::new_id("mcpr"), ..call.clone() };
                steps.extend(items::approval_steps(&request));
                waiting = true;
            } else {
                let item = plan.run_call(call, &mut steps).await;
                items.push(item);
            }
            if !send_all(&tx, steps).await {
                return;
            }
        }
        if waiting || own_calls {
            return;
        }
        round += 1;
        let started = match plan.turn(round, &items, first_new) {
            Ok((turn, _)) => turn.start(&plan.state, plan.arrival).await,
            Err(e) => Err(e),
        };
        match started {
            Ok(s) => {
                if tx.send(Step::Round).await.is_err() {
                    return;
                }
                events = s.submission.events;
            }
            Err(e) => {
                let _ = tx.send(Step::Failed(e)).await;
                return;
            }
        }
    }
}

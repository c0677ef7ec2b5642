//! The engine loop, on its own OS thread: drain commands (add, abort, end a sample cut by a stop
//! string) -> drop requests whose stream was dropped -> `schedule()` -> `execute()` ->
//! `update()` -> send token events (their text is made on the caller's side, `crate::output`). It blocks on
//! the command channel when there is nothing to do and never busy-waits. Between steps it also
//! serves prefill/decode transfers (reading a held prefix, importing a received one) and
//! releases holds at their deadline ([`crate::kv_transfer`]).
//!
//! No request is lost: every stream ends with a last event (finished, aborted or failed), also
//! when the executor fails, at shutdown, and — through `Drop` — if the loop itself panics.

use std::sync::atomic::Ordering::SeqCst;
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;
use tokio::sync::mpsc::Sender;

use pagoda_text::TokenDecoder;

use crate::config::EngineConfig;
use crate::constraint::compute_masks;
use crate::event::{FinishReason, TokenEvent, Usage};
use crate::executor::{ExecutorError, ModelExecutor, ScheduledBatch, StepOutput};
use crate::handle::{Command, EngineError, EngineHandle, HandleInner, Shared, Shutdown};
use crate::id_map::IdMap;
use crate::outbox::Outbox;
use crate::request::{Request, RequestId};
use crate::scheduler::{AddRequestError, Scheduler, StepEvents};
use crate::stats::{EngineObserver, StepStats};

/// After this many failed steps in a row the executor is taken to be broken for good.
const MAX_CONSECUTIVE_FAILURES: usize = 3;

/// Empty batches in a row (with requests in flight) after which the waiting head is failed
/// instead of retried. One empty step is legitimate right after a preemption.
const MAX_EMPTY_STEPS: usize = 2;

/// Starts engines.
pub struct Engine;

impl Engine {
    /// Validates `config` against the executor and starts the engine thread. The engine stops
    /// when `shutdown` is triggered, when the executor fails permanently, or when every handle
    /// is dropped and nothing is in flight.
    pub fn spawn<E: ModelExecutor + 'static>(
        config: EngineConfig,
        executor: E,
        decoder: Arc<dyn TokenDecoder>,
        observer: Arc<dyn EngineObserver>,
        shutdown: Shutdown,
    ) -> Result<(EngineHandle, JoinHandle<()>), EngineError> {
        config.validate_for(&executor)?;
        let mut scheduler = Scheduler::new(config.clone())?;
        let layout = executor.kv_page_layout();
        let tiers = crate::kv_tier::open_for_engine(&config, layout.as_ref(), &mut scheduler)?;
        let mut shared = Shared::new(config).with_kv_page_layout(layout);
        shared.kv_tier_stats = tiers.as_ref().map(|t| Arc::clone(t.stats()));
        let shared = Arc::new(shared);
        shared.stats.publish(&scheduler);
        let (tx, rx) = mpsc::channel();
        let inner =
            Arc::new(HandleInner { tx, shared: Arc::clone(&shared), shutdown: shutdown.clone(), decoder });
        shutdown.register(Arc::downgrade(&inner));
        let engine = EngineLoop {
            scheduler,
            executor,
            observer,
            shared,
            rx,
            shutdown,
            streams: IdMap::default(),
            events: StepEvents::default(),
            last_unstarted: 0,
            failures: 0,
            empty_steps: 0,
            steps: 0,
            pending_sleep: None,
            tiers,
        };
        let thread = std::thread::Builder::new()
            .name("pagoda-engine".into())
            .spawn(move || engine.run())
            .map_err(|e| EngineError::Spawn(e.to_string()))?;
        Ok((EngineHandle { inner }, thread))
    }
}

struct EngineLoop<E: ModelExecutor> {
    scheduler: Scheduler,
    executor: E,
    observer: Arc<dyn EngineObserver>,
    shared: Arc<Shared>,
    rx: mpsc::Receiver<Command>,
    shutdown: Shutdown,
    /// Requests whose caller has not yet been handed every event.
    streams: IdMap<RequestId, Outbox>,
    events: StepEvents,
    /// `scheduler.num_unstarted_seqs()` as last accounted in `shared.pending`.
    last_unstarted: usize,
    failures: usize,
    empty_steps: usize,
    steps: u64,
    /// A sleep waiting for the requests in flight ([`crate::sleep`]).
    pending_sleep: Option<crate::sleep::PendingSleep>,
    /// The prefix cache's offload tiers (`--kv-offload`, [`crate::kv_tier`]).
    tiers: Option<crate::kv_tier::KvTiers>,
}

enum Flow {
    Continue,
    Stop,
}

impl<E: ModelExecutor> EngineLoop<E> {
    fn run(mut self) {
        loop {
            if self.shutdown.is_triggered() {
                self.stop(FinishReason::Abort, "the engine was shut down");
                return;
            }
            let (idle, now) = (!self.scheduler.has_unfinished(), Instant::now());
            if let Some(sleep) = self.pending_sleep.take_if(|p| idle || now >= p.deadline) {
                let _ = sleep.reply.send(self.sleep(sleep.level));
            }
            if !self.scheduler.has_unfinished() {
                // Idle: sleep until a command arrives; a closed channel means no handle is left.
                // Events still waiting for a slow reader are retried every few milliseconds.
                // Held transfer blocks are released at their deadline, idle or not.
                let hold_wait =
                    self.scheduler.next_hold_deadline().map(|d| d.saturating_duration_since(Instant::now()));
                let wait = if self.streams.values().any(Outbox::has_waiting) {
                    Some(hold_wait.map_or(std::time::Duration::from_millis(5), |w| {
                        w.min(std::time::Duration::from_millis(5))
                    }))
                } else {
                    hold_wait
                };
                let received = if let Some(wait) = wait {
                    match self.rx.recv_timeout(wait) {
                        Err(mpsc::RecvTimeoutError::Timeout) => None,
                        other => Some(other.map_err(|_| ())),
                    }
                } else {
                    Some(self.rx.recv().map_err(|_| ()))
                };
                match received {
                    Some(Ok(cmd)) => self.handle(cmd),
                    // Every handle is gone but slow readers still have events to take.
                    Some(Err(())) if self.streams.values().any(Outbox::has_waiting) => {
                        std::thread::sleep(std::time::Duration::from_millis(5));
                    }
                    Some(Err(())) => {
                        self.shared.kill("every engine handle was dropped");
                        return;
                    }
                    None => {}
                }
            }
            // Take whatever else is queued without blocking (a closed channel is handled above,
            // once nothing is in flight).
            while let Ok(cmd) = self.rx.try_recv() {
                self.handle(cmd);
            }
            if self.shutdown.is_triggered() {
                continue;
            }
            self.reap_closed_streams();
            if self.scheduler.next_hold_deadline().is_some_and(|d| d <= Instant::now()) {
                self.scheduler.expire_holds(Instant::now());
                self.publish();
            }
            if self.scheduler.has_unfinished() {
                if let Flow::Stop = self.step() {
                    return;
                }
            }
            self.publish();
            self.report_cache_events();
        }
    }

    fn add(&mut self, request: Request, tx: Sender<TokenEvent>) {
        let id = request.id;
        let n = request.n;
        // Refused from the sleep's call on (and when sent before it fell asleep, taken after).
        if self.shared.asleep.load(SeqCst) != 0 || self.pending_sleep.is_some() {
            self.release_pending(n);
            let _ = tx.try_send(error_event(crate::EngineError::Asleep.to_string()));
            return;
        }
        if self.streams.contains_key(&id) {
            self.release_pending(n);
            let err = AddRequestError::DuplicateId(id);
            let _ = tx.try_send(error_event(err.to_string()));
            return;
        }
        match self.scheduler.add_request(request) {
            Ok(()) => {
                self.last_unstarted += n;
                self.streams.insert(id, Outbox::new(tx));
            }
            Err(err) => {
                self.release_pending(n);
                let _ = tx.try_send(error_event(err.to_string()));
            }
        }
    }

    fn handle(&mut self, cmd: Command) {
        match cmd {
            Command::Add(requests) => {
                for (request, tx) in requests {
                    self.add(request, tx);
                }
            }
            Command::Abort(id) => {
                self.scheduler.abort_request(id, FinishReason::Abort, &mut self.events);
                self.dispatch();
            }
            Command::FinishSample { id, index, reason } => {
                self.scheduler.finish_sample(id, index, reason, &mut self.events);
                self.dispatch();
            }
            Command::InstallLora { id, adapter, reply } => {
                let loaded = self.executor.install_lora(id, adapter).map_err(|e| e.to_string());
                let _ = reply.send(loaded);
            }
            Command::UnloadLora { id, reply } => {
                let answer = match self.scheduler.lora_in_use(id) {
                    0 if self.executor.unload_lora(id) => Ok(()),
                    0 => Err(format!("LoRA adapter {id} is not loaded")),
                    n => Err(format!("{n} sequences (running or waiting) use it")),
                };
                let _ = reply.send(answer);
            }
            Command::FlushPrefixCache { reply } => {
                let _ = reply.send(self.scheduler.flush_prefix_cache().map_err(Into::into));
            }
            // Published before answering: a caller that has the answer sees the blocks' state.
            Command::ExportHeld { key, reply } => {
                let exported = self.export_held(&key);
                if matches!(exported, Ok(crate::HeldExport::Ready(_))) {
                    self.publish();
                }
                let _ = reply.send(exported);
            }
            Command::ImportPrefix { prefix, lora, reply } => {
                let imported = self.import_prefix(&prefix, lora);
                self.publish();
                self.report_cache_events();
                let _ = reply.send(imported);
            }
            Command::Wake => {}
            Command::Sleep { level, drain, reply } => {
                if self.pending_sleep.is_some() || self.shared.asleep.load(SeqCst) != 0 {
                    // Asleep or falling asleep already: nothing changes.
                    let _ = reply.send(Ok(()));
                } else {
                    let deadline = Instant::now() + drain;
                    self.pending_sleep = Some(crate::sleep::PendingSleep { level, deadline, reply });
                }
            }
            Command::WakeUp { reply } => {
                let woken = match crate::SleepLevel::from_number(self.shared.asleep.load(SeqCst)) {
                    None => Ok(()),
                    Some(_) => self.executor.wake_up(),
                };
                if woken.is_ok() {
                    self.shared.asleep.store(0, SeqCst);
                }
                let _ = reply.send(woken);
            }
        }
    }

    /// Fails what is still in flight, empties the prefix cache (its removals reported) and lets the
    /// executor free its memory ([`crate::sleep`]). Asleep already: nothing changes.
    fn sleep(&mut self, level: crate::SleepLevel) -> Result<(), crate::SleepError> {
        if self.shared.asleep.load(SeqCst) != 0 {
            return Ok(());
        }
        let why = "the server went to sleep before the request finished";
        self.scheduler.abort_all(FinishReason::Error(why.into()), &mut self.events);
        self.dispatch();
        while self.scheduler.release_oldest_hold() {}
        self.scheduler.flush_prefix_cache().map_err(|e| crate::SleepError::Failed(e.to_string()))?;
        self.report_cache_events();
        self.executor.sleep(level)?;
        self.shared.asleep.store(crate::sleep::state_of(Some(level)), SeqCst);
        self.publish();
        Ok(())
    }

    /// Reads the pages held under `key` and releases them.
    fn export_held(&mut self, key: &str) -> Result<crate::HeldExport, String> {
        let Some(layout) = self.shared.kv_page_layout.clone() else {
            return Err("this model's KV cache cannot be transferred".into());
        };
        let held = match self.scheduler.take_held(key) {
            crate::TakeHeld::Ready(held) => held,
            crate::TakeHeld::Pending => return Ok(crate::HeldExport::Pending),
            crate::TakeHeld::Gone(reason) => return Ok(crate::HeldExport::Gone(reason.to_owned())),
        };
        let pages = self.executor.read_kv_pages(&held.blocks).map_err(|e| e.to_string());
        let token_ids = held.token_ids.clone();
        self.scheduler.release_held(held);
        Ok(crate::HeldExport::Ready(crate::KvPrefix { layout, token_ids, pages: pages? }))
    }

    /// Writes a received prefix's pages into free blocks and registers them in the prefix
    /// cache; the leading blocks cached already are not written again.
    fn import_prefix(
        &mut self,
        prefix: &crate::KvPrefix,
        lora: Option<crate::LoraId>,
    ) -> Result<usize, String> {
        match &self.shared.kv_page_layout {
            Some(layout) if *layout == prefix.layout => {}
            Some(layout) => {
                return Err(format!("the pages' layout {:?} is not this cache's {layout:?}", prefix.layout))
            }
            None => return Err("this model's KV cache cannot be transferred".into()),
        }
        prefix.check()?;
        let plan = self.scheduler.plan_import(&prefix.token_ids, lora);
        let block_bytes = prefix.layout.block_bytes();
        let first = plan.first_written_block() * block_bytes;
        let pages = &prefix.pages[first..first + plan.writes.len() * block_bytes];
        let written = if plan.writes.is_empty() {
            Ok(())
        } else {
            self.executor.write_kv_pages(&plan.writes, pages).map_err(|e| e.to_string())
        };
        let cached = self.scheduler.finish_import(plan, written.is_ok());
        written.map(|()| cached)
    }

    /// Aborts requests whose receiver is gone, so their blocks are free for this step.
    fn reap_closed_streams(&mut self) {
        let closed: Vec<RequestId> =
            self.streams.iter().filter(|(_, outbox)| outbox.is_closed()).map(|(&id, _)| id).collect();
        for id in closed {
            self.streams.remove(&id);
            self.scheduler.abort_request(id, FinishReason::Abort, &mut self.events);
        }
        self.dispatch();
    }

    fn step(&mut self) -> Flow {
        let start = Instant::now();
        if let Some(tiers) = &mut self.tiers {
            crate::kv_tier::load_waiting(tiers, &mut self.scheduler, &mut self.executor);
        }
        let batch = self.scheduler.schedule();
        // Requests admitted just now stop counting against `max_waiting_requests` before the
        // (possibly long) step runs.
        self.sync_pending();
        if batch.is_empty() && self.scheduler.num_held_blocks() > 0 {
            // Blocks held for transfers are what admission lacks: they go before any request.
            self.scheduler.release_oldest_hold();
            self.publish();
            return Flow::Continue;
        }
        if batch.is_empty() {
            self.empty_steps += 1;
            if self.empty_steps >= MAX_EMPTY_STEPS {
                // Cannot happen with a validated config; fail rather than spin.
                self.scheduler.fail_waiting_head("the request cannot be scheduled", &mut self.events);
                self.dispatch();
                self.empty_steps = 0;
            }
            return Flow::Continue;
        }
        self.empty_steps = 0;
        let exec_start = Instant::now();
        let result = self.execute_with_masks(batch);
        let execute_duration = exec_start.elapsed();
        let failure = match result {
            // Every sequence of the step was rejected, each failing its own request.
            None => None,
            Some(Ok(output)) => match self.scheduler.update(output, &mut self.events) {
                Ok(()) => None,
                Err(e) => Some(format!("the executor's output does not match the batch: {e}")),
            },
            Some(Err(ExecutorError::Fatal(msg))) => {
                let reason = format!("model executor failed permanently: {msg}");
                self.scheduler.fail_scheduled(&reason, &mut self.events);
                self.stop(FinishReason::Error(reason.clone()), &reason);
                return Flow::Stop;
            }
            Some(Err(e)) => Some(e.to_string()),
        };
        match failure {
            None => self.failures = 0,
            Some(msg) => {
                self.scheduler.fail_scheduled(&msg, &mut self.events);
                self.failures += 1;
                if self.failures >= MAX_CONSECUTIVE_FAILURES {
                    let reason = format!("{} steps failed in a row, last: {msg}", self.failures);
                    self.stop(FinishReason::Error(reason.clone()), &reason);
                    return Flow::Stop;
                }
            }
        }
        if let Some(tiers) = &mut self.tiers {
            crate::kv_tier::store_new_blocks(tiers, &mut self.scheduler, &mut self.executor);
        }
        self.steps += 1;
        let s = *self.scheduler.last_schedule_stats();
        let bm = self.scheduler.block_manager();
        let stats = StepStats {
            step: self.steps,
            num_seqs: s.num_seqs,
            num_prefill_tokens: s.num_prefill_tokens,
            num_decode_tokens: s.num_decode_tokens,
            num_preemptions: s.num_preemptions,
            num_block_copies: s.num_block_copies,
            prefix_cache_queries: s.prefix_cache_queries,
            prefix_cache_hits: s.prefix_cache_hits,
            num_running_seqs: self.scheduler.num_running_seqs(),
            num_waiting_seqs: self.scheduler.num_waiting_seqs(),
            kv_blocks_used: bm.num_used_blocks(),
            kv_blocks_total: bm.num_total_blocks(),
            duration: start.elapsed(),
            execute_duration,
            spec: *self.scheduler.last_spec_stats(),
        };
        self.shared.stats.record_step(&stats);
        self.observer.on_step(&stats);
        // Publish before sending: a caller that sees its last event also sees its blocks freed.
        self.publish();
        self.dispatch();
        Flow::Continue
    }

    /// Runs the step while a worker thread computes the grammar masks of the constrained
    /// sequences (the sampler waits for each one's mask only once the logits exist).
    fn execute_with_masks(&mut self, mut batch: ScheduledBatch) -> Option<Result<StepOutput, ExecutorError>> {
        let mut jobs = self.scheduler.take_mask_jobs(&mut batch);
        if jobs.is_empty() {
            return self.execute_isolating_rejects(batch);
        }
        let ran = std::thread::scope(|scope| {
            let worker_jobs = &mut jobs;
            let worker = std::thread::Builder::new()
                .name("pagoda-masks".into())
                .spawn_scoped(scope, move || compute_masks(worker_jobs));
            // The scope joins the worker; `compute_masks` catches the matcher's panics.
            match worker {
                Ok(_) => Ok(self.execute_isolating_rejects(batch)),
                Err(_) => Err(batch),
            }
        });
        let result = ran.unwrap_or_else(|batch| {
            // No thread to be had: compute the masks first, then run the model.
            compute_masks(&mut jobs);
            self.execute_isolating_rejects(batch)
        });
        self.scheduler.restore_constraints(jobs);
        result
    }

    /// Runs the step; a sequence the executor rejects fails its own request only, and the rest
    /// of the step runs again without it. `None` when no sequence is left to run.
    fn execute_isolating_rejects(
        &mut self,
        mut batch: ScheduledBatch,
    ) -> Option<Result<StepOutput, ExecutorError>> {
        loop {
            match self.executor.execute(&batch) {
                Err(ExecutorError::InvalidSequence { seq_id, message }) => {
                    if !self.scheduler.reject_scheduled_seq(seq_id, &message, &mut self.events) {
                        // Not a sequence of this batch: the executor is confused, fail the step.
                        let err =
                            format!("the executor rejected sequence {seq_id}, which is not in the batch");
                        return Some(Err(ExecutorError::InvalidBatch(err)));
                    }
                    let scheduler = &self.scheduler;
                    batch.seqs.retain(|s| scheduler.is_scheduled(s.seq_id));
                    if batch.is_empty() {
                        return None;
                    }
                }
                other => return Some(other),
            }
        }
    }

    /// Sends pending events; a request's stream is dropped once its last event is in the
    /// channel (a slow reader's events wait in its outbox until then).
    fn dispatch(&mut self) {
        for outbox in self.streams.values_mut() {
            outbox.flush();
        }
        for (id, event) in self.events.events.drain(..) {
            // A closed receiver is reaped (and its request aborted) before the next step.
            if let Some(outbox) = self.streams.get_mut(&id) {
                outbox.send(event);
            }
        }
        self.streams.retain(|_, outbox| !outbox.is_done());
        self.shared.stats.record_finished(self.events.finished.len());
        for metrics in self.events.finished.drain(..) {
            self.observer.on_request_finished(&metrics);
        }
        self.sync_pending();
    }

    /// Samples of requests that were scheduled for the first time (or ended before) leave
    /// `pending`.
    fn sync_pending(&mut self) {
        let now = self.scheduler.num_unstarted_seqs();
        if now < self.last_unstarted {
            self.release_pending(self.last_unstarted - now);
        }
        self.last_unstarted = now;
    }

    fn release_pending(&self, n: usize) {
        self.shared.pending.fetch_sub(n, std::sync::atomic::Ordering::SeqCst);
    }

    fn publish(&self) {
        self.shared.stats.publish(&self.scheduler);
    }

    /// Hands the prefix cache's changes (of the step, or of a flush) to the observer.
    fn report_cache_events(&mut self) {
        let events = self.scheduler.take_cache_events();
        if !events.is_empty() {
            self.observer.on_cache_events(events);
        }
    }

    /// Ends every request in flight (and any still in the channel) and marks the engine dead.
    fn stop(&mut self, reason: FinishReason, why: &str) {
        self.shared.kill(why);
        while let Ok(cmd) = self.rx.try_recv() {
            if let Command::Add(requests) = cmd {
                for (request, tx) in requests {
                    self.release_pending(request.n);
                    let _ = tx.try_send(error_event(format!("the engine stopped: {why}")));
                }
            }
        }
        self.scheduler.abort_all(reason, &mut self.events);
        self.dispatch();
        self.publish();
    }
}

impl<E: ModelExecutor> Drop for EngineLoop<E> {
    /// Normally every stream has ended by now; after a panic this still ends them.
    fn drop(&mut self) {
        self.shared.kill("the engine thread stopped unexpectedly");
        for outbox in self.streams.values_mut() {
            if !outbox.has_ended() {
                outbox.send(error_event("the engine thread stopped unexpectedly".into()));
            }
        }
        // Give slow readers a moment to take what waits for them.
        let deadline = Instant::now() + std::time::Duration::from_secs(2);
        while Instant::now() < deadline {
            self.streams.retain(|_, outbox| {
                outbox.flush();
                !outbox.is_done() && !outbox.is_closed()
            });
            if self.streams.is_empty() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }
}

/// The only (and last) event of a request that could not be served.
fn error_event(message: String) -> TokenEvent {
    let mut event = TokenEvent::finish(0, FinishReason::Error(message));
    event.usage = Some(Usage::default());
    event
}

//! One scheduling pass: running sequences first (decodes, then the next chunks of unfinished
//! prefills), then waiting ones (prefix-cache lookup, then as much of the prompt as the token
//! budget and the free blocks allow), preempting by recompute when blocks run out.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use crate::constraint::{SeqConstraint, TokenConstraint};
use crate::executor::{
    ExecutorDraft, PromptLogprobsRequest, SampleRequest, ScheduledBatch, ScheduledSeq, SeqId,
};
use crate::rng::sample_seed;
use crate::sequence::SeqStatus;
use crate::speculative::{next_draft_budget, ProposerKind, SpeculativeMethod, MAX_SPECULATIVE_TOKENS};

use super::{ScheduleStats, Scheduled, Scheduler, SeqEntry};

impl Scheduler {
    /// Builds the next step's batch. Every sequence in it computes `q_len >= 1` tokens; those
    /// that complete their prompt (or are decoding) ask for a sampled token.
    pub fn schedule(&mut self) -> ScheduledBatch {
        self.step += 1;
        self.scheduled.clear();
        self.last_stats = ScheduleStats::default();
        self.last_spec_stats = Default::default();
        let queries_before = self.blocks.prefix_cache_queries();
        let hits_before = self.blocks.prefix_cache_hits();
        let preemptions_before = self.num_preemptions;
        self.regroup_beams();
        // A search sent back whole may come back in this step.
        let preemptions_regrouped = self.num_preemptions;
        let executor_draft = match self.config.speculative.map(|s| s.method) {
            Some(SpeculativeMethod::DraftLayers { num_layers }) => Some(ExecutorDraft::Layers(num_layers)),
            Some(SpeculativeMethod::DraftModel) => Some(ExecutorDraft::Model),
            _ => None,
        };
        let mut batch = ScheduledBatch {
            seqs: Vec::with_capacity(self.running.len()),
            executor_draft,
            ..Default::default()
        };
        let mut budget = self.config.max_num_batched_tokens;

        self.schedule_running(&mut batch, &mut budget);
        // After a preemption the cache is under pressure: admitting now would only preempt again
        // (possibly the sequence just requeued).
        if self.num_preemptions == preemptions_regrouped {
            self.schedule_waiting(&mut batch, &mut budget);
        }

        // An empty batch is not run: the executor hears of these with the next one.
        if !batch.is_empty() {
            batch.released = self.blocks.take_released();
        }
        let stats = &mut self.last_stats;
        stats.num_seqs = batch.seqs.len();
        stats.num_preemptions = (self.num_preemptions - preemptions_before) as usize;
        stats.num_block_copies = batch.block_copies.len();
        stats.prefix_cache_queries = self.blocks.prefix_cache_queries() - queries_before;
        stats.prefix_cache_hits = self.blocks.prefix_cache_hits() - hits_before;
        self.check_invariants(&batch, budget);
        batch
    }

    /// Running sequences: first every decode (one token left to compute, plus whatever the
    /// proposer guesses after it), in admission order, then the next chunk of each unfinished
    /// prefill in the budget that remains.
    fn schedule_running(&mut self, batch: &mut ScheduledBatch, budget: &mut usize) {
        let mut prefills = std::mem::take(&mut self.prefill_scratch);
        prefills.clear();
        // Verification is compute a large batch no longer has to spare.
        let speculate = self
            .config
            .speculative
            .as_ref()
            .is_some_and(|spec| self.running.len() <= spec.disable_by_batch_size);
        let mut i = 0;
        while i < self.running.len() && *budget > 0 {
            let id = self.running[i];
            let Some(e) = self.seqs.get_mut(&id) else {
                i += 1;
                continue;
            };
            let remaining = e.target().saturating_sub(e.seq.num_computed_tokens);
            if remaining != 1 {
                if remaining > 1 {
                    prefills.push(id);
                } else if e.fork_into > 1 {
                    // A parent at its fork point (update forks right away; this only guards
                    // against leaving one stuck). The children are visited later in this loop.
                    self.fork(id);
                }
                i += 1;
                continue;
            }
            let mut drafts = Vec::new();
            if let (true, Some(proposers)) = (speculate, &self.proposers) {
                let limit = draft_limit(e, &self.config).min(*budget - 1);
                let kind = e.shared.speculative_method.unwrap_or(proposers.default_kind());
                proposers.propose(kind, &e.seq.token_ids, &e.proposals, limit, &mut drafts);
                if let Some(SeqConstraint(grammar)) = &e.constraint {
                    cut_to_grammar(&**grammar, &e.shared.stop.eos_token_ids, &mut drafts);
                }
            }
            // Proposals shrink to the free blocks; only the token itself may preempt.
            let fits = self.blocks.max_tokens_fitting(&e.seq, 1 + drafts.len());
            if fits >= 1 {
                drafts.truncate(fits - 1);
                let q = 1 + drafts.len();
                self.push_scheduled(id, q, drafts, batch);
                *budget -= q;
                i += 1;
                continue;
            }
            if self.make_room(id, 1, &mut i).is_some() && self.push_scheduled(id, 1, Vec::new(), batch) {
                *budget -= 1;
                i += 1;
            }
        }
        for &id in &prefills {
            if *budget == 0 {
                break;
            }
            let Some(e) = self.seqs.get_mut(&id) else { continue };
            // Preempted (or scheduled) earlier in this step.
            if e.seq.status != SeqStatus::Running || e.last_scheduled == self.step {
                continue;
            }
            let want = e.target().saturating_sub(e.seq.num_computed_tokens).min(*budget);
            // A prefill chunk shrinks to the free blocks rather than preempting anyone.
            let fits = self.blocks.max_tokens_fitting(&e.seq, want);
            let q = if fits > 0 { Some(fits) } else { self.make_room(id, want, &mut 0) };
            if let Some(q) = q {
                if self.push_scheduled(id, q, Vec::new(), batch) {
                    *budget -= q;
                }
            }
        }
        self.prefill_scratch = prefills;
    }

    /// Frees blocks until running sequence `id` can compute at least one of `want` tokens, by
    /// preempting the least urgent, most recently admitted sequence not yet scheduled in this
    /// step — or `id` itself when there is none or that one is more urgent (then `None`). `cursor` (a position in
    /// `running`) is kept pointing at the same sequence while entries before it are removed.
    fn make_room(&mut self, id: SeqId, want: usize, cursor: &mut usize) -> Option<usize> {
        loop {
            let e = self.seqs.get(&id)?;
            let q = self.blocks.max_tokens_fitting(&e.seq, want);
            if q > 0 {
                return Some(q);
            }
            match self.pick_victim(id) {
                // Never a more urgent sequence for a less urgent one: then `id` itself goes.
                Some(victim) if self.priority_of(victim) >= self.priority_of(id) => {
                    if self.preempt(victim).is_some_and(|pos| pos < *cursor) {
                        *cursor -= 1;
                    }
                }
                _ => {
                    // The next sequence moves into `id`'s position; the cursor stays.
                    self.preempt(id);
                    return None;
                }
            }
        }
    }

    /// Admits waiting sequences in queue order while budget, sequence slots and blocks allow.
    /// Head-of-line: a sequence that does not fit stops admission. The one exception is the fair
    /// share: while sequences of another group wait, a group (the prompts of one API call) that
    /// already holds running slots may not go past half of `max_num_seqs`; its waiting sequences
    /// are then passed over, so a small request waits for a slot, not for a large fan-out's
    /// whole run. Alone, a group may use every slot.
    fn schedule_waiting(&mut self, batch: &mut ScheduledBatch, budget: &mut usize) {
        if self.waiting.is_empty() {
            return;
        }
        let share = (self.config.max_num_seqs / 2).max(1);
        let mut held: HashMap<u64, usize> = HashMap::new();
        for e in self.running.iter().filter_map(|id| self.seqs.get(id)) {
            *held.entry(e.shared.group).or_default() += e.slots();
        }
        // The adapters running now: with `max_loras`, a sequence of another one waits.
        let mut adapters = self.adapters_of(self.running.iter());
        let mut waiting_by_group: HashMap<u64, usize> = HashMap::new();
        for e in self.waiting.iter().filter_map(|id| self.seqs.get(id)) {
            *waiting_by_group.entry(e.shared.group).or_default() += 1;
        }
        let mut index = 0;
        while *budget > 0 && index < self.waiting.len() {
            let id = self.waiting[index];
            let (search_need, free_blocks) =
                (self.search_admission_blocks(id), self.blocks.num_free_blocks());
            // A beam whose siblings run rejoins them: its slots are its search's own.
            let rejoining = search_need.is_some() && self.search_is_running(id);
            let Some(e) = self.seqs.get_mut(&id) else {
                self.waiting.remove(index);
                continue;
            };
            let group = e.shared.group;
            let group_slots = held.get(&group).copied().unwrap_or(0);
            let others_wait = waiting_by_group.len() > usize::from(waiting_by_group.contains_key(&group));
            if group_slots > 0 && group_slots + e.slots() > share && others_wait && !rejoining {
                index += 1;
                continue;
            }
            if self.running_slots + e.slots() > self.config.max_num_seqs {
                break;
            }
            let lora = e.seq.lora;
            if let (Some(max), Some(adapter)) = (self.config.max_loras, lora) {
                if !adapters.contains(&adapter) && adapters.len() >= max {
                    index += 1;
                    continue;
                }
            }
            // A search comes back whole or waits.
            if search_need.is_some_and(|need| need > free_blocks) {
                break;
            }
            let target = e.target();
            // Keep at least one token to compute so there are logits to sample from; a parent
            // about to fork may take everything up to the fork point from the cache. Pooling
            // reads the hidden state of every input token, and prompt logprobs the logits of
            // every prompt position: nothing comes from the cache.
            let max_cached = match (e.shared.pool || e.shared.prompt_logprobs.is_some(), e.fork_into > 1) {
                (true, _) => 0,
                (false, true) => target,
                (false, false) => target - 1,
            };
            let plan = self.blocks.plan_admission(&mut e.seq, max_cached);
            let remaining = target - plan.num_cached_tokens;
            let q = self.blocks.admission_max_tokens(&plan, remaining.min(*budget));
            // A pooling sequence runs whole in one step or waits.
            if (q == 0 && remaining > 0)
                || (e.shared.pool && q < remaining)
                || self.blocks.admission_blocks_needed(&plan, q) > self.blocks.num_free_blocks()
            {
                break;
            }
            self.waiting.remove(index);
            if let Some(adapter) = lora.filter(|a| !adapters.contains(a)) {
                adapters.push(adapter);
            }
            *held.entry(group).or_default() += e.slots();
            if let Some(count) = waiting_by_group.get_mut(&group) {
                *count -= 1;
                if *count == 0 {
                    waiting_by_group.remove(&group);
                }
            }
            let cached = plan.num_cached_tokens;
            if self.blocks.admit(&mut e.seq, plan, q, &mut batch.block_copies).is_err() {
                // Cannot happen (checked above); undo rather than lose the sequence.
                self.blocks.free(&mut e.seq);
                self.waiting.insert(index, id);
                break;
            }
            e.seq.status = SeqStatus::Running;
            let slots = e.slots();
            let request_id = e.seq.request_id;
            let prompt_len = e.seq.prompt_len;
            let forks_now = e.fork_into > 1 && e.seq.num_computed_tokens == target;
            self.running.push(id);
            self.running_slots += slots;
            if let Some(state) = self.requests.get_mut(&request_id) {
                if state.timestamps.first_scheduled.is_none() {
                    state.timestamps.first_scheduled = Some(Instant::now());
                    state.cached_prompt_tokens = Some(cached.min(prompt_len));
                    self.num_unstarted -= state.shared.n;
                }
            }
            if q > 0 && self.push_scheduled(id, q, Vec::new(), batch) {
                *budget -= q;
            }
            if forks_now {
                // Each sample computes the last prompt token on its own, budget and blocks
                // permitting; the rest wait for the next step's running pass.
                for sid in self.fork(id) {
                    if *budget == 0 {
                        break;
                    }
                    let fits =
                        self.seqs.get(&sid).is_some_and(|e| self.blocks.max_tokens_fitting(&e.seq, 1) == 1);
                    if fits && self.push_scheduled(sid, 1, Vec::new(), batch) {
                        *budget -= 1;
                    }
                }
            }
        }
    }

    /// Allocates blocks for `q` tokens of sequence `id` and appends it to the batch; the last
    /// `drafts.len()` of the `q` tokens are `drafts`, proposed after the sequence's own tokens.
    /// A decoding sequence whose proposals the executor drafts also gets slots for the drafts
    /// it makes after this step, from free blocks that no other sequence's next token needs.
    fn push_scheduled(&mut self, id: SeqId, q: usize, drafts: Vec<u32>, batch: &mut ScheduledBatch) -> bool {
        let default_proposer = self.default_proposer_now();
        let running = self.running.len();
        let Some(e) = self.seqs.get_mut(&id) else { return false };
        let start = e.seq.num_computed_tokens;
        let own = q - drafts.len();
        let pool = e.shared.pool;
        let sample = start + own == e.target() && e.fork_into <= 1 && !pool;
        debug_assert!(sample || drafts.is_empty(), "proposals for a step that samples nothing");
        // Decodes only: drafting after a prompt's last chunk would hold its first token back.
        let decoding = sample && own == 1 && e.seq.output_len() > 0;
        let kind = default_proposer.map(|default| e.shared.speculative_method.unwrap_or(default));
        let wanted = match kind {
            Some(ProposerKind::Executor) if decoding => next_draft_limit(e, &self.config, drafts.len()),
            _ => 0,
        };
        let to_draft = match wanted {
            0 => 0,
            _ => {
                // Draft slots come from blocks no other running sequence's next token needs:
                // one per sequence and group stays free for them.
                let fits = self.blocks.max_tokens_fitting(&e.seq, q + wanted).max(q);
                let reserve = running * self.blocks.groups().len();
                let left = self.blocks.num_free_blocks().checked_sub(self.blocks.blocks_needed(&e.seq, fits));
                if left.is_some_and(|left| left >= reserve) {
                    fits - q
                } else {
                    0
                }
            }
        };
        if self.blocks.allocate(&mut e.seq, q + to_draft, &mut batch.block_copies).is_err() {
            debug_assert!(false, "allocation for sequence {} failed after the fit check", e.seq.id);
            return false;
        }
        let sample_request = sample.then(|| sample_request(e));
        // Position `p` of the prompt predicts prompt token `p + 1`.
        let scored_end = (start + own).min(e.seq.prompt_len.saturating_sub(1));
        let prompt_logprobs = match e.shared.prompt_logprobs {
            Some(top) if start < scored_end => Some(PromptLogprobsRequest {
                top,
                targets: e.seq.token_ids[start + 1..scored_end + 1].to_vec(),
            }),
            _ => None,
        };
        let scored = prompt_logprobs.as_ref().map(|p| (start, p.targets.len()));
        let mut token_ids = Vec::with_capacity(q);
        token_ids.extend_from_slice(&e.seq.token_ids[start..start + own]);
        token_ids.extend_from_slice(&drafts);
        batch.seqs.push(ScheduledSeq {
            seq_id: e.seq.id,
            token_ids,
            start_pos: start,
            block_table_update: e.seq.take_table_update(),
            sample: sample_request,
            num_draft_tokens: drafts.len(),
            num_to_draft: to_draft,
            pool,
            second_segment: e.shared.second_segment,
            lora: e.shared.lora,
            prompt_logprobs,
        });
        e.last_scheduled = self.step;
        if decoding {
            self.last_stats.num_decode_tokens += q;
        } else {
            self.last_stats.num_prefill_tokens += q;
        }
        self.scheduled.push(Scheduled { seq_id: e.seq.id, q, sample, drafts, to_draft, pool, scored });
        true
    }

    /// The server's default proposer while speculation is on at this batch size.
    fn default_proposer_now(&self) -> Option<ProposerKind> {
        let spec = self.config.speculative.as_ref()?;
        let proposers = self.proposers.as_ref()?;
        (self.running.len() <= spec.disable_by_batch_size).then(|| proposers.default_kind())
    }

    /// The least urgent (highest priority value), most recently admitted running sequence other
    /// than `except` that is not in this step's batch yet.
    fn pick_victim(&self, except: SeqId) -> Option<SeqId> {
        let mut best: Option<(i32, SeqId)> = None;
        for &id in self.running.iter().rev() {
            let Some(e) = self.seqs.get(&id) else { continue };
            if id == except || e.last_scheduled == self.step {
                continue;
            }
            if best.is_none_or(|(p, _)| e.shared.priority > p) {
                best = Some((e.shared.priority, id));
            }
        }
        best.map(|(_, id)| id)
    }

    /// Preempts a running sequence by recompute: frees its blocks and requeues it at the front.
    /// Returns its former position in `running`.
    pub(crate) fn preempt(&mut self, id: SeqId) -> Option<usize> {
        let pos = self.running.iter().position(|&r| r == id)?;
        self.running.remove(pos);
        let e = self.seqs.get_mut(&id)?;
        self.blocks.free(&mut e.seq);
        // The recompute samples the last token again: drafts after it would be guesses about
        // another token's future.
        e.proposals.clear();
        // A beam's candidates come again from its recompute, with its siblings'.
        if let Some(beam) = e.beam.as_mut() {
            beam.candidates = None;
        }
        e.seq.status = SeqStatus::Waiting;
        self.running_slots -= e.slots();
        let request_id = e.seq.request_id;
        self.num_preemptions += 1;
        if let Some(state) = self.requests.get_mut(&request_id) {
            state.num_preemptions += 1;
        }
        self.enqueue_front(id);
        Some(pos)
    }

    /// Splits a parent whose prompt is computed up to its last token into the request's `n`
    /// samples, sharing its blocks. Returns the ids of the new sequences.
    pub(crate) fn fork(&mut self, parent: SeqId) -> Vec<SeqId> {
        let Some(e) = self.seqs.get_mut(&parent) else { return Vec::new() };
        let n = std::mem::take(&mut e.fork_into);
        let shared = Arc::clone(&e.shared);
        let base = e.seq.clone();
        let constraint = e.constraint.clone();
        let mut children = Vec::with_capacity(n.saturating_sub(1));
        for index in 1..n {
            let id = self.new_seq_id();
            let seq = base.fork(id, index, sample_seed(shared.seed, index));
            self.blocks.share(&seq.block_tables);
            let last_scheduled = 0;
            self.seqs.insert(
                id,
                SeqEntry {
                    seq,
                    shared: Arc::clone(&shared),
                    fork_into: 0,
                    last_scheduled,
                    constraint: constraint.clone(),
                    draft_budget: MAX_SPECULATIVE_TOKENS,
                    proposals: Vec::new(),
                    beam: None,
                },
            );
            self.running.push(id);
            children.push(id);
        }
        if let Some(state) = self.requests.get_mut(&shared.id) {
            state.seq_ids.extend_from_slice(&children);
        }
        // The parent reserved `n` slots; now each of the `n` sequences holds one.
        children
    }

    /// Cheap checks that every schedule must satisfy (debug builds).
    fn check_invariants(&self, batch: &ScheduledBatch, budget_left: usize) {
        debug_assert_eq!(
            batch.num_tokens() + budget_left,
            self.config.max_num_batched_tokens,
            "token budget"
        );
        debug_assert!(batch.num_tokens() <= self.config.max_num_batched_tokens, "token budget exceeded");
        debug_assert!(batch.seqs.len() <= self.config.max_num_seqs, "too many sequences in the batch");
        debug_assert!(self.running_slots <= self.config.max_num_seqs, "too many running sequences");
        debug_assert_eq!(
            self.blocks.num_free_blocks() + self.blocks.num_used_blocks(),
            self.blocks.num_total_blocks(),
            "free + used != total blocks"
        );
        debug_assert!(
            batch.seqs.iter().all(|s| s.q_len() > 0
                && self.seqs.get(&s.seq_id).is_some_and(|e| {
                    let tables = &e.seq.block_tables;
                    tables.len() == self.blocks.groups().len()
                        && tables.iter().all(|t| t.len() * self.blocks.block_size() >= s.context_len())
                })),
            "a scheduled sequence lacks blocks"
        );
    }
}

/// Most tokens a decoding sequence may propose: at most its request's own cap; a verified step
/// yields up to one more token than it proposed, which must stay within `max_tokens` and
/// `max_model_len`; while `min_tokens` is not reached, every verified position must be one
/// where the end-of-sequence bans hold (the sample request carries one ban list).
fn draft_limit(e: &SeqEntry, config: &crate::config::EngineConfig) -> usize {
    if e.fork_into > 1 {
        return 0;
    }
    let output = e.seq.output_len();
    let limit = proposal_cap(e, config, e.draft_budget, 0);
    let min_tokens = e.shared.stop.min_tokens;
    if output < min_tokens {
        limit.min(min_tokens - output - 1)
    } else {
        limit
    }
}

/// A bound on [`draft_limit`] at the sequence's next step, which has at least one more output
/// token and a draft budget updated from this step's `proposed` tokens: how many tokens the
/// executor drafts after this step (the next step cuts them to its own limit).
fn next_draft_limit(e: &SeqEntry, config: &crate::config::EngineConfig, proposed: usize) -> usize {
    let budget = match proposed {
        0 => e.draft_budget,
        // Every proposal holding gives the longest next budget.
        _ => next_draft_budget(proposed, proposed),
    };
    proposal_cap(e, config, budget, 1)
}

/// The caps on a proposal made `ahead` tokens after the sequence's current end: the server's
/// and the request's, the draft budget, and room for one more token than it proposes within
/// `max_tokens` and `max_model_len`.
fn proposal_cap(e: &SeqEntry, config: &crate::config::EngineConfig, budget: usize, ahead: usize) -> usize {
    let Some(spec) = &config.speculative else { return 0 };
    // A beam's next token is chosen among its siblings', never verified alone.
    if e.shared.beam.is_some() {
        return 0;
    }
    spec.num_speculative_tokens
        .min(e.shared.max_speculative_tokens.unwrap_or(usize::MAX))
        .min(budget)
        .min(e.shared.max_tokens.saturating_sub(e.seq.output_len() + 1 + ahead))
        .min(config.max_model_len.saturating_sub(e.seq.len() + 1 + ahead))
}

/// Cuts proposals at the first token the grammar would refuse (or an end-of-sequence id, which
/// the grammar never takes): verifying past it could only reject.
fn cut_to_grammar(grammar: &dyn TokenConstraint, eos: &[u32], drafts: &mut Vec<u32>) {
    if drafts.is_empty() {
        return;
    }
    let mut state = grammar.fork();
    let valid = drafts.iter().take_while(|&&t| !eos.contains(&t) && state.accept_token(t).is_ok()).count();
    drafts.truncate(valid);
}

/// What the sampler needs for this sequence's next token.
fn sample_request(e: &SeqEntry) -> SampleRequest {
    let shared = &e.shared;
    let output_index = e.seq.output_len();
    SampleRequest {
        params: Arc::clone(&shared.params),
        seed: e.seq.seed,
        output_index,
        history: shared.params.needs_history().then(|| Arc::from(e.seq.token_ids.as_slice())),
        prompt_len: e.seq.prompt_len,
        banned_token_ids: if output_index < shared.stop.min_tokens {
            shared.min_tokens_banned.clone()
        } else {
            Vec::new()
        },
        // Attached by the engine when it hands the sequence's constraint to the mask worker.
        allowed: None,
        draft_masks: Vec::new(),
        draft_grammar: None,
    }
}

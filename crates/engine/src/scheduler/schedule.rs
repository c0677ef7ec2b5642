//! One scheduling pass: running sequences first (decodes, then the next chunks of unfinished
//! prefills), then waiting ones (prefix-cache lookup, then as much of the prompt as the token
//! budget and the free blocks allow), preempting by recompute when blocks run out.

use std::time::Instant;

use crate::executor::{ScheduledBatch, SeqId};
use crate::sequence::SeqStatus;

use super::admission::AdmissionGate;
use super::speculation::executor_draft;
use super::{ScheduleStats, Scheduler};

impl Scheduler {
    /// Builds the next step's batch. Every sequence in it computes `q_len >= 1` tokens; those
    /// that complete their prompt (or are decoding) ask for a sampled token.
    pub fn schedule(&mut self) -> ScheduledBatch {
        self.step += 1;
        self.scheduled.clear();
        self.last_stats = ScheduleStats::default();
        self.speculation.reset_stats();
        let queries_before = self.blocks.prefix_cache_queries();
        let hits_before = self.blocks.prefix_cache_hits();
        let preemptions_before = self.num_preemptions;
        self.regroup_beams();
        // A search sent back whole may come back in this step.
        let preemptions_regrouped = self.num_preemptions;
        let mut batch = ScheduledBatch {
            seqs: Vec::with_capacity(self.running.len()),
            executor_draft: executor_draft(&self.config),
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
        let proposer = self.speculation.active(&self.config, self.running.len());
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
            if let Some(default) = proposer {
                self.speculation.propose(e, default, &self.config, *budget - 1, &mut drafts);
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

    /// Admits waiting sequences in queue order while budget, sequence slots and blocks allow.
    /// Head-of-line: a sequence that does not fit stops admission. The exceptions are the
    /// [`AdmissionGate`]'s: a group past its fair share, or an adapter past `max_loras`, is
    /// passed over.
    fn schedule_waiting(&mut self, batch: &mut ScheduledBatch, budget: &mut usize) {
        if self.waiting.is_empty() {
            return;
        }
        let running = self.running.iter().filter_map(|id| self.seqs.get(id));
        let waiting = self.waiting.iter().filter_map(|id| self.seqs.get(id));
        let mut gate = AdmissionGate::new(
            self.config.max_num_seqs,
            self.config.max_loras,
            running.map(|e| (e.shared.group, e.slots())),
            waiting.map(|e| e.shared.group),
            self.adapters_of(self.running.iter()),
        );
        let mut index = 0;
        while *budget > 0 {
            let Some(id) = self.waiting.get(index) else { break };
            let (search_need, free_blocks) =
                (self.search_admission_blocks(id), self.blocks.num_free_blocks());
            // A beam whose siblings run rejoins them: its slots are its search's own.
            let rejoining = search_need.is_some() && self.search_is_running(id);
            let Some(e) = self.seqs.get_mut(&id) else {
                self.waiting.remove_at(index);
                continue;
            };
            let (group, slots, lora) = (e.shared.group, e.slots(), e.seq.lora);
            if gate.over_fair_share(group, slots) && !rejoining {
                index += 1;
                continue;
            }
            if self.running_slots + slots > self.config.max_num_seqs {
                break;
            }
            if !gate.adapter_fits(lora) {
                index += 1;
                continue;
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
            let Some(queued) = self.waiting.remove_at(index) else { break };
            gate.admitted(group, slots, lora);
            let cached = plan.num_cached_tokens;
            if self.blocks.admit(&mut e.seq, plan, q, &mut batch.block_copies).is_err() {
                // Cannot happen (checked above); undo rather than lose the sequence.
                self.blocks.free(&mut e.seq);
                self.waiting.restore(queued);
                break;
            }
            let forks_now = e.fork_into > 1 && e.seq.num_computed_tokens == target;
            self.start_running(id, cached);
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

    /// An admitted sequence, its blocks allocated with `cached` tokens from the prefix cache,
    /// joins the running set; its request's first admission is recorded.
    fn start_running(&mut self, id: SeqId, cached: usize) {
        let Some(e) = self.seqs.get_mut(&id) else { return };
        e.seq.status = SeqStatus::Running;
        self.running.push(id);
        self.running_slots += e.slots();
        let (request_id, prompt_len) = (e.seq.request_id, e.seq.prompt_len);
        if let Some(state) = self.requests.get_mut(&request_id) {
            if state.timestamps.first_scheduled.is_none() {
                state.timestamps.first_scheduled = Some(Instant::now());
                state.cached_prompt_tokens = Some(cached.min(prompt_len));
                self.num_unstarted -= state.shared.n;
            }
        }
    }
}

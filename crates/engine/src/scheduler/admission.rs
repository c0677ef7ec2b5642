//! Admission's two pass-over rules, kept over one scheduling pass: the fair share between
//! groups and the cap on LoRA adapters running at once. A waiting sequence that breaks either is
//! passed over (the ones behind it may still be admitted), unlike one that does not fit in the
//! sequence slots, the token budget or the free blocks, which stops admission (head-of-line).
//!
//! The fair share: while sequences of another group wait, a group (the prompts of one API
//! call) that already holds running slots may not go past half of `max_num_seqs`, so a small
//! request waits for a slot, not for a large fan-out's whole run. Alone, a group may use every
//! slot.

use std::collections::HashMap;

use crate::executor::LoraId;

/// What admission has let run so far in this pass, by group and adapter.
#[derive(Debug)]
pub(super) struct AdmissionGate {
    /// Half of `max_num_seqs`, at least one.
    share: usize,
    /// Running slots per group.
    held: HashMap<u64, usize>,
    /// Waiting sequences per group (groups with none are absent).
    waiting: HashMap<u64, usize>,
    max_loras: Option<usize>,
    /// The adapters running now, each once.
    adapters: Vec<LoraId>,
}

impl AdmissionGate {
    /// The gate at the start of admission: `running` gives each running sequence's group and
    /// slots, `waiting` each waiting sequence's group, `adapters` the running adapters.
    pub fn new(
        max_num_seqs: usize,
        max_loras: Option<usize>,
        running: impl Iterator<Item = (u64, usize)>,
        waiting: impl Iterator<Item = u64>,
        adapters: Vec<LoraId>,
    ) -> Self {
        let mut held: HashMap<u64, usize> = HashMap::new();
        for (group, slots) in running {
            *held.entry(group).or_default() += slots;
        }
        let mut by_group: HashMap<u64, usize> = HashMap::new();
        for group in waiting {
            *by_group.entry(group).or_default() += 1;
        }
        Self { share: (max_num_seqs / 2).max(1), held, waiting: by_group, max_loras, adapters }
    }

    /// Whether a waiting sequence of `group` taking `slots` would put its group past its fair
    /// share while another group waits.
    pub fn over_fair_share(&self, group: u64, slots: usize) -> bool {
        let group_slots = self.held.get(&group).copied().unwrap_or(0);
        let others_wait = self.waiting.len() > usize::from(self.waiting.contains_key(&group));
        group_slots > 0 && group_slots + slots > self.share && others_wait
    }

    /// Whether a sequence of adapter `lora` may run beside the adapters running now.
    pub fn adapter_fits(&self, lora: Option<LoraId>) -> bool {
        match (self.max_loras, lora) {
            (Some(max), Some(adapter)) => self.adapters.contains(&adapter) || self.adapters.len() < max,
            _ => true,
        }
    }

    /// A waiting sequence of `group` and `lora` now runs with `slots`.
    pub fn admitted(&mut self, group: u64, slots: usize, lora: Option<LoraId>) {
        if let Some(adapter) = lora.filter(|a| !self.adapters.contains(a)) {
            self.adapters.push(adapter);
        }
        *self.held.entry(group).or_default() += slots;
        if let Some(count) = self.waiting.get_mut(&group) {
            *count -= 1;
            if *count == 0 {
                self.waiting.remove(&group);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_past_half_the_slots_waits_while_others_do() {
        // Group 1 runs 3 of 8 slots; groups 1 and 2 wait.
        let mut gate = AdmissionGate::new(8, None, [(1, 3)].into_iter(), [1, 2].into_iter(), Vec::new());
        assert!(!gate.over_fair_share(1, 1), "up to the share of four");
        assert!(gate.over_fair_share(1, 2));
        assert!(!gate.over_fair_share(2, 8), "a group holding nothing is never over");
        gate.admitted(2, 1, None);
        // Group 2 waits no more: group 1 is alone and may take every slot.
        assert!(!gate.over_fair_share(1, 5));
        gate.admitted(1, 1, None);
        assert!(!gate.over_fair_share(1, 5));
    }

    #[test]
    fn one_slot_is_the_smallest_share() {
        let gate = AdmissionGate::new(1, None, [(1, 1)].into_iter(), [1, 2].into_iter(), Vec::new());
        assert!(gate.over_fair_share(1, 1));
    }

    #[test]
    fn max_loras_bounds_the_adapters_running_at_once() {
        let mut gate = AdmissionGate::new(8, Some(2), std::iter::empty(), std::iter::empty(), vec![4]);
        assert!(gate.adapter_fits(None) && gate.adapter_fits(Some(4)) && gate.adapter_fits(Some(5)));
        gate.admitted(7, 1, Some(5));
        assert!(gate.adapter_fits(Some(5)), "an adapter running already");
        assert!(!gate.adapter_fits(Some(6)));
        assert!(gate.adapter_fits(None), "the base model is no adapter");
        let unbounded = AdmissionGate::new(8, None, std::iter::empty(), std::iter::empty(), vec![1, 2, 3]);
        assert!(unbounded.adapter_fits(Some(9)));
    }
}

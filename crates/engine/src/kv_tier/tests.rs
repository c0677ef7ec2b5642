//! Offload tiers driven through the scheduler and the fake executor (whose reads check every KV
//! slot's token and position, so a wrongly loaded page changes the output or fails the step),
//! and the disk tier's files: reopened, bounded, and refused when foreign, cut short or changed.

use std::path::Path;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use super::*;
use crate::config::EngineConfig;
use crate::executor::ModelExecutor;
use crate::fake::FakeExecutor;
use crate::request::Request;
use crate::sampling::SamplingParams;
use crate::scheduler::{Scheduler, StepEvents};

const BS: usize = 4;
const BLOCKS: usize = 12;
/// Eight blocks of prompt: two prompts do not fit the pool together.
const PROMPT: usize = 8 * BS + 1;

fn layout() -> KvPageLayout {
    FakeExecutor::new(BS, BLOCKS, 32).kv_page_layout().unwrap()
}

fn host_only(bytes: u64) -> KvOffloadConfig {
    KvOffloadConfig { host_bytes: Some(bytes), disk: None, model_identity: "fake".into() }
}

fn disk_only(dir: &Path, bytes: u64) -> KvOffloadConfig {
    KvOffloadConfig { host_bytes: None, disk: Some((dir.to_owned(), bytes)), model_identity: "fake".into() }
}

fn prompt(i: u32) -> Vec<u32> {
    (0..PROMPT as u32).map(|t| (t * 7 + i * 13) % 29 + 1).collect()
}

/// An engine loop without the thread: the scheduler, the fake executor and the tiers.
struct Rig {
    sched: Scheduler,
    exec: FakeExecutor,
    tiers: Option<KvTiers>,
    /// The tiers' cache events so far: stores and removals, by medium.
    tier_events: Vec<crate::CacheEvent>,
}

impl Rig {
    fn new(offload: Option<KvOffloadConfig>) -> Self {
        let mut config = EngineConfig::new(BS, BLOCKS, BS * BLOCKS);
        config.kv_offload = offload;
        config.kv_cache_events = true;
        let exec = FakeExecutor::new(BS, BLOCKS, 32);
        let mut sched = Scheduler::new(config.clone()).unwrap();
        let tiers = open_for_engine(&config, exec.kv_page_layout().as_ref(), &mut sched).unwrap();
        Self { sched, exec, tiers, tier_events: Vec::new() }
    }

    /// Runs one request alone to its end; returns its output tokens.
    fn run(&mut self, id: u64, prompt: Vec<u32>) -> Vec<u32> {
        let params = Arc::new(SamplingParams { temperature: 0.0, ..SamplingParams::default() });
        self.sched.add_request(Request::new(id, prompt, params).with_max_tokens(3)).unwrap();
        let mut events = StepEvents::default();
        let mut out = Vec::new();
        while self.sched.has_unfinished() {
            if let Some(tiers) = &mut self.tiers {
                load_waiting(tiers, &mut self.sched, &mut self.exec);
            }
            let batch = self.sched.schedule();
            assert!(!batch.is_empty(), "nothing scheduled");
            let step = self.exec.execute(&batch).unwrap();
            self.sched.update(step, &mut events).unwrap();
            if let Some(tiers) = &mut self.tiers {
                store_new_blocks(tiers, &mut self.sched, &mut self.exec);
            }
            for (_, event) in events.events.drain(..) {
                out.extend(event.token_ids);
            }
            events.finished.clear();
            let cache_events = self.sched.take_cache_events();
            self.tier_events.extend(cache_events.into_iter().filter(|e| {
                matches!(e, crate::CacheEvent::TierStored { .. } | crate::CacheEvent::TierRemoved { .. })
            }));
            self.sched.audit().unwrap();
        }
        out
    }

    fn counters(&self, medium: TierMedium) -> (u64, u64) {
        let c = self.tiers.as_ref().unwrap().stats().tier(medium);
        (c.hit_blocks.load(Relaxed), c.stored_blocks.load(Relaxed))
    }
}

/// Runs prompts 0..4 twice; returns both passes' outputs and the tokens computed in the second.
fn two_passes(rig: &mut Rig) -> (Vec<Vec<u32>>, Vec<Vec<u32>>, u64) {
    let first: Vec<_> = (0..4).map(|i| rig.run(u64::from(i), prompt(i))).collect();
    let before = rig.exec.tokens_computed();
    let second: Vec<_> = (0..4).map(|i| rig.run(10 + u64::from(i), prompt(i))).collect();
    (first, second, rig.exec.tokens_computed() - before)
}

#[test]
fn evicted_prefixes_come_back_from_host_memory_instead_of_being_recomputed() {
    let (plain_first, plain_second, recomputed) = two_passes(&mut Rig::new(None));
    let mut rig = Rig::new(Some(host_only(1 << 20)));
    let (first, second, computed) = two_passes(&mut rig);
    assert_eq!(first, plain_first);
    assert_eq!(second, plain_second, "loaded pages give the outputs recomputation gives");
    assert_eq!(first, second);
    // Without tiers the pool holds only the last prompt: three are recomputed whole.
    assert!(recomputed >= 3 * 8 * BS as u64, "{recomputed}");
    // With them each prompt computes its last token and its decodes only.
    assert!(computed <= 4 * 4, "{computed} tokens computed");
    let (hits, stored) = rig.counters(TierMedium::Cpu);
    assert!(hits >= 3 * 8, "{hits} blocks loaded");
    assert!(stored >= 4 * 8, "{stored} blocks stored");
    // Each store is a KV event naming its medium; a megabyte evicts nothing.
    let stores = rig
        .tier_events
        .iter()
        .filter(|e| matches!(e, crate::CacheEvent::TierStored { medium: TierMedium::Cpu, .. }));
    assert_eq!(stores.count() as u64, stored);
    assert_eq!(rig.tier_events.len() as u64, stored);
}

#[test]
fn a_bound_too_small_for_a_prefix_loads_what_it_kept() {
    // Room for ten blocks: the first prompt's early blocks are evicted by the later prompts'.
    let block = layout().block_bytes() as u64;
    let mut rig = Rig::new(Some(host_only(10 * block)));
    let (first, second, _) = two_passes(&mut rig);
    assert_eq!(first, second);
    assert!(rig.tiers.as_ref().unwrap().stats().tier(TierMedium::Cpu).held_bytes.load(Relaxed) <= 10 * block);
    // What the bound pushed out went out as removals, each of a block stored before.
    let mut held = std::collections::HashSet::new();
    for event in &rig.tier_events {
        match *event {
            crate::CacheEvent::TierStored { hash, .. } => assert!(held.insert(hash), "stored twice"),
            crate::CacheEvent::TierRemoved { hash, .. } => assert!(held.remove(&hash), "never stored"),
            _ => unreachable!(),
        }
    }
    assert!(held.len() <= 10);
    assert!(rig.tier_events.iter().any(|e| matches!(e, crate::CacheEvent::TierRemoved { .. })));
}

#[test]
fn a_restarted_engine_finds_its_prefixes_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let mut rig = Rig::new(Some(disk_only(dir.path(), 1 << 20)));
    let first: Vec<_> = (0..4).map(|i| rig.run(u64::from(i), prompt(i))).collect();
    drop(rig);
    // A new engine, its pool empty: everything comes from disk.
    let mut rig = Rig::new(Some(disk_only(dir.path(), 1 << 20)));
    assert!(rig.tiers.as_ref().unwrap().num_disk_blocks() >= 4 * 8);
    let second: Vec<_> = (0..4).map(|i| rig.run(10 + u64::from(i), prompt(i))).collect();
    assert_eq!(first, second);
    assert!(rig.exec.tokens_computed() <= 4 * 4, "{}", rig.exec.tokens_computed());
    assert!(rig.counters(TierMedium::Disk).0 >= 4 * 8);
}

fn block(seed: u8) -> TierBlock {
    let bytes = layout().block_bytes();
    TierBlock { parent: Some(7), tokens: vec![u32::from(seed); BS].into(), pages: vec![seed; bytes].into() }
}

fn block_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let sub = std::fs::read_dir(dir).unwrap().next().unwrap().unwrap().path();
    let mut files: Vec<_> = std::fs::read_dir(sub)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "kvb"))
        .collect();
    files.sort();
    files
}

#[test]
fn the_disk_tier_is_bounded_in_bytes_least_recently_used_first_out() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = layout().block_bytes() as u64;
    let mut store = DiskStore::open(dir.path(), 3 * bytes, "fake", &layout()).unwrap();
    for seed in 1..=3 {
        assert!(store.put(u64::from(seed), block(seed)));
    }
    assert!(!store.put(1, block(1)), "held already");
    assert!(store.fetch(1, Some(7), &[1; BS]).is_some());
    assert!(store.put(4, block(4)));
    store.sync();
    assert!(store.probe(1, Some(7), &[1; BS]) && !store.contains(2));
    assert_eq!(store.bytes(), 3 * bytes);
    assert_eq!(block_files(dir.path()).len(), 3);
    assert!(store.fetch(3, Some(8), &[3; BS]).is_none(), "another parent is another block");
}

#[test]
fn foreign_cut_short_and_changed_block_files_are_never_loaded() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = DiskStore::open(dir.path(), 1 << 20, "fake", &layout()).unwrap();
    for seed in 1..=4 {
        store.put(u64::from(seed), block(seed));
    }
    drop(store);
    let files = block_files(dir.path());
    let fingerprint_dir = files[0].parent().unwrap().to_owned();
    // 1: cut short. 2: one byte of its pages changed. 3: written by another model.
    let len = std::fs::metadata(&files[0]).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&files[0]).unwrap().set_len(len - 3).unwrap();
    let mut changed = std::fs::read(&files[1]).unwrap();
    *changed.last_mut().unwrap() ^= 0x40;
    std::fs::write(&files[1], changed).unwrap();
    let other_dir = tempfile::tempdir().unwrap();
    let mut other = DiskStore::open(other_dir.path(), 1 << 20, "another model", &layout()).unwrap();
    other.put(3, block(9));
    drop(other);
    std::fs::copy(&block_files(other_dir.path())[0], &files[2]).unwrap();
    // The same model with another page layout (an FP8 cache's scales) shares nothing either.
    let fp8 = KvPageLayout { scales: vec![[1, 2]], ..layout() };
    assert_ne!(disk::fingerprint("fake", &fp8), disk::fingerprint("fake", &layout()));

    let mut store = DiskStore::open(dir.path(), 1 << 20, "fake", &layout()).unwrap();
    assert_eq!(store.refused_at_open(), 2, "the short and the foreign file");
    assert!(!store.contains(1) && !store.contains(3));
    // The changed pages pass the header's checks; their checksum fails at load.
    assert!(store.contains(2));
    assert!(store.fetch(2, Some(7), &[2; BS]).is_none());
    assert_eq!(store.take_refused(), 1);
    assert!(!store.contains(2));
    assert_eq!(store.fetch(4, Some(7), &[4; BS]), Some(block(4)));
    store.sync();
    assert!(!fingerprint_dir.join(files[1].file_name().unwrap()).exists(), "a refused file is dropped");
}

#[test]
fn an_engine_without_pages_to_move_refuses_offload() {
    let mut config = EngineConfig::new(BS, BLOCKS, BS * BLOCKS);
    config.kv_offload = Some(host_only(1 << 20));
    let mut sched = Scheduler::new(config.clone()).unwrap();
    assert!(open_for_engine(&config, None, &mut sched).is_err());
    config.enable_prefix_caching = false;
    let mut sched = Scheduler::new(config.clone()).unwrap();
    assert!(open_for_engine(&config, Some(&layout()), &mut sched).is_err());
}

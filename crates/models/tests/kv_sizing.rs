//! The profiling step that sizes a GPU's KV cache, run on the CPU with the real models: the
//! batch the scheduler's largest step would be (every sequence sampled, with logprobs) runs
//! through the runner on exactly the pages it claims, with one KV group (SmolLM2) and with
//! Gemma 3's several (sliding-window and global layers page apart). On the CPU the sizing itself stops after
//! the step with a clear error, since there is no device memory to measure.

mod common;

use candle_core::DType;
use common::*;
use pagoda_engine::ModelExecutor;
use pagoda_models::kv_sizing::{size_from_device_memory, KvSizingError, ProfileShape};
use pagoda_models::KvLayout;

fn profile_step_runs_on(path: &std::path::Path, shape: ProfileShape) {
    let probe = runner_for(path, 1);
    let config = probe.model().config().clone();
    drop(probe);
    let groups = KvLayout::for_config(&config).num_groups();
    let (batch, pages) = shape.batch(groups, config.vocab_size);
    let mut runner = runner_for(path, pages);
    let out = runner.execute(&batch).expect("the profiling step runs on the pages it claims");
    assert_eq!(out.sampled.len(), shape.max_num_seqs.min(shape.max_num_batched_tokens));
    for s in &out.sampled {
        assert_eq!(s.token_ids.len(), 1);
        assert!((s.token_ids[0] as usize) < config.vocab_size);
        assert_eq!(s.logprobs.as_ref().unwrap()[0].top.len(), 20);
    }
}

#[test]
fn profiling_step_runs_with_one_kv_group() {
    profile_step_runs_on(
        &model_path(),
        ProfileShape { max_num_batched_tokens: 512, max_num_seqs: 32, block_size: BLOCK_SIZE },
    );
}

#[test]
fn profiling_step_runs_with_several_kv_groups() {
    let path = gemma3_path();
    let config = runner_for(&path, 1).model().config().clone();
    assert!(KvLayout::for_config(&config).num_groups() > 1, "Gemma 3 pages windowed and global layers apart");
    profile_step_runs_on(
        &path,
        ProfileShape { max_num_batched_tokens: 300, max_num_seqs: 7, block_size: BLOCK_SIZE },
    );
}

#[test]
fn sizing_from_device_memory_refuses_the_cpu_after_the_step() {
    let mut runner = runner_for(&model_path(), 4);
    let config = runner.model().config().clone();
    let shape = ProfileShape { max_num_batched_tokens: 64, max_num_seqs: 4, block_size: BLOCK_SIZE };
    let err = size_from_device_memory(&mut runner, &config, shape, DType::F32, 0.9).unwrap_err();
    assert!(matches!(err, KvSizingError::Profile(ref m) if m.contains("no memory")), "{err}");
    assert_eq!(runner.cache().num_blocks(), 1, "the scratch cache is gone");
}

//! The path CUDA graphs replay decode steps on, exercised on the CPU without a capture
//! (`ModelRunner::enable_decode_graphs(_, false)`): decode steps run at a padded batch size on
//! buffers written in place, with attention metadata planned for the longest context. Their
//! logits must be those of the eager step, on SmolLM2 and on Gemma 3 (two KV groups, a sliding
//! window); prefill chunks must not take the path.

mod common;

use common::*;
use pagoda_models::ModelRunner;

/// Prefills three prompts of different lengths together, then decodes them greedily for
/// `steps` steps (dropping one sequence half-way, so the padded size changes); returns every
/// step's logits rows.
fn run(runner: &mut ModelRunner, steps: usize) -> Vec<Vec<Vec<f32>>> {
    let prompts: [Vec<u32>; 3] =
        [(1..40).collect(), vec![7, 300, 12, 99, 4], (500..521).map(|t| t * 3).collect()];
    let per_seq = (runner.cache().num_blocks() / runner.cache().layout().num_groups() / 3) as u32;
    let groups = runner.cache().layout().num_groups();
    let stride = (runner.cache().num_blocks() / groups) as u32;
    let mut seqs: Vec<TestSeq> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| TestSeq::grouped(i as u64, p.clone(), i as u32 * per_seq, groups, stride))
        .collect();
    let mut all = Vec::new();
    for step in 0..=steps {
        if step == steps / 2 {
            seqs.pop();
        }
        let chunks: Vec<_> = seqs.iter().map(|s| s.chunk(s.tokens.len() - s.computed)).collect();
        let rows = runner.logits(&batch(chunks)).unwrap().to_vec2::<f32>().unwrap();
        for (seq, row) in seqs.iter_mut().zip(&rows) {
            seq.computed = seq.tokens.len();
            seq.tokens.push(argmax(row));
        }
        all.push(rows);
    }
    all
}

fn assert_same_logits(eager: &[Vec<Vec<f32>>], replayed: &[Vec<Vec<f32>>]) {
    assert_eq!(eager.len(), replayed.len());
    for (step, (a, b)) in eager.iter().zip(replayed).enumerate() {
        assert_eq!(a.len(), b.len(), "step {step}");
        for (ra, rb) in a.iter().zip(b) {
            let worst = ra.iter().zip(rb).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
            assert!(worst <= 1e-4, "step {step}: logits differ by {worst}");
            assert_eq!(argmax(ra), argmax(rb), "step {step}");
        }
    }
}

#[test]
fn replayed_decode_steps_give_the_eager_logits() {
    let eager = run(&mut runner(true, 48), 8);
    let mut replaying = runner(true, 48);
    replaying.enable_decode_graphs(8, 2048, false);
    let replayed = run(&mut replaying, 8);
    assert_same_logits(&eager, &replayed);
    // Three decodes pad to 4, two to 2; the prefill step took no size.
    assert_eq!(replaying.decode_graph_sizes(), vec![2, 4]);
}

#[test]
fn replayed_decode_steps_keep_gemma3_two_kv_groups() {
    let eager = run(&mut runner_for(&gemma3_path(), 96), 6);
    let mut replaying = runner_for(&gemma3_path(), 96);
    replaying.enable_decode_graphs(4, 2048, false);
    let replayed = run(&mut replaying, 6);
    assert_same_logits(&eager, &replayed);
    assert_eq!(replaying.decode_graph_sizes(), vec![2, 4]);
}

#[test]
fn batches_past_the_limit_run_eagerly() {
    let mut replaying = runner(true, 48);
    replaying.enable_decode_graphs(2, 2048, false);
    let eager = run(&mut runner(true, 48), 4);
    let replayed = run(&mut replaying, 4);
    assert_same_logits(&eager, &replayed);
    // Three decodes exceed the limit of 2; two fit.
    assert_eq!(replaying.decode_graph_sizes(), vec![2]);
}

#[test]
fn a_failed_capture_leaves_the_size_eager() {
    // No CUDA device here: every capture fails, and each step runs eagerly instead.
    let mut capturing = runner(true, 48);
    capturing.enable_decode_graphs(8, 2048, true);
    let eager = run(&mut runner(true, 48), 4);
    assert_same_logits(&eager, &run(&mut capturing, 4));
    assert!(capturing.decode_graph_sizes().is_empty());
}

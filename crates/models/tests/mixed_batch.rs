//! One mixed step (two prefill chunks and three decodes at different positions) gives every
//! sequence the logits it gets when run alone.

mod common;

use common::*;

fn prompt(seed: u32, len: usize) -> Vec<u32> {
    // Deterministic, varied, in-vocabulary ids.
    (0..len as u32).map(|i| 100 + (i * 7919 + seed * 104_729) % 40_000).collect()
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

#[test]
fn mixed_batch_equals_each_sequence_alone() {
    let mut runner = runner(true, 128);
    // Sequence setups: (prompt length, tokens computed before the mixed step, tokens in the step).
    // Two prefill chunks (one fresh, one continuing a cached prefix) and three decodes.
    let setups = [(40usize, 0usize, 23usize), (70, 33, 37), (19, 18, 1), (50, 49, 1), (33, 32, 1)];
    let seqs: Vec<TestSeq> = setups
        .iter()
        .enumerate()
        .map(|(i, &(len, _, _))| TestSeq::new(i as u64, prompt(i as u32, len), (i * 20) as u32))
        .collect();

    // Alone: each sequence computes its cached part, then its step part, in a batch of its own.
    let mut alone = Vec::new();
    for (seq, &(_, cached, step)) in seqs.iter().zip(&setups) {
        let mut s = TestSeq::new(seq.id, seq.tokens.clone(), seq.first_block);
        if cached > 0 {
            runner.logits(&batch(vec![s.chunk(cached)])).unwrap();
            s.computed = cached;
        }
        let logits = runner.logits(&batch(vec![s.chunk(step)])).unwrap();
        alone.push(logits.to_vec2::<f32>().unwrap().remove(0));
    }

    // Together: fill the cached parts again (blocks are per sequence, so this rewrites the
    // same slots), then one mixed step.
    let mut mixed_seqs = Vec::new();
    for (mut s, &(_, cached, _)) in seqs.into_iter().zip(&setups) {
        if cached > 0 {
            runner.logits(&batch(vec![s.chunk(cached)])).unwrap();
            s.computed = cached;
        }
        mixed_seqs.push(s);
    }
    let step = batch(mixed_seqs.iter().zip(&setups).map(|(s, &(_, _, n))| s.chunk(n)).collect());
    assert_eq!(step.seqs.iter().filter(|s| s.q_len() > 1).count(), 2);
    assert_eq!(step.seqs.iter().filter(|s| s.q_len() == 1).count(), 3);
    let together = runner.logits(&step).unwrap().to_vec2::<f32>().unwrap();
    for (i, (a, b)) in alone.iter().zip(&together).enumerate() {
        let diff = max_abs_diff(a, b);
        assert!(diff < 1e-3, "sequence {i}: mixed-batch logits differ from alone by {diff}");
        assert_eq!(argmax(a), argmax(b));
    }
}

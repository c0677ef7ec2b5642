//! The simulator tests of replay plans (`plan::plan_replay`): the attention kernels, taking
//! each decode's key range from its context length when they run, against the CPU op.

use candle_core::DType;
use rand::rngs::StdRng;
use rand::SeedableRng;

use super::sim_attention_tests::{attention_case_planned, Case};
use super::sim_tests::tolerance;

#[test]
fn replay_plans_match_cpu_at_every_context_length() {
    let mut rng = StdRng::seed_from_u64(11);
    for (dtype, q_heads, kv_heads, head_dim) in
        [(DType::F32, 8, 2, 64), (DType::BF16, 8, 2, 128), (DType::F16, 16, 2, 64), (DType::BF16, 6, 6, 96)]
    {
        // One long decode beside short ones, a one-token context (a padding row of a graph's
        // batch), and contexts on and off the split granule; few SMs so that the plan splits.
        let c = Case {
            dtype,
            q_heads,
            kv_heads,
            head_dim,
            block_size: 16,
            seqs: vec![(1, 1), (1, 37), (1, 128), (1, 129), (1, 700)],
            num_sms: 32,
            batch_invariant: false,
            window: None,
            softcap: None,
            fp8_cache: None,
        };
        let (err, counts) = attention_case_planned(&c, &mut rng, Some(1024));
        assert!(err <= tolerance(dtype), "{dtype:?} {q_heads}/{kv_heads} d{head_dim}: {err}");
        assert_eq!(counts[1], 0, "replay plans use no tensor-core items");
        assert!(counts[2] > 0, "the plan should split: {counts:?}");
        // Unsplit too (many SMs' worth of work already).
        let (err, counts) = attention_case_planned(&Case { num_sms: 1, ..c }, &mut rng, Some(128));
        assert!(err <= tolerance(dtype), "{dtype:?} unsplit: {err}");
        assert_eq!(counts[2], 0);
    }
}

//! The simulator tests of sliding windows, soft-capped scores and head dim 256 (Gemma's
//! attention), and of the tiny test checkpoints' head dims 16 and 32, on the CUDA kernels,
//! against the CPU op. The blocks before each sequence's window are NaN, so a kernel that reads
//! one shows it.

use candle_core::DType;
use rand::rngs::StdRng;
use rand::SeedableRng;

use super::sim_attention_tests::{attention_case, attention_case_planned, Case};
use super::sim_tests::tolerance;

fn case(dtype: DType, head_dim: usize, seqs: Vec<(usize, usize)>, window: usize, softcap: f32) -> Case {
    Case {
        dtype,
        q_heads: 8,
        kv_heads: 2,
        head_dim,
        block_size: 16,
        seqs,
        num_sms: 1,
        batch_invariant: false,
        window: Some(window),
        softcap: Some(softcap),
        fp8_cache: None,
    }
}

#[test]
fn windowed_soft_capped_attention_matches_cpu_on_cuda_cores() {
    let mut rng = StdRng::seed_from_u64(21);
    // Decodes past and inside the window, a chunk on a cached prefix that crosses the window's
    // start, a fresh prefill longer than the window; caps small enough to change the scores.
    let seqs = vec![(1, 100), (11, 60), (40, 40), (1, 5)];
    for (window, cap) in [(24, 0.5), (17, 2.0), (1, 0.5)] {
        let (err, counts) = attention_case(&case(DType::F32, 64, seqs.clone(), window, cap), &mut rng);
        assert!(err <= tolerance(DType::F32), "window {window} cap {cap}: {err}");
        assert_eq!(counts[1], 0);
    }
    // Half-precision decodes.
    for dtype in [DType::F16, DType::BF16] {
        let c = case(dtype, 128, vec![(1, 300), (1, 40), (2, 90)], 64, 1.0);
        let (err, counts) = attention_case(&c, &mut rng);
        assert!(err <= tolerance(dtype), "{dtype:?}: {err}");
        assert_eq!(counts[1], 0);
    }
}

#[test]
fn windowed_soft_capped_attention_matches_cpu_on_tensor_cores() {
    let mut rng = StdRng::seed_from_u64(22);
    for (i, dtype) in [DType::BF16, DType::F16].into_iter().enumerate() {
        // Windows shorter than a key tile, across two tiles, and longer than the context; a
        // fresh prefill, a chunk on a cached prefix, a decode.
        for window in [20, 100, 4096] {
            let c =
                case(dtype, if i == 0 { 128 } else { 64 }, vec![(150, 150), (70, 200), (1, 33)], window, 0.8);
            let (err, counts) = attention_case(&c, &mut rng);
            assert!(err <= tolerance(dtype), "{dtype:?} window {window}: {err}");
            assert!(counts[1] > 0, "tensor-core items");
        }
    }
}

#[test]
fn windowed_split_decodes_skip_the_pieces_before_the_window() {
    let mut rng = StdRng::seed_from_u64(23);
    for dtype in [DType::F32, DType::BF16] {
        // A 2000-key decode split over many SMs with a 300-key window: most pieces see nothing.
        let c = Case { num_sms: 132, ..case(dtype, 64, vec![(1, 2000), (1, 9)], 300, 1.5) };
        let (err, counts) = attention_case(&c, &mut rng);
        assert!(err <= tolerance(dtype), "{dtype:?}: {err}");
        assert!(counts[2] >= 1, "split");
        // Replayed (the range comes from the context length at run time) too.
        let c = Case { seqs: vec![(1, 1), (1, 700), (1, 1500)], ..c };
        let (err, counts) = attention_case_planned(&c, &mut rng, Some(2048));
        assert!(err <= tolerance(dtype), "{dtype:?} replayed: {err}");
        assert!(counts[2] >= 1, "split");
    }
}

#[test]
fn head_dim_256_runs_on_cuda_cores_in_half_precision() {
    let mut rng = StdRng::seed_from_u64(24);
    for dtype in [DType::F16, DType::BF16] {
        // Gemma 3 270M's shape: 4 q heads on one kv head, head dim 256, local and global layers.
        for window in [Some(512), Some(32), None] {
            let c = Case {
                q_heads: 4,
                kv_heads: 1,
                window,
                softcap: None,
                fp8_cache: None,
                ..case(dtype, 256, vec![(1, 100), (20, 90), (64, 64), (1, 700)], 0, 0.0)
            };
            let (err, counts) = attention_case(&c, &mut rng);
            assert!(err <= tolerance(dtype), "{dtype:?} {window:?}: {err}");
            assert_eq!(counts[1], 0, "no tensor-core kernel at 256");
        }
    }
}

#[test]
fn the_tiny_checkpoints_head_dims_run_on_both_kernels() {
    let mut rng = StdRng::seed_from_u64(25);
    for head_dim in [16, 32] {
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            // Decodes, a fresh prefill past one key tile and a chunk on a cached prefix; the
            // Gemma 2 checkpoint's window and cap on every other run.
            let windowed = dtype != DType::F16;
            let c = Case {
                window: windowed.then_some(48),
                softcap: windowed.then_some(50.0),
                fp8_cache: None,
                ..case(dtype, head_dim, vec![(1, 100), (70, 70), (20, 90)], 0, 0.0)
            };
            let (err, counts) = attention_case(&c, &mut rng);
            assert!(err <= tolerance(dtype), "{dtype:?} d{head_dim}: {err}");
            assert_eq!(counts[1] > 0, dtype != DType::F32, "{dtype:?} d{head_dim}: {counts:?}");
        }
    }
}

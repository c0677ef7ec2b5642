//! The simulator tests of paged attention: one case's plan and kernels (CUDA-core, tensor-core
//! and combine) against the CPU op, over shapes, dtypes, block sizes, GQA ratios, split keys and
//! batch-invariant plans, over float and FP8 caches. [`attention_case_planned`] is the harness
//! the replay and window tests use too.

use candle_core::{DType, Device, Tensor};
use float8::F8E4M3;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;

use super::launch::{self, AttentionArgs, AttentionKernel};
use super::plan::{plan_attention, plan_replay, PlanParams, WorkItem, SIMT_MAX_ROWS, SIMT_SMALL_ROWS};
use super::sim_tests::{f32_values, random, rel_err, run, tolerance, HostBuf, DTYPES};
use crate::AttentionMetadata;

/// One attention configuration: `seqs` are (new tokens, context length after the step).
pub(super) struct Case {
    pub dtype: DType,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub block_size: usize,
    pub seqs: Vec<(usize, usize)>,
    pub num_sms: usize,
    /// Plan every token as a decode of its own ([`PlanParams::batch_invariant`]).
    pub batch_invariant: bool,
    /// A sliding window of keys: the blocks before each sequence's window are given back, as a
    /// windowed layer's cache does (their table entries point at a block of NaNs).
    pub window: Option<usize>,
    /// Soft-capped scores.
    pub softcap: Option<f32>,
    /// The caches hold FP8 codes (Pagoda's encoder, on the CPU) with these scales; `dtype` is
    /// the queries' and output's.
    pub fp8_cache: Option<crate::KvScales>,
}

/// Runs `c` through the plan and the simulated kernels and through the CPU op; returns the
/// relative error and the plan's (simt, mma, split groups) counts.
pub(super) fn attention_case(c: &Case, rng: &mut StdRng) -> (f32, [usize; 3]) {
    attention_case_planned(c, rng, None)
}

/// [`attention_case`], planned for replay ([`plan_replay`]) with room for `replay_max_context`
/// keys when that is given (every sequence must then be a one-token decode).
pub(super) fn attention_case_planned(
    c: &Case,
    rng: &mut StdRng,
    replay_max_context: Option<usize>,
) -> (f32, [usize; 3]) {
    let blocks_per_seq: Vec<usize> = c.seqs.iter().map(|&(_, ctx)| ctx.div_ceil(c.block_size)).collect();
    let num_blocks = blocks_per_seq.iter().sum::<usize>() + 3;
    let mut ids: Vec<u32> = (0..num_blocks as u32).collect();
    ids.shuffle(rng);
    let mut tables = Vec::new();
    let mut taken = 0;
    for &n in &blocks_per_seq {
        tables.push(ids[taken..taken + n].to_vec());
        taken += n;
    }
    let (mut cu, mut ctxs, mut slots) = (vec![0u32], Vec::new(), Vec::new());
    for (i, &(q_len, ctx)) in c.seqs.iter().enumerate() {
        for pos in ctx - q_len..ctx {
            slots.push(tables[i][pos / c.block_size] * c.block_size as u32 + (pos % c.block_size) as u32);
        }
        cu.push(cu.last().unwrap() + q_len as u32);
        ctxs.push(ctx as u32);
    }
    let num_tokens = *cu.last().unwrap() as usize;
    // The block past the others is all NaN: what a window gave back points there.
    let poison = num_blocks;
    if let Some(w) = c.window {
        for (table, &(q_len, ctx)) in tables.iter_mut().zip(&c.seqs) {
            let first_visible = (ctx - q_len + 1).saturating_sub(w);
            for entry in &mut table[..first_visible / c.block_size] {
                *entry = poison as u32;
            }
        }
    }
    let meta = AttentionMetadata::new(slots, cu.clone(), ctxs.clone(), &tables, &Device::Cpu).unwrap();
    let (d, extra_heads) = (c.head_dim, 1);
    let cache_shape = [num_blocks + 1, c.block_size, c.kv_heads, d];
    let block_len = c.block_size * c.kv_heads * d;
    // An FP8 cache's poison is its largest code: no NaN code is ever written, and 448 times
    // the scale wrecks any output that reads it.
    let poisoned = |t: Tensor, scale: f32| match c.fp8_cache {
        None => {
            let mut values = f32_values(&t);
            values[poison * block_len..].fill(f32::NAN);
            Tensor::from_vec(values, &cache_shape, &Device::Cpu).unwrap().to_dtype(c.dtype).unwrap()
        }
        Some(_) => {
            let mut codes: Vec<F8E4M3> = f32_values(&t)
                .iter()
                .map(|&v| F8E4M3::from_bits(crate::fp8_e4m3::encode(v / scale)))
                .collect();
            codes[poison * block_len..].fill(F8E4M3::from_bits(0x7E));
            Tensor::from_vec(codes, &cache_shape, &Device::Cpu).unwrap()
        }
    };
    let scales = c.fp8_cache.unwrap_or(crate::KvScales::UNIT);
    let k_cache = poisoned(random(rng, &cache_shape, c.dtype), scales.k);
    let v_cache = poisoned(random(rng, &cache_shape, c.dtype), scales.v);
    let q_full = random(rng, &[num_tokens, c.q_heads + extra_heads, d], c.dtype);
    let q = q_full.narrow(1, 0, c.q_heads).unwrap();
    let scale = 1.0 / (d as f32).sqrt();
    let attention = crate::AttentionParams {
        window: c.window,
        logit_softcap: c.softcap,
        kv_scales: scales,
        ..crate::AttentionParams::scaled(scale)
    };
    let want = f32_values(&crate::paged_attention_with(&q, &k_cache, &v_cache, &meta, attention).unwrap());

    let params = PlanParams {
        num_q_heads: c.q_heads,
        num_kv_heads: c.kv_heads,
        tensor_cores: c.dtype != DType::F32 && launch::CUDA_MMA_HEAD_DIMS.contains(&c.head_dim),
        num_sms: c.num_sms,
        batch_invariant: c.batch_invariant,
    };
    let plan = match replay_max_context {
        Some(max_context) => plan_replay(ctxs.len(), max_context, &params),
        None => plan_attention(&cu, &ctxs, &params),
    };
    let mut context_lens = HostBuf::words(ctxs.clone());
    let words = |items: &[WorkItem]| HostBuf::words(items.iter().flat_map(|i| i.words()).collect());
    let (mut qb, mut kb, mut vb) = (HostBuf::of(&q_full), HostBuf::of(&k_cache), HostBuf::of(&v_cache));
    let mut bt = HostBuf::words(meta.host().block_tables.clone());
    bt.addr(0);
    let mut out = HostBuf::poisoned(c.dtype, num_tokens * c.q_heads * d);
    let mut part_o = HostBuf::poisoned(DType::F32, plan.partial_rows * d + 1);
    let mut part_lse = HostBuf::poisoned(DType::F32, plan.partial_rows + 1);
    let args = AttentionArgs {
        dtype: c.dtype,
        fp8_cache: c.fp8_cache.is_some(),
        head_dim: d,
        q: qb.addr(0),
        q_row_stride: (c.q_heads + extra_heads) * d,
        k_cache: kb.addr(0),
        v_cache: vb.addr(0),
        block_tables: if meta.host().block_tables.is_empty() { 0 } else { bt.addr(0) },
        max_blocks_per_seq: meta.host().max_blocks_per_seq,
        block_size: c.block_size,
        num_kv_heads: c.kv_heads,
        group: c.q_heads / c.kv_heads,
        softmax_scale: scale * scales.k,
        window: c.window.unwrap_or(0),
        logit_softcap: c.softcap.unwrap_or(0.0),
        v_scale: scales.v,
        out: out.addr(0),
        part_o: part_o.addr(0),
        part_lse: part_lse.addr(0),
        context_lens: context_lens.addr(0),
    };
    for (items, kernel) in [
        (&plan.simt_small, AttentionKernel::Simt { rows: SIMT_SMALL_ROWS }),
        (&plan.simt, AttentionKernel::Simt { rows: SIMT_MAX_ROWS }),
        (&plan.mma, AttentionKernel::Mma),
    ] {
        let mut list = words(items);
        run(launch::attention(&args, kernel, list.addr(0), items.len()).unwrap());
    }
    let mut groups = words(&plan.combine);
    run(launch::attention_combine(&args, groups.addr(0), plan.combine.len()).unwrap());
    let counts = [plan.simt_small.len() + plan.simt.len(), plan.mma.len(), plan.combine.len()];
    (rel_err(&out.to_f32(), &want), counts)
}

#[test]
fn attention_cuda_core_path_matches_cpu() {
    let mut rng = StdRng::seed_from_u64(5);
    // f32 runs everything on CUDA cores: decodes, prefill chunks with and without a cached
    // prefix, an empty sequence, contexts that are not multiples of the block size.
    for (q_heads, kv_heads, head_dim, block_size) in
        [(8, 2, 64, 16), (9, 3, 64, 7), (4, 4, 128, 32), (16, 1, 80, 16), (6, 2, 96, 8)]
    {
        let c = Case {
            dtype: DType::F32,
            q_heads,
            kv_heads,
            head_dim,
            block_size,
            seqs: vec![(1, 37), (5, 5), (0, 3), (1, 1), (11, 40)],
            num_sms: 1,
            batch_invariant: false,
            window: None,
            softcap: None,
            fp8_cache: None,
        };
        let (err, counts) = attention_case(&c, &mut rng);
        assert!(err <= tolerance(DType::F32), "f32 {q_heads}/{kv_heads} d{head_dim} bs{block_size}: {err}");
        assert_eq!(counts[1], 0);
    }
    // Half precision decodes (4-row items) and two-token chunks (8-row items) stay on CUDA
    // cores.
    for dtype in [DType::F16, DType::BF16] {
        let c = Case {
            dtype,
            q_heads: 8,
            kv_heads: 2,
            head_dim: 128,
            block_size: 16,
            seqs: vec![(1, 100), (1, 17), (2, 50)],
            num_sms: 1,
            batch_invariant: false,
            window: None,
            softcap: None,
            fp8_cache: None,
        };
        let (err, counts) = attention_case(&c, &mut rng);
        assert!(err <= tolerance(dtype), "{dtype:?} decode: {err}");
        assert_eq!(counts, [3, 0, 0]);
    }
}

#[test]
fn attention_split_kv_matches_cpu() {
    let mut rng = StdRng::seed_from_u64(6);
    for dtype in DTYPES {
        // One long decode and a short one on a "GPU" of 132 SMs: the long one is split.
        let c = Case {
            dtype,
            q_heads: 4,
            kv_heads: 1,
            head_dim: 64,
            block_size: 16,
            seqs: vec![(1, 1000), (1, 9)],
            num_sms: 132,
            batch_invariant: false,
            window: None,
            softcap: None,
            fp8_cache: None,
        };
        let (err, counts) = attention_case(&c, &mut rng);
        assert!(err <= tolerance(dtype), "{dtype:?} split decode: {err}");
        assert_eq!(counts[2], 1, "one split group");
        // Alone, a 2500-key decode is cut into more splits than the combine kernel reads at
        // once, and not a multiple of that: both of its loops run.
        let splits = super::plan::num_splits(2500, 1, 132);
        assert!(splits > 8 && !splits.is_multiple_of(8), "{splits} splits");
        let c = Case { seqs: vec![(1, 2500)], ..c };
        let (err, counts) = attention_case(&c, &mut rng);
        assert!(err <= tolerance(dtype), "{dtype:?} {splits}-way split decode: {err}");
        assert_eq!(counts[2], 1, "one split group");
    }
    // A split f32 prefill chunk: rows of early tokens see no keys in late splits.
    let c = Case {
        dtype: DType::F32,
        q_heads: 2,
        kv_heads: 2,
        head_dim: 64,
        block_size: 16,
        seqs: vec![(3, 700)],
        num_sms: 132,
        batch_invariant: false,
        window: None,
        softcap: None,
        fp8_cache: None,
    };
    let (err, counts) = attention_case(&c, &mut rng);
    assert!(err <= tolerance(DType::F32), "split prefill: {err}");
    assert!(counts[2] >= 1);
}

#[test]
fn attention_tensor_core_path_matches_cpu() {
    let mut rng = StdRng::seed_from_u64(7);
    let shapes = [(8, 2, 128, 16), (9, 3, 64, 16), (4, 4, 80, 8), (8, 1, 96, 32), (2, 2, 64, 5)];
    for (i, (q_heads, kv_heads, head_dim, block_size)) in shapes.into_iter().enumerate() {
        let dtype = if i % 2 == 0 { DType::BF16 } else { DType::F16 };
        // A fresh prefill longer than one key tile, a chunk on a cached prefix, and a decode
        // in the same batch.
        let c = Case {
            dtype,
            q_heads,
            kv_heads,
            head_dim,
            block_size,
            seqs: vec![(70, 70), (20, 90), (1, 33)],
            num_sms: 1,
            batch_invariant: false,
            window: None,
            softcap: None,
            fp8_cache: None,
        };
        let (err, counts) = attention_case(&c, &mut rng);
        assert!(err <= tolerance(dtype), "{dtype:?} {q_heads}/{kv_heads} d{head_dim} bs{block_size}: {err}");
        assert!(counts[1] > 0, "tensor-core items");
    }
}

/// Batch-invariant plans on the simulated kernels: a verification-shaped chunk (9 tokens), a
/// prefill chunk, long split decodes (one at the cap of 16 pieces) and a short one, every token
/// on its own CUDA-core items, against the CPU op.
#[test]
fn attention_batch_invariant_plans_match_cpu() {
    let mut rng = StdRng::seed_from_u64(8);
    for dtype in DTYPES {
        for (q_heads, kv_heads) in [(9, 3), (8, 1)] {
            let c = Case {
                dtype,
                q_heads,
                kv_heads,
                head_dim: 64,
                block_size: 16,
                seqs: vec![(9, 300), (20, 20), (1, 700), (1, 2200), (1, 5)],
                num_sms: 132,
                batch_invariant: true,
                window: None,
                softcap: None,
                fp8_cache: None,
            };
            let (err, counts) = attention_case(&c, &mut rng);
            assert!(err <= tolerance(dtype), "{dtype:?} {q_heads}/{kv_heads}: {err}");
            assert_eq!(counts[1], 0, "no tensor-core items");
            assert!(counts[2] >= 9, "the 700-key decode and the 300-key chunk's tokens are split");
        }
    }
}

#[test]
fn attention_over_an_fp8_cache_matches_cpu() {
    let mut rng = StdRng::seed_from_u64(12);
    // Scales that are not powers of two, K and V apart: a scale applied twice or not at all
    // shows.
    let scales = crate::KvScales { k: 0.011, v: 0.0037 };
    for (dtype, head_dim) in
        [(DType::F16, 128), (DType::BF16, 64), (DType::F32, 80), (DType::BF16, 256), (DType::F16, 32)]
    {
        for (window, softcap) in [(None, None), (Some(24), Some(30.0))] {
            let c = Case {
                dtype,
                q_heads: 8,
                kv_heads: 2,
                head_dim,
                block_size: 16,
                // Decodes (one long enough to split on 132 SMs), a prefill chunk over a cached
                // prefix, a fresh prompt.
                seqs: vec![(1, 700), (1, 9), (40, 90), (17, 17)],
                num_sms: 132,
                batch_invariant: false,
                window,
                softcap,
                fp8_cache: Some(scales),
            };
            let (err, counts) = attention_case(&c, &mut rng);
            let what = format!("{dtype:?} d{head_dim} window {window:?}: counts {counts:?}");
            assert!(err <= tolerance(dtype), "{what}: {err}");
            let tensor_cores = dtype != DType::F32 && head_dim <= 128;
            assert_eq!(counts[1] > 0, tensor_cores, "{what}");
            assert!(counts[2] > 0, "{what}: the long decode is split");
        }
    }
}

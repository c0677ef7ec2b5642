//! paged_attention against a dense causal attention written with plain candle ops, over mixed
//! batches, block sizes, GQA ratios, head dims and storage dtypes; plus its argument errors.

mod common;

use candle_core::{DType, Device, Result, Tensor, D};
use common::{assert_close, err_text, random_tensor, rng, uniform};
use pagoda_ops::{
    paged_attention, paged_attention_with, reshape_and_cache, AttentionMetadata, AttentionParams,
    HostAttentionMetadata, NULL_BLOCK,
};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;

/// Value in cache slots no query may read: large enough to wreck any output that reads it.
const POISON: f32 = 100.0;

#[derive(Clone, Copy)]
struct Seq {
    context: usize,
    q_len: usize,
}

struct Shape {
    block_size: usize,
    kv_heads: usize,
    group: usize,
    head_dim: usize,
}

struct Batch {
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    meta: AttentionMetadata,
    /// Per sequence, `[context, kv_heads, head_dim]` f32, as stored (rounded to the cache dtype).
    dense_k: Vec<Tensor>,
    dense_v: Vec<Tensor>,
}

fn round_to(t: Tensor, dtype: DType) -> Result<Tensor> {
    t.to_dtype(dtype)?.to_dtype(DType::F32)
}

/// Builds caches holding each sequence's cached prefix (written directly, at shuffled blocks)
/// and its new tokens (written by `reshape_and_cache`), with every other slot poisoned; block
/// table padding is `u32::MAX` so reading it would fail.
fn build(rng: &mut StdRng, seqs: &[Seq], s: &Shape, cache_dtype: DType, q_dtype: DType) -> Result<Batch> {
    let (bs, kvh, hd) = (s.block_size, s.kv_heads, s.head_dim);
    let row = kvh * hd;
    let needed: Vec<usize> = seqs.iter().map(|q| q.context.div_ceil(bs)).collect();
    let num_blocks = needed.iter().sum::<usize>() + 3;
    let mut ids: Vec<u32> = (0..num_blocks as u32).collect();
    ids.shuffle(rng);
    let max_blocks = needed.iter().max().copied().unwrap_or(0) + 1;

    let mut k_host = vec![POISON; num_blocks * bs * row];
    let mut v_host = vec![POISON; num_blocks * bs * row];
    let (mut new_k, mut new_v, mut slots) = (Vec::new(), Vec::new(), Vec::new());
    let (mut dense_k, mut dense_v) = (Vec::new(), Vec::new());
    let mut tables = vec![u32::MAX; seqs.len() * max_blocks];
    let (mut cu, mut ctx) = (vec![0u32], Vec::new());
    let mut next = 0;
    for (i, sq) in seqs.iter().enumerate() {
        let blocks = &ids[next..next + needed[i]];
        next += needed[i];
        tables[i * max_blocks..i * max_blocks + blocks.len()].copy_from_slice(blocks);
        let k = round_to(random_tensor(rng, &[sq.context, kvh, hd], DType::F32)?, cache_dtype)?;
        let v = round_to(random_tensor(rng, &[sq.context, kvh, hd], DType::F32)?, cache_dtype)?;
        let (kv, vv) = (common::values(&k), common::values(&v));
        for p in 0..sq.context {
            let slot = blocks[p / bs] as usize * bs + p % bs;
            let (src, dst) = (p * row..(p + 1) * row, slot * row..(slot + 1) * row);
            if p < sq.context - sq.q_len {
                k_host[dst.clone()].copy_from_slice(&kv[src.clone()]);
                v_host[dst].copy_from_slice(&vv[src]);
            } else {
                new_k.extend_from_slice(&kv[src.clone()]);
                new_v.extend_from_slice(&vv[src]);
                slots.push(slot as u32);
            }
        }
        dense_k.push(k);
        dense_v.push(v);
        cu.push(cu[i] + sq.q_len as u32);
        ctx.push(sq.context as u32);
    }
    let cpu = &Device::Cpu;
    let shape = (num_blocks, bs, kvh, hd);
    let k_cache = Tensor::from_vec(k_host, shape, cpu)?.to_dtype(cache_dtype)?;
    let v_cache = Tensor::from_vec(v_host, shape, cpu)?.to_dtype(cache_dtype)?;
    let num_tokens = slots.len();
    let new_k = Tensor::from_vec(new_k, (num_tokens, kvh, hd), cpu)?.to_dtype(cache_dtype)?;
    let new_v = Tensor::from_vec(new_v, (num_tokens, kvh, hd), cpu)?.to_dtype(cache_dtype)?;
    let host = HostAttentionMetadata {
        slot_mapping: slots,
        cu_seqlens_q: cu,
        context_lens: ctx,
        block_tables: tables,
        max_blocks_per_seq: max_blocks,
    };
    let meta = AttentionMetadata::from_host(host, cpu)?;
    reshape_and_cache(&new_k, &new_v, &k_cache, &v_cache, &meta.slot_mapping)?;
    // Scaled up so the softmax is peaky rather than nearly uniform.
    let q = (random_tensor(rng, &[num_tokens, kvh * s.group, hd], DType::F32)? * 4.0)?;
    let q = q.to_dtype(q_dtype)?;
    Ok(Batch { q, k_cache, v_cache, meta, dense_k, dense_v })
}

/// `[ctx, kv_heads, hd]` -> `[q_heads, ctx, hd]`, q head h reading kv head h / group.
fn expand_heads(kv: &Tensor, group: usize) -> Result<Tensor> {
    let (ctx, kvh, hd) = kv.dims3()?;
    kv.unsqueeze(2)?
        .expand((ctx, kvh, group, hd))?
        .reshape((ctx, kvh * group, hd))?
        .transpose(0, 1)?
        .contiguous()
}

/// softmax(Q K^T * scale + causal mask) V per sequence, on dense f32 tensors; with a window,
/// key `j` is visible to position `p` only when `p - j < window`.
fn reference(b: &Batch, seqs: &[Seq], group: usize, params: AttentionParams) -> Result<Tensor> {
    let (scale, window) = (params.softmax_scale, params.window);
    let q = b.q.to_dtype(DType::F32)?;
    let (_, q_heads, hd) = q.dims3()?;
    let mut outs = Vec::new();
    let mut start = 0;
    for (i, s) in seqs.iter().enumerate() {
        if s.q_len == 0 {
            continue;
        }
        let qs = q.narrow(0, start, s.q_len)?.transpose(0, 1)?.contiguous()?;
        start += s.q_len;
        let k = expand_heads(&b.dense_k[i], group)?;
        let v = expand_heads(&b.dense_v[i], group)?;
        let mut scores = (qs.matmul(&k.t()?)? * scale as f64)?;
        if let Some(cap) = params.logit_softcap {
            scores = ((scores / cap as f64)?.tanh()? * cap as f64)?;
        }
        let first = s.context - s.q_len;
        let mask: Vec<f32> = (0..s.q_len)
            .flat_map(|t| {
                (0..s.context).map(move |j| {
                    let outside = window.is_some_and(|w| first + t >= j + w);
                    if j > first + t || outside {
                        f32::NEG_INFINITY
                    } else {
                        0.0
                    }
                })
            })
            .collect();
        let mask = Tensor::from_vec(mask, (s.q_len, s.context), &Device::Cpu)?;
        let p = candle_nn::ops::softmax_last_dim(&scores.broadcast_add(&mask)?)?;
        outs.push(p.matmul(&v)?.transpose(0, 1)?);
    }
    if outs.is_empty() {
        return Tensor::zeros((0, q_heads, hd), DType::F32, &Device::Cpu);
    }
    Tensor::cat(&outs, 0)
}

/// Decodes with long contexts, prefill chunks after a cached prefix, a fresh prefill, and a
/// first-token decode; contexts mostly not multiples of any block size.
const MIXED: [Seq; 6] = [
    Seq { context: 517, q_len: 1 },
    Seq { context: 200, q_len: 70 },
    Seq { context: 37, q_len: 37 },
    Seq { context: 300, q_len: 1 },
    Seq { context: 45, q_len: 13 },
    Seq { context: 1, q_len: 1 },
];

fn check(seqs: &[Seq], s: &Shape, cache: DType, q: DType, seed: u64, atol: f32, rtol: f32) {
    check_with(seqs, s, cache, q, seed, atol, rtol, None, None);
}

#[allow(clippy::too_many_arguments)]
fn check_with(
    seqs: &[Seq],
    s: &Shape,
    cache: DType,
    q: DType,
    seed: u64,
    atol: f32,
    rtol: f32,
    window: Option<usize>,
    logit_softcap: Option<f32>,
) {
    let mut rng = rng(seed);
    let b = build(&mut rng, seqs, s, cache, q).unwrap();
    let params = AttentionParams {
        window,
        logit_softcap,
        ..AttentionParams::scaled(1.0 / (s.head_dim as f32).sqrt())
    };
    let expected = reference(&b, seqs, s.group, params).unwrap();
    // The kernel splits work by thread count (whole sequences with few threads, kv heads apart
    // with many), so run both ways.
    for threads in [1, 24] {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        let out =
            pool.install(|| paged_attention_with(&b.q, &b.k_cache, &b.v_cache, &b.meta, params)).unwrap();
        assert_eq!(out.dtype(), q);
        let what = format!(
            "bs {} kvh {} group {} hd {} cache {cache:?} q {q:?} threads {threads} window {window:?}",
            s.block_size, s.kv_heads, s.group, s.head_dim
        );
        assert_close(&out, &expected, atol, rtol, &what);
    }
    if let Some(w) = window {
        // Blocks wholly before each sequence's first window released, as the engine does for
        // sliding-window layers: nothing changes.
        let mut host = b.meta.host().clone();
        let width = host.max_blocks_per_seq;
        for (i, sq) in seqs.iter().enumerate() {
            let first = (sq.context - sq.q_len + 1).saturating_sub(w) / s.block_size;
            host.block_tables[i * width..i * width + first].fill(NULL_BLOCK);
        }
        let released = AttentionMetadata::from_host(host, &Device::Cpu).unwrap();
        let out = paged_attention_with(&b.q, &b.k_cache, &b.v_cache, &released, params).unwrap();
        assert_close(&out, &expected, atol, rtol, &format!("window {w} with released blocks"));
    }
}

#[test]
fn matches_dense_reference_across_block_sizes_gqa_ratios_and_head_dims() {
    let mut seed = 0;
    for block_size in [1, 8, 16, 32] {
        for group in [1, 2, 4, 8] {
            for head_dim in [64, 128] {
                // group 8 with a single kv head is MQA.
                let kv_heads = if group == 8 { 1 } else { 2 };
                let shape = Shape { block_size, kv_heads, group, head_dim };
                seed += 1;
                check(&MIXED, &shape, DType::F32, DType::F32, seed, 1e-5, 1e-5);
            }
        }
    }
}

#[test]
fn sliding_window_sees_only_the_last_window_positions() {
    // Windows shorter than, equal to and longer than the contexts; 1 is a query seeing itself.
    let seqs = [
        Seq { context: 700, q_len: 300 },
        Seq { context: 517, q_len: 1 },
        Seq { context: 129, q_len: 129 },
        Seq { context: 64, q_len: 3 },
        Seq { context: 1, q_len: 1 },
    ];
    let mut seed = 300;
    for window in [1, 5, 64, 100, 129, 512, 4096] {
        for (block_size, group) in [(16, 1), (8, 4), (1, 2)] {
            let shape = Shape { block_size, kv_heads: 2, group, head_dim: 64 };
            seed += 1;
            check_with(&seqs, &shape, DType::F32, DType::F32, seed, 1e-5, 1e-5, Some(window), None);
        }
    }
    let shape = Shape { block_size: 16, kv_heads: 1, group: 4, head_dim: 256 };
    check_with(&MIXED, &shape, DType::BF16, DType::F32, 399, 2e-2, 2e-2, Some(48), None);
    let b = small();
    let params = AttentionParams { window: Some(0), ..AttentionParams::scaled(1.0) };
    let zero = paged_attention_with(&b.q, &b.k_cache, &b.v_cache, &b.meta, params);
    assert!(zero.unwrap_err().to_string().contains("at least one position"));
}

#[test]
fn soft_capped_scores_alone_and_with_a_window() {
    // Queries are scaled up (see `build`), so scores reach past the small caps and the cap
    // changes the result.
    let shape = Shape { block_size: 16, kv_heads: 2, group: 2, head_dim: 64 };
    for (i, cap) in [0.5f32, 5.0, 50.0].into_iter().enumerate() {
        check_with(&MIXED, &shape, DType::F32, DType::F32, 500 + i as u64, 1e-5, 1e-5, None, Some(cap));
        check_with(&MIXED, &shape, DType::F32, DType::F32, 510 + i as u64, 1e-5, 1e-5, Some(40), Some(cap));
    }
    let b = small();
    for bad in [0.0, -1.0, f32::NAN] {
        let params = AttentionParams { logit_softcap: Some(bad), ..AttentionParams::scaled(1.0) };
        let e = paged_attention_with(&b.q, &b.k_cache, &b.v_cache, &b.meta, params).unwrap_err();
        assert!(e.to_string().contains("soft cap"), "{e}");
    }
}

#[test]
fn long_prefill_chunk_spans_many_query_tiles_and_key_chunks() {
    let seqs = [Seq { context: 700, q_len: 300 }, Seq { context: 129, q_len: 129 }];
    for group in [1, 3] {
        let shape = Shape { block_size: 16, kv_heads: 3, group, head_dim: 64 };
        check(&seqs, &shape, DType::F32, DType::F32, 100 + group as u64, 1e-5, 1e-5);
    }
}

#[test]
fn many_decodes_with_block_aligned_and_unaligned_contexts() {
    let seqs: Vec<Seq> = (0..20).map(|i| Seq { context: 16 * (i + 1) + (i % 3), q_len: 1 }).collect();
    let shape = Shape { block_size: 16, kv_heads: 3, group: 3, head_dim: 64 };
    check(&seqs, &shape, DType::F32, DType::F32, 7, 1e-5, 1e-5);
}

#[test]
fn half_precision_caches_and_queries() {
    let shape = Shape { block_size: 16, kv_heads: 3, group: 3, head_dim: 64 };
    for dtype in [DType::BF16, DType::F16] {
        check(&MIXED, &shape, dtype, dtype, 11, 1e-3, 1e-2);
        // f32 queries over a half cache: only the output rounding differs from the reference.
        check(&MIXED, &shape, dtype, DType::F32, 12, 1e-5, 1e-5);
    }
}

#[test]
fn strided_queries_from_a_fused_projection_give_the_same_result() {
    let mut rng = rng(21);
    let shape = Shape { block_size: 8, kv_heads: 2, group: 2, head_dim: 64 };
    let b = build(&mut rng, &MIXED, &shape, DType::F32, DType::F32).unwrap();
    let (t, qh, hd) = b.q.dims3().unwrap();
    // q as the first heads of a [T, q_heads + 2 kv_heads, hd] QKV buffer.
    let qkv = Tensor::cat(&[&b.q, &Tensor::zeros((t, 4, hd), DType::F32, &Device::Cpu).unwrap()], 1).unwrap();
    let q_view = qkv.narrow(1, 0, qh).unwrap();
    assert!(!q_view.is_contiguous());
    let a = paged_attention(&b.q, &b.k_cache, &b.v_cache, &b.meta, 0.125).unwrap();
    let c = paged_attention(&q_view, &b.k_cache, &b.v_cache, &b.meta, 0.125).unwrap();
    assert_eq!(common::values(&a), common::values(&c));
}

#[test]
fn empty_batch_and_sequences_without_queries() {
    let mut rng = rng(31);
    let shape = Shape { block_size: 4, kv_heads: 1, group: 2, head_dim: 64 };
    let b = build(&mut rng, &[], &shape, DType::F32, DType::F32).unwrap();
    let out = paged_attention(&b.q, &b.k_cache, &b.v_cache, &b.meta, 1.0).unwrap();
    assert_eq!(out.dims(), &[0, 2, 64]);

    let seqs = [Seq { context: 9, q_len: 0 }, Seq { context: 10, q_len: 3 }, Seq { context: 5, q_len: 0 }];
    check(&seqs, &shape, DType::F32, DType::F32, 32, 1e-5, 1e-5);
}

/// A small valid batch to break one argument at a time.
fn small() -> Batch {
    let mut rng = rng(41);
    let shape = Shape { block_size: 4, kv_heads: 2, group: 2, head_dim: 8 };
    build(&mut rng, &[Seq { context: 10, q_len: 2 }], &shape, DType::F32, DType::F32).unwrap()
}

fn meta(context: u32, table: Vec<u32>) -> AttentionMetadata {
    AttentionMetadata::new(vec![0], vec![0, 1], vec![context], &[table], &Device::Cpu).unwrap()
}

#[test]
fn rejects_inconsistent_arguments() {
    let b = small();
    let run = |q: &Tensor, k: &Tensor, v: &Tensor, m: &AttentionMetadata| paged_attention(q, k, v, m, 0.5);
    assert!(run(&b.q, &b.k_cache, &b.v_cache, &b.meta).is_ok());
    let num_blocks = b.k_cache.dim(0).unwrap() as u32;

    // q rows != metadata tokens.
    let q1 = b.q.narrow(0, 0, 1).unwrap();
    assert!(err_text(run(&q1, &b.k_cache, &b.v_cache, &b.meta)).contains("tokens"));
    // Context 10 needs 3 blocks of 4; the table has 2.
    assert!(err_text(run(&q1, &b.k_cache, &b.v_cache, &meta(10, vec![0, 1]))).contains("block table"));
    // Block id past the cache.
    assert!(err_text(run(&q1, &b.k_cache, &b.v_cache, &meta(3, vec![num_blocks]))).contains("uses block"));
    // v_cache dtype differs from k_cache.
    let v16 = b.v_cache.to_dtype(DType::F16).unwrap();
    assert!(run(&b.q, &b.k_cache, &v16, &b.meta).is_err());
    // Non-float cache.
    let ku = b.k_cache.to_dtype(DType::U32).unwrap();
    let vu = b.v_cache.to_dtype(DType::U32).unwrap();
    assert!(run(&b.q, &ku, &vu, &b.meta).is_err());
    // 3 q heads over 2 kv heads.
    let q3 = b.q.narrow(1, 0, 3).unwrap();
    assert!(err_text(run(&q3, &b.k_cache, &b.v_cache, &b.meta)).contains("multiple"));
    // head_dim mismatch.
    let q_short = b.q.narrow(2, 0, 4).unwrap();
    assert!(err_text(run(&q_short, &b.k_cache, &b.v_cache, &b.meta)).contains("head_dim"));
    // Wrong rank.
    let q2 = b.q.flatten_from(1).unwrap();
    assert!(run(&q2, &b.k_cache, &b.v_cache, &b.meta).is_err());
    // Non-contiguous cache of the right shape.
    let (nb, bs, kvh, hd) = b.k_cache.dims4().unwrap();
    let strided =
        Tensor::zeros((nb, kvh, bs, hd), DType::F32, &Device::Cpu).unwrap().transpose(1, 2).unwrap();
    assert!(matches!(
        run(&b.q, &strided, &strided, &b.meta),
        Err(candle_core::Error::RequiresContiguous { .. })
    ));
    // NaN scale.
    assert!(paged_attention(&b.q, &b.k_cache, &b.v_cache, &b.meta, f32::NAN).is_err());
}

#[test]
fn uniform_keys_average_the_visible_values() {
    // With all-zero keys every visible position gets the same weight, so the output for the
    // query at position p is the mean of V over 0..=p: an independent closed-form check.
    let cpu = &Device::Cpu;
    let (bs, hd, ctx) = (4, 8, 7);
    let k_cache = Tensor::zeros((2, bs, 1, hd), DType::F32, cpu).unwrap();
    let mut v_rows = vec![0f32; 2 * bs * hd];
    for p in 0..ctx {
        v_rows[p * hd..(p + 1) * hd].fill(p as f32);
    }
    let v_cache = Tensor::from_vec(v_rows, (2, bs, 1, hd), cpu).unwrap();
    let m = AttentionMetadata::new(vec![5, 6], vec![0, 2], vec![ctx as u32], &[vec![0, 1]], cpu).unwrap();
    let q = Tensor::from_vec(uniform(&mut rng(5), 2 * hd), (2, 1, hd), cpu).unwrap();
    let out = paged_attention(&q, &k_cache, &v_cache, &m, 1.0).unwrap();
    let out = out.squeeze(1).unwrap().mean(D::Minus1).unwrap().to_vec1::<f32>().unwrap();
    // Positions 5 and 6: means of 0..=5 and 0..=6.
    assert!((out[0] - 2.5).abs() < 1e-6 && (out[1] - 3.0).abs() < 1e-6, "{out:?}");
}

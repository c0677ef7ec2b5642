//! CPU paged attention gives every query the same bits however the step around it is built:
//! alone as a decode, inside a prefill chunk of any length, next to other sequences, on any
//! number of threads, with or without a sliding window. `--batch-invariant` relies on this:
//! a prefix-cache hit, a chunked prefill or a preempted and recomputed sequence changes which
//! queries share a step, and must not change a single logit bit.

mod common;

use candle_core::{DType, Device, Tensor};
use common::{rng, uniform, values};
use pagoda_ops::{paged_attention_with, AttentionMetadata, AttentionParams};
use rand::seq::SliceRandom;
use rand::Rng;

const KV_HEADS: usize = 2;
const GROUP: usize = 3;
const HEAD_DIM: usize = 64;
const Q_WIDTH: usize = KV_HEADS * GROUP * HEAD_DIM;

/// A sequence's K/V, already in a cache at shuffled blocks, and a query row per position.
struct Fixture {
    k_cache: Tensor,
    v_cache: Tensor,
    /// Block table of the sequence under test (`len` positions).
    table: Vec<u32>,
    /// Block table of a neighbour sequence sharing the cache.
    other_table: Vec<u32>,
    /// `[len, q_heads * head_dim]` queries, one row per position.
    queries: Vec<f32>,
    len: usize,
}

fn fixture(len: usize, block_size: usize, cache_dtype: DType, seed: u64) -> Fixture {
    let mut rng = rng(seed);
    let blocks = len.div_ceil(block_size);
    let mut ids: Vec<u32> = (0..2 * blocks as u32).collect();
    ids.shuffle(&mut rng);
    let row = KV_HEADS * HEAD_DIM;
    let shape = (2 * blocks, block_size, KV_HEADS, HEAD_DIM);
    let k = Tensor::from_vec(uniform(&mut rng, 2 * blocks * block_size * row), shape, &Device::Cpu).unwrap();
    let v = Tensor::from_vec(uniform(&mut rng, 2 * blocks * block_size * row), shape, &Device::Cpu).unwrap();
    // Scaled so the softmax is peaky and the running max moves between key chunks.
    let queries = uniform(&mut rng, len * Q_WIDTH).into_iter().map(|x| x * 6.0).collect();
    Fixture {
        k_cache: k.to_dtype(cache_dtype).unwrap(),
        v_cache: v.to_dtype(cache_dtype).unwrap(),
        table: ids[..blocks].to_vec(),
        other_table: ids[blocks..].to_vec(),
        queries,
        len,
    }
}

/// One sequence's part of a step: the queries at positions `first..first + q_len`.
#[derive(Clone, Copy)]
struct Part {
    neighbour: bool,
    first: usize,
    q_len: usize,
}

/// Attention output rows (`[tokens, Q_WIDTH]`, flattened) of a step made of `parts`.
fn step(f: &Fixture, parts: &[Part], params: AttentionParams, threads: usize) -> Vec<f32> {
    let (mut q, mut cu, mut contexts, mut tables) = (Vec::new(), vec![0u32], Vec::new(), Vec::new());
    for p in parts {
        q.extend_from_slice(&f.queries[p.first * Q_WIDTH..(p.first + p.q_len) * Q_WIDTH]);
        cu.push(cu.last().unwrap() + p.q_len as u32);
        contexts.push((p.first + p.q_len) as u32);
        tables.push(if p.neighbour { f.other_table.clone() } else { f.table.clone() });
    }
    let tokens = q.len() / Q_WIDTH;
    let q = Tensor::from_vec(q, (tokens, KV_HEADS * GROUP, HEAD_DIM), &Device::Cpu).unwrap();
    // The K/V are in the cache already: nothing is written, so the slots are never used.
    let meta = AttentionMetadata::new(vec![0; tokens], cu, contexts, &tables, &Device::Cpu).unwrap();
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
    let out = pool.install(|| paged_attention_with(&q, &f.k_cache, &f.v_cache, &meta, params)).unwrap();
    values(&out)
}

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// Every position computed alone (a decode over its own prefix) against the same position
/// inside whole-prompt prefills, random chunkings and mixed batches.
fn check(f: &Fixture, params: AttentionParams, seed: u64, what: &str) {
    let alone: Vec<Vec<f32>> =
        (0..f.len).map(|p| step(f, &[Part { neighbour: false, first: p, q_len: 1 }], params, 1)).collect();
    let mut rng = rng(seed);
    for trial in 0..6 {
        let threads = [1, 2, 24][trial % 3];
        // A random chunking of the whole sequence, each chunk in a step with a neighbour's
        // chunk before or after it.
        let mut first = 0;
        while first < f.len {
            let q_len = if trial == 0 { f.len } else { rng.random_range(1..=f.len - first) };
            let mine = Part { neighbour: false, first, q_len };
            let len = rng.random_range(1..=f.len);
            let other_first = rng.random_range(0..=f.len - len);
            let other = Part { neighbour: true, first: other_first, q_len: len };
            let (parts, offset) =
                if rng.random_bool(0.5) { (vec![mine, other], 0) } else { (vec![other, mine], len) };
            let out = step(f, &parts, params, threads);
            for i in 0..q_len {
                let row = &out[(offset + i) * Q_WIDTH..(offset + i + 1) * Q_WIDTH];
                assert!(
                    same_bits(row, &alone[first + i]),
                    "{what}: position {} in a chunk {first}..{} ({threads} threads) differs from its decode",
                    first + i,
                    first + q_len
                );
            }
            first += q_len;
        }
    }
}

#[test]
fn a_query_gets_the_same_bits_alone_chunked_and_batched() {
    let f = fixture(200, 16, DType::F32, 1);
    check(&f, AttentionParams::scaled(0.125), 10, "full attention");
    let capped = AttentionParams { logit_softcap: Some(5.0), ..AttentionParams::scaled(0.125) };
    check(&f, capped, 11, "soft cap");
}

#[test]
fn sliding_window_queries_get_the_same_bits_alone_chunked_and_batched() {
    // Windows that start mid key-chunk: a chunk's queries see windows starting at different
    // offsets, which must not move the key chunks any one query is folded over.
    for (window, block_size, seed) in [(37, 16, 2), (100, 4, 3), (64, 16, 4), (150, 1, 5)] {
        let f = fixture(230, block_size, DType::F32, seed);
        let params = AttentionParams { window: Some(window), ..AttentionParams::scaled(0.125) };
        check(&f, params, 20 + seed, &format!("window {window} block {block_size}"));
    }
}

#[test]
fn half_precision_caches_too() {
    for dtype in [DType::BF16, DType::F16] {
        let f = fixture(150, 16, dtype, 6);
        check(&f, AttentionParams::scaled(0.125), 30, &format!("{dtype:?} cache"));
        let params = AttentionParams { window: Some(45), ..AttentionParams::scaled(0.125) };
        check(&f, params, 31, &format!("{dtype:?} cache, window 45"));
    }
}

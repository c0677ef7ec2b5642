//! The item kernels' builds (portable, AVX2, AVX-512) against each other on small caches.

use super::*;
use crate::attention_plan::test_meta as meta;

/// The portable build of the kernel (what CPUs without AVX2/FMA run) agrees with the one
/// `attend` picks on this machine. The integration tests check the latter against a dense
/// reference, so this covers the former too.
#[test]
fn portable_and_dispatched_kernels_agree() {
    let (block_size, kv_heads, group, hd) = (4usize, 2usize, 3usize, 40usize);
    let q_lens = [1u32, 9, 3];
    let contexts = [70u32, 9, 20];
    let num_blocks: usize = contexts.iter().map(|&c| (c as usize).div_ceil(block_size)).sum();
    let max_blocks = contexts.iter().map(|&c| (c as usize).div_ceil(block_size)).max().unwrap_or(0);
    let mut m = meta(&q_lens, &contexts);
    // Blocks handed out in reverse so tables are not the identity.
    let mut next = num_blocks as u32;
    m.max_blocks_per_seq = max_blocks;
    for &c in &contexts {
        let n = (c as usize).div_ceil(block_size);
        let mut row: Vec<u32> = (0..n)
            .map(|_| {
                next -= 1;
                next
            })
            .collect();
        row.resize(max_blocks, 0);
        m.block_tables.extend(row);
    }
    let wave = |n: usize, f: f32| (0..n).map(|i| (i as f32 * f).sin()).collect::<Vec<f32>>();
    let cache_len = num_blocks * block_size * kv_heads * hd;
    let (k, v) = (wave(cache_len, 0.37), wave(cache_len, 0.11));
    let q = wave(m.num_tokens() * kv_heads * group * hd, 0.23);
    let cache = CacheView { k: &k, v: &v, block_size, kv_heads, head_dim: hd };
    let queries = Queries {
        q: &q,
        q_heads: kv_heads * group,
        softmax_scale: 0.3,
        window: None,
        logit_softcap: None,
        v_scale: 1.0,
    };
    let items = plan(&m, kv_heads, 4, None);
    let mut scratch = Scratch {
        q: vec![0.0; 4 * kv_heads * group * hd],
        scores: vec![0.0; 4 * kv_heads * group * KEY_CHUNK],
        max: vec![0.0; 4 * kv_heads * group],
        sum: vec![0.0; 4 * kv_heads * group],
        split_out: vec![0.0; 4 * kv_heads * group * hd],
        offsets: vec![0; 2 * KEY_CHUNK],
        kv: vec![0.0; KEY_CHUNK * kv_heads * hd],
        kt: vec![0.0; hd * KEY_CHUNK],
    };
    for item in items {
        let rows = (item.t1 - item.t0) * (item.kv1 - item.kv0) * group;
        let (mut a, mut b) = (RowStates::empty(rows, hd), RowStates::empty(rows, hd));
        attend(&queries, &cache, &m, item, &mut scratch, &mut a);
        attend_impl::<f32, Separate>(&queries, &cache, &m, item, &mut scratch, &mut b);
        let (a, b) = (a.max.iter().chain(&a.sum).chain(&a.out), b.max.iter().chain(&b.sum).chain(&b.out));
        // Scores are summed in different orders (lanes over the head, or one fused chain
        // per key), so the running maxima (up to ~40 here) differ by a few units in the last
        // place.
        for (x, y) in a.zip(b) {
            assert!(x == y || (x - y).abs() < 1e-5 * x.abs().max(1.0), "{item:?}: {x} vs {y}");
        }
    }
}

/// One work item's kernel, as the x86 builds and the portable loops are called.
#[cfg(target_arch = "x86_64")]
type ItemKernel<T> =
    unsafe fn(&Queries<'_>, &CacheView<'_, T>, &HostAttentionMetadata, Item, &mut Scratch, &mut RowStates);

/// Every x86 build of the item kernel (the dispatcher runs only the widest one) gives the
/// portable loops' results, for f32 and f16 caches, decode and prefill items.
#[cfg(target_arch = "x86_64")]
#[test]
fn x86_item_kernels_match_the_portable_one() {
    let (kv_heads, q_heads, hd, block) = (2, 6, 64, 4);
    let (num_blocks, contexts, q_lens) = (12, [9u32, 20], [1u32, 7]);
    let value = |i: usize| ((i * 2654435761) % 1000) as f32 / 500.0 - 1.0;
    let cache_len = num_blocks * block * kv_heads * hd;
    let k32: Vec<f32> = (0..cache_len).map(value).collect();
    let v32: Vec<f32> = (0..cache_len).map(|i| value(i + 7)).collect();
    let mut m = meta(&q_lens, &contexts);
    m.max_blocks_per_seq = 6;
    // Sequence 0 in blocks 11, 3, 7; sequence 1 in blocks 0, 5, 2, 9, 1 (padding after).
    m.block_tables = vec![11, 3, 7, 0, 0, 0, 0, 5, 2, 9, 1, 0];
    let tokens = q_lens.iter().sum::<u32>() as usize;
    let q: Vec<f32> = (0..tokens * q_heads * hd).map(|i| value(i + 3)).collect();
    let queries =
        Queries { q: &q, q_heads, softmax_scale: 0.125, window: None, logit_softcap: None, v_scale: 1.0 };
    fn run<T: Float>(
        kernel: ItemKernel<T>,
        q: &Queries<'_>,
        c: &CacheView<'_, T>,
        m: &HostAttentionMetadata,
    ) -> Vec<Vec<f32>> {
        let group = q.q_heads / c.kv_heads;
        plan(m, c.kv_heads, 4, None)
            .into_iter()
            .map(|item| {
                let rows = (item.t1 - item.t0) * (item.kv1 - item.kv0) * group;
                let mut scratch = Scratch {
                    q: vec![0.0; rows * c.head_dim],
                    scores: vec![0.0; rows * KEY_CHUNK],
                    max: vec![0.0; rows],
                    sum: vec![0.0; rows],
                    split_out: vec![0.0; rows * c.head_dim],
                    offsets: vec![0; 2 * KEY_CHUNK],
                    kv: vec![0.0; KEY_CHUNK * c.kv_heads * c.head_dim],
                    kt: vec![0.0; c.head_dim * KEY_CHUNK],
                };
                let mut state = RowStates::empty(rows, c.head_dim);
                // SAFETY: only called with kernels this CPU supports (checked by the caller).
                unsafe { kernel(q, c, m, item, &mut scratch, &mut state) };
                state.max.into_iter().chain(state.sum).chain(state.out).collect()
            })
            .collect()
    }
    fn portable<T: Float>(
        q: &Queries<'_>,
        c: &CacheView<'_, T>,
        m: &HostAttentionMetadata,
        item: Item,
        s: &mut Scratch,
        out: &mut RowStates,
    ) {
        attend_impl::<T, Separate>(q, c, m, item, s, out);
    }
    fn check<T: Float>(k: &[T], v: &[T], q: &Queries<'_>, m: &HostAttentionMetadata, hd: usize) {
        let c = CacheView { k, v, block_size: 4, kv_heads: 2, head_dim: hd };
        let want = run(portable::<T>, q, &c, m);
        let mut kernels: Vec<(&str, ItemKernel<T>)> = Vec::new();
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
            kernels.push(("avx2", attend_avx2::<T>));
        }
        if std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("fma") {
            kernels.push(("avx512", attend_avx512::<T>));
        }
        for (name, kernel) in kernels {
            let got = run(kernel, q, &c, m);
            for (g, w) in got.iter().flatten().zip(want.iter().flatten()) {
                assert!(g == w || (g - w).abs() <= 1e-5, "{name}: {g} vs {w}");
            }
        }
    }
    check(&k32, &v32, &queries, &m, hd);
    let k16: Vec<half::f16> = k32.iter().map(|&x| half::f16::from_f32(x)).collect();
    let v16: Vec<half::f16> = v32.iter().map(|&x| half::f16::from_f32(x)).collect();
    check(&k16, &v16, &queries, &m, hd);
}

//! `KvCache::copy_blocks`, the copy-on-write of a forked sequence's partial last page, costs
//! what the copied pages cost, not what the cache costs (issue 63: a copy cloned whole cache
//! tensors, so `n: 64` spent a minute copying a 1 GiB cache 63 times). Measured without timing:
//! this binary's global allocator counts the bytes allocated, and the peak during a copy must
//! stay within a few pages, far below one cache tensor. One test, so nothing else allocates
//! meanwhile.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use candle_core::{DType, Device, Tensor};
use pagoda_models::{KvCache, ModelConfig};
use pagoda_ops::RotaryStyle;

/// The system allocator, counting the bytes live and the most live since the last reset.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is passed to the system allocator unchanged; the counters are plain atomics.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
        PEAK.fetch_max(live, Ordering::Relaxed);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
        PEAK.fetch_max(live, Ordering::Relaxed);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > layout.size() {
            let live = LIVE.fetch_add(new_size - layout.size(), Ordering::Relaxed) + new_size - layout.size();
            PEAK.fetch_max(live, Ordering::Relaxed);
        } else {
            LIVE.fetch_sub(layout.size() - new_size, Ordering::Relaxed);
        }
        // SAFETY: the caller's contract, passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Bytes allocated beyond those live when `f` started, at the most.
fn peak_growth(f: impl FnOnce()) -> usize {
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    f();
    PEAK.load(Ordering::Relaxed) - base
}

/// Two layers of one KV head of 8 dimensions: a page of 16 tokens is 512 bytes of f32 per K or
/// V tensor.
fn config() -> ModelConfig {
    ModelConfig {
        architecture: "llama".into(),
        vocab_size: 8,
        hidden_size: 8,
        intermediate_size: 8,
        num_layers: 2,
        num_heads: 1,
        num_kv_heads: 1,
        head_dim: 8,
        rms_norm_eps: 1e-5,
        rope_theta: 10_000.0,
        rope_scaling: Default::default(),
        rope_freq_factors: None,
        rope_style: RotaryStyle::Halves,
        max_position_embeddings: 64,
        tie_word_embeddings: true,
        attention_bias: false,
        qk_norm: false,
        sliding_window: None,
        sliding_layers: vec![false; 2],
        rope_local_theta: None,
        query_pre_attn_scalar: None,
        attn_logit_softcapping: None,
        final_logit_softcapping: None,
        moe: None,
        long_rope: None,
    }
}

#[test]
fn block_copies_allocate_pages_not_caches() {
    const BLOCKS: usize = 4096;
    const BLOCK_SIZE: usize = 16;
    let page_bytes = BLOCK_SIZE * 8 * 4;
    let tensor_bytes = BLOCKS * page_bytes;
    let cache = KvCache::new(&config(), BLOCKS, BLOCK_SIZE, DType::F32, &Device::Cpu).unwrap();
    let (k, _) = cache.layer(0);
    k.slice_set(&Tensor::ones((1, BLOCK_SIZE, 1, 8), DType::F32, &Device::Cpu).unwrap(), 0, 7).unwrap();

    // A request of n = 64 forks: its partial page 7 is copied for 63 samples into fresh pages.
    let fork: Vec<(u32, u32)> = (0..63).map(|i| (7, 100 + i)).collect();
    // Beams chosen again: their partial pages copied into scattered fresh ones.
    let beams: Vec<(u32, u32)> = vec![(7, 4000), (300, 17), (301, 2500), (999, 18), (7, 19)];
    for (what, pairs) in [("fork", &fork), ("beams", &beams)] {
        let grown = peak_growth(|| cache.copy_blocks(pairs).unwrap());
        // The pages copied (at most one K or V tensor's worth at a time) and a little
        // bookkeeping; a clone of one cache tensor would be 2 MiB.
        let limit = pairs.len() * page_bytes + 16 * 1024;
        assert!(
            grown <= limit,
            "{what}: {} page copies allocated {grown} bytes at the peak (limit {limit}; one cache tensor is {tensor_bytes})",
            pairs.len()
        );
    }
    let page =
        |b: usize| -> Vec<f32> { k.narrow(0, b, 1).unwrap().flatten_all().unwrap().to_vec1().unwrap() };
    for b in [100, 162, 4000, 19] {
        assert!(page(b).iter().all(|&x| x == 1.0), "page {b} was copied from page 7");
    }
    assert!(page(163).iter().all(|&x| x == 0.0), "page 163 was not copied into");
}

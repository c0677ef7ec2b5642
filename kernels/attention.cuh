// Pieces shared by the paged-attention kernels: the work item the host plans, and the
// asynchronous load of one tile of keys and values through a sequence's block table.
#pragma once
#include "fp8.cuh"

namespace pagoda {

// One unit of attention work: some query tokens of one sequence, some q heads of each kv
// head's group (the kv head is blockIdx.y), and a range of key positions. Built on the host
// by crates/ops/src/cuda/plan.rs (`WorkItem`, same field order, 12 x u32).
//
// Rows of an item are (token, head) pairs, token-major: row r is query token tok0 + r / head_cnt
// at position pos0 + r / head_cnt, q head kv_head * group + head_lo + r % head_cnt.
struct WorkItem {
    uint32_t seq;           // sequence: row of the block table
    uint32_t tok0;          // first query token: row of q and out
    uint32_t ntok;          // query tokens
    uint32_t pos0;          // position of tok0 in its sequence
    uint32_t head_lo;       // first q head within the group
    uint32_t head_cnt;      // q heads of the group covered
    uint32_t kv_lo;         // key positions [kv_lo, kv_hi) read by this item
    uint32_t kv_hi;
    uint32_t split;         // which split of the key range this is
    uint32_t num_splits;    // 1: the item writes `out`; > 1: partial rows for the combine kernel
    uint32_t scratch_base;  // first partial row of the split group
    uint32_t flags;         // ITEM_RANGE_AT_RUN_TIME or 0
};

// Flag of a one-token decode item planned before its context length was known (a CUDA graph
// replays the plan at every step): pos0, kv_lo and kv_hi come from context_lens at run time.
constexpr uint32_t ITEM_RANGE_AT_RUN_TIME = 1;
// The split rule's constants (crates/ops/src/cuda/plan.rs, SPLIT_GRANULE and SPLIT_MIN_KEYS).
constexpr uint32_t SPLIT_GRANULE = 64;
constexpr uint32_t SPLIT_MIN_KEYS = 128;

// Fills in an ITEM_RANGE_AT_RUN_TIME item from its sequence's context length: split s of S
// covers keys [s * piece, (s + 1) * piece) of the context, piece being the context over S
// rounded up to SPLIT_GRANULE and at least SPLIT_MIN_KEYS; pieces past the context are empty.
// The host's mirror is plan.rs's `range_at_run_time`.
__device__ __forceinline__ void resolve_range_at_run_time(WorkItem &it, const uint32_t *__restrict__ context_lens) {
    if (!(it.flags & ITEM_RANGE_AT_RUN_TIME)) return;
    const uint32_t ctx = context_lens[it.seq];
    uint32_t piece = (ctx + it.num_splits - 1) / it.num_splits;
    piece = (piece + SPLIT_GRANULE - 1) / SPLIT_GRANULE * SPLIT_GRANULE;
    piece = piece < SPLIT_MIN_KEYS ? SPLIT_MIN_KEYS : piece;
    const uint32_t lo = min(it.split * piece, ctx);
    it.kv_lo = lo;
    it.kv_hi = min(lo + piece, ctx);
    it.pos0 = ctx - it.ntok;
}

// The first key an item reads: its planned start, or later when a sliding window of `window`
// keys (0: none) hides the keys before its first query's window. Keys before it are never
// loaded: a windowed layer's cache may have given their blocks back.
__device__ __forceinline__ int window_start(const WorkItem &it, int window) {
    const int lo = (int)it.kv_lo;
    return window > 0 ? max(lo, (int)it.pos0 + 1 - window) : lo;
}

// Whether a query at `row_pos` sees the key at `pos`: causal, and inside the window if any.
__device__ __forceinline__ bool visible(int pos, int row_pos, int window) {
    return pos <= row_pos && (window <= 0 || pos + window > row_pos);
}

// Gemma's soft-capped scores, cap * tanh(score / cap), in the base-2 units the kernels use
// (both score and cap scaled by log2(e)); `cap_log2` 0 leaves the score as it is.
__device__ __forceinline__ float soft_cap(float score_log2, float cap_log2) {
    return cap_log2 > 0.f ? cap_log2 * tanhf(score_log2 / cap_log2) : score_log2;
}

// Partial results of split items: row (split, kv_head, r) of a group lives at
// scratch_base + (split * kv_heads + kv_head) * rows + r in part_o ([.., head_dim] f32,
// normalised by its own softmax sum) and part_lse (log2 of that sum plus the running max, in
// the base-2 units the kernels work in; -inf when no key was visible).
__device__ __forceinline__ long long partial_row(const WorkItem &it, int kv_heads, int kv_head, int r) {
    const long long rows = (long long)it.ntok * it.head_cnt;
    return (long long)it.scratch_base + ((long long)it.split * kv_heads + kv_head) * rows + r;
}

// A lane's chunk of a cache row in shared memory (N elements), widened to f32. Float caches
// give their values; an FP8 cache's codes widen through f16 as their values times 2^-8, which
// FACTOR undoes where the kernels apply the cache's scales.
template <typename C> struct CacheChunk {
    static constexpr int N = Vec16<C>::N;
    static constexpr float FACTOR = 1.f;
    static __device__ __forceinline__ void to_f32(const C *p, float (&out)[N]) {
        Vec16<C>::to_f32(*reinterpret_cast<const uint4 *>(p), out);
    }
};

template <> struct CacheChunk<fp8_e4m3> {
    static constexpr int N = 8;
    static constexpr float FACTOR = 256.f;
    static __device__ __forceinline__ void to_f32(const fp8_e4m3 *p, float (&out)[8]) {
        Vec16<f16>::to_f32(fp8_widen8<f16>(*reinterpret_cast<const uint2 *>(p)), out);
    }
};

// Starts the asynchronous copy of keys tile_start .. tile_start + KT of one kv head into
// k_dst / v_dst (rows of `dst_stride` elements of the cache's type T, 16 bytes at a time). Positions >= kv_hi are zero-filled: their
// scores are masked, and zeros keep 0 * V finite.
template <typename T, int D, int KT, int NT>
__device__ __forceinline__ void load_kv_tile(T *k_dst, T *v_dst, int dst_stride, const T *__restrict__ k_cache,
                                             const T *__restrict__ v_cache, const uint32_t *__restrict__ table,
                                             int block_size, int kv_heads, int kv_head, int tile_start, int kv_hi) {
    constexpr int VEC = 16 / (int)sizeof(T);
    constexpr int CH = D / VEC;
    for (int c = threadIdx.x; c < KT * CH; c += NT) {
        const int key = c / CH, part = c % CH;
        const int pos = tile_start + key;
        const bool valid = pos < kv_hi;
        long long offset = 0;
        if (valid) {
            const long long block = table[pos / block_size];
            const long long slot = block * block_size + pos % block_size;
            offset = (slot * kv_heads + kv_head) * D + part * VEC;
        }
        cp_async_16(k_dst + key * dst_stride + part * VEC, k_cache + offset, valid);
        cp_async_16(v_dst + key * dst_stride + part * VEC, v_cache + offset, valid);
    }
}

}  // namespace pagoda

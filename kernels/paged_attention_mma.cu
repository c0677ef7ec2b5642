// Paged attention on tensor cores (f16/bf16): prefill chunks, causal within the chunk and
// attending to all cached context (or to a sliding window of it, with optionally soft-capped
// scores), in the FlashAttention-2 style with mma.sync m16n8k16.
//
// Launch: grid (num_items, num_kv_heads), block 128 threads (4 warps), dynamic shared memory
// MmaShape<D>::SMEM_BYTES, or SMEM_BYTES_FP8 for the `_fp8` entries (opt-in above 48 KiB). Each block handles one WorkItem for one kv
// head: up to 64 rows = query tokens x q heads of the group (packing the group's heads into
// rows is how every K/V tile serves all of them), 16 rows per warp.
//
// Shared memory holds the Q tile and two stages of K and V tiles (64 keys each), rows padded
// by 16 bytes so ldmatrix reads are free of bank conflicts. Per key tile each warp computes
// S = Q K^T (A from Q via ldmatrix, B from K via ldmatrix), scales and masks it, updates its
// rows' running max and sum, turns P into bf16/f16 A fragments in registers and accumulates
// O += P V (B from V via ldmatrix.trans). Key tiles past a warp's last row position are
// skipped; only tiles crossing the diagonal are masked.
//
// Over an FP8 cache (the `_fp8` entries) the two stages hold the tiles' codes, and each tile
// is widened into one stage of f16/bf16 tiles (fp8.cuh) before the products; the cache's K
// scale is folded into scale_log2 by the host and its V scale applied to the output rows.
#include "attention.cuh"

namespace pagoda {

constexpr int MMA_THREADS = 128;
constexpr int MMA_ROWS = 64;
constexpr int MMA_KEYS = 64;

template <int D> struct MmaShape {
    static constexpr int STRIDE = D + 8;  // elements per shared row (16 bytes of padding)
    static constexpr int SMEM_BYTES = 5 * 64 * STRIDE * 2;  // Q + 2 stages of K and V
    // Q + one stage of K and V widened + 2 stages of their codes.
    static constexpr int SMEM_BYTES_FP8 = 3 * 64 * STRIDE * 2 + 2 * 2 * 64 * D;
    static_assert(D % 16 == 0, "head_dim must be a multiple of 16");
};

// What scores and outputs are multiplied by for a cache of C read as T tiles: 1 for a float
// cache, FP8 codes' widening factor for an FP8 one.
template <typename T, typename C> struct CacheFactor {
    static constexpr bool FP8 = false;
    static constexpr float value = 1.f;
};
template <typename T> struct CacheFactor<T, fp8_e4m3> {
    static constexpr bool FP8 = true;
    static constexpr float value = Fp8Factor<T>::value;
};

// LOCAL: the variant with sliding windows and soft caps; the plain one keeps the registers of
// causal attention (the masks and the tanh cost about 50 more per thread).
template <typename T, typename C, int D, bool LOCAL>
__device__ __forceinline__ void paged_attention_mma(const WorkItem *__restrict__ items, const T *__restrict__ q,
                                                    long long q_row_stride, const C *__restrict__ k_cache,
                                                    const C *__restrict__ v_cache, const uint32_t *__restrict__ block_tables,
                                                    int max_blocks_per_seq, int block_size, int kv_heads, int group,
                                                    float scale_log2, int window_arg, float softcap_arg, float v_scale,
                                                    T *__restrict__ out) {
    const int window = LOCAL ? window_arg : 0;
    const float softcap_log2 = LOCAL ? softcap_arg : 0.f;
    constexpr bool FP8 = CacheFactor<T, C>::FP8;
    constexpr int STRIDE = MmaShape<D>::STRIDE;
    constexpr int CH = D / 8;  // 16-byte chunks per row
    // Rows of a stage in C elements: padded T rows, or an FP8 stage's unpadded codes.
    constexpr int STAGE_STRIDE = FP8 ? D : STRIDE;
    const float score_scale = scale_log2 * CacheFactor<T, C>::value;
    PAGODA_DYNAMIC_SMEM(smem);
    T *q_s = reinterpret_cast<T *>(smem);           // [64][STRIDE]
    T *k_s = q_s + MMA_ROWS * STRIDE;               // [2][64][STRIDE]; FP8: [64][STRIDE]
    T *v_s = k_s + (FP8 ? 1 : 2) * MMA_KEYS * STRIDE;  // likewise
    // Where the loads land: the T tiles themselves, or an FP8 cache's codes ([2][64][D] each).
    C *k_stage = FP8 ? reinterpret_cast<C *>(v_s + MMA_KEYS * STRIDE) : reinterpret_cast<C *>(k_s);
    C *v_stage = FP8 ? k_stage + 2 * MMA_KEYS * D : reinterpret_cast<C *>(v_s);

    const WorkItem it = items[blockIdx.x];
    const int kv_head = blockIdx.y;
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int g = lane / 4, tq = lane % 4;  // mma fragment coordinates
    const int nrows = (int)(it.ntok * it.head_cnt);
    const int q_heads = kv_heads * group;
    const uint32_t *table = block_tables + (long long)it.seq * max_blocks_per_seq;
    const int kv_lo = window_start(it, window), kv_hi = (int)it.kv_hi;
    const int num_tiles = kv_hi > kv_lo ? (kv_hi - kv_lo + MMA_KEYS - 1) / MMA_KEYS : 0;

    if (num_tiles > 0) {
        load_kv_tile<C, D, MMA_KEYS, MMA_THREADS>(k_stage, v_stage, STAGE_STRIDE, k_cache, v_cache, table, block_size,
                                                  kv_heads, kv_head, kv_lo, kv_hi);
    }
    cp_async_commit();

    // Q tile: rows past nrows are zero. Plain loads: q may be a view with any alignment.
    for (int c = tid; c < MMA_ROWS * CH; c += MMA_THREADS) {
        const int row = c / CH, part = c % CH;
        T *dst = q_s + row * STRIDE + part * 8;
        if (row < nrows) {
            const long long tok = it.tok0 + row / it.head_cnt;
            const int head = kv_head * group + it.head_lo + row % it.head_cnt;
            const T *src = q + tok * q_row_stride + (long long)head * D + part * 8;
#pragma unroll
            for (int e = 0; e < 8; ++e) dst[e] = src[e];
        } else {
#pragma unroll
            for (int e = 0; e < 8; ++e) dst[e] = Float<T>::from_f32(0.f);
        }
    }
    __syncthreads();

    uint32_t qf[D / 16][4];
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        ldmatrix_x4(qf[kk], q_s + (warp * 16 + lane % 16) * STRIDE + kk * 16 + (lane / 16) * 8);
    }

    // Positions of this thread's two rows (g and g + 8 of the warp's 16); -1 masks a padding row.
    const int r0 = warp * 16 + g, r1 = r0 + 8;
    const int pos_r0 = r0 < nrows ? (int)(it.pos0 + r0 / it.head_cnt) : -1;
    const int pos_r1 = r1 < nrows ? (int)(it.pos0 + r1 / it.head_cnt) : -1;
    const bool warp_live = warp * 16 < nrows;
    const int warp_last_row = min(warp * 16 + 15, nrows - 1);
    const int warp_min_pos = (int)(it.pos0 + (warp * 16) / it.head_cnt);
    const int warp_max_pos = (int)(it.pos0 + warp_last_row / it.head_cnt);

    float o[D / 8][4];
#pragma unroll
    for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    float max0 = -INFINITY, max1 = -INFINITY, sum0 = 0.f, sum1 = 0.f;

    for (int t = 0; t < num_tiles; ++t) {
        if (t + 1 < num_tiles) {
            const int next = (t + 1) & 1;
            load_kv_tile<C, D, MMA_KEYS, MMA_THREADS>(k_stage + next * MMA_KEYS * STAGE_STRIDE,
                                                      v_stage + next * MMA_KEYS * STAGE_STRIDE, STAGE_STRIDE, k_cache,
                                                      v_cache, table, block_size, kv_heads, kv_head,
                                                      kv_lo + (t + 1) * MMA_KEYS, kv_hi);
        }
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        const T *k_tile = k_s + (FP8 ? 0 : (t & 1) * MMA_KEYS * STRIDE);
        const T *v_tile = v_s + (FP8 ? 0 : (t & 1) * MMA_KEYS * STRIDE);
        if constexpr (FP8) {
            // Widen this tile's codes, 8 a thread at a time; every warp reads both tiles.
            const C *k_codes = k_stage + (t & 1) * MMA_KEYS * D;
            const C *v_codes = v_stage + (t & 1) * MMA_KEYS * D;
            for (int c = tid; c < MMA_KEYS * CH; c += MMA_THREADS) {
                const int key = c / CH, part = c % CH;
                const int from = key * D + part * 8, to = key * STRIDE + part * 8;
                *reinterpret_cast<uint4 *>(k_s + to) = fp8_widen8<T>(*reinterpret_cast<const uint2 *>(k_codes + from));
                *reinterpret_cast<uint4 *>(v_s + to) = fp8_widen8<T>(*reinterpret_cast<const uint2 *>(v_codes + from));
            }
            __syncthreads();
        }
        const int tile_start = kv_lo + t * MMA_KEYS;
        // Warp-uniform: skip tiles after the warp's last row, and before its first row's window.
        const bool before_window = window > 0 && tile_start + MMA_KEYS - 1 < warp_min_pos + 1 - window;
        if (warp_live && tile_start <= warp_max_pos && !before_window) {

            // S = Q K^T: 8 n-tiles of 8 keys.
            float s[8][4];
#pragma unroll
            for (int n = 0; n < 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
            for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
                for (int np = 0; np < 4; ++np) {
                    uint32_t b[4];
                    ldmatrix_x4(b, k_tile + (np * 16 + (lane % 8) + (lane / 16) * 8) * STRIDE + kk * 16 + ((lane / 8) % 2) * 8);
                    const uint32_t b_lo[2] = {b[0], b[1]}, b_hi[2] = {b[2], b[3]};
                    mma_16816<T>(s[2 * np], qf[kk], b_lo);
                    mma_16816<T>(s[2 * np + 1], qf[kk], b_hi);
                }
            }

            // Scale to base-2 units (soft-capped if asked); mask keys after each row's position
            // (this also masks positions >= kv_hi and padding rows) and before its window. Only
            // tiles crossing the diagonal or a window's start need the masks.
            const bool diagonal = tile_start + MMA_KEYS - 1 > warp_min_pos;
            const bool window_edge = window > 0 && tile_start < warp_max_pos + 1 - window;
#pragma unroll
            for (int n = 0; n < 8; ++n) {
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const int key = tile_start + n * 8 + 2 * tq + (i & 1);
                    const int row_pos = i < 2 ? pos_r0 : pos_r1;
                    const float v = soft_cap(s[n][i] * score_scale, softcap_log2);
                    const bool hidden = (diagonal && key > row_pos) || (window_edge && key + window <= row_pos);
                    s[n][i] = hidden ? -INFINITY : v;
                }
            }

            // Online softmax: a row's 64 scores sit in the 4 lanes of a quad.
            float tmax0 = -INFINITY, tmax1 = -INFINITY;
#pragma unroll
            for (int n = 0; n < 8; ++n) {
                tmax0 = fmaxf(tmax0, fmaxf(s[n][0], s[n][1]));
                tmax1 = fmaxf(tmax1, fmaxf(s[n][2], s[n][3]));
            }
#pragma unroll
            for (int offset = 1; offset < 4; offset <<= 1) {
                tmax0 = fmaxf(tmax0, __shfl_xor_sync(FULL_MASK, tmax0, offset));
                tmax1 = fmaxf(tmax1, __shfl_xor_sync(FULL_MASK, tmax1, offset));
            }
            const float new0 = fmaxf(max0, tmax0), new1 = fmaxf(max1, tmax1);
            const float alpha0 = new0 == -INFINITY ? 1.f : exp2f(max0 - new0);
            const float alpha1 = new1 == -INFINITY ? 1.f : exp2f(max1 - new1);
            max0 = new0;
            max1 = new1;
            float tsum0 = 0.f, tsum1 = 0.f;
#pragma unroll
            for (int n = 0; n < 8; ++n) {
                s[n][0] = new0 == -INFINITY ? 0.f : exp2f(s[n][0] - new0);
                s[n][1] = new0 == -INFINITY ? 0.f : exp2f(s[n][1] - new0);
                s[n][2] = new1 == -INFINITY ? 0.f : exp2f(s[n][2] - new1);
                s[n][3] = new1 == -INFINITY ? 0.f : exp2f(s[n][3] - new1);
                tsum0 += s[n][0] + s[n][1];
                tsum1 += s[n][2] + s[n][3];
            }
            // Sums stay per lane until the end; only the rescale needs them consistent.
            sum0 = sum0 * alpha0 + tsum0;
            sum1 = sum1 * alpha1 + tsum1;
#pragma unroll
            for (int n = 0; n < D / 8; ++n) {
                o[n][0] *= alpha0;
                o[n][1] *= alpha0;
                o[n][2] *= alpha1;
                o[n][3] *= alpha1;
            }

            // O += P V: the accumulator layout of two adjacent n-tiles is the A layout of one
            // k16 step, so P goes straight from registers into the next mma.
#pragma unroll
            for (int kt = 0; kt < 4; ++kt) {
                const uint32_t pa[4] = {
                    pack2<T>(s[2 * kt][0], s[2 * kt][1]), pack2<T>(s[2 * kt][2], s[2 * kt][3]),
                    pack2<T>(s[2 * kt + 1][0], s[2 * kt + 1][1]), pack2<T>(s[2 * kt + 1][2], s[2 * kt + 1][3])};
#pragma unroll
                for (int dp = 0; dp < D / 16; ++dp) {
                    uint32_t b[4];
                    ldmatrix_x4_trans(b, v_tile + (kt * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * STRIDE + dp * 16 + (lane / 16) * 8);
                    const uint32_t b_lo[2] = {b[0], b[1]}, b_hi[2] = {b[2], b[3]};
                    mma_16816<T>(o[2 * dp], pa, b_lo);
                    mma_16816<T>(o[2 * dp + 1], pa, b_hi);
                }
            }
        }
        __syncthreads();  // the stage just read is refilled by the next iteration's loads
    }
    cp_async_wait<0>();

#pragma unroll
    for (int offset = 1; offset < 4; offset <<= 1) {
        sum0 += __shfl_xor_sync(FULL_MASK, sum0, offset);
        sum1 += __shfl_xor_sync(FULL_MASK, sum1, offset);
    }
    // The V scale (and widening factor) of an FP8 cache; 1 for a float cache.
    const float out_scale = v_scale * CacheFactor<T, C>::value;
    const float inv0 = sum0 > 0.f ? out_scale / sum0 : 0.f;
    const float inv1 = sum1 > 0.f ? out_scale / sum1 : 0.f;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int r = half == 0 ? r0 : r1;
        if (r >= nrows) continue;
        const float inv = half == 0 ? inv0 : inv1;
        const long long tok = it.tok0 + r / it.head_cnt;
        const int head = kv_head * group + it.head_lo + r % it.head_cnt;
        T *dst = out + (tok * q_heads + head) * D;
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
            const int col = n * 8 + 2 * tq;
            *reinterpret_cast<uint32_t *>(dst + col) = pack2<T>(o[n][2 * half] * inv, o[n][2 * half + 1] * inv);
        }
    }
}

}  // namespace pagoda

#define PAGODA_ATTENTION_MMA_VARIANT(name, T, C, D, LOCAL)                                                           \
    extern "C" __global__ void __launch_bounds__(pagoda::MMA_THREADS) name(                                          \
        const pagoda::WorkItem *items, const T *q, long long q_row_stride, const C *k_cache, const C *v_cache,        \
        const uint32_t *block_tables, int max_blocks_per_seq, int block_size, int kv_heads, int group,               \
        float scale_log2, int window, float softcap_log2, float v_scale, T *out) {                                   \
        pagoda::paged_attention_mma<T, C, D, LOCAL>(items, q, q_row_stride, k_cache, v_cache, block_tables,         \
                                                    max_blocks_per_seq, block_size, kv_heads, group, scale_log2,     \
                                                    window, softcap_log2, v_scale, out);                             \
    }                                                                                                                \
    PAGODA_ENTRY(name)

#define PAGODA_ATTENTION_MMA(suffix, T, C, D)                                                       \
    PAGODA_ATTENTION_MMA_VARIANT(pagoda_paged_attention_mma_##suffix, T, C, D, false)               \
    PAGODA_ATTENTION_MMA_VARIANT(pagoda_paged_attention_mma_local_##suffix, T, C, D, true)

#define PAGODA_ATTENTION_MMA_DIMS(dt, T, C)     \
    PAGODA_ATTENTION_MMA(dt##_d16, T, C, 16)   \
    PAGODA_ATTENTION_MMA(dt##_d32, T, C, 32)   \
    PAGODA_ATTENTION_MMA(dt##_d64, T, C, 64)   \
    PAGODA_ATTENTION_MMA(dt##_d80, T, C, 80)   \
    PAGODA_ATTENTION_MMA(dt##_d96, T, C, 96)   \
    PAGODA_ATTENTION_MMA(dt##_d128, T, C, 128)

PAGODA_ATTENTION_MMA_DIMS(f16, pagoda::f16, pagoda::f16)
PAGODA_ATTENTION_MMA_DIMS(bf16, pagoda::bf16, pagoda::bf16)
PAGODA_ATTENTION_MMA_DIMS(f16_fp8, pagoda::f16, pagoda::fp8_e4m3)
PAGODA_ATTENTION_MMA_DIMS(bf16_fp8, pagoda::bf16, pagoda::fp8_e4m3)

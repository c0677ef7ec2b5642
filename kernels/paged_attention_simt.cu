// Paged attention on CUDA cores: decodes (and every f32 item, and every item of a head dim the
// tensor-core kernel lacks), with an optional split of the key range (flash-decoding) whose
// partial results paged_attention_combine.cu merges; causal, or inside a sliding window, with
// optionally soft-capped scores.
//
// Launch: grid (num_items, num_kv_heads), block 128 threads, static shared memory only
// (< 48 KiB). Each block handles one WorkItem for one kv head: up to RT rows (query tokens x
// q heads of the kv head's group; RT is 4 or 8, one entry point each, so small groups keep
// fewer registers), and every K/V tile is read from memory once for all the heads that share
// it (GQA/MQA).
//
// The cache holds T (the queries' type) or FP8 codes (the `_fp8` entries: C = fp8_e4m3, with
// per-tensor scales: K's folded into scale_log2 by the host, V's applied to each output row).
//
// Thread layout: threads form groups of DX lanes; lane d of a group owns VEC elements of the
// head dimension (16 bytes of a float cache, 8 codes of an FP8 one), so a group holds one key row and the query rows live in
// registers. Keys stream through shared memory in tiles of KT positions, double-buffered with
// cp.async; per tile: scores (one key per group at a time, reduced across the group's lanes
// with shuffles), online softmax (one warp per row, base-2 exponentials), then P.V with each
// group accumulating its keys into per-row registers. At the end the groups' partial outputs
// are summed (shuffles within a warp, shared memory across warps).
#include "attention.cuh"

namespace pagoda {

constexpr int SIMT_THREADS = 128;

template <typename C, int D, int RT> struct SimtShape {
    static constexpr int VEC = CacheChunk<C>::N;         // elements per lane chunk
    static constexpr int CH = D / VEC;                   // chunks per head row
    static constexpr int DX = CH <= 8 ? 8 : CH <= 16 ? 16 : 32;  // lanes per group
    static constexpr int NG = SIMT_THREADS / DX;         // groups per block
    // Keys per tile: 16 for f32 and for wide heads, so that two stages fit static shared memory.
    static constexpr int KT = sizeof(C) == 4 || D > 128 ? 16 : 32;
    static constexpr int KPG = KT / NG;                  // keys per group per tile
    static constexpr int NW = SIMT_THREADS / 32;
    static constexpr int STAGE_BYTES = 2 * 2 * KT * D * (int)sizeof(C);  // K and V, two stages
    static constexpr int REDUCE_BYTES = NW * RT * D * 4;
    static constexpr int SMEM_BYTES = STAGE_BYTES > REDUCE_BYTES ? STAGE_BYTES : REDUCE_BYTES;
    static_assert(D % VEC == 0 && CH <= 32, "head_dim must be a multiple of 16 bytes, at most 32 chunks");
    static_assert(KT % NG == 0 && KT <= 64, "each group must get whole keys of a tile");
};

template <typename T, typename C, int D, int RT>
__device__ __forceinline__ void paged_attention_simt(const WorkItem *__restrict__ items, const T *__restrict__ q,
                                                     long long q_row_stride, const C *__restrict__ k_cache,
                                                     const C *__restrict__ v_cache, const uint32_t *__restrict__ block_tables,
                                                     int max_blocks_per_seq, int block_size, int kv_heads, int group,
                                                     float scale_log2, int window, float softcap_log2, float v_scale,
                                                     T *__restrict__ out, float *__restrict__ part_o,
                                                     float *__restrict__ part_lse,
                                                     const uint32_t *__restrict__ context_lens) {
    using S = SimtShape<C, D, RT>;
    constexpr int VEC = S::VEC, CH = S::CH, DX = S::DX, NG = S::NG, KT = S::KT, KPG = S::KPG, NW = S::NW;

    __shared__ __align__(16) unsigned char smem[S::SMEM_BYTES];
    __shared__ float s_tile[RT][KT];  // scores, then probabilities, of the current tile
    __shared__ float row_max[RT], row_sum[RT], row_scale[RT];
    C *k_tiles = reinterpret_cast<C *>(smem);  // [2][KT][D]
    C *v_tiles = k_tiles + 2 * KT * D;         // [2][KT][D]
    float *o_partial = reinterpret_cast<float *>(smem);  // [NW][RT][D], after the key loop

    WorkItem it = items[blockIdx.x];
    resolve_range_at_run_time(it, context_lens);
    const int kv_head = blockIdx.y;
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int lane_d = tid % DX, grp = tid / DX;
    const int nrows = (int)(it.ntok * it.head_cnt);
    const int q_heads = kv_heads * group;
    const uint32_t *table = block_tables + (long long)it.seq * max_blocks_per_seq;

    // This thread's chunk of every query row, pre-scaled so scores come out in base-2 units
    // (and undo the widening factor of an FP8 cache's keys).
    const float q_scale = scale_log2 * CacheChunk<C>::FACTOR;
    float qv[RT][VEC];
    int row_pos[RT];
#pragma unroll
    for (int r = 0; r < RT; ++r) {
        const bool live = r < nrows;
        row_pos[r] = live ? (int)(it.pos0 + r / it.head_cnt) : -1;
        const long long tok = it.tok0 + (live ? r / it.head_cnt : 0);
        const int head = kv_head * group + it.head_lo + (live ? r % it.head_cnt : 0);
        const T *src = q + tok * q_row_stride + (long long)head * D + lane_d * VEC;
#pragma unroll
        for (int i = 0; i < VEC; ++i) qv[r][i] = (live && lane_d < CH) ? Float<T>::to_f32(src[i]) * q_scale : 0.f;
    }
    float acc_o[RT][VEC];
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
        for (int i = 0; i < VEC; ++i) acc_o[r][i] = 0.f;
    if (tid < RT) {
        row_max[tid] = -INFINITY;
        row_sum[tid] = 0.f;
    }

    const int kv_lo = window_start(it, window), kv_hi = (int)it.kv_hi;
    const int num_tiles = kv_hi > kv_lo ? (kv_hi - kv_lo + KT - 1) / KT : 0;
    if (num_tiles > 0) {
        load_kv_tile<C, D, KT, SIMT_THREADS>(k_tiles, v_tiles, D, k_cache, v_cache, table, block_size, kv_heads, kv_head,
                                             kv_lo, kv_hi);
    }
    cp_async_commit();

    for (int t = 0; t < num_tiles; ++t) {
        if (t + 1 < num_tiles) {
            const int next = (t + 1) & 1;
            load_kv_tile<C, D, KT, SIMT_THREADS>(k_tiles + next * KT * D, v_tiles + next * KT * D, D, k_cache, v_cache,
                                                 table, block_size, kv_heads, kv_head, kv_lo + (t + 1) * KT, kv_hi);
        }
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        const C *k_tile = k_tiles + (t & 1) * KT * D;
        const C *v_tile = v_tiles + (t & 1) * KT * D;
        const int tile_start = kv_lo + t * KT;

        // Scores: group `grp` takes keys grp, grp + NG, ...
#pragma unroll
        for (int j = 0; j < KPG; ++j) {
            const int key = j * NG + grp;
            float kf[VEC];
            if (lane_d < CH) {
                CacheChunk<C>::to_f32(k_tile + key * D + lane_d * VEC, kf);
            } else {
#pragma unroll
                for (int i = 0; i < VEC; ++i) kf[i] = 0.f;
            }
            float dot[RT];
#pragma unroll
            for (int r = 0; r < RT; ++r) {
                dot[r] = 0.f;
#pragma unroll
                for (int i = 0; i < VEC; ++i) dot[r] += qv[r][i] * kf[i];
            }
#pragma unroll
            for (int offset = DX / 2; offset > 0; offset >>= 1)
#pragma unroll
                for (int r = 0; r < RT; ++r) dot[r] += __shfl_xor_sync(FULL_MASK, dot[r], offset);
            if (lane_d == 0) {
                const int pos = tile_start + key;
#pragma unroll
                for (int r = 0; r < RT; ++r) {
                    const bool seen = pos < kv_hi && visible(pos, row_pos[r], window);
                    s_tile[r][key] = seen ? soft_cap(dot[r], softcap_log2) : -INFINITY;
                }
            }
        }
        __syncthreads();

        // Online softmax, one warp per row.
        for (int r = warp; r < nrows; r += NW) {
            constexpr int PER_LANE = (KT + 31) / 32;
            float sv[PER_LANE];
            float tile_max = -INFINITY;
#pragma unroll
            for (int c = 0; c < PER_LANE; ++c) {
                const int k = lane + 32 * c;
                sv[c] = k < KT ? s_tile[r][k] : -INFINITY;
                tile_max = fmaxf(tile_max, sv[c]);
            }
            tile_max = warp_max(tile_max);
            const float old_max = row_max[r];
            const float new_max = fmaxf(old_max, tile_max);
            float tile_sum = 0.f;
#pragma unroll
            for (int c = 0; c < PER_LANE; ++c) {
                const int k = lane + 32 * c;
                const float p = new_max == -INFINITY ? 0.f : exp2f(sv[c] - new_max);
                if (k < KT) s_tile[r][k] = p;
                tile_sum += p;
            }
            tile_sum = warp_sum(tile_sum);
            if (lane == 0) {
                const float alpha = new_max == -INFINITY ? 1.f : exp2f(old_max - new_max);
                row_scale[r] = alpha;
                row_sum[r] = row_sum[r] * alpha + tile_sum;
                row_max[r] = new_max;
            }
        }
        __syncthreads();

        // Output: rescale, then add this tile's P.V for the group's keys.
#pragma unroll
        for (int r = 0; r < RT; ++r) {
            if (r < nrows) {
                const float alpha = row_scale[r];
#pragma unroll
                for (int i = 0; i < VEC; ++i) acc_o[r][i] *= alpha;
            }
        }
#pragma unroll
        for (int j = 0; j < KPG; ++j) {
            const int key = j * NG + grp;
            float vf[VEC];
            if (lane_d < CH) {
                CacheChunk<C>::to_f32(v_tile + key * D + lane_d * VEC, vf);
            } else {
#pragma unroll
                for (int i = 0; i < VEC; ++i) vf[i] = 0.f;
            }
#pragma unroll
            for (int r = 0; r < RT; ++r) {
                if (r < nrows) {
                    const float p = s_tile[r][key];
#pragma unroll
                    for (int i = 0; i < VEC; ++i) acc_o[r][i] += p * vf[i];
                }
            }
        }
        __syncthreads();  // the stage just read is refilled by the next iteration's loads
    }
    cp_async_wait<0>();
    __syncthreads();

    // Sum the groups: first the groups of a warp (lanes DX apart), then the warps.
#pragma unroll
    for (int offset = DX; offset < 32; offset <<= 1)
#pragma unroll
        for (int r = 0; r < RT; ++r)
#pragma unroll
            for (int i = 0; i < VEC; ++i) acc_o[r][i] += __shfl_xor_sync(FULL_MASK, acc_o[r][i], offset);
    if (lane < DX && lane_d < CH) {
#pragma unroll
        for (int r = 0; r < RT; ++r) {
            if (r < nrows) {
#pragma unroll
                for (int i = 0; i < VEC; ++i) o_partial[(warp * RT + r) * D + lane_d * VEC + i] = acc_o[r][i];
            }
        }
    }
    __syncthreads();

    // The V scale (and widening factor) of an FP8 cache; 1 for a float cache, leaving o / sum.
    const float out_scale = v_scale * CacheChunk<C>::FACTOR;
    for (int idx = tid; idx < nrows * D; idx += SIMT_THREADS) {
        const int r = idx / D, d = idx % D;
        float o = 0.f;
#pragma unroll
        for (int w = 0; w < NW; ++w) o += o_partial[(w * RT + r) * D + d];
        const float sum = row_sum[r];
        const float value = sum > 0.f ? o / sum * out_scale : 0.f;
        if (it.num_splits == 1) {
            const long long tok = it.tok0 + r / it.head_cnt;
            const int head = kv_head * group + it.head_lo + r % it.head_cnt;
            out[(tok * q_heads + head) * D + d] = Float<T>::from_f32(value);
        } else {
            const long long pr = partial_row(it, kv_heads, kv_head, r);
            part_o[pr * D + d] = value;
            if (d == 0) part_lse[pr] = sum > 0.f ? row_max[r] + log2f(sum) : -INFINITY;
        }
    }
}

}  // namespace pagoda

#define PAGODA_ATTENTION_SIMT(suffix, T, C, D, RT)                                                                   \
    extern "C" __global__ void __launch_bounds__(pagoda::SIMT_THREADS) pagoda_paged_attention_simt_##suffix(         \
        const pagoda::WorkItem *items, const T *q, long long q_row_stride, const C *k_cache, const C *v_cache,        \
        const uint32_t *block_tables, int max_blocks_per_seq, int block_size, int kv_heads, int group,               \
        float scale_log2, int window, float softcap_log2, float v_scale, T *out, float *part_o, float *part_lse,     \
        const uint32_t *context_lens) {                                                                              \
        pagoda::paged_attention_simt<T, C, D, RT>(items, q, q_row_stride, k_cache, v_cache, block_tables,           \
                                                  max_blocks_per_seq, block_size, kv_heads, group, scale_log2,       \
                                                  window, softcap_log2, v_scale, out, part_o, part_lse,              \
                                                  context_lens);                                                     \
    }                                                                                                                \
    PAGODA_ENTRY(pagoda_paged_attention_simt_##suffix)

#define PAGODA_ATTENTION_SIMT_ROWS(dt, T, C, D) \
    PAGODA_ATTENTION_SIMT(dt##_d##D##_r4, T, C, D, 4) \
    PAGODA_ATTENTION_SIMT(dt##_d##D##_r8, T, C, D, 8)

#define PAGODA_ATTENTION_SIMT_DIMS(dt, T, C)   \
    PAGODA_ATTENTION_SIMT_ROWS(dt, T, C, 16)  \
    PAGODA_ATTENTION_SIMT_ROWS(dt, T, C, 32)  \
    PAGODA_ATTENTION_SIMT_ROWS(dt, T, C, 64)  \
    PAGODA_ATTENTION_SIMT_ROWS(dt, T, C, 80)  \
    PAGODA_ATTENTION_SIMT_ROWS(dt, T, C, 96)  \
    PAGODA_ATTENTION_SIMT_ROWS(dt, T, C, 128)

PAGODA_ATTENTION_SIMT_DIMS(f32, float, float)
PAGODA_ATTENTION_SIMT_DIMS(f16, pagoda::f16, pagoda::f16)
PAGODA_ATTENTION_SIMT_DIMS(bf16, pagoda::bf16, pagoda::bf16)
// Head dim 256 (Gemma) in half precision only: an f32 row is 64 chunks, past one warp's lanes.
PAGODA_ATTENTION_SIMT_ROWS(f16, pagoda::f16, pagoda::f16, 256)
PAGODA_ATTENTION_SIMT_ROWS(bf16, pagoda::bf16, pagoda::bf16, 256)
// Over an FP8 cache: the same head dims for each query type.
PAGODA_ATTENTION_SIMT_DIMS(f32_fp8, float, pagoda::fp8_e4m3)
PAGODA_ATTENTION_SIMT_DIMS(f16_fp8, pagoda::f16, pagoda::fp8_e4m3)
PAGODA_ATTENTION_SIMT_DIMS(bf16_fp8, pagoda::bf16, pagoda::fp8_e4m3)
PAGODA_ATTENTION_SIMT_ROWS(f16_fp8, pagoda::f16, pagoda::fp8_e4m3, 256)
PAGODA_ATTENTION_SIMT_ROWS(bf16_fp8, pagoda::bf16, pagoda::fp8_e4m3, 256)

// Merges the partial results of split-KV attention items (flash-decoding): each split saw a
// slice of the keys and left its normalised output and log-sum-exp (base 2) per row; the
// merged row is the lse-weighted average of the splits.
//
// Launch: grid (num_groups, num_kv_heads), block 128 threads; one block per split group (the
// work item with split 0 describes it) and kv head, one warp per row, lanes over splits for the
// weights and over head_dim (four floats each) for the sum.
#include "attention.cuh"

namespace pagoda {

constexpr int COMBINE_THREADS = 128;
constexpr int COMBINE_UNROLL = 8;

// acc += 2^(lse - lse_max) * o, skipping splits that saw no key.
__device__ __forceinline__ void add_weighted(float4 &acc, float lse, float lse_max, const float4 &o) {
    if (lse == -INFINITY) return;
    const float w = exp2f(lse - lse_max);
    acc.x += w * o.x;
    acc.y += w * o.y;
    acc.z += w * o.z;
    acc.w += w * o.w;
}

template <typename T>
__device__ __forceinline__ void attention_combine(const WorkItem *__restrict__ groups, const float *__restrict__ part_o,
                                                  const float *__restrict__ part_lse, T *__restrict__ out, int kv_heads,
                                                  int group, int head_dim) {
    const WorkItem first = groups[blockIdx.x];
    const int kv_head = blockIdx.y;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int nrows = (int)(first.ntok * first.head_cnt);
    const int num_splits = (int)first.num_splits;
    const int q_heads = kv_heads * group;
    for (int r = warp; r < nrows; r += COMBINE_THREADS / 32) {
        WorkItem it = first;
        float lse_max = -INFINITY;
        for (int s = lane; s < num_splits; s += 32) {
            it.split = s;
            lse_max = fmaxf(lse_max, part_lse[partial_row(it, kv_heads, kv_head, r)]);
        }
        lse_max = warp_max(lse_max);
        float weight_sum = 0.f;
        for (int s = lane; s < num_splits; s += 32) {
            it.split = s;
            const float lse = part_lse[partial_row(it, kv_heads, kv_head, r)];
            weight_sum += lse_max == -INFINITY ? 0.f : exp2f(lse - lse_max);
        }
        weight_sum = warp_sum(weight_sum);
        const long long tok = first.tok0 + r / first.head_cnt;
        const int head = kv_head * group + first.head_lo + r % first.head_cnt;
        T *dst = out + (tok * q_heads + head) * head_dim;
        // Lanes over head_dim in 4-float chunks (head_dim is a multiple of 4); the splits are
        // visited COMBINE_UNROLL at a time, every load issued before any is used, so a lane keeps
        // that many L2 reads in flight instead of one. Each element still sums its splits in
        // ascending order.
        for (int c = lane; c < head_dim / 4; c += 32) {
            float4 acc = {0.f, 0.f, 0.f, 0.f};
            int s = 0;
            for (; s + COMBINE_UNROLL <= num_splits; s += COMBINE_UNROLL) {
                float lse[COMBINE_UNROLL];
                float4 o[COMBINE_UNROLL];
#pragma unroll
                for (int u = 0; u < COMBINE_UNROLL; ++u) {
                    it.split = s + u;
                    const long long pr = partial_row(it, kv_heads, kv_head, r);
                    lse[u] = part_lse[pr];
                    o[u] = reinterpret_cast<const float4 *>(part_o + pr * head_dim)[c];
                }
#pragma unroll
                for (int u = 0; u < COMBINE_UNROLL; ++u) add_weighted(acc, lse[u], lse_max, o[u]);
            }
            for (; s < num_splits; ++s) {
                it.split = s;
                const long long pr = partial_row(it, kv_heads, kv_head, r);
                add_weighted(acc, part_lse[pr], lse_max, reinterpret_cast<const float4 *>(part_o + pr * head_dim)[c]);
            }
            const bool any = weight_sum > 0.f;
            dst[4 * c + 0] = Float<T>::from_f32(any ? acc.x / weight_sum : 0.f);
            dst[4 * c + 1] = Float<T>::from_f32(any ? acc.y / weight_sum : 0.f);
            dst[4 * c + 2] = Float<T>::from_f32(any ? acc.z / weight_sum : 0.f);
            dst[4 * c + 3] = Float<T>::from_f32(any ? acc.w / weight_sum : 0.f);
        }
    }
}

}  // namespace pagoda

#define PAGODA_ATTENTION_COMBINE(suffix, T)                                                                          \
    extern "C" __global__ void __launch_bounds__(pagoda::COMBINE_THREADS) pagoda_attention_combine_##suffix(          \
        const pagoda::WorkItem *groups, const float *part_o, const float *part_lse, T *out, int kv_heads, int group,  \
        int head_dim) {                                                                                              \
        pagoda::attention_combine<T>(groups, part_o, part_lse, out, kv_heads, group, head_dim);                      \
    }                                                                                                                \
    PAGODA_ENTRY(pagoda_attention_combine_##suffix)

PAGODA_ATTENTION_COMBINE(f32, float)
PAGODA_ATTENTION_COMBINE(f16, pagoda::f16)
PAGODA_ATTENTION_COMBINE(bf16, pagoda::bf16)

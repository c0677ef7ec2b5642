// Merges the partial results of split-KV attention items (flash-decoding): each split saw a
// slice of the keys and left its normalised output and log-sum-exp (base 2) per row; the
// merged row is the lse-weighted average of the splits.
//
// Launch: grid (num_groups, num_kv_heads), block 128 threads; one block per split group (the
// work item with split 0 describes it) and kv head, one warp per row, lanes over splits for the
// weights and over head_dim for the sum.
#include "attention.cuh"

namespace pagoda {

constexpr int COMBINE_THREADS = 128;

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
        for (int d = lane; d < head_dim; d += 32) {
            float acc = 0.f;
            for (int s = 0; s < num_splits; ++s) {
                it.split = s;
                const long long pr = partial_row(it, kv_heads, kv_head, r);
                const float lse = part_lse[pr];
                if (lse != -INFINITY) acc += exp2f(lse - lse_max) * part_o[pr * head_dim + d];
            }
            dst[d] = Float<T>::from_f32(weight_sum > 0.f ? acc / weight_sum : 0.f);
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

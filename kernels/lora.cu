// lora_add: the LoRA delta of a step that mixes adapters (Punica's segmented gather, shrink then
// expand in one kernel). Row r of the output is base[r] + B_s (A_s x[r]) when r lies in segment
// s, else base[r]; A_s is [rank_s, in] and B_s is given transposed, [rank_s, out] (already
// scaled), row-major, in the storage dtype; math in f32.
//
// Segments: `segments` holds num_segments descriptors of 5 int64 each, ascending and disjoint:
// (first row, rows, rank, address of A, address of B).
//
// Launch: one block per row (gridDim.x = rows), a whole number of warps; dynamic shared memory
// holds max_rank floats. Each warp reduces ranks k = warp, warp + warps, ... over `in` (lanes
// striding), then every thread expands output columns. A row's result depends only on its own
// input and adapter: the same bits in any batch.
#include "common.cuh"

namespace pagoda {

template <typename T>
__device__ __forceinline__ void lora_add(const T *__restrict__ base, const T *__restrict__ x, T *__restrict__ out,
                                         const long long *__restrict__ segments, int num_segments, int in,
                                         int width) {
    PAGODA_DYNAMIC_SMEM(smem);
    float *t = reinterpret_cast<float *>(smem);
    const long long row = blockIdx.x;
    const T *base_row = base + row * width;
    T *out_row = out + row * width;
    // The segment holding this row, if any (segments are few: a linear scan).
    int seg = -1;
    for (int s = 0; s < num_segments; ++s) {
        const long long first = segments[5 * s], rows = segments[5 * s + 1];
        if (row >= first && row < first + rows) seg = s;
    }
    if (seg < 0) {
        for (int j = threadIdx.x; j < width; j += blockDim.x) out_row[j] = base_row[j];
        return;
    }
    const int rank = (int)segments[5 * seg + 2];
    const T *a = reinterpret_cast<const T *>(segments[5 * seg + 3]);
    const T *b = reinterpret_cast<const T *>(segments[5 * seg + 4]);
    const T *x_row = x + row * in;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    for (int k = warp; k < rank; k += warps) {
        const T *a_row = a + (long long)k * in;
        float acc = 0.f;
        for (int i = lane; i < in; i += 32) acc += Float<T>::to_f32(x_row[i]) * Float<T>::to_f32(a_row[i]);
        acc = warp_sum(acc);
        if (lane == 0) t[k] = acc;
    }
    __syncthreads();
    for (int j = threadIdx.x; j < width; j += blockDim.x) {
        float acc = 0.f;
        for (int k = 0; k < rank; ++k) acc += t[k] * Float<T>::to_f32(b[(long long)k * width + j]);
        out_row[j] = Float<T>::from_f32(Float<T>::to_f32(base_row[j]) + acc);
    }
}

}  // namespace pagoda

#define PAGODA_LORA_ADD(suffix, T)                                                                                    \
    extern "C" __global__ void pagoda_lora_add_##suffix(const T *base, const T *x, T *out, const long long *segments, \
                                                        int num_segments, int in, int width) {                        \
        pagoda::lora_add<T>(base, x, out, segments, num_segments, in, width);                                         \
    }                                                                                                                 \
    PAGODA_ENTRY(pagoda_lora_add_##suffix)

PAGODA_LORA_ADD(f32, float)
PAGODA_LORA_ADD(f16, pagoda::f16)
PAGODA_LORA_ADD(bf16, pagoda::bf16)

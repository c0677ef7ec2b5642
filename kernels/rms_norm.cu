// rms_norm and add_rms_norm: y = x / sqrt(mean(x^2) + eps) * weight over each row, in f32.
//
// Launch: grid (rows), block 128..1024 threads (a multiple of 32), one row per block. Rows of
// x (and residual) may be strided; outputs are contiguous. add_rms_norm writes `normed` rows
// to out[0 .. rows*hidden) and `x + residual` (rounded to the dtype, then normalised) to
// out[rows*hidden .. 2*rows*hidden), like the CPU op's [2, ...] result.
#include "common.cuh"

namespace pagoda {

template <typename T, typename W>
__device__ __forceinline__ void normalize_row(const T *__restrict__ x, const W *__restrict__ weight,
                                              T *__restrict__ out, int hidden, float eps, float *scratch) {
    float sum_sq = 0.f;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        const float v = Float<T>::to_f32(x[i]);
        sum_sq += v * v;
    }
    sum_sq = block_sum(sum_sq, scratch);
    const float inv = rsqrtf(sum_sq / (float)hidden + eps);
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        out[i] = Float<T>::from_f32(Float<T>::to_f32(x[i]) * inv * Float<W>::to_f32(weight[i]));
    }
}

// Rows of up to NORM_REGS elements per thread stay in registers between the two passes, and
// every global load (row, residual, weight) is issued before the reduction waits: at one row
// per step (decode at batch 1) the kernel is a chain of memory latencies, not a stream.
constexpr int NORM_REGS = 8;

// normalize_row with the row already in registers (v[j] is element threadIdx.x + j*blockDim.x):
// the same sums in the same order, so the same bits.
template <typename T, typename W>
__device__ __forceinline__ void normalize_regs(const float (&v)[NORM_REGS], const W *__restrict__ weight,
                                               T *__restrict__ out, int hidden, float eps, float *scratch) {
    float w[NORM_REGS];
    float sum_sq = 0.f;
#pragma unroll
    for (int j = 0; j < NORM_REGS; ++j) {
        const int i = threadIdx.x + j * blockDim.x;
        w[j] = i < hidden ? Float<W>::to_f32(weight[i]) : 0.f;
        if (i < hidden) sum_sq += v[j] * v[j];
    }
    sum_sq = block_sum(sum_sq, scratch);
    const float inv = rsqrtf(sum_sq / (float)hidden + eps);
#pragma unroll
    for (int j = 0; j < NORM_REGS; ++j) {
        const int i = threadIdx.x + j * blockDim.x;
        if (i < hidden) out[i] = Float<T>::from_f32(v[j] * inv * w[j]);
    }
}

template <typename T, typename W>
__device__ __forceinline__ void rms_norm(const T *__restrict__ x, long long x_row_stride, const W *__restrict__ weight,
                                         T *__restrict__ out, int hidden, float eps) {
    __shared__ float scratch[32];
    const long long row = blockIdx.x;
    const T *xr = x + row * x_row_stride;
    if (hidden <= NORM_REGS * (int)blockDim.x) {
        float v[NORM_REGS];
#pragma unroll
        for (int j = 0; j < NORM_REGS; ++j) {
            const int i = threadIdx.x + j * blockDim.x;
            v[j] = i < hidden ? Float<T>::to_f32(xr[i]) : 0.f;
        }
        normalize_regs(v, weight, out + row * hidden, hidden, eps, scratch);
        return;
    }
    normalize_row(xr, weight, out + row * hidden, hidden, eps, scratch);
}

template <typename T, typename W>
__device__ __forceinline__ void add_rms_norm(const T *__restrict__ x, long long x_row_stride, const T *__restrict__ residual,
                                             long long r_row_stride, const W *__restrict__ weight, T *__restrict__ out,
                                             long long rows, int hidden, float eps) {
    __shared__ float scratch[32];
    const long long row = blockIdx.x;
    const T *xr = x + row * x_row_stride;
    const T *rr = residual + row * r_row_stride;
    T *summed = out + (rows + row) * hidden;
    if (hidden <= NORM_REGS * (int)blockDim.x) {
        float v[NORM_REGS];
#pragma unroll
        for (int j = 0; j < NORM_REGS; ++j) {
            const int i = threadIdx.x + j * blockDim.x;
            if (i < hidden) {
                // The sum rounded to the dtype, as stored, is what gets normalised.
                const T sum = Float<T>::from_f32(Float<T>::to_f32(xr[i]) + Float<T>::to_f32(rr[i]));
                summed[i] = sum;
                v[j] = Float<T>::to_f32(sum);
            } else {
                v[j] = 0.f;
            }
        }
        normalize_regs(v, weight, out + row * hidden, hidden, eps, scratch);
        return;
    }
    // Each thread later re-reads only the elements it wrote here, so no barrier is needed
    // between the two passes beyond the one inside the reduction.
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        summed[i] = Float<T>::from_f32(Float<T>::to_f32(xr[i]) + Float<T>::to_f32(rr[i]));
    }
    normalize_row(static_cast<const T *>(summed), weight, out + row * hidden, hidden, eps, scratch);
}

}  // namespace pagoda

#define PAGODA_RMS_NORM(suffix, T, W)                                                                               \
    extern "C" __global__ void pagoda_rms_norm_##suffix(const T *x, long long x_row_stride, const W *weight,         \
                                                        T *out, int hidden, float eps) {                             \
        pagoda::rms_norm<T, W>(x, x_row_stride, weight, out, hidden, eps);                                          \
    }                                                                                                                \
    PAGODA_ENTRY(pagoda_rms_norm_##suffix)                                                                           \
    extern "C" __global__ void pagoda_add_rms_norm_##suffix(const T *x, long long x_row_stride, const T *residual,   \
                                                            long long r_row_stride, const W *weight, T *out,         \
                                                            long long rows, int hidden, float eps) {                 \
        pagoda::add_rms_norm<T, W>(x, x_row_stride, residual, r_row_stride, weight, out, rows, hidden, eps);         \
    }                                                                                                                \
    PAGODA_ENTRY(pagoda_add_rms_norm_##suffix)

PAGODA_RMS_NORM(f32_f32, float, float)
PAGODA_RMS_NORM(f32_f16, float, pagoda::f16)
PAGODA_RMS_NORM(f32_bf16, float, pagoda::bf16)
PAGODA_RMS_NORM(f16_f32, pagoda::f16, float)
PAGODA_RMS_NORM(f16_f16, pagoda::f16, pagoda::f16)
PAGODA_RMS_NORM(f16_bf16, pagoda::f16, pagoda::bf16)
PAGODA_RMS_NORM(bf16_f32, pagoda::bf16, float)
PAGODA_RMS_NORM(bf16_f16, pagoda::bf16, pagoda::f16)
PAGODA_RMS_NORM(bf16_bf16, pagoda::bf16, pagoda::bf16)

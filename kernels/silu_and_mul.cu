// silu_and_mul: out = silu(gate) * up elementwise, silu(g) = g / (1 + e^-g), in f32.
//
// Launch: 1-D grid of 256-thread blocks striding over rows * width elements. Rows of gate and
// up may be strided (halves of a fused projection); the output is contiguous.
#include "common.cuh"

namespace pagoda {

template <typename T>
__device__ __forceinline__ void silu_and_mul(const T *__restrict__ gate, long long gate_row_stride, const T *__restrict__ up,
                                             long long up_row_stride, T *__restrict__ out, long long rows, int width) {
    const long long n = rows * width;
    const long long step = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        const long long r = i / width, c = i % width;
        const float g = Float<T>::to_f32(gate[r * gate_row_stride + c]);
        const float u = Float<T>::to_f32(up[r * up_row_stride + c]);
        out[i] = Float<T>::from_f32(g / (1.f + expf(-g)) * u);
    }
}

}  // namespace pagoda

#define PAGODA_SILU_AND_MUL(suffix, T)                                                                              \
    extern "C" __global__ void pagoda_silu_and_mul_##suffix(const T *gate, long long gate_row_stride, const T *up,   \
                                                            long long up_row_stride, T *out, long long rows,        \
                                                            int width) {                                            \
        pagoda::silu_and_mul<T>(gate, gate_row_stride, up, up_row_stride, out, rows, width);                        \
    }                                                                                                               \
    PAGODA_ENTRY(pagoda_silu_and_mul_##suffix)

PAGODA_SILU_AND_MUL(f32, float)
PAGODA_SILU_AND_MUL(f16, pagoda::f16)
PAGODA_SILU_AND_MUL(bf16, pagoda::bf16)

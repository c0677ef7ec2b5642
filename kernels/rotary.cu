// rotary_embedding: rotates each head's pairs by the angle of its token's position.
//
// Launch: grid (num_tokens), any block size (the host gives about four pairs per thread);
// threads walk the token's (head, pair) items. Input token rows may be strided; the output
// is contiguous [num_tokens, num_heads, head_dim].
// `interleaved` pairs (2i, 2i+1) (GGUF), otherwise (i, i + head_dim/2) (Hugging Face). A
// position >= max_positions is never read: its row is written as NaN so the error shows.
#include "common.cuh"

namespace pagoda {

template <typename T>
__device__ __forceinline__ void rotary(const T *__restrict__ x, long long x_row_stride, const uint32_t *__restrict__ positions,
                                       const float *__restrict__ cos_table, const float *__restrict__ sin_table,
                                       int max_positions, T *__restrict__ out, int num_heads, int head_dim, int interleaved) {
    const long long t = blockIdx.x;
    const int half = head_dim / 2;
    const uint32_t pos = positions[t];
    const bool in_range = pos < (uint32_t)max_positions;
    const T *src = x + t * x_row_stride;
    T *dst = out + t * (long long)num_heads * head_dim;
    const float *c = cos_table + (long long)pos * half;
    const float *s = sin_table + (long long)pos * half;
    for (int item = threadIdx.x; item < num_heads * half; item += blockDim.x) {
        const int h = item / half, i = item % half;
        const int ia = h * head_dim + (interleaved ? 2 * i : i);
        const int ib = h * head_dim + (interleaved ? 2 * i + 1 : i + half);
        if (!in_range) {
            dst[ia] = Float<T>::from_f32(__int_as_float(0x7fc00000));
            dst[ib] = Float<T>::from_f32(__int_as_float(0x7fc00000));
            continue;
        }
        const float a = Float<T>::to_f32(src[ia]), b = Float<T>::to_f32(src[ib]);
        dst[ia] = Float<T>::from_f32(a * c[i] - b * s[i]);
        dst[ib] = Float<T>::from_f32(a * s[i] + b * c[i]);
    }
}

}  // namespace pagoda

#define PAGODA_ROTARY(suffix, T)                                                                                    \
    extern "C" __global__ void pagoda_rotary_##suffix(const T *x, long long x_row_stride, const uint32_t *positions, \
                                                      const float *cos_table, const float *sin_table,               \
                                                      int max_positions, T *out, int num_heads, int head_dim,       \
                                                      int interleaved) {                                            \
        pagoda::rotary<T>(x, x_row_stride, positions, cos_table, sin_table, max_positions, out, num_heads,          \
                          head_dim, interleaved);                                                                   \
    }                                                                                                               \
    PAGODA_ENTRY(pagoda_rotary_##suffix)

PAGODA_ROTARY(f32, float)
PAGODA_ROTARY(f16, pagoda::f16)
PAGODA_ROTARY(bf16, pagoda::bf16)

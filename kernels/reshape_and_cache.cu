// reshape_and_cache: copies each new token's K (or V) row into its slot of the paged cache.
//
// Launch: grid (num_tokens), block 128; one call per cache (K, then V). The copy into a float
// cache is dtype-agnostic: rows are moved as bytes, 16 at a time when source, destination and
// row length allow it, else 2 at a time (every float storage dtype is a multiple of 2 bytes).
// An FP8 cache (the `_fp8_<src>` entries) stores each value times the reciprocal of the
// cache's scale, encoded as the nearest e4m3 code (fp8.cuh): the CPU op's bits.
#include "fp8.cuh"

namespace pagoda {

__device__ __forceinline__ void copy_row(unsigned char *dst, const unsigned char *src, int row_bytes) {
    const bool wide = ((reinterpret_cast<unsigned long long>(dst) | reinterpret_cast<unsigned long long>(src) |
                        (unsigned long long)row_bytes) &
                       15ull) == 0;
    if (wide) {
        uint4 *d = reinterpret_cast<uint4 *>(dst);
        const uint4 *s = reinterpret_cast<const uint4 *>(src);
        for (int i = threadIdx.x; i < row_bytes / 16; i += blockDim.x) d[i] = s[i];
    } else {
        unsigned short *d = reinterpret_cast<unsigned short *>(dst);
        const unsigned short *s = reinterpret_cast<const unsigned short *>(src);
        for (int i = threadIdx.x; i < row_bytes / 2; i += blockDim.x) d[i] = s[i];
    }
}

}  // namespace pagoda

// `src` row t starts `src_row_stride_bytes` after row t-1; slot s of `cache` starts at byte
// s * row_bytes. A slot >= num_slots is skipped (the host validates slots; the kernel never
// writes outside the cache).
extern "C" __global__ void __launch_bounds__(128)
    pagoda_reshape_and_cache(const unsigned char *__restrict__ src, long long src_row_stride_bytes,
                             unsigned char *__restrict__ cache, const uint32_t *__restrict__ slot_mapping,
                             int row_bytes, long long num_slots) {
    const long long t = blockIdx.x;
    const unsigned long long slot = slot_mapping[t];
    if (slot >= (unsigned long long)num_slots) return;
    pagoda::copy_row(cache + slot * (unsigned long long)row_bytes, src + t * src_row_stride_bytes, row_bytes);
}
PAGODA_ENTRY(pagoda_reshape_and_cache)

namespace pagoda {

template <typename T>
__device__ __forceinline__ void reshape_and_cache_fp8(const T *__restrict__ src, long long src_row_stride,
                                                      uint8_t *__restrict__ cache, const uint32_t *__restrict__ slot_mapping,
                                                      int row_len, long long num_slots, float inv_scale) {
    const long long t = blockIdx.x;
    const unsigned long long slot = slot_mapping[t];
    if (slot >= (unsigned long long)num_slots) return;
    const T *row = src + t * src_row_stride;
    uint8_t *dst = cache + slot * (unsigned long long)row_len;
    for (int i = threadIdx.x; i < row_len; i += blockDim.x) {
        dst[i] = (uint8_t)fp8_encode(mul_rn(Float<T>::to_f32(row[i]), inv_scale));
    }
}

}  // namespace pagoda

// `src` row t starts `src_row_stride` elements after row t-1; slot s of `cache` (one byte a
// code) starts at s * row_len. Slots >= num_slots are skipped, as above.
#define PAGODA_RESHAPE_AND_CACHE_FP8(suffix, T)                                                                   \
    extern "C" __global__ void __launch_bounds__(128) pagoda_reshape_and_cache_fp8_##suffix(                      \
        const T *src, long long src_row_stride, uint8_t *cache, const uint32_t *slot_mapping, int row_len,        \
        long long num_slots, float inv_scale) {                                                                   \
        pagoda::reshape_and_cache_fp8<T>(src, src_row_stride, cache, slot_mapping, row_len, num_slots, inv_scale); \
    }                                                                                                             \
    PAGODA_ENTRY(pagoda_reshape_and_cache_fp8_##suffix)

PAGODA_RESHAPE_AND_CACHE_FP8(f32, float)
PAGODA_RESHAPE_AND_CACHE_FP8(f16, pagoda::f16)
PAGODA_RESHAPE_AND_CACHE_FP8(bf16, pagoda::bf16)

// reshape_and_cache: copies each new token's K (or V) row into its slot of the paged cache.
//
// Launch: grid (num_tokens), block 128; one call per cache (K, then V). The copy is
// dtype-agnostic: rows are moved as bytes, 16 at a time when source, destination and row
// length allow it, else 2 at a time (every storage dtype is a multiple of 2 bytes).
#include "common.cuh"

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

// skinny_matmul: out[m][n] = sum_k x[m][k] * w[n][k] for a few rows of x (16 per block), 16-bit
// storage, f32 accumulation on tensor cores. The decode-step projections: at one to eight tokens
// a step reads every weight once and multiplies it by almost nothing, so the kernel's job is to
// keep enough of W's bytes in flight, not to reuse them.
//
// Each mma.m16n8k16 takes 16 rows of W as its A operand and 8 rows of x, transposed, as B, so
// the batch sits in the tile's 8 columns (cuBLAS needs M >= 64 for a full tile). The dot product
// is free to visit k in any order as long as A and B agree, so a lane fetches 16 contiguous bytes
// (8 elements) of each of its W rows and of its x row per chunk of 32 elements, and hands them to
// two mmas as fragments (below): no ldmatrix, no shuffles.
//
// The fetches go global -> shared with cp.async into a ring per warp: STAGES fetches in flight,
// each of GROUP consecutive chunks (so a row's GROUP * 64 bytes are asked for together). A lane
// only ever reads back its own 16-byte slots, so the ring needs no barrier; its refill waits on
// cp.async commit groups alone.
//
// Launch: grid (ceil(N / 16), ceil(M / (8 * TILES))), `warps` warps per block (blockDim.x = 32 * warps), dynamic shared
// memory `warps * STAGES * GROUP * (2 + TILES) * 512` bytes. Block b computes features
// 16b..16b+15 for the 8 * TILES rows of x of its grid row (batch-invariant models send every
// step's rows this way, reading W once per grid row); warp w of it takes a contiguous range of the K / (32 * GROUP)
// fetches, and the block adds the warps' partial tiles in warp order. Nothing depends on M: a
// row's result is the same bits whatever the other rows are (and whichever tile count serves
// it), given N, K and the spread.
//
// Requirements (checked by the launch builder): K % (32 * GROUP) == 0; rows of x and w 16-byte
// aligned.
#include "common.cuh"

namespace pagoda {

// 16 bytes global -> shared, asynchronously, zero-filled when `valid` is false. Unlike
// cp_async_16 these helpers are compiler barriers for memory: a lane reads back only its own
// copies, with no __syncthreads in between to order the ring's reads and refills.
__device__ __forceinline__ void skinny_copy_16(void *smem_dst, const void *gmem_src, bool valid) {
#ifdef PAGODA_SIM
    sim::copy16(smem_dst, gmem_src, valid);
#else
    const unsigned dst = (unsigned)__cvta_generic_to_shared(smem_dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem_src), "r"(valid ? 16 : 0)
                 : "memory");
#endif
}

__device__ __forceinline__ void skinny_commit() {
#ifndef PAGODA_SIM
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

template <int N> __device__ __forceinline__ void skinny_wait() {
#ifndef PAGODA_SIM
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

// TILES tiles of 8 rows of x (M <= 8 * TILES); STAGES stages of GROUP chunks of 32 elements in
// flight per warp (a stage's chunks are fetched together: GROUP * 64 contiguous bytes of a row).
template <typename T, int TILES, int STAGES, int GROUP>
__device__ __forceinline__ void skinny_matmul(const T *__restrict__ x, long long x_row_stride, const T *__restrict__ w,
                                              long long w_row_stride, T *__restrict__ out, long long out_row_stride,
                                              int m, int n, int k) {
    PAGODA_DYNAMIC_SMEM(smem_raw);
    // 16-byte pieces per lane and chunk: two W rows, then TILES x rows.
    constexpr int PIECES = 2 + TILES;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    // The mma fragments' "group" of a lane is the tile row it holds; `lane_row` here, since
    // GROUP counts chunks per fetch.
    const int quad = lane % 4, lane_row = lane / 4;
    const int n0 = blockIdx.x * 16;
    // This warp's ring: [stage][piece][lane], 16 bytes each, so a warp's read of one piece is
    // 512 contiguous bytes (no bank conflicts).
    uint4 *ring = reinterpret_cast<uint4 *>(smem_raw) + (long long)warp * STAGES * GROUP * PIECES * 32;

    // This lane's two W rows (lane_row and lane_row + 8 of the block's 16) and TILES x rows. Rows
    // past the end read as zeros (the copy still needs a valid address: row 0).
    const bool w_ok0 = n0 + lane_row < n, w_ok1 = n0 + lane_row + 8 < n;
    const T *w_row0 = w + (long long)(w_ok0 ? n0 + lane_row : 0) * w_row_stride + quad * 8;
    const T *w_row1 = w + (long long)(w_ok1 ? n0 + lane_row + 8 : 0) * w_row_stride + quad * 8;
    const T *x_rows[TILES];
    bool x_ok[TILES];
#pragma unroll
    for (int t = 0; t < TILES; ++t) {
        x_ok[t] = t * 8 + lane_row < m;
        x_rows[t] = x + (long long)(x_ok[t] ? t * 8 + lane_row : 0) * x_row_stride + quad * 8;
    }

    // This warp's fetches (GROUP chunks each): a contiguous range of K, the same for any M.
    const int fetches = k / (32 * GROUP);
    const int first = (int)((long long)fetches * warp / warps), last = (int)((long long)fetches * (warp + 1) / warps);

    auto fetch = [&](int f, int stage) {
#pragma unroll
        for (int j = 0; j < GROUP; ++j) {
            uint4 *slot = ring + (stage * GROUP + j) * PIECES * 32 + lane;
            const long long off = ((long long)f * GROUP + j) * 32;
            skinny_copy_16(slot, w_row0 + off, w_ok0);
            skinny_copy_16(slot + 32, w_row1 + off, w_ok1);
#pragma unroll
            for (int t = 0; t < TILES; ++t) skinny_copy_16(slot + (2 + t) * 32, x_rows[t] + off, x_ok[t]);
        }
    };

    float acc[TILES][4];
#pragma unroll
    for (int t = 0; t < TILES; ++t) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.f;

    // One cp.async commit group per fetch, committed even when empty, so that waiting for all
    // but STAGES - 1 commit groups always means "fetch f has landed".
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (first + s < last) fetch(first + s, s);
        skinny_commit();
    }
    for (int f = first; f < last; ++f) {
        const int i = f - first;
        if (f + STAGES - 1 < last) fetch(f + STAGES - 1, (i + STAGES - 1) % STAGES);
        skinny_commit();
        skinny_wait<STAGES - 1>();
#pragma unroll
        for (int j = 0; j < GROUP; ++j) {
            const uint4 *slot = ring + ((i % STAGES) * GROUP + j) * PIECES * 32 + lane;
            const uint4 wa = slot[0], wb = slot[32];
            // Lane (lane_row, quad) holds elements 8 * quad .. 8 * quad + 7 of the chunk. The first
            // mma reads registers .x (its columns 2q, 2q+1) and .y (columns 2q+8, 2q+9), the
            // second .z and .w: each of the chunk's 32 elements meets its x element exactly once.
            const uint32_t a_lo[4] = {wa.x, wb.x, wa.y, wb.y};
            const uint32_t a_hi[4] = {wa.z, wb.z, wa.w, wb.w};
#pragma unroll
            for (int t = 0; t < TILES; ++t) {
                const uint4 xv = slot[(2 + t) * 32];
                const uint32_t b_lo[2] = {xv.x, xv.y};
                const uint32_t b_hi[2] = {xv.z, xv.w};
                mma_16816<T>(acc[t], a_lo, b_lo);
                mma_16816<T>(acc[t], a_hi, b_hi);
            }
        }
    }
    skinny_wait<0>();
    // Every lane's copies have landed before any lane reuses the ring (a lane's partial tile
    // covers other lanes' slots when TILES = 2).
    __syncthreads();

    // The warps' partial tiles (each in its own ring, now idle), then one thread per output
    // element adds them in warp order.
    constexpr int TILE_FLOATS = 16 * 8 * TILES;
    float *partial = reinterpret_cast<float *>(smem_raw);
    const int ring_floats = STAGES * GROUP * PIECES * 32 * 4;
#pragma unroll
    for (int t = 0; t < TILES; ++t)
#pragma unroll
        for (int i = 0; i < 4; ++i) partial[warp * ring_floats + (lane * TILES + t) * 4 + i] = acc[t][i];
    __syncthreads();
    for (int e = threadIdx.x; e < TILE_FLOATS; e += blockDim.x) {
        const int l = e / (4 * TILES), t = (e / 4) % TILES, i = e % 4;
        // mma's D fragment: element i of lane l is row l/4 (+8 for i >= 2), column 2(l%4) + i%2.
        const int row = n0 + l / 4 + (i >= 2 ? 8 : 0);
        const int col = t * 8 + 2 * (l % 4) + i % 2;
        float sum = 0.f;
        for (int v = 0; v < warps; ++v) sum += partial[v * ring_floats + e];
        if (row < n && col < m) out[(long long)col * out_row_stride + row] = Float<T>::from_f32(sum);
    }
}

}  // namespace pagoda

#define PAGODA_SKINNY_MATMUL(suffix, T, TILES, STAGES, GROUP)                                        \
    extern "C" __global__ void pagoda_skinny_matmul_##suffix##_t##TILES##_s##STAGES##_g##GROUP(      \
        const T *x, long long x_row_stride, const T *w, long long w_row_stride, T *out,              \
        long long out_row_stride, int m, int n, int k) {                                              \
        /* Grid row y takes rows 8 * TILES * y onwards, as a launch of its own would. */              \
        const int first_row = (int)blockIdx.y * 8 * TILES;                                            \
        const int rows = m - first_row < 8 * TILES ? m - first_row : 8 * TILES;                       \
        pagoda::skinny_matmul<T, TILES, STAGES, GROUP>(x + (long long)first_row * x_row_stride,      \
                                                       x_row_stride, w, w_row_stride,                \
                                                       out + (long long)first_row * out_row_stride,  \
                                                       out_row_stride, rows, n, k);                  \
    }                                                                                                 \
    PAGODA_ENTRY(pagoda_skinny_matmul_##suffix##_t##TILES##_s##STAGES##_g##GROUP)

// The (stages, group) pairs the launch builder names: eight chunks in flight, fetched one, two
// or four at a time, and sixteen fetched four at a time.
#define PAGODA_SKINNY_MATMUL_SPREADS(suffix, T, TILES) \
    PAGODA_SKINNY_MATMUL(suffix, T, TILES, 8, 1)       \
    PAGODA_SKINNY_MATMUL(suffix, T, TILES, 4, 2)       \
    PAGODA_SKINNY_MATMUL(suffix, T, TILES, 2, 4)       \
    PAGODA_SKINNY_MATMUL(suffix, T, TILES, 4, 4)

PAGODA_SKINNY_MATMUL_SPREADS(f16, pagoda::f16, 1)
PAGODA_SKINNY_MATMUL_SPREADS(f16, pagoda::f16, 2)
PAGODA_SKINNY_MATMUL_SPREADS(bf16, pagoda::bf16, 1)
PAGODA_SKINNY_MATMUL_SPREADS(bf16, pagoda::bf16, 2)

// quant_matmul: out[m][n] = sum_k x[m][k] * w[n][k] for the few rows of a decode step, with W
// kept in GGUF block formats on the device and dequantized in registers; and quant_dequantize,
// W written out dense for the larger steps that cuBLAS multiplies.
//
// W is a `pagoda_ops::QuantizedWeight` as uploaded (crates/ops/src/matmul/device_quant.rs): per
// 32-element block, `CODE_WORDS` words of codes (Q8_0: 32 signed bytes; else 16 bytes, byte j
// holding element j in its low nibble and element j + 16 in its high one), `PLANES` words of
// high code bits (bit j of plane p is bit 4 + p of element j's code), `SCALES` f32 scales (one
// per 16 elements for Q6_K) and, for formats with minimums, one f32 minimum. Element j's value
// is `scale * (code - OFFSET) (+ min)`.
//
// Two ways to that value, by dtype and format:
// - exact (f16, and Q8_0 in bf16; always in quant_dequantize): computed as the CPU computes it
//   (a rounded product, then a rounded sum: no fused multiply-add), then rounded once to the
//   16-bit dtype, the numbers a dequantized copy of the weight holds;
// - packed (bf16, the 4- to 6-bit formats): two elements per register. A shift and a mask put
//   two codes q under the bf16 pattern of 128 (0x4300 | q is 128 + q exactly), a bf16x2
//   multiply-add takes off 128 + OFFSET (exact), and a second one applies the scale and the
//   minimum rounded to bf16, rounding once: within about 1.5 bf16 units of the exact value, in
//   half the instructions. Computing every element exactly bound the kernel by its
//   instructions, not by memory, on the 4-bit formats
//   (benches/reports/2026-11-28-quantized-cuda-h200.md).
//
// The matmul is skinny_matmul's tile turned to blocks: each mma.m16n8k16 takes 16 rows of W as
// A and 8 rows of x as B. A warp walks its range of K four blocks (128 elements) at a time;
// lane (row g, quad q) takes all 32 elements of block 4f + q for its W rows g and g + 8 and for
// x row g. The dot product may visit k in any order as long as A and B agree, so mma i of a
// block takes its elements 4i .. 4i + 3 from every quad, with no shuffles. Each warp loads
// DEPTH fetches before it multiplies any of them (or, pipelined, two groups of half as many
// in turn), so up to DEPTH * 4 blocks of each row are in flight.
//
// Launch: grid (ceil(N / 16)), `warps` warps per block (blockDim.x = 32 * warps), no dynamic
// shared memory; M <= 8, or up to 16 and 32 with the `_t2` and `_t4` entries (two and four
// tiles of x rows per fetch of W; warps * tiles <= 32). Warp w takes a contiguous range of the
// ceil(blocks_per_row / 4) fetches and the block adds the warps' tiles in warp order, so a
// row's result does not depend on M. Rows of x start on 16-byte boundaries. The `_pipelined`
// entries issue a group's loads before multiplying the group before it.
#include "common.cuh"

namespace pagoda {

// `pagoda_ops::QuantFormat`, in its order.
enum QuantFmt { Q4_0 = 0, Q4_1 = 1, Q5_0 = 2, Q8_0 = 3, Q4K = 4, Q5K = 5, Q6K = 6 };

template <int FMT> struct QuantLayout {
    static constexpr int CODE_WORDS = FMT == Q8_0 ? 8 : 4;
    static constexpr int PLANES = (FMT == Q5_0 || FMT == Q5K) ? 1 : (FMT == Q6K ? 2 : 0);
    static constexpr int SCALES = FMT == Q6K ? 2 : 1;
    static constexpr bool MINS = FMT == Q4_1 || FMT == Q4K || FMT == Q5K;
    static constexpr int OFFSET = FMT == Q4_0 ? 8 : (FMT == Q5_0 ? 16 : (FMT == Q6K ? 32 : 0));
    // Fetches a warp loads before multiplying: Q8_0's blocks are twice the bytes.
    static constexpr int DEPTH = FMT == Q8_0 ? 2 : 4;
};

// Device addresses of a weight's arrays (unused ones may be null).
struct QuantArrays {
    const uint32_t *codes;
    const uint32_t *high;
    const float *scales;
    const float *mins;
};

// One block of one W row, in registers.
template <int FMT> struct QBlock {
    using L = QuantLayout<FMT>;
    uint32_t codes[L::CODE_WORDS];
    uint32_t high[L::PLANES > 0 ? L::PLANES : 1];
    float scale[L::SCALES];
    float min;
};

// Block `block` (counted over the whole matrix) into `b`; zeros when `valid` is false.
template <int FMT> __device__ __forceinline__ void load_block(QBlock<FMT> &b, const QuantArrays &w, long long block,
                                                             bool valid) {
    using L = QuantLayout<FMT>;
    if (!valid) {
#pragma unroll
        for (int i = 0; i < L::CODE_WORDS; ++i) b.codes[i] = 0;
#pragma unroll
        for (int i = 0; i < (L::PLANES > 0 ? L::PLANES : 1); ++i) b.high[i] = 0;
#pragma unroll
        for (int i = 0; i < L::SCALES; ++i) b.scale[i] = 0.f;
        b.min = 0.f;
        return;
    }
#pragma unroll
    for (int i = 0; i < L::CODE_WORDS / 4; ++i) {
        const uint4 v = load_stream_16(w.codes + block * L::CODE_WORDS + 4 * i);
        b.codes[4 * i] = v.x;
        b.codes[4 * i + 1] = v.y;
        b.codes[4 * i + 2] = v.z;
        b.codes[4 * i + 3] = v.w;
    }
#pragma unroll
    for (int p = 0; p < L::PLANES; ++p) b.high[p] = w.high[block * L::PLANES + p];
    if (L::PLANES == 0) b.high[0] = 0;
#pragma unroll
    for (int s = 0; s < L::SCALES; ++s) b.scale[s] = w.scales[block * L::SCALES + s];
    b.min = L::MINS ? w.mins[block] : 0.f;
}

// Element e of the block, exactly as the CPU dequantizes it.
template <int FMT> __device__ __forceinline__ float dequant(const QBlock<FMT> &b, int e) {
    using L = QuantLayout<FMT>;
    // The unsigned code goes into the mantissa of 2^23, and 2^23 plus the offset comes off:
    // float(code - offset) exactly, in two cheap instructions instead of an int-to-float
    // conversion (quarter rate). Q8_0's signed byte becomes byte + 128 by flipping its top bit.
    uint32_t q;
    float bias;
    if (FMT == Q8_0) {
        q = ((b.codes[e / 4] >> (8 * (e % 4))) & 0xFFu) ^ 0x80u;
        bias = 8388608.f + 128.f;
    } else {
        const int j = e % 16;
        q = (b.codes[j / 4] >> (8 * (j % 4) + 4 * (e / 16))) & 0xFu;
#pragma unroll
        for (int p = 0; p < L::PLANES; ++p) q |= ((b.high[p] >> e) & 1u) << (4 + p);
        bias = 8388608.f + (float)L::OFFSET;
    }
    const float code = __uint_as_float(0x4B000000u | q) - bias;
    // The product and the sum round once each, as on the CPU.
    const float scaled = mul_rn(L::SCALES == 2 ? b.scale[e / 16] : b.scale[0], code);
    return L::MINS ? add_rn(scaled, b.min) : scaled;
}

// Whether (T, FMT) takes the packed bf16 dequantization.
template <typename T, int FMT> struct PackedDequant {
    static constexpr bool value = false;
};
template <int FMT> struct PackedDequant<bf16, FMT> {
    static constexpr bool value = FMT != Q8_0;
};

// The bf16 pair of one block's elements e and e + 2 (e = 16 * half + 4 * word + odd), scaled:
// `scale2` and `min2` hold the scale (of e's half) and minimum twice, `neg_k2` -(128 + OFFSET).
template <int FMT>
__device__ __forceinline__ uint32_t packed_pair(const QBlock<FMT> &b, int word, int half, int odd, uint32_t scale2,
                                                uint32_t min2, uint32_t neg_k2) {
    using L = QuantLayout<FMT>;
    // After the shift, bits 0-3 and 16-19 hold the codes of elements e and e + 2: bytes
    // 4 * word + odd and 4 * word + odd + 2, their low nibbles for half 0, high for half 1.
    uint32_t q = (b.codes[word] >> (8 * odd + 4 * half)) & 0x000F000Fu;
    const int e = 16 * half + 4 * word + odd;
#pragma unroll
    for (int p = 0; p < L::PLANES; ++p) {
        const uint32_t t = b.high[p] >> e;
        q |= ((t & 1u) | ((t & 4u) << 14)) << (4 + p);
    }
    const uint32_t code2 = bf16x2_fma(q | 0x43004300u, 0x3F803F80u, neg_k2);
    return bf16x2_fma(code2, scale2, min2);
}

// One fetch of a lane: block 4f + quad of its two W rows and the same 32 elements of its x row
// in each of the TILES tiles of 8 x rows.
template <int FMT, int TILES> struct Fetch {
    QBlock<FMT> w0, w1;
    uint4 x[TILES][4];
};

// Where a lane's fetches come from.
template <typename T, int TILES> struct LaneRows {
    QuantArrays w;
    long long row0, row1;  // first block of the lane's W rows
    bool w_ok0, w_ok1;
    bool x_ok[TILES];
    const T *x_rows[TILES];
    int quad, blocks_per_row, last;  // `last`: one past the warp's last fetch
};

template <typename T, int FMT, int TILES>
__device__ __forceinline__ void load_fetch(Fetch<FMT, TILES> &g, const LaneRows<T, TILES> &r, int f) {
    const int block = 4 * f + r.quad;
    const bool valid = f < r.last && block < r.blocks_per_row;
    load_block(g.w0, r.w, r.row0 + block, valid && r.w_ok0);
    load_block(g.w1, r.w, r.row1 + block, valid && r.w_ok1);
    const uint4 zero = {0u, 0u, 0u, 0u};
#pragma unroll
    for (int t = 0; t < TILES; ++t)
#pragma unroll
        for (int i = 0; i < 4; ++i)
            g.x[t][i] = valid && r.x_ok[t]
                            ? *reinterpret_cast<const uint4 *>(r.x_rows[t] + (long long)block * 32 + 8 * i)
                            : zero;
}

// acc[t] += the fetch's 16 x 8 tile product with x tile t: eight mmas per tile, one per 4
// elements of the block, each W fragment dequantized once for all tiles.
template <typename T, int FMT, int TILES>
__device__ __forceinline__ void mma_fetch(float (&acc)[TILES][4], const Fetch<FMT, TILES> &g) {
    using L = QuantLayout<FMT>;
    if constexpr (PackedDequant<T, FMT>::value) {
        const uint32_t neg_k2 = pack2_rn<bf16>(-(128.f + L::OFFSET), -(128.f + L::OFFSET));
        uint32_t s0[2], s1[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const float x0 = g.w0.scale[L::SCALES == 2 ? h : 0], x1 = g.w1.scale[L::SCALES == 2 ? h : 0];
            s0[h] = pack2_rn<bf16>(x0, x0);
            s1[h] = pack2_rn<bf16>(x1, x1);
        }
        const uint32_t m0 = pack2_rn<bf16>(g.w0.min, g.w0.min), m1 = pack2_rn<bf16>(g.w1.min, g.w1.min);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            // mma i takes elements 4i .. 4i + 3 as the pairs (4i, 4i + 2) and (4i + 1, 4i + 3),
            // from code word i % 4, low nibbles for i < 4.
            const int word = i % 4, half = i / 4;
            const uint32_t a[4] = {
                packed_pair(g.w0, word, half, 0, s0[half], m0, neg_k2),
                packed_pair(g.w1, word, half, 0, s1[half], m1, neg_k2),
                packed_pair(g.w0, word, half, 1, s0[half], m0, neg_k2),
                packed_pair(g.w1, word, half, 1, s1[half], m1, neg_k2),
            };
#pragma unroll
            for (int t = 0; t < TILES; ++t) {
                // x words 2i and 2i + 1 hold elements (4i, 4i + 1) and (4i + 2, 4i + 3).
                const uint4 &v = g.x[t][i / 2];
                const uint32_t lo = i % 2 == 0 ? v.x : v.z, hi = i % 2 == 0 ? v.y : v.w;
                const uint32_t bx[2] = {(lo & 0xFFFFu) | (hi << 16), (lo >> 16) | (hi & 0xFFFF0000u)};
                mma_16816<T>(acc[t], a, bx);
            }
        }
    } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int e = 4 * i;
            const uint32_t a[4] = {
                pack2_rn<T>(dequant(g.w0, e), dequant(g.w0, e + 1)),
                pack2_rn<T>(dequant(g.w1, e), dequant(g.w1, e + 1)),
                pack2_rn<T>(dequant(g.w0, e + 2), dequant(g.w0, e + 3)),
                pack2_rn<T>(dequant(g.w1, e + 2), dequant(g.w1, e + 3)),
            };
#pragma unroll
            for (int t = 0; t < TILES; ++t) {
                // x elements 4i .. 4i + 3 of the block: words 2(i % 2) and 2(i % 2) + 1 of its
                // 16-byte piece i / 2.
                const uint4 &v = g.x[t][i / 2];
                const uint32_t bx[2] = {i % 2 == 0 ? v.x : v.z, i % 2 == 0 ? v.y : v.w};
                mma_16816<T>(acc[t], a, bx);
            }
        }
    }
}

// The most floats of warps' partial tiles a block keeps (16 KiB): warps * TILES <= 32.
#define PAGODA_QUANT_PARTIAL_FLOATS 4096

// TILES tiles of 8 rows of x (M <= 8 * TILES), read with each fetch of W. PIPELINED: two groups
// of DEPTH / 2 fetches, the next group's loads issued before the current group is multiplied
// (twice the registers of one group); otherwise DEPTH fetches loaded, then multiplied. With
// more than one tile, half the depth, so the tiles' x fit the registers.
template <typename T, int FMT, bool PIPELINED, int TILES>
__device__ __forceinline__ void quant_matmul(const T *__restrict__ x, long long x_row_stride, QuantArrays w,
                                             int blocks_per_row, T *__restrict__ out, long long out_row_stride, int m,
                                             int n) {
    using L = QuantLayout<FMT>;
    constexpr int DEPTH = TILES == 1 ? L::DEPTH : (L::DEPTH + 1) / 2;
    __shared__ float partial[PAGODA_QUANT_PARTIAL_FLOATS];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    const int lane_row = lane / 4;
    const int n0 = blockIdx.x * 16;

    LaneRows<T, TILES> r;
    r.w = w;
    r.quad = lane % 4;
    r.blocks_per_row = blocks_per_row;
    r.w_ok0 = n0 + lane_row < n;
    r.w_ok1 = n0 + lane_row + 8 < n;
    r.row0 = (long long)(r.w_ok0 ? n0 + lane_row : 0) * blocks_per_row;
    r.row1 = (long long)(r.w_ok1 ? n0 + lane_row + 8 : 0) * blocks_per_row;
#pragma unroll
    for (int t = 0; t < TILES; ++t) {
        r.x_ok[t] = t * 8 + lane_row < m;
        r.x_rows[t] = x + (long long)(r.x_ok[t] ? t * 8 + lane_row : 0) * x_row_stride;
    }

    const int fetches = (blocks_per_row + 3) / 4;
    const int first = (int)((long long)fetches * warp / warps);
    r.last = (int)((long long)fetches * (warp + 1) / warps);

    float acc[TILES][4];
#pragma unroll
    for (int t = 0; t < TILES; ++t) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.f;
    if constexpr (PIPELINED) {
        constexpr int HALF = DEPTH / 2 > 0 ? DEPTH / 2 : 1;
        Fetch<FMT, TILES> a[HALF], b[HALF];
#pragma unroll
        for (int d = 0; d < HALF; ++d) load_fetch(a[d], r, first + d);
        for (int f0 = first; f0 < r.last; f0 += 2 * HALF) {
#pragma unroll
            for (int d = 0; d < HALF; ++d) load_fetch(b[d], r, f0 + HALF + d);
#pragma unroll
            for (int d = 0; d < HALF; ++d) mma_fetch<T, FMT, TILES>(acc, a[d]);
#pragma unroll
            for (int d = 0; d < HALF; ++d) load_fetch(a[d], r, f0 + 2 * HALF + d);
#pragma unroll
            for (int d = 0; d < HALF; ++d) mma_fetch<T, FMT, TILES>(acc, b[d]);
        }
    } else {
        for (int f0 = first; f0 < r.last; f0 += DEPTH) {
            Fetch<FMT, TILES> g[DEPTH];
#pragma unroll
            for (int d = 0; d < DEPTH; ++d) load_fetch(g[d], r, f0 + d);
#pragma unroll
            for (int d = 0; d < DEPTH; ++d) mma_fetch<T, FMT, TILES>(acc, g[d]);
        }
    }

    // Each warp's tiles, [warp][tile][lane * 4 + i]; then one thread per output element adds
    // the warps' in warp order.
#pragma unroll
    for (int t = 0; t < TILES; ++t)
#pragma unroll
        for (int i = 0; i < 4; ++i) partial[(warp * TILES + t) * 128 + lane * 4 + i] = acc[t][i];
    __syncthreads();
    for (int e = threadIdx.x; e < 128 * TILES; e += blockDim.x) {
        const int t = e / 128, l = (e % 128) / 4, i = e % 4;
        // mma's D fragment: element i of lane l is row l/4 (+8 for i >= 2), column 2(l%4) + i%2.
        const int row = n0 + l / 4 + (i >= 2 ? 8 : 0);
        const int col = t * 8 + 2 * (l % 4) + i % 2;
        float sum = 0.f;
        for (int v = 0; v < warps; ++v) sum += partial[(v * TILES + t) * 128 + e % 128];
        if (row < n && col < m) out[(long long)col * out_row_stride + row] = Float<T>::from_f32(sum);
    }
}

// Every block of W written out as dense rows (`[rows, blocks_per_row * 32]`, 16-byte aligned),
// one thread per block, grid-stride.
template <typename T, int FMT>
__device__ __forceinline__ void quant_dequantize(QuantArrays w, long long blocks, T *__restrict__ out) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long block = (long long)blockIdx.x * blockDim.x + threadIdx.x; block < blocks; block += stride) {
        QBlock<FMT> b;
        load_block(b, w, block, true);
        // The block's 32 values in registers, then written in 16-byte stores.
        __align__(16) T values[32];
#pragma unroll
        for (int e = 0; e < 32; ++e) values[e] = Float<T>::from_f32(dequant(b, e));
        uint4 *dst = reinterpret_cast<uint4 *>(out + block * 32);
        const uint4 *src = reinterpret_cast<const uint4 *>(values);
#pragma unroll
        for (int i = 0; i < (int)(32 * sizeof(T) / 16); ++i) dst[i] = src[i];
    }
}

}  // namespace pagoda

#define PAGODA_QUANT_MATMUL_ENTRY(name, T, fmt, pipelined, tiles)                                     \
    extern "C" __global__ void name(const T *x, long long x_row_stride, const uint32_t *codes, const uint32_t *high, \
                                    const float *scales, const float *mins, int blocks_per_row, T *out,          \
                                    long long out_row_stride, int m, int n) {                                    \
        pagoda::quant_matmul<T, pagoda::fmt, pipelined, tiles>(x, x_row_stride,                                  \
                                                               pagoda::QuantArrays{codes, high, scales, mins},   \
                                                               blocks_per_row, out, out_row_stride, m, n);       \
    }                                                                                                            \
    PAGODA_ENTRY(name)

// One tile of rows (models' decode steps), plain and pipelined; two and four tiles (9 to 32
// rows, timed against the dequantized copy), plain.
#define PAGODA_QUANT_MATMUL(suffix, T, fmt)                                                       \
    PAGODA_QUANT_MATMUL_ENTRY(pagoda_quant_matmul_##suffix##_##fmt, T, fmt, false, 1)             \
    PAGODA_QUANT_MATMUL_ENTRY(pagoda_quant_matmul_##suffix##_##fmt##_pipelined, T, fmt, true, 1)  \
    PAGODA_QUANT_MATMUL_ENTRY(pagoda_quant_matmul_##suffix##_##fmt##_t2, T, fmt, false, 2)        \
    PAGODA_QUANT_MATMUL_ENTRY(pagoda_quant_matmul_##suffix##_##fmt##_t4, T, fmt, false, 4)

#define PAGODA_QUANT_DEQUANTIZE(suffix, T, fmt)                                                          \
    extern "C" __global__ void pagoda_quant_dequantize_##suffix##_##fmt(                                 \
        const uint32_t *codes, const uint32_t *high, const float *scales, const float *mins, long long blocks, \
        T *out) {                                                                                         \
        pagoda::quant_dequantize<T, pagoda::fmt>(pagoda::QuantArrays{codes, high, scales, mins}, blocks, out); \
    }                                                                                                     \
    PAGODA_ENTRY(pagoda_quant_dequantize_##suffix##_##fmt)

#define PAGODA_QUANT_FORMATS(X, suffix, T) \
    X(suffix, T, Q4_0)                     \
    X(suffix, T, Q4_1)                     \
    X(suffix, T, Q5_0)                     \
    X(suffix, T, Q8_0)                     \
    X(suffix, T, Q4K)                      \
    X(suffix, T, Q5K)                      \
    X(suffix, T, Q6K)

PAGODA_QUANT_FORMATS(PAGODA_QUANT_MATMUL, f16, pagoda::f16)
PAGODA_QUANT_FORMATS(PAGODA_QUANT_MATMUL, bf16, pagoda::bf16)
PAGODA_QUANT_FORMATS(PAGODA_QUANT_DEQUANTIZE, f32, float)
PAGODA_QUANT_FORMATS(PAGODA_QUANT_DEQUANTIZE, f16, pagoda::f16)
PAGODA_QUANT_FORMATS(PAGODA_QUANT_DEQUANTIZE, bf16, pagoda::bf16)

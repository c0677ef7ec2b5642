// quant_matmul: out[m][n] = sum_k x[m][k] * w[n][k] for the few rows of a decode step, with W
// kept in GGUF block formats on the device and dequantized in registers; and quant_dequantize,
// W written out dense for the larger steps that cuBLAS multiplies.
//
// W is a `pagoda_ops::QuantizedWeight` as uploaded (crates/ops/src/matmul/device_quant.rs): per
// 32-element block, `CODE_WORDS` words of codes (Q8_0: 32 signed bytes; else 16 bytes, byte j
// holding element j in its low nibble and element j + 16 in its high one), `PLANES` words of
// high code bits (bit j of plane p is bit 4 + p of element j's code), `SCALES` f32 scales (one
// per 16 elements for Q6_K) and, for formats with minimums, one f32 minimum. Element j's value
// is `scale * (code - OFFSET) (+ min)`, computed exactly as the CPU computes it (a rounded
// product, then a rounded sum: no fused multiply-add), then rounded once to the 16-bit dtype:
// the same numbers a dequantized bf16/f16 copy of the weight would hold.
//
// The matmul is skinny_matmul's tile turned to blocks: each mma.m16n8k16 takes 16 rows of W as
// A and 8 rows of x as B. A warp walks its range of K four blocks (128 elements) at a time;
// lane (row g, quad q) takes all 32 elements of block 4f + q for its W rows g and g + 8 and for
// x row g. The dot product may visit k in any order as long as A and B agree, so mma i of a
// block takes its elements 4i .. 4i + 3 from every quad, with no shuffles. Each warp loads
// DEPTH fetches before it multiplies any of them, so DEPTH * 4 blocks of each row are in flight.
//
// Launch: grid (ceil(N / 16)), `warps` warps per block (blockDim.x = 32 * warps), no dynamic
// shared memory; M <= 8. Warp w takes a contiguous range of the ceil(blocks_per_row / 4)
// fetches and the block adds the warps' tiles in warp order, so a row's result does not depend
// on M. Rows of x start on 16-byte boundaries.
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

template <typename T, int FMT>
__device__ __forceinline__ void quant_matmul(const T *__restrict__ x, long long x_row_stride, QuantArrays w,
                                             int blocks_per_row, T *__restrict__ out, long long out_row_stride, int m,
                                             int n) {
    using L = QuantLayout<FMT>;
    constexpr int DEPTH = L::DEPTH;
    // Up to 16 warps' partial tiles of 16 x 8 floats.
    __shared__ float partial[16 * 128];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    const int quad = lane % 4, lane_row = lane / 4;
    const int n0 = blockIdx.x * 16;

    const bool w_ok0 = n0 + lane_row < n, w_ok1 = n0 + lane_row + 8 < n;
    const long long row0 = (long long)(w_ok0 ? n0 + lane_row : 0) * blocks_per_row;
    const long long row1 = (long long)(w_ok1 ? n0 + lane_row + 8 : 0) * blocks_per_row;
    const bool x_ok = lane_row < m;
    const T *x_row = x + (long long)(x_ok ? lane_row : 0) * x_row_stride;

    const int fetches = (blocks_per_row + 3) / 4;
    const int first = (int)((long long)fetches * warp / warps), last = (int)((long long)fetches * (warp + 1) / warps);

    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    for (int f0 = first; f0 < last; f0 += DEPTH) {
        QBlock<FMT> b0[DEPTH], b1[DEPTH];
        uint4 xv[DEPTH][4];
#pragma unroll
        for (int d = 0; d < DEPTH; ++d) {
            const int block = 4 * (f0 + d) + quad;
            const bool valid = f0 + d < last && block < blocks_per_row;
            load_block(b0[d], w, row0 + block, valid && w_ok0);
            load_block(b1[d], w, row1 + block, valid && w_ok1);
            const uint4 zero = {0u, 0u, 0u, 0u};
#pragma unroll
            for (int i = 0; i < 4; ++i)
                xv[d][i] = valid && x_ok ? *reinterpret_cast<const uint4 *>(x_row + (long long)block * 32 + 8 * i)
                                         : zero;
        }
#pragma unroll
        for (int d = 0; d < DEPTH; ++d) {
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                const int e = 4 * i;
                const uint32_t a[4] = {
                    pack2_rn<T>(dequant(b0[d], e), dequant(b0[d], e + 1)),
                    pack2_rn<T>(dequant(b1[d], e), dequant(b1[d], e + 1)),
                    pack2_rn<T>(dequant(b0[d], e + 2), dequant(b0[d], e + 3)),
                    pack2_rn<T>(dequant(b1[d], e + 2), dequant(b1[d], e + 3)),
                };
                // x elements 4i .. 4i + 3 of the block: words 2(i % 2) and 2(i % 2) + 1 of
                // its 16-byte piece i / 2.
                const uint4 &v = xv[d][i / 2];
                const uint32_t bx[2] = {i % 2 == 0 ? v.x : v.z, i % 2 == 0 ? v.y : v.w};
                mma_16816<T>(acc, a, bx);
            }
        }
    }

#pragma unroll
    for (int i = 0; i < 4; ++i) partial[warp * 128 + lane * 4 + i] = acc[i];
    __syncthreads();
    for (int e = threadIdx.x; e < 128; e += blockDim.x) {
        const int l = e / 4, i = e % 4;
        // mma's D fragment: element i of lane l is row l/4 (+8 for i >= 2), column 2(l%4) + i%2.
        const int row = n0 + l / 4 + (i >= 2 ? 8 : 0);
        const int col = 2 * (l % 4) + i % 2;
        float sum = 0.f;
        for (int v = 0; v < warps; ++v) sum += partial[v * 128 + e];
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

#define PAGODA_QUANT_MATMUL(suffix, T, fmt)                                                              \
    extern "C" __global__ void pagoda_quant_matmul_##suffix##_##fmt(                                     \
        const T *x, long long x_row_stride, const uint32_t *codes, const uint32_t *high, const float *scales, \
        const float *mins, int blocks_per_row, T *out, long long out_row_stride, int m, int n) {          \
        pagoda::quant_matmul<T, pagoda::fmt>(x, x_row_stride, pagoda::QuantArrays{codes, high, scales, mins}, \
                                             blocks_per_row, out, out_row_stride, m, n);                 \
    }                                                                                                     \
    PAGODA_ENTRY(pagoda_quant_matmul_##suffix##_##fmt)

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

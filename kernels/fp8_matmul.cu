// fp8_matmul: out[m][n] = scale[n] * sum_k x[m][k] * e4m3(code[n][k]) for the few rows of a
// decode step, W kept as FP8 codes with a scale per row (`pagoda_ops::Fp8Weight`, uploaded by
// crates/ops/src/matmul/device_fp8.rs: the row-major codes, then the f32 scales); and
// fp8_dequantize, W written out dense for the larger steps that cuBLAS multiplies; and
// fp8_quantize, a dense weight turned into codes and scales on the device as a model loads.
//
// Codes become 16-bit floats by moving bits, exactly: a code's sign goes to the top of its
// half, its 7 exponent-and-mantissa bits under the 16-bit exponent, so an f16 holds the code's
// value times 2^-8 (both formats' exponent biases differ by 8) and a bf16 its value times
// 2^-120. The f16 factor folds into the row's scale at the end; the bf16 one is undone by an
// exact bf16x2 multiply by 2^120, since products near 2^-120 would underflow the f32 sums.
// Weights carry no subnormal codes (Fp8Weight never makes one), so no step meets a subnormal.
//
// The matmul is quant_matmul's tile: each mma.m16n8k16 takes 16 rows of W as A and 8 rows of x
// as B. A warp walks its range of K 64 elements at a time; lane (row g, quad q) loads 16 codes
// (16 bytes), elements 16q .. 16q + 15 of the 64, for its W rows g and g + 8, and the same
// elements of x row g (32 bytes). The dot product may visit k in any order as long as A and B
// agree, so mma j takes the lane's elements 4j .. 4j + 3 from every quad, with no shuffles.
// Each warp loads DEPTH fetches before it multiplies any of them.
//
// Launch: grid (ceil(N / 16)), `warps` warps per block (blockDim.x = 32 * warps), no dynamic
// shared memory; M <= 8, or up to 16 and 32 with the `_t2` and `_t4` entries (warps * tiles
// <= 32). K % 64 == 0; rows of x and the codes start on 16-byte boundaries. Warp w takes a
// contiguous range of the K / 64 fetches and the block adds the warps' tiles in warp order, so a
// row's result does not depend on M.
#include "fp8.cuh"

namespace pagoda {

// One fetch of one lane: 16 codes of each of its two W rows, and the same 16 elements of its x
// row of every tile.
template <int TILES> struct Fp8Fetch {
    uint4 w0, w1;
    uint4 x[TILES][2];
};

template <typename T, int TILES> struct Fp8LaneRows {
    const uint8_t *w0, *w1;  // the lane's W rows, at its quad's first code
    bool w_ok0, w_ok1;
    bool x_ok[TILES];
    const T *x_rows[TILES];  // at the quad's first element
    int last;                // one past the warp's last fetch
};

template <typename T, int TILES>
__device__ __forceinline__ void fp8_load(Fp8Fetch<TILES> &g, const Fp8LaneRows<T, TILES> &r, int f) {
    const bool valid = f < r.last;
    const uint4 zero = {0u, 0u, 0u, 0u};
    const long long off = (long long)f * 64;
    g.w0 = valid && r.w_ok0 ? load_stream_16(reinterpret_cast<const uint32_t *>(r.w0 + off)) : zero;
    g.w1 = valid && r.w_ok1 ? load_stream_16(reinterpret_cast<const uint32_t *>(r.w1 + off)) : zero;
#pragma unroll
    for (int t = 0; t < TILES; ++t)
#pragma unroll
        for (int i = 0; i < 2; ++i)
            g.x[t][i] = valid && r.x_ok[t] ? *reinterpret_cast<const uint4 *>(r.x_rows[t] + off + 8 * i) : zero;
}

__device__ __forceinline__ uint32_t word_of(const uint4 &v, int i) {
    return i == 0 ? v.x : (i == 1 ? v.y : (i == 2 ? v.z : v.w));
}

// acc[t] += the fetch's 16 x 8 tile product with x tile t: four mmas, mma j over the lane's
// elements 4j .. 4j + 3 (code word j; x words 2j and 2j + 1).
template <typename T, int TILES>
__device__ __forceinline__ void fp8_mma(float (&acc)[TILES][4], const Fp8Fetch<TILES> &g) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        uint32_t s0lo, s0hi, s1lo, s1hi;
        fp8_spread(word_of(g.w0, j), s0lo, s0hi);
        fp8_spread(word_of(g.w1, j), s1lo, s1hi);
        const uint32_t a[4] = {fp8_pair<T>(s0lo), fp8_pair<T>(s1lo), fp8_pair<T>(s0hi), fp8_pair<T>(s1hi)};
#pragma unroll
        for (int t = 0; t < TILES; ++t) {
            const uint4 &v = g.x[t][j / 2];
            const uint32_t b[2] = {j % 2 == 0 ? v.x : v.z, j % 2 == 0 ? v.y : v.w};
            mma_16816<T>(acc[t], a, b);
        }
    }
}

// The most floats of warps' partial tiles a block keeps (16 KiB): warps * TILES <= 32.
#define PAGODA_FP8_PARTIAL_FLOATS 4096

template <typename T, int TILES>
__device__ __forceinline__ void fp8_matmul(const T *__restrict__ x, long long x_row_stride,
                                           const uint8_t *__restrict__ codes, const float *__restrict__ scales,
                                           int k, T *__restrict__ out, long long out_row_stride, int m, int n) {
    constexpr int DEPTH = TILES == 1 ? 4 : 2;
    __shared__ float partial[PAGODA_FP8_PARTIAL_FLOATS];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    const int lane_row = lane / 4, quad = lane % 4;
    const int n0 = blockIdx.x * 16;

    Fp8LaneRows<T, TILES> r;
    r.w_ok0 = n0 + lane_row < n;
    r.w_ok1 = n0 + lane_row + 8 < n;
    r.w0 = codes + (long long)(r.w_ok0 ? n0 + lane_row : 0) * k + 16 * quad;
    r.w1 = codes + (long long)(r.w_ok1 ? n0 + lane_row + 8 : 0) * k + 16 * quad;
#pragma unroll
    for (int t = 0; t < TILES; ++t) {
        r.x_ok[t] = t * 8 + lane_row < m;
        r.x_rows[t] = x + (long long)(r.x_ok[t] ? t * 8 + lane_row : 0) * x_row_stride + 16 * quad;
    }
    const int fetches = k / 64;
    const int first = (int)((long long)fetches * warp / warps);
    r.last = (int)((long long)fetches * (warp + 1) / warps);

    float acc[TILES][4];
#pragma unroll
    for (int t = 0; t < TILES; ++t) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.f;
    for (int f0 = first; f0 < r.last; f0 += DEPTH) {
        Fp8Fetch<TILES> g[DEPTH];
#pragma unroll
        for (int d = 0; d < DEPTH; ++d) fp8_load(g[d], r, f0 + d);
#pragma unroll
        for (int d = 0; d < DEPTH; ++d) fp8_mma<T, TILES>(acc, g[d]);
    }

    // Each warp's tiles, [warp][tile][lane * 4 + i]; then one thread per output element adds
    // the warps' in warp order and applies the row's scale.
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
        if (row < n && col < m)
            out[(long long)col * out_row_stride + row] = Float<T>::from_f32(sum * (scales[row] * Fp8Factor<T>::value));
    }
}

// W written out as dense `[rows, k]` rows, `scale * value` rounded once in f32 and once to T;
// one thread per 16 codes (k % 16 == 0), grid-stride.
template <typename T>
__device__ __forceinline__ void fp8_dequantize(const uint8_t *__restrict__ codes, const float *__restrict__ scales,
                                               int k, long long groups, T *__restrict__ out) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long group = (long long)blockIdx.x * blockDim.x + threadIdx.x; group < groups; group += stride) {
        const uint4 v = load_stream_16(reinterpret_cast<const uint32_t *>(codes + group * 16));
        const float scale = scales[group * 16 / k];
        T values[16];
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            uint32_t lo, hi;
            fp8_spread(word_of(v, w), lo, hi);
            const uint32_t h[2] = {fp8_pair<f16>(lo), fp8_pair<f16>(hi)};
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                // The f16 pattern holds the value times 2^-8, exactly.
                const float value = Float<f16>::bits_to_f32((h[e / 2] >> (16 * (e % 2))) & 0xFFFFu) * 256.f;
                values[4 * w + e] = Float<T>::from_f32(scale * value);
            }
        }
#pragma unroll
        for (int e = 0; e < 16; ++e) out[group * 16 + e] = values[e];
    }
}

// Row blockIdx.x of a dense `[rows, k]` weight (contiguous) quantized: its scale (largest
// magnitude / 448, 0 for a row of zeros) and its codes (value / scale, clamped to +-448, then
// encoded); the same bits as the CPU's quantization.
template <typename T>
__device__ __forceinline__ void fp8_quantize(const T *__restrict__ w, int k, uint8_t *__restrict__ codes,
                                             float *__restrict__ scales) {
    __shared__ float scratch[32];
    const T *row = w + (long long)blockIdx.x * k;
    float amax = 0.f;
    for (int i = threadIdx.x; i < k; i += blockDim.x) amax = fmaxf(amax, fabsf(Float<T>::to_f32(row[i])));
    amax = warp_max(amax);
    if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = amax;
    __syncthreads();
    amax = 0.f;
    for (int v = 0; v < (int)(blockDim.x + 31) / 32; ++v) amax = fmaxf(amax, scratch[v]);
    const float scale = amax == 0.f ? 0.f : __fdiv_rn(amax, 448.f);
    if (threadIdx.x == 0) scales[blockIdx.x] = scale;
    uint8_t *out = codes + (long long)blockIdx.x * k;
    for (int i = threadIdx.x; i < k; i += blockDim.x) {
        const float v = scale == 0.f ? 0.f : fminf(fmaxf(__fdiv_rn(Float<T>::to_f32(row[i]), scale), -448.f), 448.f);
        out[i] = (uint8_t)fp8_encode(v);
    }
}

}  // namespace pagoda

#define PAGODA_FP8_MATMUL_ENTRY(name, T, tiles)                                                                    \
    extern "C" __global__ void name(const T *x, long long x_row_stride, const uint8_t *codes, const float *scales, \
                                    int k, T *out, long long out_row_stride, int m, int n) {                       \
        pagoda::fp8_matmul<T, tiles>(x, x_row_stride, codes, scales, k, out, out_row_stride, m, n);                \
    }                                                                                                              \
    PAGODA_ENTRY(name)

#define PAGODA_FP8_MATMUL(suffix, T)                                  \
    PAGODA_FP8_MATMUL_ENTRY(pagoda_fp8_matmul_##suffix, T, 1)         \
    PAGODA_FP8_MATMUL_ENTRY(pagoda_fp8_matmul_##suffix##_t2, T, 2)    \
    PAGODA_FP8_MATMUL_ENTRY(pagoda_fp8_matmul_##suffix##_t4, T, 4)

#define PAGODA_FP8_DEQUANTIZE(suffix, T)                                                                        \
    extern "C" __global__ void pagoda_fp8_dequantize_##suffix(const uint8_t *codes, const float *scales, int k, \
                                                              long long groups, T *out) {                       \
        pagoda::fp8_dequantize<T>(codes, scales, k, groups, out);                                              \
    }                                                                                                           \
    PAGODA_ENTRY(pagoda_fp8_dequantize_##suffix)

PAGODA_FP8_MATMUL(f16, pagoda::f16)
PAGODA_FP8_MATMUL(bf16, pagoda::bf16)
PAGODA_FP8_DEQUANTIZE(f32, float)
PAGODA_FP8_DEQUANTIZE(f16, pagoda::f16)
PAGODA_FP8_DEQUANTIZE(bf16, pagoda::bf16)

#define PAGODA_FP8_QUANTIZE(suffix, T)                                                                         \
    extern "C" __global__ void pagoda_fp8_quantize_##suffix(const T *w, int k, uint8_t *codes, float *scales) { \
        pagoda::fp8_quantize<T>(w, k, codes, scales);                                                          \
    }                                                                                                          \
    PAGODA_ENTRY(pagoda_fp8_quantize_##suffix)

PAGODA_FP8_QUANTIZE(f32, float)
PAGODA_FP8_QUANTIZE(f16, pagoda::f16)
PAGODA_FP8_QUANTIZE(bf16, pagoda::bf16)

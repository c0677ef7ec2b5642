// A CPU stand-in for the CUDA features Pagoda's kernels use, so that kernels/*.cu compile as
// C++ (-DPAGODA_SIM) and run on a machine without a GPU.
//
// Each CUDA thread of a block runs as a fiber (ucontext); blocks run one after another. A
// fiber yields at __syncthreads (released when every live thread of the block arrived) and at
// warp collectives (shuffles, ldmatrix, mma: released when all 32 lanes arrived; a collective
// that a lane never reaches, or that some lanes reach while others wait at __syncthreads, is
// reported as an error, as it would hang or be undefined on hardware). `__shared__` variables
// become function statics, which is sound because blocks never overlap.
//
// The fragment layouts of ldmatrix and mma.m16n8k16 are implemented from the PTX ISA
// description, independently of how the kernels use them, so a kernel that misreads a layout
// fails its comparison with the CPU reference.
#pragma once

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <cstddef>
#include <utility>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(...)

struct uint4 {
    unsigned x, y, z, w;
};
struct __attribute__((aligned(8))) uint2 {
    unsigned x, y;
};
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }
struct __attribute__((aligned(16))) float4 {
    float x, y, z, w;
};

namespace sim {

struct Dim3 {
    unsigned x, y, z;
};

// Coordinates of the fiber that is running now.
struct ThreadCoords {
    Dim3 thread, block, block_dim, grid_dim;
};
const ThreadCoords &coords();

// ---- 16-bit floats ---------------------------------------------------------------------------

struct half_t {
    uint16_t bits;
};
struct bfloat_t {
    uint16_t bits;
};

inline uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
inline float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

inline float f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) {
        const float v = (float)m * (1.0f / 16777216.0f);  // subnormal: m * 2^-24
        return sign ? -v : v;
    }
    if (e == 31) return bits_f32(sign | 0x7f800000u | (m << 13));
    return bits_f32(sign | ((e - 15 + 127) << 23) | (m << 13));
}

// Round to nearest even, with overflow to infinity and gradual underflow.
inline uint16_t f32_to_f16(float f) {
    const uint32_t x = f32_bits(f);
    const uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) return (uint16_t)(sign | (ax > 0x7f800000u ? 0x7e00u : 0x7c00u));
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);  // >= 65520 rounds to infinity
    if (ax < 0x38800000u) {                                    // below 2^-14: subnormal or zero
        const float scaled = bits_f32(ax) * 16777216.0f;       // exact: a power-of-two scale
        return (uint16_t)(sign | (uint32_t)nearbyintf(scaled));
    }
    const uint32_t e = (ax >> 23) - 127 + 15, m = ax & 0x7fffffu;
    uint32_t h = (e << 10) | (m >> 13);
    const uint32_t rest = m & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
    return (uint16_t)(sign | h);
}

inline float bf16_to_f32(uint16_t b) { return bits_f32((uint32_t)b << 16); }

inline uint16_t f32_to_bf16(float f) {
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);  // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

// ---- fibers and collectives (defined in runtime.h) -------------------------------------------

void syncthreads();
// Every lane of the current warp deposits `bytes` bytes; after the exchange `lane_data(l)`
// returns lane l's deposit until `end_exchange`.
void begin_exchange(const void *data, size_t bytes);
const void *lane_data(int lane);
void end_exchange();
int lane_id();
unsigned char *dynamic_smem();

template <typename V> V shfl_xor(V v, int lane_mask) {
    begin_exchange(&v, sizeof(V));
    V r;
    memcpy(&r, lane_data(lane_id() ^ lane_mask), sizeof(V));
    end_exchange();
    return r;
}

inline void copy16(void *dst, const void *src, bool valid) {
    if (valid) {
        memcpy(dst, src, 16);
    } else {
        memset(dst, 0, 16);
    }
}

// ldmatrix .m8n8.x4 (.trans): lanes 8i..8i+7 give the row addresses of matrix i.
inline void ldmatrix_x4(uint32_t (&r)[4], const void *row_addr, bool trans) {
    begin_exchange(&row_addr, sizeof(row_addr));
    const int lane = lane_id();
    const int g = lane / 4, t = lane % 4;
    auto elem = [](int matrix, int row, int col) -> uint32_t {
        const uint16_t *p;
        memcpy(&p, lane_data(matrix * 8 + row), sizeof(p));
        return p[col];
    };
    for (int i = 0; i < 4; ++i) {
        if (trans) {
            r[i] = elem(i, 2 * t, g) | (elem(i, 2 * t + 1, g) << 16);
        } else {
            r[i] = elem(i, g, 2 * t) | (elem(i, g, 2 * t + 1) << 16);
        }
    }
    end_exchange();
}

// mma.m16n8k16.row.col with f32 accumulators. A (16x16): register j of lane l holds rows
// l/4 (+8 for j odd), columns 2*(l%4) (+8 for j >= 2), low half first. B (16x8): register j
// holds rows 2*(l%4) (+8 for j = 1), column l/4. C/D: d[i] is row l/4 (+8 for i >= 2),
// column 2*(l%4) + i%2.
inline void mma_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], bool bf16) {
    uint32_t mine[6] = {a[0], a[1], a[2], a[3], b[0], b[1]};
    begin_exchange(mine, sizeof(mine));
    auto value = [bf16](uint32_t reg, int half) {
        const uint16_t bits = (uint16_t)(half ? reg >> 16 : reg & 0xffffu);
        return bf16 ? bf16_to_f32(bits) : f16_to_f32(bits);
    };
    auto a_at = [&](int row, int k) {
        const uint32_t *regs = static_cast<const uint32_t *>(lane_data((row % 8) * 4 + (k % 8) / 2));
        return value(regs[(row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0)], k % 2);
    };
    auto b_at = [&](int k, int n) {
        const uint32_t *regs = static_cast<const uint32_t *>(lane_data(n * 4 + (k % 8) / 2));
        return value(regs[4 + (k >= 8 ? 1 : 0)], k % 2);
    };
    const int lane = lane_id();
    float result[4];
    for (int i = 0; i < 4; ++i) {
        const int row = lane / 4 + (i >= 2 ? 8 : 0), col = 2 * (lane % 4) + i % 2;
        float acc = d[i];
        for (int k = 0; k < 16; ++k) acc += a_at(row, k) * b_at(k, col);
        result[i] = acc;
    }
    end_exchange();
    for (int i = 0; i < 4; ++i) d[i] = result[i];
}

// ---- kernel registry -------------------------------------------------------------------------

using Invoke = void (*)(void **params);
void register_kernel(const char *name, Invoke invoke);

// Calls a kernel with its parameters given as CUDA's driver API gives them: params[i] points
// at the value of parameter i.
template <auto F> struct Invoker;
template <typename... A, void (*F)(A...)> struct Invoker<F> {
    static void call(void **params) { call_with(params, std::index_sequence_for<A...>{}); }
    template <size_t... I> static void call_with(void **params, std::index_sequence<I...>) {
        F(*static_cast<A *>(params[I])...);
    }
};

struct Registrar {
    Registrar(const char *name, Invoke invoke) { register_kernel(name, invoke); }
};

}  // namespace sim

#define PAGODA_SIM_REGISTER(fn) static ::sim::Registrar sim_registrar_##fn(#fn, &::sim::Invoker<&fn>::call);

#define threadIdx (::sim::coords().thread)
#define blockIdx (::sim::coords().block)
#define blockDim (::sim::coords().block_dim)
#define gridDim (::sim::coords().grid_dim)

inline void __syncthreads() { ::sim::syncthreads(); }
template <typename V> inline V __shfl_xor_sync(unsigned, V v, int lane_mask) { return ::sim::shfl_xor(v, lane_mask); }

inline float __half2float(sim::half_t h) { return sim::f16_to_f32(h.bits); }
inline sim::half_t __float2half_rn(float f) { return sim::half_t{sim::f32_to_f16(f)}; }
inline sim::half_t __ushort_as_half(unsigned short b) { return sim::half_t{b}; }
inline unsigned short __half_as_ushort(sim::half_t h) { return h.bits; }
inline float __bfloat162float(sim::bfloat_t b) { return sim::bf16_to_f32(b.bits); }
inline sim::bfloat_t __float2bfloat16_rn(float f) { return sim::bfloat_t{sim::f32_to_bf16(f)}; }
inline unsigned short __bfloat16_as_ushort(sim::bfloat_t b) { return b.bits; }
inline float __uint_as_float(unsigned u) { return sim::bits_f32(u); }
inline float __int_as_float(int i) { return sim::bits_f32((uint32_t)i); }
inline unsigned __float_as_uint(float f) { return sim::f32_bits(f); }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
// Round-to-nearest arithmetic that is never fused into an FMA (the host compiler targets no FMA).
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }

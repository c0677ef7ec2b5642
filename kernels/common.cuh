// Shared helpers of Pagoda's CUDA kernels: storage types and their f32 conversions, warp
// reductions, and thin wrappers over the PTX instructions the attention kernels use (cp.async,
// ldmatrix, mma.sync).
//
// Every kernel also compiles as plain C++ with -DPAGODA_SIM (see sim/cuda_sim.h): the CPU
// simulator runs each CUDA thread as a fiber, so the kernels' indexing, masking and fragment
// layouts are tested against the Rust CPU ops without a GPU. Kernels therefore touch the
// hardware only through this header.
#pragma once

#ifdef PAGODA_SIM
#include "sim/cuda_sim.h"
#else
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#endif

#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif

namespace pagoda {

#ifdef PAGODA_SIM
using f16 = sim::half_t;
using bf16 = sim::bfloat_t;
#else
using f16 = __half;
using bf16 = __nv_bfloat16;
#endif

// ---- storage types -------------------------------------------------------------------------

// Math is always f32; Float<T> converts one storage element (or its 16-bit pattern) to and
// from f32, rounding to nearest even.
template <typename T> struct Float;

template <> struct Float<float> {
    static __device__ __forceinline__ float to_f32(float v) { return v; }
    static __device__ __forceinline__ float from_f32(float v) { return v; }
};

template <> struct Float<f16> {
    static __device__ __forceinline__ float to_f32(f16 v) { return __half2float(v); }
    static __device__ __forceinline__ f16 from_f32(float v) { return __float2half_rn(v); }
    static __device__ __forceinline__ float bits_to_f32(uint32_t bits) {
        return __half2float(__ushort_as_half((unsigned short)bits));
    }
    static __device__ __forceinline__ uint32_t f32_to_bits(float v) {
        return __half_as_ushort(__float2half_rn(v));
    }
};

template <> struct Float<bf16> {
    static __device__ __forceinline__ float to_f32(bf16 v) { return __bfloat162float(v); }
    static __device__ __forceinline__ bf16 from_f32(float v) { return __float2bfloat16_rn(v); }
    // bf16 is the top half of an f32.
    static __device__ __forceinline__ float bits_to_f32(uint32_t bits) {
        return __uint_as_float(bits << 16);
    }
    static __device__ __forceinline__ uint32_t f32_to_bits(float v) {
        return __bfloat16_as_ushort(__float2bfloat16_rn(v));
    }
};

// Two f32 values rounded into one 32-bit register of 16-bit elements, `lo` in the low half
// (the element with the lower index in mma fragments).
template <typename T> __device__ __forceinline__ uint32_t pack2(float lo, float hi) {
    return Float<T>::f32_to_bits(lo) | (Float<T>::f32_to_bits(hi) << 16);
}

// As pack2, in one conversion instruction for both halves on the device (cvt.rn.*x2.f32).
template <typename T> __device__ __forceinline__ uint32_t pack2_rn(float lo, float hi);

template <> __device__ __forceinline__ uint32_t pack2_rn<bf16>(float lo, float hi) {
#ifdef PAGODA_SIM
    return pack2<bf16>(lo, hi);
#else
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t *>(&v);
#endif
}

template <> __device__ __forceinline__ uint32_t pack2_rn<f16>(float lo, float hi) {
#ifdef PAGODA_SIM
    return pack2<f16>(lo, hi);
#else
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t *>(&v);
#endif
}

// Two bf16 values per register: a * b + c in each half, rounded once (fma.rn.bf16x2, sm_80+).
__device__ __forceinline__ uint32_t bf16x2_fma(uint32_t a, uint32_t b, uint32_t c) {
#ifdef PAGODA_SIM
    uint32_t out = 0;
    for (int h = 0; h < 2; ++h) {
        const auto half = [h](uint32_t v) { return (double)Float<bf16>::bits_to_f32((v >> (16 * h)) & 0xffffu); };
        // The product of two bf16 values and the sum are exact in double; one rounding after.
        out |= Float<bf16>::f32_to_bits((float)(half(a) * half(b) + half(c))) << (16 * h);
    }
    return out;
#else
    uint32_t d;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
#endif
}

// Rounded products and sums that the compiler may not fuse into a multiply-add (the CPU
// reference rounds each).
__device__ __forceinline__ float mul_rn(float a, float b) {
#ifdef PAGODA_SIM
    return a * b;
#else
    return __fmul_rn(a, b);
#endif
}

__device__ __forceinline__ float add_rn(float a, float b) {
#ifdef PAGODA_SIM
    return a + b;
#else
    return __fadd_rn(a, b);
#endif
}

// 16 bytes of data read once (a weight streamed by a matmul): not kept in L1 on the device.
__device__ __forceinline__ uint4 load_stream_16(const uint32_t *p) {
#ifdef PAGODA_SIM
    return *reinterpret_cast<const uint4 *>(p);
#else
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
#endif
}

// 16 bytes of storage elements (what one cp.async / vector load moves), widened to f32.
template <typename T> struct Vec16;

template <> struct Vec16<float> {
    static constexpr int N = 4;
    static __device__ __forceinline__ void to_f32(const uint4 &u, float (&out)[4]) {
        out[0] = __uint_as_float(u.x);
        out[1] = __uint_as_float(u.y);
        out[2] = __uint_as_float(u.z);
        out[3] = __uint_as_float(u.w);
    }
};

template <typename H> struct Vec16Half {
    static constexpr int N = 8;
    static __device__ __forceinline__ void to_f32(const uint4 &u, float (&out)[8]) {
        const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            out[2 * i] = Float<H>::bits_to_f32(w[i] & 0xffffu);
            out[2 * i + 1] = Float<H>::bits_to_f32(w[i] >> 16);
        }
    }
};
template <> struct Vec16<f16> : Vec16Half<f16> {};
template <> struct Vec16<bf16> : Vec16Half<bf16> {};

// ---- warp and block reductions ---------------------------------------------------------------

constexpr unsigned FULL_MASK = 0xffffffffu;

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(FULL_MASK, v, offset);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, offset));
    return v;
}

// Sum over the whole block; every thread gets the result. `scratch` holds one float per warp.
// Must be reached by every thread of the block.
__device__ __forceinline__ float block_sum(float v, float *scratch) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int num_warps = (blockDim.x + 31) / 32;
    v = warp_sum(v);
    __syncthreads();  // `scratch` may still be read by a previous call
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float total = 0.f;
    for (int w = 0; w < num_warps; ++w) total += scratch[w];
    return total;
}

// ---- asynchronous copies (sm_80+) ------------------------------------------------------------

// Copies 16 bytes global -> shared without blocking; with `valid` false the destination is
// zero-filled and nothing is read (the source address is still required to be a valid global
// pointer, so callers pass a base pointer).
__device__ __forceinline__ void cp_async_16(void *smem_dst, const void *gmem_src, bool valid) {
#ifdef PAGODA_SIM
    sim::copy16(smem_dst, gmem_src, valid);
#else
    const unsigned dst = (unsigned)__cvta_generic_to_shared(smem_dst);
    const int src_bytes = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem_src), "r"(src_bytes));
#endif
}

__device__ __forceinline__ void cp_async_commit() {
#ifndef PAGODA_SIM
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}

// Waits until at most `N` committed groups are still in flight.
template <int N> __device__ __forceinline__ void cp_async_wait() {
#ifndef PAGODA_SIM
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

// ---- tensor cores (sm_80+) -------------------------------------------------------------------

// Loads four 8x8 matrices of 16-bit elements from shared memory: lanes 8i..8i+7 give the row
// addresses of matrix i; register i of every lane receives its (row lane/4, columns
// 2*(lane%4), +1) pair of matrix i.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void *smem_row) {
#ifdef PAGODA_SIM
    sim::ldmatrix_x4(r, smem_row, false);
#else
    const unsigned addr = (unsigned)__cvta_generic_to_shared(smem_row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
#endif
}

// As ldmatrix_x4, transposed: register i receives the (rows 2*(lane%4), +1; column lane/4)
// pair of matrix i.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void *smem_row) {
#ifdef PAGODA_SIM
    sim::ldmatrix_x4(r, smem_row, true);
#else
    const unsigned addr = (unsigned)__cvta_generic_to_shared(smem_row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
#endif
}

// d += a * b for one m16n8k16 tile with f32 accumulators: `a` is the 16x16 row-major A
// fragment, `b` the 16x8 column-major B fragment (PTX ISA "matrix fragments for mma.m16n8k16").
template <typename T> __device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]);

template <> __device__ __forceinline__ void mma_16816<bf16>(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#ifdef PAGODA_SIM
    sim::mma_16816(d, a, b, true);
#else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

template <> __device__ __forceinline__ void mma_16816<f16>(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#ifdef PAGODA_SIM
    sim::mma_16816(d, a, b, false);
#else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

}  // namespace pagoda

// Declares the block's dynamic shared memory as `unsigned char name[]`, 16-byte aligned.
#ifdef PAGODA_SIM
#define PAGODA_DYNAMIC_SMEM(name) unsigned char *name = sim::dynamic_smem()
#else
#define PAGODA_DYNAMIC_SMEM(name) extern __shared__ __align__(16) unsigned char name[]
#endif

// Declares an `extern "C"` kernel entry point; under the simulator it is also registered by
// name so the host side can launch it like a PTX function.
#ifdef PAGODA_SIM
#define PAGODA_ENTRY(name) PAGODA_SIM_REGISTER(name)
#else
#define PAGODA_ENTRY(name)
#endif

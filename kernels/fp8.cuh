// FP8 (e4m3) codes: what FP8 weights (fp8_matmul.cu) and the FP8 KV cache (reshape_and_cache.cu,
// the attention kernels) store. Pagoda's encoder never makes a subnormal or NaN code
// (crates/ops/src/fp8_e4m3.rs), so every nonzero code is a normal number and becomes a 16-bit
// float by moving bits, exactly: the code's sign goes to the top of its half, its 7
// exponent-and-mantissa bits under the 16-bit exponent, so an f16 holds the code's value times
// 2^-8 (the two formats' exponent biases differ by 8) and a bf16 its value times 2^-120, undone
// by an exact bf16x2 multiply by 2^120.
#pragma once
#include "common.cuh"

namespace pagoda {

// One e4m3 code as a storage element (a KV cache of codes), distinct from a plain byte.
struct fp8_e4m3 {
    uint8_t bits;
};

// Codes 0 and 1 of `word` into the high bytes of a register's two halves (low half first), and
// codes 2 and 3.
__device__ __forceinline__ void fp8_spread(uint32_t word, uint32_t &lo, uint32_t &hi) {
#ifdef PAGODA_SIM
    lo = ((word & 0xFFu) << 8) | ((word & 0xFF00u) << 16);
    hi = ((word >> 8) & 0xFF00u) | (word & 0xFF000000u);
#else
    lo = __byte_perm(word, 0u, 0x1404u);
    hi = __byte_perm(word, 0u, 0x3424u);
#endif
}

// Two codes in the high bytes of their halves as two T values: exact e4m3 values for bf16, the
// values times 2^-8 for f16 (Fp8Factor<T> is what results are multiplied by at the end).
template <typename T> __device__ __forceinline__ uint32_t fp8_pair(uint32_t spread);

template <> __device__ __forceinline__ uint32_t fp8_pair<f16>(uint32_t spread) {
    return (spread & 0x80008000u) | ((spread >> 1) & 0x3F803F80u);
}

template <> __device__ __forceinline__ uint32_t fp8_pair<bf16>(uint32_t spread) {
    const uint32_t scaled = (spread & 0x80008000u) | ((spread >> 4) & 0x07F007F0u);
    // 2^120 in each half (exponent 247), plus -0: an exact product of normal numbers.
    return bf16x2_fma(scaled, 0x7B807B80u, 0x80008000u);
}

template <typename T> struct Fp8Factor;
template <> struct Fp8Factor<f16> {
    static constexpr float value = 256.f;
};
template <> struct Fp8Factor<bf16> {
    static constexpr float value = 1.f;
};

// Eight codes (two words) as eight T values in 16 bytes, element order kept.
template <typename T> __device__ __forceinline__ uint4 fp8_widen8(uint2 codes) {
    uint32_t a, b, c, d;
    fp8_spread(codes.x, a, b);
    fp8_spread(codes.y, c, d);
    return make_uint4(fp8_pair<T>(a), fp8_pair<T>(b), fp8_pair<T>(c), fp8_pair<T>(d));
}

// The e4m3 code nearest v (ties to even), no subnormal, magnitudes past 448 saturating:
// exactly `pagoda_ops`' encoder. Below the smallest normal (2^-6) a value goes to zero or to
// 2^-6, whichever is nearer; otherwise the f32 exponent is rebased from 127 to 7 and the 23
// mantissa bits rounded to 3, a carry moving up the exponent.
__device__ __forceinline__ uint32_t fp8_encode(float v) {
    const uint32_t bits = __float_as_uint(v);
    const uint32_t sign = (bits >> 24) & 0x80u;
    const float magnitude = fabsf(v);
    if (magnitude < 0.015625f) return magnitude > 0.0078125f ? (sign | 0x08u) : sign;
    const uint32_t m = bits & 0x7FFFFFu;
    const uint32_t field = ((((bits >> 23) & 0xFFu) - 120u) << 3) + ((m + 0x7FFFFu + ((m >> 20) & 1u)) >> 20);
    return sign | (field < 0x7Eu ? field : 0x7Eu);
}

}  // namespace pagoda

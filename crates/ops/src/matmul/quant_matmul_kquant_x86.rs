//! Block decoders of the x86 quantized-matmul kernels for Q4_0, Q5_0, Q5_K and Q6_K, and their
//! instances of the shared row loops (dispatch and loops: `quant_matmul_x86`; Q4_K runs Q4_1's
//! kernels, its layout in memory being the same).
//!
//! Code bits above the nibble come from 32-bit planes, bit `j` for element `j`. AVX-512 uses
//! each 16-bit half of a plane as a lane mask and adds the bit's value to the widened nibbles
//! under it; AVX2 spreads a plane into bytes (the bit's value or 0) with a shuffle and a
//! compare and ORs them into the nibbles before widening. Offsets (8, 16, 32) are subtracted as
//! integers, so every code, and every dequantized weight, is exact.

use super::*;

dispatch!(q4_0_avx2, q4_0_avx2_rows, Avx2);
dispatch!(q5_0_avx2, q5_0_avx2_rows, Avx2);
dispatch!(q5_k_avx2, q5_k_avx2_rows, Avx2);
dispatch!(q6_k_avx2, q6_k_avx2_rows, Avx2);
dispatch!(q4_0_avx512, q4_0_avx512_rows, Avx512);
dispatch!(q5_0_avx512, q5_0_avx512_rows, Avx512);
dispatch!(q5_k_avx512, q5_k_avx512_rows, Avx512);
dispatch!(q6_k_avx512, q6_k_avx512_rows, Avx512);

avx2_rows!(q4_0_avx2_rows, q4_0_codes_avx2);
avx2_rows!(q5_0_avx2_rows, q5_0_codes_avx2);
avx2_rows!(q5_k_avx2_rows, q5_k_codes_avx2);
avx2_rows!(q6_k_avx2_rows, q6_k_codes_avx2, true);
avx512_tile!(q4_0_avx512_rows, q4_0_block_avx512);
avx512_tile!(q5_0_avx512_rows, q5_0_block_avx512);
avx512_tile!(q5_k_avx512_rows, q5_k_block_avx512);
avx512_tile!(q6_k_avx512_rows, q6_k_block_avx512);

/// The nibbles of block `block` (counted over the whole matrix), one per byte: elements 0..16
/// and 16..32.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn nibbles(w: &QuantizedWeight, block: usize) -> (__m128i, __m128i) {
    let mask = _mm_set1_epi8(0x0F);
    // SAFETY: `block` is a block of the matrix (the callers iterate over checked rows), and
    // every format decoded here keeps 16 bytes of nibbles per block.
    let raw = unsafe { _mm_loadu_si128(w.codes().as_ptr().add(block * 16).cast()) };
    (_mm_and_si128(raw, mask), _mm_and_si128(_mm_srli_epi16::<4>(raw), mask))
}

/// Bits 0..16 and 16..32 of `plane` as bytes: `value` where the bit is set, 0 elsewhere.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn plane_bytes(plane: u32, value: i8) -> (__m128i, __m128i) {
    let v = _mm_cvtsi32_si128(plane as i32);
    let bit = _mm_setr_epi8(1, 2, 4, 8, 16, 32, 64, -128, 1, 2, 4, 8, 16, 32, 64, -128);
    let value = _mm_set1_epi8(value);
    // Byte `j` of the result takes byte `j / 8` of the plane; the compare picks its bit `j % 8`.
    let spread = |idx: __m128i| {
        let bytes = _mm_shuffle_epi8(v, idx);
        _mm_and_si128(_mm_cmpeq_epi8(_mm_and_si128(bytes, bit), bit), value)
    };
    (
        spread(_mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1)),
        spread(_mm_setr_epi8(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3)),
    )
}

/// 32 signed codes (elements 0..16 in `lo`, 16..32 in `hi`) as f32: elements 0..8, 8..16,
/// 16..24, 24..32.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn codes_f32(lo: __m128i, hi: __m128i) -> [__m256; 4] {
    let widen = |v: __m128i| _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
    [widen(lo), widen(_mm_unpackhi_epi64(lo, lo)), widen(hi), widen(_mm_unpackhi_epi64(hi, hi))]
}

#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn q4_0_codes_avx2(w: &QuantizedWeight, block: usize) -> [__m256; 4] {
    // SAFETY: as for `nibbles`.
    let (lo, hi) = unsafe { nibbles(w, block) };
    let eight = _mm_set1_epi8(8);
    codes_f32(_mm_sub_epi8(lo, eight), _mm_sub_epi8(hi, eight))
}

#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn q5_0_codes_avx2(w: &QuantizedWeight, block: usize) -> [__m256; 4] {
    // SAFETY: as for `nibbles`.
    let (lo, hi) = unsafe { nibbles(w, block) };
    let (hl, hh) = plane_bytes(w.high()[block], 16);
    let sixteen = _mm_set1_epi8(16);
    codes_f32(_mm_sub_epi8(_mm_or_si128(lo, hl), sixteen), _mm_sub_epi8(_mm_or_si128(hi, hh), sixteen))
}

#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn q5_k_codes_avx2(w: &QuantizedWeight, block: usize) -> [__m256; 4] {
    // SAFETY: as for `nibbles`.
    let (lo, hi) = unsafe { nibbles(w, block) };
    let (hl, hh) = plane_bytes(w.high()[block], 16);
    codes_f32(_mm_or_si128(lo, hl), _mm_or_si128(hi, hh))
}

#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn q6_k_codes_avx2(w: &QuantizedWeight, block: usize) -> [__m256; 4] {
    // SAFETY: as for `nibbles`.
    let (lo, hi) = unsafe { nibbles(w, block) };
    let (l4, h4) = plane_bytes(w.high()[2 * block], 16);
    let (l5, h5) = plane_bytes(w.high()[2 * block + 1], 32);
    let off = _mm_set1_epi8(32);
    let code =
        |n: __m128i, b4: __m128i, b5: __m128i| _mm_sub_epi8(_mm_or_si128(_mm_or_si128(n, b4), b5), off);
    codes_f32(code(lo, l4, l5), code(hi, h4, h5))
}

/// The two 16-bit halves of high-bit plane `index`: lane masks for elements 0..16 and 16..32.
#[inline(always)]
fn plane_masks(w: &QuantizedWeight, index: usize) -> (__mmask16, __mmask16) {
    let plane = w.high()[index];
    (plane as u16, (plane >> 16) as u16)
}

/// Adds `value` to the lanes of `lo` (elements 0..16) and `hi` (16..32) set in `masks`.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
fn add_where_set(lo: __m512i, hi: __m512i, masks: (__mmask16, __mmask16), value: i32) -> (__m512i, __m512i) {
    let v = _mm512_set1_epi32(value);
    (_mm512_mask_add_epi32(lo, masks.0, lo, v), _mm512_mask_add_epi32(hi, masks.1, hi, v))
}

/// Subtracts `value` from the lanes of `lo` and `hi` clear in `masks`.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
fn sub_where_clear(
    lo: __m512i,
    hi: __m512i,
    masks: (__mmask16, __mmask16),
    value: i32,
) -> (__m512i, __m512i) {
    let v = _mm512_set1_epi32(value);
    (_mm512_mask_sub_epi32(lo, !masks.0, lo, v), _mm512_mask_sub_epi32(hi, !masks.1, hi, v))
}

#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn q4_0_block_avx512(w: &QuantizedWeight, block: usize) -> (__m512, __m512) {
    // SAFETY: as for `nibbles_avx512`.
    let (lo, hi) = unsafe { nibbles_avx512(w, block) };
    // `d * q - 8d` is `d * (q - 8)` exactly: both products are exact, and so is their sum.
    let d = _mm512_set1_ps(w.scales()[block]);
    let off = _mm512_mul_ps(d, _mm512_set1_ps(-8.0));
    (_mm512_fmadd_ps(_mm512_cvtepi32_ps(lo), d, off), _mm512_fmadd_ps(_mm512_cvtepi32_ps(hi), d, off))
}

#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn q5_0_block_avx512(w: &QuantizedWeight, block: usize) -> (__m512, __m512) {
    // SAFETY: as for `nibbles_avx512`.
    let (lo, hi) = unsafe { nibbles_avx512(w, block) };
    // `q - 16` is the nibble where bit 4 is set, the nibble less 16 where it is clear.
    let (lo, hi) = sub_where_clear(lo, hi, plane_masks(w, block), 16);
    let d = _mm512_set1_ps(w.scales()[block]);
    (_mm512_mul_ps(_mm512_cvtepi32_ps(lo), d), _mm512_mul_ps(_mm512_cvtepi32_ps(hi), d))
}

#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn q5_k_block_avx512(w: &QuantizedWeight, block: usize) -> (__m512, __m512) {
    // SAFETY: as for `nibbles_avx512`.
    let (lo, hi) = unsafe { nibbles_avx512(w, block) };
    let (lo, hi) = add_where_set(lo, hi, plane_masks(w, block), 16);
    let (s, m) = (_mm512_set1_ps(w.scales()[block]), _mm512_set1_ps(w.mins()[block]));
    (_mm512_fmadd_ps(_mm512_cvtepi32_ps(lo), s, m), _mm512_fmadd_ps(_mm512_cvtepi32_ps(hi), s, m))
}

#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn q6_k_block_avx512(w: &QuantizedWeight, block: usize) -> (__m512, __m512) {
    // SAFETY: as for `nibbles_avx512`.
    let (lo, hi) = unsafe { nibbles_avx512(w, block) };
    let (lo, hi) = add_where_set(lo, hi, plane_masks(w, 2 * block), 16);
    let (lo, hi) = sub_where_clear(lo, hi, plane_masks(w, 2 * block + 1), 32);
    let s = &w.scales()[2 * block..2 * block + 2];
    (
        _mm512_mul_ps(_mm512_cvtepi32_ps(lo), _mm512_set1_ps(s[0])),
        _mm512_mul_ps(_mm512_cvtepi32_ps(hi), _mm512_set1_ps(s[1])),
    )
}

//! The CPU attention's scores `S = Q K^T` for one key chunk and one kv head, with keys in the
//! vector lanes (AVX-512 builds: see `MulAdd::keys_in_lanes`): the chunk's
//! key rows are transposed once (`kt[d * KEY_CHUNK + j]` is element `d` of key `j`; a 16-bit cache
//! is widened in the same pass), then each query row's `head_dim` values are broadcast against
//! the transposed keys, so a multiply-add serves 16 keys at once and no horizontal sums are left
//! at the end. A block of query rows shares every load of the transposed keys, and the
//! transposition is paid once per chunk for all the rows of a prefill tile.
//!
//! Every score is one chain of fused multiply-adds over `d = 0..head_dim` in order, starting
//! from zero, whichever lanes or row block it was computed in: a query's scores therefore have
//! the same bits alone (decode) and in any prefill tile. The portable loops (the tests'
//! reference) keep the same order.

use crate::dtype::Halves;
use crate::simd::MulAdd;

/// `kt[d * stride + j] = rows[j][at + d]` for `j < rows.len()` and `d < head_dim`; columns
/// `rows.len()..` of `kt` are left as they are (lanes nobody reads).
#[inline(always)]
pub(crate) fn transpose_portable(rows: &[&[f32]], at: usize, head_dim: usize, kt: &mut [f32], stride: usize) {
    for (j, row) in rows.iter().enumerate() {
        for (d, &x) in row[at..at + head_dim].iter().enumerate() {
            kt[d * stride + j] = x;
        }
    }
}

/// `scores[g * stride + j] = q_g . k_j` for every row `g` of `q` (rows of `head_dim`) and keys
/// `j` in `keys`, from the transposed chunk `kt` (row stride `kt_stride`).
#[inline(always)]
pub(crate) fn scores_portable<M: MulAdd>(
    q: &[f32],
    head_dim: usize,
    kt: &[f32],
    kt_stride: usize,
    keys: std::ops::Range<usize>,
    scores: &mut [f32],
    stride: usize,
) {
    for (g, q_row) in q.chunks_exact(head_dim).enumerate() {
        let out = &mut scores[g * stride + keys.start..g * stride + keys.end];
        out.fill(0.0);
        for (d, &qd) in q_row.iter().enumerate() {
            let k = &kt[d * kt_stride + keys.start..d * kt_stride + keys.end];
            for (o, &kj) in out.iter_mut().zip(k) {
                *o = M::mul_add(qd, kj, *o);
            }
        }
    }
}

/// Where a chunk's key rows sit in a 16-bit cache: row `j`'s first element at `offsets[j] + at`.
/// The next chunk's rows (`ahead`, `ahead_width` elements each) are prefetched into level 2 as
/// these are read, one row per row (as `paged_attention_cpu::chunk_rows` does for the others).
pub(crate) struct HalfRows<'a> {
    pub offsets: &'a [usize],
    pub at: usize,
    pub ahead: &'a [usize],
    pub ahead_width: usize,
}

impl HalfRows<'_> {
    /// Whether every row (this chunk's `head_dim` values, the next chunk's `ahead_width`) lies
    /// inside a cache of `len` elements.
    fn fit(&self, len: usize, head_dim: usize) -> bool {
        self.offsets.iter().all(|&o| o + self.at + head_dim <= len)
            && self.ahead.iter().all(|&o| o + self.ahead_width <= len)
    }

    /// Prefetches share `part` of `parts` of the next chunk's rows `j0..j0 + count` (a block's
    /// worth), so the requests are spread over the block's loads: issued in one burst they
    /// stalled the loads behind them.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn prefetch_share(&self, src: *const u16, j0: usize, count: usize, part: usize, parts: usize) {
        let lines_per_row = (self.ahead_width * 2).div_ceil(64);
        let total = self.ahead.len().saturating_sub(j0).min(count) * lines_per_row;
        for k in total * part / parts..total * (part + 1) / parts {
            let (i, line) = (k / lines_per_row, k % lines_per_row);
            let at = src.wrapping_add(self.ahead[j0 + i]).cast::<i8>().wrapping_add(line * 64);
            // SAFETY: prefetching never faults or writes, whatever the address.
            unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(at) };
        }
    }
}

/// [`transpose_portable`] for AVX-512: 16 x 16 blocks transposed in registers; missing rows are
/// read as zeros and partial blocks of `head_dim` masked.
///
/// # Safety
/// The CPU must have AVX-512F; every row holds `at + head_dim` values and `kt` reaches
/// `(head_dim - 1) * stride + rows.len().next_multiple_of(16)`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn transpose_avx512(
    rows: &[&[f32]],
    at: usize,
    head_dim: usize,
    kt: &mut [f32],
    stride: usize,
) {
    use std::arch::x86_64::*;
    assert!(rows.iter().all(|r| r.len() >= at + head_dim));
    assert!(head_dim == 0 || kt.len() >= (head_dim - 1) * stride + rows.len().next_multiple_of(16));
    for j0 in (0..rows.len()).step_by(16) {
        for d0 in (0..head_dim).step_by(16) {
            let width = (head_dim - d0).min(16);
            let mask: __mmask16 = if width == 16 { 0xFFFF } else { ((1u32 << width) - 1) as u16 };
            // SAFETY (block): masked loads read `width` values of rows that hold `at + head_dim`;
            // stores write `width` rows of `kt` at columns `j0..j0 + 16` (asserted above).
            unsafe {
                let r: [__m512; 16] = std::array::from_fn(|i| match rows.get(j0 + i) {
                    Some(row) => _mm512_maskz_loadu_ps(mask, row.as_ptr().add(at + d0)),
                    None => _mm512_setzero_ps(),
                });
                transpose16_store(r, kt.as_mut_ptr().add(d0 * stride + j0), stride, width);
            }
        }
    }
}

/// [`transpose_avx512`] reading a 16-bit cache directly, widened as loaded (`vcvtph2ps`, or a
/// shift for bf16: both exact), with no f32 copy of the rows in between.
///
/// # Safety
/// The CPU must have AVX-512F; `head_dim` is a multiple of 16 and `kt` reaches
/// `(head_dim - 1) * stride + rows.offsets.len().next_multiple_of(16)`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn transpose_halves_avx512(
    src: Halves<'_>,
    rows: &HalfRows<'_>,
    head_dim: usize,
    kt: &mut [f32],
    stride: usize,
) {
    assert!(head_dim.is_multiple_of(16) && rows.fit(src.len(), head_dim));
    assert!(head_dim == 0 || kt.len() >= (head_dim - 1) * stride + rows.offsets.len().next_multiple_of(16));
    // SAFETY: the rows lie inside the cache and `kt` is large enough (asserted).
    unsafe {
        match src {
            Halves::F16(s) => {
                halves_avx512::<false>(s.as_ptr().cast(), rows, head_dim, kt.as_mut_ptr(), stride)
            }
            Halves::Bf16(s) => {
                halves_avx512::<true>(s.as_ptr().cast(), rows, head_dim, kt.as_mut_ptr(), stride)
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn halves_avx512<const BF16: bool>(
    src: *const u16,
    rows: &HalfRows<'_>,
    head_dim: usize,
    kt: *mut f32,
    stride: usize,
) {
    use std::arch::x86_64::*;
    let n = rows.offsets.len();
    let blocks = head_dim / 16;
    for j0 in (0..n).step_by(16) {
        let m = (n - j0).min(16);
        for b in 0..blocks {
            rows.prefetch_share(src, j0, 16, b, blocks);
            let d0 = b * 16;
            // SAFETY (block): each load reads 16 values of a row inside the cache; the stores
            // write 16 rows of `kt` at columns `j0..j0 + 16` (the caller's guarantees).
            unsafe {
                let r: [__m512; 16] = std::array::from_fn(|i| {
                    if i >= m {
                        return _mm512_setzero_ps();
                    }
                    let h = _mm256_loadu_si256(src.add(rows.offsets[j0 + i] + rows.at + d0).cast());
                    if BF16 {
                        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
                    } else {
                        _mm512_cvtph_ps(h)
                    }
                });
                transpose16_store(r, kt.add(d0 * stride + j0), stride, 16);
            }
        }
    }
}

/// Rows `r[i]` (16 keys' values at 16 consecutive `d`) written as `kt[d * stride + i]` for
/// `d < width`: unpacks within 128-bit lanes, then 128-bit lane shuffles.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn transpose16_store(r: [std::arch::x86_64::__m512; 16], kt: *mut f32, stride: usize, width: usize) {
    use std::arch::x86_64::*;
    // SAFETY (whole body): the caller guarantees `width` rows of 16 values at `kt`.
    unsafe {
        // t[2i], t[2i+1]: rows 2i and 2i + 1 interleaved within each 128-bit lane.
        let t: [__m512; 16] = std::array::from_fn(|i| {
            let (a, b) = (r[i & !1], r[i | 1]);
            if i % 2 == 0 {
                _mm512_unpacklo_ps(a, b)
            } else {
                _mm512_unpackhi_ps(a, b)
            }
        });
        // u[4a + e], 128-bit lane L: element 4L + e of rows 4a..4a + 4.
        let u: [__m512; 16] = std::array::from_fn(|i| {
            let (a, e) = (i / 4, i % 4);
            let (x, y) = (_mm512_castps_pd(t[4 * a + e / 2]), _mm512_castps_pd(t[4 * a + 2 + e / 2]));
            _mm512_castpd_ps(if e % 2 == 0 { _mm512_unpacklo_pd(x, y) } else { _mm512_unpackhi_pd(x, y) })
        });
        for e in 0..4 {
            let v = _mm512_shuffle_f32x4::<0x44>(u[e], u[4 + e]);
            let w = _mm512_shuffle_f32x4::<0xEE>(u[e], u[4 + e]);
            let x = _mm512_shuffle_f32x4::<0x44>(u[8 + e], u[12 + e]);
            let y = _mm512_shuffle_f32x4::<0xEE>(u[8 + e], u[12 + e]);
            let out = [
                _mm512_shuffle_f32x4::<0x88>(v, x),
                _mm512_shuffle_f32x4::<0xDD>(v, x),
                _mm512_shuffle_f32x4::<0x88>(w, y),
                _mm512_shuffle_f32x4::<0xDD>(w, y),
            ];
            for (l, o) in out.into_iter().enumerate() {
                let d = 4 * l + e;
                if d < width {
                    _mm512_storeu_ps(kt.add(d * stride), o);
                }
            }
        }
    }
}

/// [`scores_portable`] for AVX-512 with FMA: blocks of up to 4 query rows x 4 vectors of 16
/// keys stay in registers while `d` runs over the head.
///
/// # Safety
/// The CPU must have AVX-512F and FMA; `q` holds whole rows; `kt` holds `head_dim` rows of
/// `kt_stride` values with `keys.end.next_multiple_of(16) <= kt_stride`; every score row
/// (`stride` apart) reaches column `keys.end.next_multiple_of(16)` (columns outside `keys` may
/// be overwritten).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
pub(crate) unsafe fn scores_avx512(
    q: &[f32],
    head_dim: usize,
    kt: &[f32],
    kt_stride: usize,
    keys: std::ops::Range<usize>,
    scores: &mut [f32],
    stride: usize,
) {
    let rows = q.len() / head_dim.max(1);
    if rows == 0 || keys.is_empty() {
        return;
    }
    let (v0, v1) = (keys.start / 16, keys.end.div_ceil(16));
    assert!(v1 * 16 <= kt_stride && kt.len() >= head_dim * kt_stride);
    assert!(scores.len() >= (rows - 1) * stride + v1 * 16);
    let mut g = 0;
    while g < rows {
        let (qp, sp) = (q[g * head_dim..].as_ptr(), scores[g * stride..].as_mut_ptr());
        let kp = kt.as_ptr();
        let mut v = v0;
        while v < v1 {
            // SAFETY: rows g.. of q and scores and vectors v.. of kt exist (asserted above).
            unsafe {
                match ((rows - g).min(4), (v1 - v).min(4)) {
                    (1, 1) => scores_block_avx512::<1, 1>(qp, head_dim, kp, kt_stride, v, sp, stride),
                    (1, 2) => scores_block_avx512::<1, 2>(qp, head_dim, kp, kt_stride, v, sp, stride),
                    (1, 3) => scores_block_avx512::<1, 3>(qp, head_dim, kp, kt_stride, v, sp, stride),
                    (1, _) => scores_block_avx512::<1, 4>(qp, head_dim, kp, kt_stride, v, sp, stride),
                    (2, 1) => scores_block_avx512::<2, 1>(qp, head_dim, kp, kt_stride, v, sp, stride),
                    (2, 2) => scores_block_avx512::<2, 2>(qp, head_dim, kp, kt_stride, v, sp, stride),
                    (2, 3) => scores_block_avx512::<2, 3>(qp, head_dim, kp, kt_stride, v, sp, stride),
                    (2, _) => scores_block_avx512::<2, 4>(qp, head_dim, kp, kt_stride, v, sp, stride),
                    (3, 1) => scores_block_avx512::<3, 1>(qp, head_dim, kp, kt_stride, v, sp, stride),
                    (3, 2) => scores_block_avx512::<3, 2>(qp, head_dim, kp, kt_stride, v, sp, stride),
                    (3, 3) => scores_block_avx512::<3, 3>(qp, head_dim, kp, kt_stride, v, sp, stride),
                    (3, _) => scores_block_avx512::<3, 4>(qp, head_dim, kp, kt_stride, v, sp, stride),
                    (_, 1) => scores_block_avx512::<4, 1>(qp, head_dim, kp, kt_stride, v, sp, stride),
                    (_, 2) => scores_block_avx512::<4, 2>(qp, head_dim, kp, kt_stride, v, sp, stride),
                    (_, 3) => scores_block_avx512::<4, 3>(qp, head_dim, kp, kt_stride, v, sp, stride),
                    (_, _) => scores_block_avx512::<4, 4>(qp, head_dim, kp, kt_stride, v, sp, stride),
                }
            }
            v += 4;
        }
        g += 4;
    }
}

/// `R` query rows at `q` against key vectors `v..v + V` of `kt`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn scores_block_avx512<const R: usize, const V: usize>(
    q: *const f32,
    head_dim: usize,
    kt: *const f32,
    kt_stride: usize,
    v: usize,
    out: *mut f32,
    stride: usize,
) {
    use std::arch::x86_64::*;
    // SAFETY (whole body): the caller guarantees R rows of q and of scores and `head_dim` rows
    // of kt holding vectors v..v + V.
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); V]; R];
        for d in 0..head_dim {
            let k: [__m512; V] =
                std::array::from_fn(|i| _mm512_loadu_ps(kt.add(d * kt_stride + (v + i) * 16)));
            for (r, acc_r) in acc.iter_mut().enumerate() {
                let qd = _mm512_set1_ps(*q.add(r * head_dim + d));
                for i in 0..V {
                    acc_r[i] = _mm512_fmadd_ps(qd, k[i], acc_r[i]);
                }
            }
        }
        for (r, acc_r) in acc.iter().enumerate() {
            for (i, a) in acc_r.iter().enumerate() {
                _mm512_storeu_ps(out.add(r * stride + (v + i) * 16), *a);
            }
        }
    }
}

#[cfg(test)]
#[path = "attention_scores_tests.rs"]
mod tests;

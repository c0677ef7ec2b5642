//! The CPU attention's inner loops over one group: the query heads of one token that share a kv
//! head (3 for SmolLM2). Each key and value row is loaded once for the whole group instead of
//! once per query head, which is most of what these loops read.
//!
//! Layouts: the group's query rows and output rows are contiguous (`rows * head_dim`); its
//! scores are `rows` rows `stride` apart. The portable loops run one row at a time through
//! [`MulAdd`]; x86 has AVX2 scores (four keys per horizontal-add tree) and AVX-512 value
//! accumulation, which [`MulAdd::group_scores`] and [`MulAdd::group_accumulate`] dispatch to.

use crate::simd::{add_weighted_rows, dot_rows_portable, MulAdd};

/// `scores[g * stride + j] = q_g . keys[j]` for every query row `g` of the group.
#[inline(always)]
pub(crate) fn scores_portable<M: MulAdd>(
    q: &[f32],
    head_dim: usize,
    keys: &[&[f32]],
    scores: &mut [f32],
    stride: usize,
) {
    for (g, q_row) in q.chunks_exact(head_dim).enumerate() {
        dot_rows_portable::<M>(q_row, keys, &mut scores[g * stride..g * stride + keys.len()]);
    }
}

/// `out_g += sum_j p[g * stride + j] * values[j]` for every output row `g` of the group.
#[inline(always)]
pub(crate) fn accumulate_portable<M: MulAdd>(
    out: &mut [f32],
    head_dim: usize,
    p: &[f32],
    stride: usize,
    values: &[&[f32]],
) {
    for (g, out_row) in out.chunks_exact_mut(head_dim).enumerate() {
        add_weighted_rows::<M>(out_row, &p[g * stride..g * stride + values.len()], values);
    }
}

/// [`scores_portable`] with AVX2: up to three query rows share every load of four keys, and
/// each row's four sums are reduced by one tree of horizontal adds.
///
/// # Safety
/// The CPU must have AVX2 and FMA; every key row holds at least `head_dim` values, `q` holds
/// whole rows and `scores` reaches `(rows - 1) * stride + keys.len()`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn scores_avx2(
    q: &[f32],
    head_dim: usize,
    keys: &[&[f32]],
    scores: &mut [f32],
    stride: usize,
) {
    let rows = q.len() / head_dim;
    assert!(keys.iter().all(|k| k.len() >= head_dim));
    assert!(rows == 0 || scores.len() >= (rows - 1) * stride + keys.len());
    let mut g = 0;
    while g < rows {
        let (qp, sp) = (q[g * head_dim..].as_ptr(), scores[g * stride..].as_mut_ptr());
        // SAFETY: rows g.. of q and scores exist (asserted above), keys are long enough.
        unsafe {
            match rows - g {
                1 => scores_rows_avx2::<1>(qp, head_dim, keys, sp, stride),
                2 => scores_rows_avx2::<2>(qp, head_dim, keys, sp, stride),
                _ => scores_rows_avx2::<3>(qp, head_dim, keys, sp, stride),
            }
        }
        g += 3;
    }
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn scores_rows_avx2<const G: usize>(
    q: *const f32,
    head_dim: usize,
    keys: &[&[f32]],
    out: *mut f32,
    stride: usize,
) {
    use std::arch::x86_64::*;
    let full = head_dim / 8 * 8;
    let n = keys.len();
    // SAFETY (whole body): the caller guarantees G query rows at `q`, G score rows at `out`
    // (`stride` apart, `n` long) and `head_dim` values in every key row.
    unsafe {
        let mut j = 0;
        while j + 4 <= n {
            let k = [keys[j].as_ptr(), keys[j + 1].as_ptr(), keys[j + 2].as_ptr(), keys[j + 3].as_ptr()];
            let mut acc = [[_mm256_setzero_ps(); 4]; G];
            for d in (0..full).step_by(8) {
                let kv = [
                    _mm256_loadu_ps(k[0].add(d)),
                    _mm256_loadu_ps(k[1].add(d)),
                    _mm256_loadu_ps(k[2].add(d)),
                    _mm256_loadu_ps(k[3].add(d)),
                ];
                for (g, acc_g) in acc.iter_mut().enumerate() {
                    let qv = _mm256_loadu_ps(q.add(g * head_dim + d));
                    for i in 0..4 {
                        acc_g[i] = _mm256_fmadd_ps(qv, kv[i], acc_g[i]);
                    }
                }
            }
            for (g, acc_g) in acc.iter().enumerate() {
                // Pairwise sums within 128-bit halves, then the halves added: lane i of the
                // 128-bit result is key i's total.
                let t0 = _mm256_hadd_ps(acc_g[0], acc_g[1]);
                let t1 = _mm256_hadd_ps(acc_g[2], acc_g[3]);
                let u = _mm256_hadd_ps(t0, t1);
                let sums = _mm_add_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps::<1>(u));
                let mut lanes = [0f32; 4];
                _mm_storeu_ps(lanes.as_mut_ptr(), sums);
                for (i, lane) in lanes.iter().enumerate() {
                    let mut tail = 0.0;
                    for d in full..head_dim {
                        tail += *q.add(g * head_dim + d) * *k[i].add(d);
                    }
                    *out.add(g * stride + j + i) = lane + tail;
                }
            }
            j += 4;
        }
        for (jj, key) in keys.iter().enumerate().skip(j) {
            for g in 0..G {
                let q_row = std::slice::from_raw_parts(q.add(g * head_dim), head_dim);
                *out.add(g * stride + jj) = crate::simd::dot::<crate::simd::Fused>(q_row, key);
            }
        }
    }
}

/// [`accumulate_portable`] with AVX-512: for each 64-wide slice of the head, up to four output
/// rows stay in registers while the values stream past once.
///
/// # Safety
/// The CPU must have AVX-512F and FMA; `out` holds whole rows, every value row at least
/// `head_dim` values and `p` reaches `(rows - 1) * stride + values.len()`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
pub(crate) unsafe fn accumulate_avx512(
    out: &mut [f32],
    head_dim: usize,
    p: &[f32],
    stride: usize,
    values: &[&[f32]],
) {
    let rows = out.len() / head_dim;
    assert!(values.iter().all(|v| v.len() >= head_dim));
    assert!(rows == 0 || p.len() >= (rows - 1) * stride + values.len());
    let mut g = 0;
    while g < rows {
        let (op, pp) = (out[g * head_dim..].as_mut_ptr(), p[g * stride..].as_ptr());
        // SAFETY: rows g.. of out and p exist (asserted above), values are long enough.
        unsafe {
            match rows - g {
                1 => accumulate_rows_avx512::<1>(op, head_dim, pp, stride, values),
                2 => accumulate_rows_avx512::<2>(op, head_dim, pp, stride, values),
                3 => accumulate_rows_avx512::<3>(op, head_dim, pp, stride, values),
                _ => accumulate_rows_avx512::<4>(op, head_dim, pp, stride, values),
            }
        }
        g += 4;
    }
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn accumulate_rows_avx512<const G: usize>(
    out: *mut f32,
    head_dim: usize,
    p: *const f32,
    stride: usize,
    values: &[&[f32]],
) {
    use std::arch::x86_64::*;
    // SAFETY (whole body): the caller guarantees G output rows at `out`, G weight rows at `p`
    // (`stride` apart, `values.len()` long) and `head_dim` values in every value row; masked
    // loads and stores cover only the lanes below `head_dim`.
    unsafe {
        for d0 in (0..head_dim).step_by(64) {
            let width = (head_dim - d0).min(64);
            let masks: [__mmask16; 4] = std::array::from_fn(|s| {
                let lanes = width.saturating_sub(s * 16).min(16);
                if lanes == 16 {
                    0xFFFF
                } else {
                    ((1u32 << lanes) - 1) as u16
                }
            });
            let mut acc = [[_mm512_setzero_ps(); 4]; G];
            for (j, v) in values.iter().enumerate() {
                let v = v.as_ptr().add(d0);
                let vv = [
                    _mm512_maskz_loadu_ps(masks[0], v),
                    _mm512_maskz_loadu_ps(masks[1], v.add(16)),
                    _mm512_maskz_loadu_ps(masks[2], v.add(32)),
                    _mm512_maskz_loadu_ps(masks[3], v.add(48)),
                ];
                for (g, acc_g) in acc.iter_mut().enumerate() {
                    let w = _mm512_set1_ps(*p.add(g * stride + j));
                    for s in 0..4 {
                        acc_g[s] = _mm512_fmadd_ps(w, vv[s], acc_g[s]);
                    }
                }
            }
            for (g, acc_g) in acc.iter().enumerate() {
                let o = out.add(g * head_dim + d0);
                for s in 0..4 {
                    let cur = _mm512_maskz_loadu_ps(masks[s], o.add(s * 16));
                    _mm512_mask_storeu_ps(o.add(s * 16), masks[s], _mm512_add_ps(cur, acc_g[s]));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simd::Separate;

    fn values(n: usize, seed: usize) -> Vec<f32> {
        (0..n).map(|i| (((i + seed) * 2654435761) % 1000) as f32 / 500.0 - 1.0).collect()
    }

    /// The x86 group loops agree with the portable ones for group sizes around their row blocks,
    /// head sizes with partial vectors, and key counts around their blocks of four.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn x86_group_loops_match_the_portable_ones() {
        use crate::simd::{level, Level};
        let stride = 70;
        for head_dim in [64, 40, 13, 128] {
            for rows in 1..=7 {
                for n in [0, 1, 3, 4, 9, 64] {
                    let q = values(rows * head_dim, 1);
                    let kv = values(n * head_dim, 2);
                    let keys: Vec<&[f32]> = kv.chunks_exact(head_dim).collect();
                    let mut want = vec![0f32; rows * stride];
                    scores_portable::<Separate>(&q, head_dim, &keys, &mut want, stride);
                    if level() != Level::None {
                        let mut got = vec![0f32; rows * stride];
                        // SAFETY: the CPU has AVX2 and FMA; the shapes are as required.
                        unsafe { scores_avx2(&q, head_dim, &keys, &mut got, stride) };
                        for (g, w) in got.iter().zip(&want) {
                            assert!(
                                (g - w).abs() <= 1e-4,
                                "scores hd {head_dim} rows {rows} n {n}: {g} vs {w}"
                            );
                        }
                    }
                    let p = values(rows * stride, 3);
                    let start = values(rows * head_dim, 4);
                    let mut want = start.clone();
                    accumulate_portable::<Separate>(&mut want, head_dim, &p, stride, &keys);
                    if level() == Level::Avx512 {
                        let mut got = start.clone();
                        // SAFETY: the CPU has AVX-512F and FMA; the shapes are as required.
                        unsafe { accumulate_avx512(&mut got, head_dim, &p, stride, &keys) };
                        for (g, w) in got.iter().zip(&want) {
                            assert!(
                                (g - w).abs() <= 1e-4,
                                "accumulate hd {head_dim} rows {rows} n {n}: {g} vs {w}"
                            );
                        }
                    }
                }
            }
        }
    }
}

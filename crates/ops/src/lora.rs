//! The LoRA delta of a step that mixes adapters: rows `start..start + rows` of a projection's
//! output add `B (A x)` of their own adapter, every segment in one op (Punica's segmented
//! gather: shrink to the rank, then expand), rows of no segment pass through. `A` is `[r, in]`
//! (PEFT's layout) and `B` is given transposed, `[r, out]`, already scaled by `alpha / r`: the
//! expansion then reads contiguous rows of outputs (vector adds on the CPU, coalesced loads on a
//! GPU). The matrices are of `x`'s dtype, or on the CPU bfloat16 whatever `x`'s (read widened
//! to f32, so an f32 model's bfloat16 adapter gives the bits of f32 matrices of its values). [`lora_add_parts`] takes several projections of the same input (Q/K/V, gate/up) in
//! one call: on the CPU one parallel loop for all of them ([`crate::lora_cpu`]).
//!
//! Each output row is computed from its own input row alone, in a fixed order (on the CPU the
//! same sums whatever the batch, block or vector width; on CUDA kernels/lora.cu, one block per
//! row), so a row's bits do not depend on which other rows or adapters share the step: what
//! `--batch-invariant` needs. On Metal the segments run as candle matmuls.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp2, DType, Device, Layout, Result, Shape, Storage, Tensor, WithDType};

use crate::check::{self, invalid};
use crate::dtype::{check_float, with_float};
use crate::lora_cpu::{add_parts, CpuPart};

const OP: &str = "lora_add";

/// Rows `start..start + rows` use the adapter whose matrices are `a` (`[r, in]`) and `b`
/// (`B^T`, `[r, out]`, scaled).
#[derive(Debug, Clone)]
pub struct LoraSegment {
    pub start: usize,
    pub rows: usize,
    pub a: Tensor,
    pub b: Tensor,
}

/// `base + delta`: `base` is the projection of `x` (`[rows, in]`), any shape of `rows * out`
/// elements; the result has its shape and dtype. Segments must be ascending and disjoint, their
/// matrices of `x`'s dtype and device with `in` and `out` matching.
pub fn lora_add(base: &Tensor, x: &Tensor, segments: &[LoraSegment]) -> Result<Tensor> {
    let (rows, out) = check_part(base, x, segments)?;
    if is_no_delta(segments, x, out) {
        return Ok(base.clone());
    }
    let flat = base.reshape((rows, out))?;
    let sum = match x.device() {
        Device::Cpu | Device::Cuda(_) => {
            flat.apply_op2_no_bwd(&x.contiguous()?, &LoraAdd { segments: segments.to_vec() })?
        }
        Device::Metal(_) => composite(&flat, x, segments)?,
    };
    sum.reshape(base.shape())
}

/// One projection of [`lora_add_parts`]: its base output and the segments adding deltas to it
/// (as [`lora_add`] takes them).
#[derive(Debug, Clone)]
pub struct LoraPart {
    pub base: Tensor,
    pub segments: Vec<LoraSegment>,
}

/// [`lora_add`] of each part, all with input `x`: the projections that share an input (Q/K/V,
/// gate/up) in one call. On the CPU every part's shrink and expansion run in one parallel
/// loop, rows of one adapter together; elsewhere it is one [`lora_add`] per part. Results are
/// in the parts' order, each of its base's shape (contiguous when a delta was added).
pub fn lora_add_parts(x: &Tensor, parts: &[LoraPart]) -> Result<Vec<Tensor>> {
    let mut widths = Vec::with_capacity(parts.len());
    for part in parts {
        widths.push(check_part(&part.base, x, &part.segments)?.1);
    }
    if !x.device().is_cpu() {
        return parts.iter().map(|p| lora_add(&p.base, x, &p.segments)).collect();
    }
    let busy: Vec<usize> =
        (0..parts.len()).filter(|&i| !is_no_delta(&parts[i].segments, x, widths[i])).collect();
    let mut results: Vec<Tensor> = parts.iter().map(|p| p.base.clone()).collect();
    if busy.is_empty() {
        return Ok(results);
    }
    let x = row_view(x, x.dim(0)?)?;
    let rows = x.dim(0)?;
    let bases: Vec<Tensor> = busy
        .iter()
        .map(|&i| row_view(&parts[i].base.reshape((rows, widths[i]))?, rows))
        .collect::<Result<_>>()?;
    let (x_storage, x_layout) = x.storage_and_layout();
    let Storage::Cpu(x_cpu) = &*x_storage else { return Err(invalid(OP, "x is not on the CPU")) };
    let guards: Vec<_> = bases.iter().map(|b| b.storage_and_layout()).collect();
    let sums = with_float!(x.dtype(), OP, T => {
        let cpu_parts = busy
            .iter()
            .zip(&guards)
            .map(|(&i, (storage, layout))| {
                let Storage::Cpu(cpu) = &**storage else { return Err(invalid(OP, "base is not on the CPU")) };
                Ok(CpuPart { base: cpu.as_slice::<T>()?, rows: check::rows(layout, 1, OP)?, segments: &parts[i].segments })
            })
            .collect::<Result<Vec<_>>>()?;
        add_parts::<T>(x_cpu.as_slice::<T>()?, check::rows(x_layout, 1, OP)?, &cpu_parts)?
            .into_iter()
            .zip(&busy)
            .map(|(sum, &i)| Tensor::from_vec(sum, parts[i].base.shape(), &Device::Cpu))
            .collect::<Result<Vec<_>>>()
    })?;
    for (sum, &i) in sums.into_iter().zip(&busy) {
        results[i] = sum;
    }
    Ok(results)
}

/// Checks a part (see [`lora_add`]); returns `x`'s rows and the output width.
fn check_part(base: &Tensor, x: &Tensor, segments: &[LoraSegment]) -> Result<(usize, usize)> {
    let [rows, input] = check::dims::<2>(x)?;
    let out = base.elem_count().checked_div(rows).unwrap_or(0);
    if out * rows != base.elem_count() {
        return Err(invalid(OP, format!("base of shape {:?} is not {rows} rows", base.shape())));
    }
    check_float(x.dtype(), OP)?;
    check::dtype_is(base, x.dtype(), OP)?;
    check::same_device(base, x, OP)?;
    let mut next = 0;
    for s in segments {
        if s.start < next || s.start + s.rows > rows {
            return Err(invalid(
                OP,
                format!("segment {}..{} is out of order or past {rows} rows", s.start, s.start + s.rows),
            ));
        }
        next = s.start + s.rows;
        let [r, a_in] = check::dims::<2>(&s.a)?;
        check::shape_is(&s.b, &[r, out], OP, "b")?;
        if a_in != input {
            return Err(invalid(OP, format!("a is [{r}, {a_in}], x rows are {input} wide")));
        }
        for m in [&s.a, &s.b] {
            // The CPU kernel also reads bfloat16 matrices beside wider inputs (an f32 model's
            // adapter kept in its file's bfloat16).
            if !(x.device().is_cpu() && m.dtype() == DType::BF16) {
                check::dtype_is(m, x.dtype(), OP)?;
            }
            check::same_device(m, x, OP)?;
        }
    }
    Ok((rows, out))
}

/// No rows to adapt, or a delta of nothing (no inputs) or into nothing (no outputs).
fn is_no_delta(segments: &[LoraSegment], x: &Tensor, out: usize) -> bool {
    segments.iter().all(|s| s.rows == 0) || x.dim(1).unwrap_or(0) == 0 || out == 0
}

/// `t` (`[rows, ...]`) itself when the CPU kernel can read it as rows, else a contiguous copy.
fn row_view(t: &Tensor, rows: usize) -> Result<Tensor> {
    match check::rows(t.layout(), t.rank().saturating_sub(1), OP) {
        Ok(view) if view.rows == rows => Ok(t.clone()),
        _ => t.contiguous(),
    }
}

/// Candle matmuls per segment, concatenated with the untouched rows between them.
fn composite(base: &Tensor, x: &Tensor, segments: &[LoraSegment]) -> Result<Tensor> {
    let mut pieces = Vec::with_capacity(2 * segments.len() + 1);
    let mut next = 0;
    for s in segments.iter().filter(|s| s.rows > 0) {
        if s.start > next {
            pieces.push(base.narrow(0, next, s.start - next)?);
        }
        let delta = x.narrow(0, s.start, s.rows)?.matmul(&s.a.t()?)?.matmul(&s.b)?;
        pieces.push((base.narrow(0, s.start, s.rows)? + delta)?);
        next = s.start + s.rows;
    }
    if next < base.dim(0)? {
        pieces.push(base.narrow(0, next, base.dim(0)? - next)?);
    }
    Tensor::cat(&pieces, 0)
}

struct LoraAdd {
    segments: Vec<LoraSegment>,
}

impl CustomOp2 for LoraAdd {
    fn name(&self) -> &'static str {
        OP
    }

    fn cpu_fwd(
        &self,
        base: &CpuStorage,
        b_l: &Layout,
        x: &CpuStorage,
        x_l: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let storage = with_float!(base.dtype(), OP, T => {
            let part = CpuPart { base: base.as_slice::<T>()?, rows: check::rows(b_l, 1, OP)?, segments: &self.segments };
            let sum = add_parts::<T>(x.as_slice::<T>()?, check::rows(x_l, 1, OP)?, &[part])?;
            Ok(T::to_cpu_storage_owned(sum.into_iter().next().unwrap_or_default()))
        })?;
        Ok((storage, b_l.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        base: &candle_core::CudaStorage,
        b_l: &Layout,
        x: &candle_core::CudaStorage,
        x_l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        crate::cuda::lora::lora_add(base, b_l, x, x_l, &self.segments)
    }
}

#[cfg(test)]
mod tests {
    use candle_core::DType;

    use super::*;

    fn random(seed: u64, shape: &[usize]) -> Tensor {
        let n: usize = shape.iter().product();
        let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let values: Vec<f32> = (0..n)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5
            })
            .collect();
        Tensor::from_vec(values, shape, &Device::Cpu).unwrap()
    }

    fn segment(seed: u64, start: usize, rows: usize, rank: usize, input: usize, out: usize) -> LoraSegment {
        LoraSegment { start, rows, a: random(seed, &[rank, input]), b: random(seed + 1, &[rank, out]) }
    }

    #[test]
    fn matches_matmuls_and_leaves_other_rows_alone() {
        let (rows, input, out) = (9, 37, 21);
        let x = random(1, &[rows, input]);
        let base = random(2, &[rows, out]);
        let segments = [segment(10, 1, 3, 4, input, out), segment(20, 5, 2, 7, input, out)];
        let got = lora_add(&base, &x, &segments).unwrap();
        let want = composite(&base, &x, &segments).unwrap();
        let diff = (got - &want).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
        assert!(diff < 1e-5, "{diff}");
        let got = lora_add(&base, &x, &segments).unwrap();
        for untouched in [0, 4, 7, 8] {
            assert_eq!(
                got.get(untouched).unwrap().to_vec1::<f32>().unwrap(),
                base.get(untouched).unwrap().to_vec1::<f32>().unwrap()
            );
        }
    }

    #[test]
    fn a_row_has_the_same_bits_in_any_batch() {
        let (input, out) = (64, 48);
        let x = random(3, &[12, input]);
        let base = random(4, &[12, out]);
        let lora = segment(30, 0, 12, 8, input, out);
        let all = lora_add(&base, &x, std::slice::from_ref(&lora)).unwrap();
        for (start, rows) in [(0, 1), (5, 1), (3, 6)] {
            let alone = LoraSegment { start: 0, rows, ..lora.clone() };
            let part =
                lora_add(&base.narrow(0, start, rows).unwrap(), &x.narrow(0, start, rows).unwrap(), &[alone])
                    .unwrap();
            let whole = all.narrow(0, start, rows).unwrap();
            assert_eq!(
                part.to_vec2::<f32>().unwrap(),
                whole.to_vec2::<f32>().unwrap(),
                "rows {start}+{rows}"
            );
        }
    }

    #[test]
    fn half_precision_and_head_shaped_outputs() {
        let (rows, input, heads, dim) = (5, 16, 3, 4);
        let x = random(5, &[rows, input]).to_dtype(DType::BF16).unwrap();
        let base = random(6, &[rows, heads, dim]).to_dtype(DType::BF16).unwrap();
        let s = segment(40, 2, 3, 2, input, heads * dim);
        let s =
            LoraSegment { a: s.a.to_dtype(DType::BF16).unwrap(), b: s.b.to_dtype(DType::BF16).unwrap(), ..s };
        let got = lora_add(&base, &x, std::slice::from_ref(&s)).unwrap();
        assert_eq!(got.dims(), [rows, heads, dim]);
        let want = composite(&base.reshape((rows, heads * dim)).unwrap(), &x, &[s]).unwrap();
        let diff = (got.reshape((rows, heads * dim)).unwrap().to_dtype(DType::F32).unwrap()
            - want.to_dtype(DType::F32).unwrap())
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
        assert!(diff < 0.05, "{diff}");
    }

    /// `base + B^T (A x)` of each row of `segments` in f64, from the tensors' values.
    fn reference(base: &Tensor, x: &Tensor, segments: &[LoraSegment]) -> Vec<Vec<f64>> {
        let rows = x.dim(0).unwrap();
        let as64 = |t: &Tensor| t.to_dtype(DType::F64).unwrap().to_vec2::<f64>().unwrap();
        let (x, mut want) = (as64(x), as64(&base.reshape((rows, ())).unwrap()));
        for s in segments {
            let (a, b) = (as64(&s.a), as64(&s.b));
            for (row, want) in want.iter_mut().enumerate().skip(s.start).take(s.rows) {
                let t: Vec<f64> = a.iter().map(|a| a.iter().zip(&x[row]).map(|(a, x)| a * x).sum()).collect();
                for (c, w) in want.iter_mut().enumerate() {
                    *w += t.iter().zip(&b).map(|(t, b)| t * b[c]).sum::<f64>();
                }
            }
        }
        want
    }

    /// Three projections of one input (odd widths, one of them head-shaped) over rows that take
    /// turns at three adapters of ranks 8, 16 and 5 (the same adapter in separate segments) and
    /// at none: each part matches the f64 sum, equals `lora_add` of that part alone, and a row's
    /// bits do not change when it runs alone, in a pool of one thread or of four.
    #[test]
    fn parts_match_float64_and_a_row_keeps_its_bits() {
        let (rows, input) = (11, 67);
        let outs = [150, 21, 3 * 30];
        let x = random(50, &[rows, input]);
        let adapters: Vec<Vec<(Tensor, Tensor)>> = [8, 16, 5]
            .iter()
            .enumerate()
            .map(|(i, &rank)| {
                outs.iter()
                    .enumerate()
                    .map(|(p, &out)| {
                        let s = segment(100 * i as u64 + 10 * p as u64, 0, 0, rank, input, out);
                        (s.a, s.b)
                    })
                    .collect()
            })
            .collect();
        // (start, rows, adapter): row 2 and rows 9..11 have none.
        let layout = [(0, 2, 0), (3, 3, 1), (6, 1, 0), (7, 2, 2)];
        let parts: Vec<LoraPart> = outs
            .iter()
            .enumerate()
            .map(|(p, &out)| {
                let base = random(60 + p as u64, &[rows, out]);
                let base = if p == 2 { base.reshape((rows, 3, 30)).unwrap() } else { base };
                let segments = layout
                    .iter()
                    .map(|&(start, n, i)| {
                        let (a, b) = &adapters[i][p];
                        LoraSegment { start, rows: n, a: a.clone(), b: b.clone() }
                    })
                    .collect();
                LoraPart { base, segments }
            })
            .collect();
        let flat = |t: &Tensor| t.flatten_from(1).unwrap().to_vec2::<f32>().unwrap();
        let pool = |n| rayon::ThreadPoolBuilder::new().num_threads(n).build().unwrap();
        let all = pool(4).install(|| lora_add_parts(&x, &parts)).unwrap();
        for (p, (part, got)) in parts.iter().zip(&all).enumerate() {
            assert_eq!(got.dims(), part.base.dims());
            let want = reference(&part.base, &x, &part.segments);
            for (r, (got, want)) in flat(got).iter().zip(&want).enumerate() {
                for (g, w) in got.iter().zip(want) {
                    assert!((*g as f64 - w).abs() < 1e-5, "part {p} row {r}: {g} against {w}");
                }
            }
            for untouched in [2, 9, 10] {
                assert_eq!(flat(got)[untouched], flat(&part.base)[untouched]);
            }
            let alone = lora_add(&part.base, &x, &part.segments).unwrap();
            assert_eq!(flat(&alone), flat(got), "part {p} through lora_add");
        }
        // Each row alone, its segment cut to it: one block (split into column pieces in a pool of
        // several threads), instead of a block of up to four rows of its adapter.
        for threads in [1, 4] {
            for row in 0..rows {
                let one: Vec<LoraPart> = parts
                    .iter()
                    .map(|p| LoraPart {
                        base: p.base.narrow(0, row, 1).unwrap(),
                        segments: p
                            .segments
                            .iter()
                            .filter(|s| (s.start..s.start + s.rows).contains(&row))
                            .map(|s| LoraSegment { start: 0, rows: 1, ..s.clone() })
                            .collect(),
                    })
                    .collect();
                let x_row = x.narrow(0, row, 1).unwrap();
                let got = pool(threads).install(|| lora_add_parts(&x_row, &one)).unwrap();
                for (p, (got, whole)) in got.iter().zip(&all).enumerate() {
                    assert_eq!(flat(got)[0], flat(whole)[row], "part {p} row {row}, {threads} threads");
                }
            }
        }
    }

    #[test]
    fn half_precision_parts_and_errors() {
        let (rows, input) = (6, 24);
        let x = random(70, &[rows, input]).to_dtype(DType::BF16).unwrap();
        let half = |s: LoraSegment| LoraSegment {
            a: s.a.to_dtype(DType::BF16).unwrap(),
            b: s.b.to_dtype(DType::BF16).unwrap(),
            ..s
        };
        let parts: Vec<LoraPart> = [40, 17]
            .iter()
            .enumerate()
            .map(|(p, &out)| LoraPart {
                base: random(71 + p as u64, &[rows, out]).to_dtype(DType::BF16).unwrap(),
                segments: vec![half(segment(80 + p as u64, 1, 4, 16, input, out))],
            })
            .collect();
        let got = lora_add_parts(&x, &parts).unwrap();
        for (part, got) in parts.iter().zip(&got) {
            let want = reference(&part.base, &x, &part.segments);
            for (g, w) in got
                .to_dtype(DType::F32)
                .unwrap()
                .to_vec2::<f32>()
                .unwrap()
                .iter()
                .flatten()
                .zip(want.iter().flatten())
            {
                assert!((*g as f64 - w).abs() < 0.02 * (1.0 + w.abs()), "{g} against {w}");
            }
        }
        let mut wrong = parts.clone();
        wrong[1].segments[0].start = 4;
        assert!(lora_add_parts(&x, &wrong).is_err(), "a segment past the rows");
        let no_rows = [LoraPart { base: parts[0].base.clone(), segments: Vec::new() }];
        let same = lora_add_parts(&x, &no_rows).unwrap();
        assert_eq!(
            same[0].to_dtype(DType::F32).unwrap().to_vec2::<f32>().unwrap(),
            parts[0].base.to_dtype(DType::F32).unwrap().to_vec2::<f32>().unwrap()
        );
    }

    #[test]
    fn bad_segments_are_errors() {
        let x = random(7, &[4, 8]);
        let base = random(8, &[4, 6]);
        let overlapping = [segment(1, 0, 3, 2, 8, 6), segment(2, 2, 2, 2, 8, 6)];
        assert!(lora_add(&base, &x, &overlapping).is_err());
        assert!(lora_add(&base, &x, &[segment(3, 3, 2, 2, 8, 6)]).is_err(), "past the rows");
        assert!(lora_add(&base, &x, &[segment(4, 0, 2, 2, 9, 6)]).is_err(), "wrong input width");
        assert!(lora_add(&base, &x, &[segment(5, 0, 2, 2, 8, 5)]).is_err(), "wrong output width");
        // Empty widths are no delta, not a crash.
        let (empty_x, empty_base) = (random(9, &[4, 0]), random(10, &[4, 6]));
        let same = lora_add(&empty_base, &empty_x, &[segment(6, 0, 2, 2, 0, 6)]).unwrap();
        assert_eq!(same.to_vec2::<f32>().unwrap(), empty_base.to_vec2::<f32>().unwrap());
        let nothing = lora_add(&random(11, &[4, 0]), &x, &[segment(7, 0, 2, 2, 8, 0)]).unwrap();
        assert_eq!(nothing.dims(), [4, 0]);
    }

    /// bfloat16 matrices beside f32 rows (an f32 model's bfloat16 adapter) give the bits of f32
    /// matrices holding the same values, through both entry points and in a pool of one thread or
    /// four; on other devices the dtypes must still match.
    #[test]
    fn bfloat16_matrices_give_the_bits_of_f32_ones() {
        let (rows, input) = (7, 67);
        let x = random(90, &[rows, input]);
        let round = |t: Tensor| t.to_dtype(DType::BF16).unwrap();
        let parts16: Vec<LoraPart> = [150, 21]
            .iter()
            .enumerate()
            .map(|(p, &out)| {
                let s = segment(91 + p as u64, 1, 5, 16, input, out);
                LoraPart {
                    base: random(95 + p as u64, &[rows, out]),
                    segments: vec![LoraSegment { a: round(s.a), b: round(s.b), ..s }],
                }
            })
            .collect();
        let parts32: Vec<LoraPart> = parts16
            .iter()
            .map(|p| LoraPart {
                base: p.base.clone(),
                segments: p
                    .segments
                    .iter()
                    .map(|s| LoraSegment {
                        a: s.a.to_dtype(DType::F32).unwrap(),
                        b: s.b.to_dtype(DType::F32).unwrap(),
                        ..s.clone()
                    })
                    .collect(),
            })
            .collect();
        let bits = |t: &Tensor| {
            t.flatten_all().unwrap().to_vec1::<f32>().unwrap().iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        };
        let pool = |n| rayon::ThreadPoolBuilder::new().num_threads(n).build().unwrap();
        for threads in [1, 4] {
            let want = pool(threads).install(|| lora_add_parts(&x, &parts32)).unwrap();
            let got = pool(threads).install(|| lora_add_parts(&x, &parts16)).unwrap();
            for (p, (got, want)) in got.iter().zip(&want).enumerate() {
                assert_eq!(got.dtype(), DType::F32);
                assert_eq!(bits(got), bits(want), "part {p}, {threads} threads");
                let alone = lora_add(&parts16[p].base, &x, &parts16[p].segments).unwrap();
                assert_eq!(bits(&alone), bits(want), "part {p} through lora_add");
            }
        }
        // f16 matrices beside f32 rows are still refused.
        let s = &parts16[0].segments[0];
        let f16 = LoraSegment {
            a: s.a.to_dtype(DType::F16).unwrap(),
            b: s.b.to_dtype(DType::F16).unwrap(),
            ..s.clone()
        };
        assert!(lora_add(&parts16[0].base, &x, &[f16]).is_err());
    }
}

//! The LoRA delta of a step that mixes adapters: rows `start..start + rows` of a projection's
//! output add `B (A x)` of their own adapter, every segment in one op (Punica's segmented
//! gather: shrink to the rank, then expand), rows of no segment pass through. `A` is `[r, in]`
//! (PEFT's layout) and `B` is given transposed, `[r, out]`, already scaled by `alpha / r`: the
//! expansion then reads contiguous rows of outputs (vector adds on the CPU, coalesced loads on a
//! GPU).
//!
//! Each output row is computed from its own input row alone, in a fixed order (on the CPU f32
//! dot products of the same lengths whatever the batch; on CUDA kernels/lora.cu, one block per
//! row), so a row's bits do not depend on which other rows or adapters share the step: what
//! `--batch-invariant` needs. On Metal the segments run as candle matmuls.

use std::borrow::Cow;

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp2, Device, Layout, Result, Shape, Storage, Tensor};
use rayon::prelude::*;

use crate::check::{self, invalid};
use crate::dtype::{check_float, storage_to_f32, with_float, Float};
use crate::simd::{dot, Separate};

const OP: &str = "lora_add";
/// Rows a block of the CPU op computes together.
const BLOCK_ROWS: usize = 4;
/// Output columns of one task of the CPU op's expansion when blocks are few.
const EXPAND_COLUMNS: usize = 256;

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
            check::dtype_is(m, x.dtype(), OP)?;
            check::same_device(m, x, OP)?;
        }
    }
    // No rows to adapt, or a delta of nothing (no inputs) or into nothing (no outputs).
    if segments.iter().all(|s| s.rows == 0) || input == 0 || out == 0 {
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

/// A segment's matrices as f32 on the host: `a` row-major `[r, in]`, `b` `[r, out]`.
struct HostSegment<'a> {
    start: usize,
    rows: usize,
    rank: usize,
    a: Cow<'a, [f32]>,
    b: Cow<'a, [f32]>,
}

/// The elements of contiguous CPU storage `s` (laid out by `l`) as f32: borrowed when f32.
fn host_f32<'a>(s: &'a Storage, l: &Layout) -> Result<Cow<'a, [f32]>> {
    let Storage::Cpu(cpu) = s else {
        return Err(invalid(OP, "adapter matrices must be on the CPU with x"));
    };
    let (start, end) = check::contiguous_range(l, OP)?;
    if let CpuStorage::F32(v) = cpu {
        return v
            .get(start..end)
            .map(Cow::Borrowed)
            .ok_or_else(|| invalid(OP, "matrix view past its storage"));
    }
    Ok(Cow::Owned(storage_to_f32(cpu, start, end - start, OP)?))
}

impl LoraAdd {
    fn run<T: Float>(
        &self,
        base: &CpuStorage,
        b_l: &Layout,
        x: &CpuStorage,
        x_l: &Layout,
    ) -> Result<CpuStorage> {
        let (bs, xs) = (base.as_slice::<T>()?, x.as_slice::<T>()?);
        let (b_rows, x_rows) = (check::rows(b_l, 1, OP)?, check::rows(x_l, 1, OP)?);
        if b_rows.end() > bs.len() || x_rows.end() > xs.len() || b_rows.rows != x_rows.rows {
            return Err(invalid(OP, "base / x views do not match their storage"));
        }
        let guards: Vec<_> =
            self.segments.iter().map(|s| (s.a.storage_and_layout(), s.b.storage_and_layout())).collect();
        let segments = self
            .segments
            .iter()
            .zip(&guards)
            .map(|(s, ((a, a_l), (b, b_l)))| {
                Ok(HostSegment {
                    start: s.start,
                    rows: s.rows,
                    rank: s.a.dim(0)?,
                    a: host_f32(a, a_l)?,
                    b: host_f32(b, b_l)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let (rows, input, out) = (b_rows.rows, x_rows.row_len, b_rows.row_len);
        // Blocks of up to BLOCK_ROWS rows of one segment (or of none), in row order: a block
        // reads each row of A and B once for all its rows.
        let mut blocks: Vec<(usize, usize, Option<usize>)> = Vec::new();
        let mut push = |from: usize, to: usize, segment: Option<usize>| {
            for first in (from..to).step_by(BLOCK_ROWS) {
                blocks.push((first, BLOCK_ROWS.min(to - first), segment));
            }
        };
        let mut next = 0;
        for (i, s) in segments.iter().enumerate() {
            push(next, s.start, None);
            push(s.start, s.start + s.rows, Some(i));
            next = s.start + s.rows;
        }
        push(next, rows, None);
        // Shrink: each block's `t = A x` (`[n, r]`), blocks in parallel.
        let shrunk: Vec<Vec<f32>> = blocks
            .par_iter()
            .map(|&(first, n, segment)| {
                let Some(s) = segment.map(|i| &segments[i]) else { return Vec::new() };
                let mut xf = vec![0f32; n * input];
                for (j, x_row) in xf.chunks_exact_mut(input).enumerate() {
                    T::to_f32_slice(&xs[x_rows.range(first + j)], x_row);
                }
                let mut t = vec![0f32; n * s.rank];
                for (k, a_k) in s.a.chunks_exact(input).enumerate() {
                    for (j, x_row) in xf.chunks_exact(input).enumerate() {
                        t[j * s.rank + k] = dot::<Separate>(x_row, a_k);
                    }
                }
                t
            })
            .collect();
        // Expand: tasks of one block's rows over a range of output columns, so that even one
        // row keeps every thread of the pool busy (a thread left idle falls asleep, and the
        // next op's matmul waits for it to wake).
        let mut out_rows = vec![T::from_f32(0.0); rows * out];
        // With blocks enough for every thread, a task takes whole rows (each row of B read once
        // per block); with few, ranges of columns.
        let columns =
            if blocks.len() >= 2 * rayon::current_num_threads() { out.max(1) } else { EXPAND_COLUMNS };
        let mut tasks: Vec<(usize, usize, Vec<&mut [T]>)> = Vec::new();
        let mut rest = out_rows.as_mut_slice();
        for (b, &(_, n, _)) in blocks.iter().enumerate() {
            let (part, tail) = rest.split_at_mut(n * out);
            rest = tail;
            let first_task = tasks.len();
            for (j, row) in part.chunks_exact_mut(out).enumerate() {
                for (c, cols) in row.chunks_mut(columns).enumerate() {
                    if j == 0 {
                        tasks.push((b, c * columns, Vec::with_capacity(n)));
                    }
                    tasks[first_task + c].2.push(cols);
                }
            }
        }
        tasks.into_par_iter().for_each(|(b, c0, mut dst)| {
            let (first, _, segment) = blocks[b];
            let width = dst[0].len();
            let Some(s) = segment.map(|i| &segments[i]) else {
                for (j, d) in dst.iter_mut().enumerate() {
                    d.copy_from_slice(&bs[b_rows.range(first + j)][c0..c0 + width]);
                }
                return;
            };
            let t = &shrunk[b];
            // delta = sum over k of t[k] * B^T[k], k ascending: plain adds, which the compiler
            // vectorizes and never fuses, so a row's bits depend on neither the CPU nor its
            // block or column range.
            let mut acc = vec![0f32; dst.len() * width];
            for (k, b_k) in s.b.chunks_exact(out).enumerate() {
                let b_k = &b_k[c0..c0 + width];
                for (j, acc_row) in acc.chunks_exact_mut(width).enumerate() {
                    let tk = t[j * s.rank + k];
                    for (a, &w) in acc_row.iter_mut().zip(b_k) {
                        *a += tk * w;
                    }
                }
            }
            for (j, (d, acc_row)) in dst.iter_mut().zip(acc.chunks_exact(width)).enumerate() {
                let base_row = &bs[b_rows.range(first + j)][c0..c0 + width];
                for ((o, b), a) in d.iter_mut().zip(base_row).zip(acc_row) {
                    *o = T::from_f32(b.to_f32() + a);
                }
            }
        });
        Ok(T::to_cpu_storage_owned(out_rows))
    }
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
        let storage = with_float!(base.dtype(), OP, T => self.run::<T>(base, b_l, x, x_l))?;
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
}

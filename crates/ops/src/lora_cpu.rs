//! The CPU kernel of the LoRA op: the deltas of several projections that share their input
//! (`parts`), each part's rows grouped by adapter, in one parallel loop.
//!
//! - **One parallel loop per call.** A task shrinks its rows (`t = A x`) and expands them into
//!   its columns (`base + B^T t`) itself, so no task waits on another and the pool's threads
//!   never sit idle between a shrink loop and an expand loop (an idle thread falls asleep, and
//!   the next op waits for it to wake). When tasks would be fewer than threads (a decode step's
//!   one row), a part's columns are split and each piece shrinks again: the shrink is small
//!   beside the cost of a sleeping thread.
//! - **Rows of one adapter together.** Segments of the same adapter (the same `a` and `b`
//!   tensors) anywhere in the step form one group, processed [`BLOCK_ROWS`] rows at a time, so
//!   a step taking turns at four adapters reads each adapter's matrices once per block, not once
//!   per row.
//! - **Register blocking.** The shrink keeps `rows x ranks` dot products, the expansion
//!   `rows x columns` sums, in vector registers; the widest x86 level the CPU has is picked at
//!   run time (the build targets baseline x86-64).
//!
//! - **bfloat16 adapters read as they are.** Matrices stored as bfloat16 (an f32 model's
//!   adapter kept in its file's dtype) are widened in the kernels' loads, not copied to f32 per
//!   call: a decode step reads half the bytes, and the bits are those of f32 matrices holding the
//!   same values ([`crate::lora_kernels::Weight`]).
//!
//! Every value is computed in the same order whatever the vector width, block, column range or
//! batch: a shrink dot product keeps 8 partial sums (element `i` in lane `i % 8`), adds them in
//! lane order, then adds the leftover elements' own sum; an output is
//! `base + sum_k t[k] * B^T[k]`, `k` ascending from zero. Multiplies and adds are separate (no
//! FMA), so a row's bits depend on neither the CPU nor its neighbours: what `--batch-invariant`
//! needs.

use std::borrow::Cow;

use candle_core::{CpuStorage, Layout, Result, Storage};
use half::bf16;
use rayon::prelude::*;

use crate::check::{self, invalid, Rows};
use crate::dtype::{storage_to_f32, Float};
use crate::lora::LoraSegment;

const OP: &str = "lora_add";
/// Rows of one adapter a task computes together: each row of `A` and `B^T` is read once for
/// all of them. (8, two kernel tiles, measured no faster at 32 rows over 4 adapters.)
const BLOCK_ROWS: usize = 4;
/// Column pieces of a split part are multiples of this (whole expansion tiles).
const PIECE_COLUMNS: usize = 64;
/// Rows of no adapter a task copies at a time.
const COPY_ROWS: usize = 64;

/// One projection of a call: its base output (rows of `base` as `rows` views them) and the
/// segments of rows that add an adapter's delta (validated by the caller).
pub(crate) struct CpuPart<'a, T> {
    pub base: &'a [T],
    pub rows: Rows,
    pub segments: &'a [LoraSegment],
}

/// The rows of one adapter in a part, and its matrices: `a` `[rank, in]`, `b` `[rank, out]`.
struct Group<'a> {
    rank: usize,
    matrices: Matrices<'a>,
    rows: Vec<usize>,
}

/// A group's `a` and `b` as the kernels read them: both bfloat16 when both are stored so, else
/// both as f32 (borrowed when f32, converted otherwise).
enum Matrices<'a> {
    F32(Cow<'a, [f32]>, Cow<'a, [f32]>),
    Bf16(&'a [bf16], &'a [bf16]),
}

/// A task: `rows` of part `part` over columns `columns`, with group `group`'s delta or copied.
struct Task {
    part: usize,
    group: Option<usize>,
    rows: Vec<usize>,
    columns: std::ops::Range<usize>,
}

/// Each part's output (`[rows, out]`, row-major): base plus delta for the rows of a segment,
/// base for the others. `x` is `[rows, in]` as `x_rows` views it.
pub(crate) fn add_parts<T: Float>(x: &[T], x_rows: Rows, parts: &[CpuPart<'_, T>]) -> Result<Vec<Vec<T>>> {
    let rows = x_rows.rows;
    if x_rows.end() > x.len() || parts.iter().any(|p| p.rows.end() > p.base.len() || p.rows.rows != rows) {
        return Err(invalid(OP, "base / x views do not match their storage"));
    }
    // Read guards of each group's first segment's matrices, then the groups borrowing them.
    let mut firsts: Vec<Vec<usize>> = Vec::with_capacity(parts.len());
    let mut members: Vec<Vec<Vec<usize>>> = Vec::with_capacity(parts.len());
    for part in parts {
        let (mut first, mut rows_of): (Vec<usize>, Vec<Vec<usize>>) = (Vec::new(), Vec::new());
        for (i, s) in part.segments.iter().enumerate().filter(|(_, s)| s.rows > 0) {
            let same = |&f: &usize| {
                let g: &LoraSegment = &part.segments[f];
                g.a.id() == s.a.id() && g.b.id() == s.b.id()
            };
            let g = match first.iter().position(same) {
                Some(g) => g,
                None => {
                    first.push(i);
                    rows_of.push(Vec::new());
                    first.len() - 1
                }
            };
            rows_of[g].extend(s.start..s.start + s.rows);
        }
        firsts.push(first);
        members.push(rows_of);
    }
    let guards: Vec<Vec<_>> = parts
        .iter()
        .zip(&firsts)
        .map(|(part, first)| {
            first
                .iter()
                .map(|&i| (part.segments[i].a.storage_and_layout(), part.segments[i].b.storage_and_layout()))
                .collect()
        })
        .collect();
    let groups: Vec<Vec<Group<'_>>> = parts
        .iter()
        .zip(&firsts)
        .zip(guards.iter().zip(members))
        .map(|((part, first), (guards, members))| {
            first
                .iter()
                .zip(guards)
                .zip(members)
                .map(|((&i, ((a, a_l), (b, b_l))), rows)| {
                    let matrices = match (host_bf16(a, a_l)?, host_bf16(b, b_l)?) {
                        (Some(a), Some(b)) => Matrices::Bf16(a, b),
                        _ => Matrices::F32(host_f32(a, a_l)?, host_f32(b, b_l)?),
                    };
                    Ok(Group { rank: part.segments[i].a.dim(0)?, matrices, rows })
                })
                .collect::<Result<Vec<_>>>()
        })
        .collect::<Result<_>>()?;

    let (tasks, pieces) = plan(x_rows.row_len, parts, &groups, rows);
    let mut outputs: Vec<Vec<T>> =
        parts.iter().map(|p| vec![T::from_f32(0.0); rows * p.rows.row_len]).collect();
    // Every task's destination slices, cut from the outputs: (row, column piece) cells, each
    // taken by exactly one task.
    let mut cells: Vec<Vec<Option<&mut [T]>>> = outputs
        .iter_mut()
        .zip(parts.iter().zip(&pieces))
        .map(|(output, (part, &piece))| {
            let out = part.rows.row_len.max(1);
            output.chunks_exact_mut(out).flat_map(|row| row.chunks_mut(piece).map(Some)).collect()
        })
        .collect();
    let jobs: Vec<(&Task, Vec<&mut [T]>)> = tasks
        .iter()
        .map(|task| {
            let piece = pieces[task.part];
            let per_row = parts[task.part].rows.row_len.div_ceil(piece);
            let cell = task.columns.start / piece;
            let dst = task
                .rows
                .iter()
                .map(|&r| cells[task.part][r * per_row + cell].take().expect("one task per cell"))
                .collect();
            (task, dst)
        })
        .collect();
    let input = x_rows.row_len;
    jobs.into_par_iter().for_each(|(task, mut dst)| {
        let part = &parts[task.part];
        let base_row = |r: usize| &part.base[part.rows.range(r)][task.columns.clone()];
        let Some(group) = task.group.map(|g| &groups[task.part][g]) else {
            for (d, &r) in dst.iter_mut().zip(&task.rows) {
                d.copy_from_slice(base_row(r));
            }
            return;
        };
        // The block's rows of x as f32: borrowed when they are f32 already.
        let mut scratch = Vec::new();
        let xs: Vec<&[f32]> = match T::as_f32(x) {
            Some(xf) => task.rows.iter().map(|&r| &xf[x_rows.range(r)]).collect(),
            None => {
                scratch.resize(task.rows.len() * input, 0f32);
                for (s, &r) in scratch.chunks_exact_mut(input).zip(&task.rows) {
                    T::to_f32_slice(&x[x_rows.range(r)], s);
                }
                scratch.chunks_exact(input).collect()
            }
        };
        let bases: Vec<&[T]> = task.rows.iter().map(|&r| base_row(r)).collect();
        let (rank, out, columns) = (group.rank, part.rows.row_len, task.columns.clone());
        match &group.matrices {
            Matrices::F32(a, b) => {
                let block = Block { xs: &xs, a, b, rank, out, columns, bases: &bases };
                crate::lora_kernels::add_block(&block, &mut dst);
            }
            Matrices::Bf16(a, b) => {
                let block = Block { xs: &xs, a, b, rank, out, columns, bases: &bases };
                crate::lora_kernels::add_block(&block, &mut dst);
            }
        }
    });
    Ok(outputs)
}

/// What one task computes: rows `xs` of one adapter (`a`, `b`, of f32 or bfloat16 `W`), into
/// `columns` of their outputs.
pub(crate) struct Block<'a, T, W = f32> {
    pub xs: &'a [&'a [f32]],
    pub a: &'a [W],
    pub b: &'a [W],
    pub rank: usize,
    pub out: usize,
    pub columns: std::ops::Range<usize>,
    /// The rows' base outputs over `columns`.
    pub bases: &'a [&'a [T]],
}

/// The tasks of a call: blocks of each group's rows and of the rows of no group, each part's
/// columns whole or, when blocks are fewer than the pool's threads, in pieces.
/// Returns the tasks and each part's piece width.
fn plan<T>(
    input: usize,
    parts: &[CpuPart<'_, T>],
    groups: &[Vec<Group<'_>>],
    rows: usize,
) -> (Vec<Task>, Vec<usize>) {
    let blocks: usize = groups.iter().flatten().map(|g| g.rows.len().div_ceil(BLOCK_ROWS)).sum();
    let threads = rayon::current_num_threads();
    let (mut tasks, mut widths) = (Vec::new(), Vec::with_capacity(parts.len()));
    for (p, (part, groups)) in parts.iter().zip(groups).enumerate() {
        let out = part.rows.row_len;
        // Splitting repeats the shrink (`in` per rank) in every piece: worth it only where the
        // expansion (`out` per rank) is at least as long.
        let pieces =
            if blocks < threads && out >= input { threads.min(out / PIECE_COLUMNS).max(1) } else { 1 };
        let piece = out.div_ceil(pieces).next_multiple_of(PIECE_COLUMNS).min(out).max(1);
        widths.push(piece);
        let mut adapted = vec![false; rows];
        for (g, group) in groups.iter().enumerate() {
            for block in group.rows.chunks(BLOCK_ROWS) {
                for c0 in (0..out).step_by(piece) {
                    tasks.push(Task {
                        part: p,
                        group: Some(g),
                        rows: block.to_vec(),
                        columns: c0..(c0 + piece).min(out),
                    });
                }
                block.iter().for_each(|&r| adapted[r] = true);
            }
        }
        let plain: Vec<usize> = (0..rows).filter(|&r| !adapted[r]).collect();
        for block in plain.chunks(COPY_ROWS) {
            for c0 in (0..out).step_by(piece) {
                tasks.push(Task {
                    part: p,
                    group: None,
                    rows: block.to_vec(),
                    columns: c0..(c0 + piece).min(out),
                });
            }
        }
    }
    (tasks, widths)
}

/// The elements of contiguous CPU storage `s` (laid out by `l`) when they are bfloat16.
fn host_bf16<'a>(s: &'a Storage, l: &Layout) -> Result<Option<&'a [bf16]>> {
    let Storage::Cpu(CpuStorage::BF16(v)) = s else { return Ok(None) };
    let (start, end) = check::contiguous_range(l, OP)?;
    v.get(start..end).map(Some).ok_or_else(|| invalid(OP, "matrix view past its storage"))
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

//! Output buffers of the CPU ops, filled row by row in parallel without a serial memset first.
//!
//! `vec![0.0; rows * width]` zeroes the whole buffer on the calling thread before any task
//! starts. For a prefill's activations (a few hundred KB to a few MB per op, 30 layers, DRAM
//! bound) that memset was about an eighth of the step while the other threads waited. Here each
//! task zeroes only the rows it is about to fill, so the zeroing is spread over the threads and
//! the rows are still in cache when the op writes them.

use std::mem::MaybeUninit;

use rayon::prelude::*;

/// `rows * width` values, row `i` written by `fill(state, i, row)`; each task makes its own
/// `state` with `init` (scratch space). A row is zeroed before `fill` sees it, so values `fill`
/// leaves alone are `zero`. At least `min_len` rows go to a task.
pub(crate) fn par_rows_with<T, S>(
    rows: usize,
    width: usize,
    min_len: usize,
    zero: T,
    init: impl Fn() -> S + Sync + Send,
    fill: impl Fn(&mut S, usize, &mut [T]) + Sync + Send,
) -> Vec<T>
where
    T: Copy + Send + Sync,
{
    let len = rows * width;
    let mut out: Vec<T> = Vec::with_capacity(len);
    if width > 0 {
        out.spare_capacity_mut()[..len]
            .par_chunks_mut(width)
            .with_min_len(min_len.max(1))
            .enumerate()
            .for_each_init(init, |state, (i, row)| fill(state, i, zeroed(row, zero)));
    }
    // SAFETY: every one of the `len` elements was initialised by `zeroed` above (none when
    // `width` is 0, and then `len` is 0).
    unsafe { out.set_len(len) };
    out
}

/// [`par_rows_with`] without per-task state.
pub(crate) fn par_rows<T: Copy + Send + Sync>(
    rows: usize,
    width: usize,
    min_len: usize,
    zero: T,
    fill: impl Fn(usize, &mut [T]) + Sync + Send,
) -> Vec<T> {
    par_rows_with(rows, width, min_len, zero, || (), |_, i, row| fill(i, row))
}

/// Writes `zero` into every element of `row` and returns it as initialised values.
pub(crate) fn zeroed<T: Copy>(row: &mut [MaybeUninit<T>], zero: T) -> &mut [T] {
    for v in row.iter_mut() {
        v.write(zero);
    }
    // SAFETY: every element was just written; `MaybeUninit<T>` has `T`'s layout.
    unsafe { &mut *(row as *mut [MaybeUninit<T>] as *mut [T]) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_is_filled_once_and_the_rest_is_zero() {
        let out = par_rows(37, 5, 1, -1.0f32, |i, row| row[..i % 5].fill(i as f32));
        assert_eq!(out.len(), 37 * 5);
        for (i, row) in out.chunks(5).enumerate() {
            let filled = i % 5;
            assert!(row[..filled].iter().all(|&v| v == i as f32), "row {i}: {row:?}");
            assert!(row[filled..].iter().all(|&v| v == -1.0), "row {i}: {row:?}");
        }
        assert!(par_rows(4, 0, 1, 0u32, |_, _| unreachable!()).is_empty());
        assert!(par_rows(0, 3, 1, 0u32, |_, _| unreachable!()).is_empty());
        // Per-task scratch is handed to every row of the task.
        let out = par_rows_with(9, 2, 3, 0usize, || vec![7usize], |s, i, row| row[0] = s[0] + i);
        assert_eq!(out.iter().step_by(2).copied().collect::<Vec<_>>(), (7..16).collect::<Vec<_>>());
    }
}

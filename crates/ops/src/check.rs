//! Argument validation shared by the ops, and the "rows" view of a tensor layout.
//!
//! All failures are `candle_core::Error` values (never panics), using candle's typed variants
//! where one fits (shape, dtype, device, contiguity, index) and `Error::Msg` for metadata that
//! is inconsistent in ways candle has no variant for. Every message starts with the op's name.

use candle_core::{DType, Error, Layout, Result, Shape, Tensor};

/// An error for inputs that are well-typed but inconsistent (bad metadata, bad parameters).
pub(crate) fn invalid(op: &'static str, msg: impl std::fmt::Display) -> Error {
    Error::Msg(format!("{op}: {msg}"))
}

/// Checks the rank of `t` and returns its dims.
pub(crate) fn dims<const N: usize>(t: &Tensor) -> Result<[usize; N]> {
    <[usize; N]>::try_from(t.dims()).map_err(|_| Error::UnexpectedNumberOfDims {
        expected: N,
        got: t.rank(),
        shape: t.shape().clone(),
    })
}

/// Checks that `t` has exactly the `expected` shape.
pub(crate) fn shape_is(t: &Tensor, expected: &[usize], op: &'static str, name: &str) -> Result<()> {
    if t.dims() == expected {
        Ok(())
    } else {
        Err(Error::UnexpectedShape {
            msg: format!("{op}: unexpected shape for {name}"),
            expected: Shape::from(expected.to_vec()),
            got: t.shape().clone(),
        })
    }
}

/// Checks that `t` has dtype `expected` (the dtype of the tensor it must match).
pub(crate) fn dtype_is(t: &Tensor, expected: DType, op: &'static str) -> Result<()> {
    if t.dtype() == expected {
        Ok(())
    } else {
        Err(Error::DTypeMismatchBinaryOp { lhs: expected, rhs: t.dtype(), op })
    }
}

/// Checks that `b` lives on the same device as `a`.
pub(crate) fn same_device(a: &Tensor, b: &Tensor, op: &'static str) -> Result<()> {
    if a.device().same_device(b.device()) {
        Ok(())
    } else {
        Err(Error::DeviceMismatchBinaryOp { lhs: a.device().location(), rhs: b.device().location(), op })
    }
}

/// Fails unless `t` is a contiguous tensor (needed for in-place destinations and tables).
pub(crate) fn contiguous(t: &Tensor, op: &'static str) -> Result<()> {
    if t.is_contiguous() {
        Ok(())
    } else {
        Err(Error::RequiresContiguous { op })
    }
}

/// The `[start, end)` element range of a contiguous layout.
pub(crate) fn contiguous_range(layout: &Layout, op: &'static str) -> Result<(usize, usize)> {
    layout.contiguous_offsets().ok_or(Error::RequiresContiguous { op })
}

/// A tensor seen as `rows` rows of `row_len` contiguous elements, the first at `start`, each
/// `row_stride` elements after the previous. This covers contiguous tensors and also views such
/// as a narrow of the last dim of a fused projection, which the kernels can then read without
/// a copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rows {
    pub start: usize,
    pub rows: usize,
    pub row_len: usize,
    pub row_stride: usize,
}

impl Rows {
    /// The element range of row `i` in the storage.
    #[inline]
    pub fn range(&self, i: usize) -> std::ops::Range<usize> {
        let s = self.start + i * self.row_stride;
        s..s + self.row_len
    }

    /// One past the last element any row touches, for bounds checks against the storage.
    pub fn end(&self) -> usize {
        if self.rows == 0 {
            self.start
        } else {
            self.start + (self.rows - 1) * self.row_stride + self.row_len
        }
    }
}

/// Views `layout` as rows made of its last `row_dims` dims. Fails with `RequiresContiguous`
/// unless those trailing dims are contiguous and the leading dims collapse into one stride.
pub(crate) fn rows(layout: &Layout, row_dims: usize, op: &'static str) -> Result<Rows> {
    let dims = layout.dims();
    let strides = layout.stride();
    if row_dims > dims.len() {
        return Err(Error::UnexpectedNumberOfDims {
            expected: row_dims,
            got: dims.len(),
            shape: layout.shape().clone(),
        });
    }
    let split = dims.len() - row_dims;
    let row_len: usize = dims[split..].iter().product();
    let rows: usize = dims[..split].iter().product();
    if let Some((start, _)) = layout.contiguous_offsets() {
        return Ok(Rows { start, rows, row_len, row_stride: row_len });
    }
    if rows == 0 || row_len == 0 {
        return Ok(Rows { start: layout.start_offset(), rows, row_len, row_stride: row_len });
    }
    // Walk dims from the innermost outwards, ignoring size-1 dims (their stride is meaningless),
    // checking each stride equals the span of everything inside it.
    let mut expected = 1usize;
    for i in (split..dims.len()).rev() {
        if dims[i] != 1 && strides[i] != expected {
            return Err(Error::RequiresContiguous { op });
        }
        expected *= dims[i];
    }
    let mut row_stride = None;
    let mut span = 0usize;
    for i in (0..split).rev() {
        if dims[i] == 1 {
            continue;
        }
        match row_stride {
            None => {
                row_stride = Some(strides[i]);
                span = strides[i] * dims[i];
            }
            Some(_) => {
                if strides[i] != span {
                    return Err(Error::RequiresContiguous { op });
                }
                span *= dims[i];
            }
        }
    }
    let row_stride = row_stride.unwrap_or(row_len);
    // A stride smaller than a row would make rows overlap; never produced by candle views we
    // accept, but reject it rather than read garbage.
    if row_stride < row_len {
        return Err(Error::RequiresContiguous { op });
    }
    Ok(Rows { start: layout.start_offset(), rows, row_len, row_stride })
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn contiguous_tensor_is_dense_rows() {
        let t = Tensor::zeros((3, 4, 5), DType::F32, &Device::Cpu).unwrap();
        let r = rows(t.layout(), 2, "test").unwrap();
        assert_eq!(r, Rows { start: 0, rows: 3, row_len: 20, row_stride: 20 });
        assert_eq!(r.end(), 60);
    }

    #[test]
    fn narrowed_last_dim_is_strided_rows() {
        let t = Tensor::zeros((3, 10), DType::F32, &Device::Cpu).unwrap();
        let up = t.narrow(1, 4, 6).unwrap();
        let r = rows(up.layout(), 1, "test").unwrap();
        assert_eq!(r, Rows { start: 4, rows: 3, row_len: 6, row_stride: 10 });
        assert_eq!(r.range(2), 24..30);
        assert_eq!(r.end(), 30);
    }

    #[test]
    fn transposed_rows_are_rejected() {
        let t = Tensor::zeros((3, 4), DType::F32, &Device::Cpu).unwrap().t().unwrap();
        assert!(matches!(rows(t.layout(), 1, "test"), Err(Error::RequiresContiguous { .. })));
    }

    #[test]
    fn leading_dims_must_collapse() {
        // [2, 3, 4] narrowed on dim 1 -> leading dims (2, 2) with strides (12, 4) do not collapse.
        let t = Tensor::zeros((2, 3, 4), DType::F32, &Device::Cpu).unwrap();
        let v = t.narrow(1, 0, 2).unwrap();
        assert!(rows(v.layout(), 1, "test").is_err());
        // Narrowing the last dim breaks the row [3, 2] but still leaves rows of 2 elements.
        let w = t.narrow(2, 1, 2).unwrap();
        assert!(rows(w.layout(), 2, "test").is_err());
        let r = rows(w.layout(), 1, "test").unwrap();
        assert_eq!((r.rows, r.row_len, r.row_stride), (6, 2, 4));
    }

    #[test]
    fn shape_and_dtype_checks_report_errors() {
        let t = Tensor::zeros((2, 3), DType::F32, &Device::Cpu).unwrap();
        assert!(matches!(dims::<3>(&t), Err(Error::UnexpectedNumberOfDims { expected: 3, got: 2, .. })));
        assert_eq!(dims::<2>(&t).unwrap(), [2, 3]);
        assert!(shape_is(&t, &[2, 4], "test", "t").is_err());
        assert!(shape_is(&t, &[2, 3], "test", "t").is_ok());
        assert!(dtype_is(&t, DType::F16, "test").is_err());
        assert!(dtype_is(&t, DType::F32, "test").is_ok());
    }
}

//! `x . w^T` for the few rows of a decode step (at most [`SKINNY_MAX_ROWS`]) on CUDA, in
//! place of cuBLAS: a tensor-core kernel that streams each weight once, up to 16 chunks of 32
//! elements in flight per warp through a shared-memory ring, with no split-K reduction pass
//! (kernels/skinny_matmul.cu). Each output row is the same bits whatever the other rows are (up
//! to eight rows, where models use it: [`skinny_matmul_preferred`]).
//!
//! The CPU implementation is the reference (f32 sums in input order, rounded once), for tests;
//! the CPU model never calls it.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp2, DType, Layout, Result, Shape, Tensor};

use crate::check::{self, invalid};
use crate::cuda::skinny::SKINNY_K_CHUNK;
pub use crate::cuda::skinny::{SkinnyLaunch, SKINNY_MAX_ROWS, SKINNY_MODEL_ROWS};
use crate::dtype::{with_float, Float};

const OP: &str = "skinny_matmul";

/// Whether [`skinny_matmul`] takes `x . w^T`: both on a CUDA device, both f16 or both bf16,
/// `x` of 1..=16 rows and `w` of K columns with K a multiple of 32, rows of both contiguous
/// and starting on 16-byte boundaries of their storage.
pub fn skinny_matmul_fits(x: &Tensor, w: &Tensor) -> bool {
    // The device first: on the CPU this is asked of every dense projection.
    if !x.device().is_cuda() || !w.device().same_device(x.device()) {
        return false;
    }
    let (Ok((m, k)), Ok((_, wk))) = (x.dims2(), w.dims2()) else { return false };
    let elements_16_bytes = |t: &Tensor| {
        check::rows(t.layout(), 1, OP)
            .is_ok_and(|r| r.start.is_multiple_of(8) && (r.rows == 1 || r.row_stride.is_multiple_of(8)))
    };
    matches!(x.dtype(), DType::BF16 | DType::F16)
        && w.dtype() == x.dtype()
        && (1..=SKINNY_MAX_ROWS).contains(&m)
        && k == wk
        && k.is_multiple_of(SKINNY_K_CHUNK)
        && elements_16_bytes(x)
        && elements_16_bytes(w)
}

/// Whether a model takes [`skinny_matmul`] over cuBLAS for `x . w^T`: it fits and `x` has at
/// most [`SKINNY_MODEL_ROWS`] rows.
pub fn skinny_matmul_preferred(x: &Tensor, w: &Tensor) -> bool {
    x.dim(0).is_ok_and(|m| m <= SKINNY_MODEL_ROWS) && skinny_matmul_fits(x, w)
}

/// `x [M, K] . w [N, K]^T` as a contiguous `[M, N]` in x's dtype, f32 sums. On CUDA only for
/// inputs [`skinny_matmul_fits`] accepts; on the CPU any f32/f16/bf16 pair of one dtype.
pub fn skinny_matmul(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    skinny_matmul_with(x, w, None)
}

/// As [`skinny_matmul`] with the kernel's spread chosen by the caller (`None` for the shape's
/// rule): for timing the rule, not for models.
pub fn skinny_matmul_with(x: &Tensor, w: &Tensor, launch: Option<SkinnyLaunch>) -> Result<Tensor> {
    let (_, k) = x.dims2()?;
    let (_, wk) = w.dims2()?;
    if k != wk {
        return Err(invalid(OP, format!("x has {k} columns, w {wk}")));
    }
    check::dtype_is(w, x.dtype(), OP)?;
    check::same_device(x, w, OP)?;
    x.apply_op2_no_bwd(w, &SkinnyMatmul { launch })
}

struct SkinnyMatmul {
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    launch: Option<SkinnyLaunch>,
}

fn reference<T: Float>(x: &CpuStorage, x_l: &Layout, w: &CpuStorage, w_l: &Layout) -> Result<CpuStorage> {
    let (xr, wr) = (check::rows(x_l, 1, OP)?, check::rows(w_l, 1, OP)?);
    let (xs, ws) = (x.as_slice::<T>()?, w.as_slice::<T>()?);
    if xr.end() > xs.len() || wr.end() > ws.len() {
        return Err(invalid(OP, "views do not match their storage"));
    }
    let mut out = Vec::with_capacity(xr.rows * wr.rows);
    for m in 0..xr.rows {
        let xm = &xs[xr.range(m)];
        for n in 0..wr.rows {
            let sum: f32 = xm.iter().zip(&ws[wr.range(n)]).map(|(a, b)| a.to_f32() * b.to_f32()).sum();
            out.push(T::from_f32(sum));
        }
    }
    Ok(T::to_cpu_storage_owned(out))
}

impl CustomOp2 for SkinnyMatmul {
    fn name(&self) -> &'static str {
        OP
    }

    fn cpu_fwd(
        &self,
        x: &CpuStorage,
        x_l: &Layout,
        w: &CpuStorage,
        w_l: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let shape = Shape::from((x_l.dims()[0], w_l.dims()[0]));
        let out = with_float!(x.dtype(), OP, T => reference::<T>(x, x_l, w, w_l))?;
        Ok((out, shape))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        x: &candle_core::CudaStorage,
        x_l: &Layout,
        w: &candle_core::CudaStorage,
        w_l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        crate::cuda::matmul::skinny_matmul(self.launch, x, x_l, w, w_l)
    }
}

#[cfg(test)]
mod tests {
    use candle_core::Device;

    use super::*;

    #[test]
    fn the_reference_is_a_matmul() {
        let x = Tensor::new(&[[1f32, 2., 3.], [4., 5., 6.]], &Device::Cpu).unwrap();
        let w =
            Tensor::new(&[[1f32, 0., 1.], [0., 1., 0.], [2., 2., 2.], [1., -1., 0.]], &Device::Cpu).unwrap();
        let got = skinny_matmul(&x, &w).unwrap();
        let want = x.matmul(&w.t().unwrap()).unwrap();
        assert_eq!(got.to_vec2::<f32>().unwrap(), want.to_vec2::<f32>().unwrap());
        assert!(skinny_matmul(&x, &w.narrow(1, 0, 2).unwrap()).is_err());
        assert!(skinny_matmul(&x, &w.to_dtype(DType::BF16).unwrap()).is_err());
    }

    #[test]
    fn only_cuda_inputs_fit() {
        let x = Tensor::zeros((2, 64), DType::BF16, &Device::Cpu).unwrap();
        let w = Tensor::zeros((8, 64), DType::BF16, &Device::Cpu).unwrap();
        assert!(!skinny_matmul_fits(&x, &w));
        assert!(!skinny_matmul_preferred(&x, &w));
    }
}

//! `x . w^T` for the few rows of a decode step on CUDA, in place of cuBLAS: a tensor-core kernel
//! that streams each weight once per [`SKINNY_MAX_ROWS`] rows, up to 16 chunks of 32 elements in
//! flight per warp through a shared-memory ring, with no split-K reduction pass
//! (kernels/skinny_matmul.cu). Each output row is the same bits whatever the other rows are and
//! however many there are. Models take it for steps of up to eight rows
//! ([`skinny_matmul_preferred`]), and batch-invariant ones for every step
//! ([`row_invariant_matmul`]).
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
/// `x` of at least one row and `w` of K columns with K a multiple of 32, rows of both contiguous
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
        && m >= 1
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

/// `x [M, K] . w [N, K]^T` with each output row the same bits whatever M is: one
/// [`skinny_matmul`] over all rows (its spread depends on the weight's shape only, a row's bits
/// are the same in a one-tile and a two-tile block, and each 16 rows take a grid row of their
/// own: `gpu-check`'s ops section), or one row at a time through candle's matmul where the shape
/// does not fit it (the same one-row GEMM for every row). What a batch-invariant CUDA model
/// multiplies dense weights with: a prefill of P tokens reads the weight P / 16 times, so it
/// trades prefill speed for exactness. On the CPU the kernel's reference runs (tests), and
/// shapes the kernel does not take one row at a time.
pub fn row_invariant_matmul(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    let (m, k) = x.dims2()?;
    let x = x.contiguous()?;
    let fits = m == 0
        || match x.device().is_cpu() {
            true => k.is_multiple_of(SKINNY_K_CHUNK),
            false => skinny_matmul_fits(&x, w),
        };
    if fits {
        return skinny_matmul(&x, w);
    }
    let w_t = w.t()?;
    let rows = (0..m).map(|i| x.narrow(0, i, 1)?.matmul(&w_t)).collect::<Result<Vec<_>>>()?;
    Tensor::cat(&rows, 0)
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

    /// Every row of a 1..=35-row product has the bits of the same row alone, tiles and the
    /// one-row fallback (K not a multiple of 32) alike, and the values of a matmul.
    #[test]
    fn row_invariant_rows_do_not_depend_on_m() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for k in [64, 40] {
            let values: Vec<f32> = (0..35 * k).map(|_| rng.random_range(-1f32..1.)).collect();
            let x = Tensor::from_vec(values, (35, k), &Device::Cpu).unwrap().to_dtype(DType::BF16).unwrap();
            let values: Vec<f32> = (0..24 * k).map(|_| rng.random_range(-1f32..1.)).collect();
            let w = Tensor::from_vec(values, (24, k), &Device::Cpu).unwrap().to_dtype(DType::BF16).unwrap();
            let bits = |t: &Tensor| -> Vec<Vec<u16>> {
                t.to_vec2::<half::bf16>()
                    .unwrap()
                    .iter()
                    .map(|r| r.iter().map(|v| v.to_bits()).collect())
                    .collect()
            };
            let alone: Vec<Vec<u16>> = (0..35)
                .map(|i| bits(&row_invariant_matmul(&x.narrow(0, i, 1).unwrap(), &w).unwrap()).remove(0))
                .collect();
            for m in 1..=35 {
                let got = row_invariant_matmul(&x.narrow(0, 0, m).unwrap(), &w).unwrap();
                assert_eq!(got.dims(), [m, 24]);
                assert_eq!(bits(&got), alone[..m], "k {k}, m {m}");
            }
            let want = x
                .to_dtype(DType::F32)
                .unwrap()
                .matmul(&w.to_dtype(DType::F32).unwrap().t().unwrap())
                .unwrap();
            let got = row_invariant_matmul(&x, &w).unwrap().to_dtype(DType::F32).unwrap();
            let diff = (got - want).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
            assert!(diff < 0.05, "k {k}: off by {diff}");
        }
        assert!(row_invariant_matmul(
            &Tensor::zeros((0, 64), DType::BF16, &Device::Cpu).unwrap(),
            &Tensor::zeros((8, 64), DType::BF16, &Device::Cpu).unwrap()
        )
        .is_ok_and(|t| t.dims() == [0, 8]));
    }

    #[test]
    fn only_cuda_inputs_fit() {
        let x = Tensor::zeros((2, 64), DType::BF16, &Device::Cpu).unwrap();
        let w = Tensor::zeros((8, 64), DType::BF16, &Device::Cpu).unwrap();
        assert!(!skinny_matmul_fits(&x, &w));
        assert!(!skinny_matmul_preferred(&x, &w));
    }
}

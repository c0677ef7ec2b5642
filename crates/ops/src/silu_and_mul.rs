//! `silu_and_mul`: the gated MLP activation `silu(gate) * up` in one pass.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp2, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

use crate::check::{self, invalid};
use crate::dtype::{check_float, with_float, Float};

const OP: &str = "silu_and_mul";

/// Elements per rayon task at least, so small inputs stay on one thread.
const MIN_ELEMS_PER_TASK: usize = 1 << 14;

/// `silu(gate) * up` elementwise, with `silu(x) = x / (1 + e^-x)`, in f32.
///
/// Takes the two halves as separate tensors of the same shape and dtype (f32/f16/bf16). For a
/// fused `[T, 2 * I]` gate-up projection pass `narrow(-1, 0, I)` and `narrow(-1, I, I)`: views
/// with contiguous rows are read in place, without a copy. Returns a contiguous tensor.
pub fn silu_and_mul(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    if gate.dims() != up.dims() {
        return Err(candle_core::Error::ShapeMismatchBinaryOp {
            lhs: gate.shape().clone(),
            rhs: up.shape().clone(),
            op: OP,
        });
    }
    check_float(gate.dtype(), OP)?;
    check::dtype_is(up, gate.dtype(), OP)?;
    check::same_device(gate, up, OP)?;
    gate.apply_op2_no_bwd(up, &SiluAndMul)
}

struct SiluAndMul;

impl SiluAndMul {
    fn run<T: Float>(gate: &CpuStorage, g_l: &Layout, up: &CpuStorage, u_l: &Layout) -> Result<CpuStorage> {
        // A 0-d tensor is one row of one element.
        let row_dims = g_l.dims().len().min(1);
        let g_rows = check::rows(g_l, row_dims, OP)?;
        let u_rows = check::rows(u_l, row_dims, OP)?;
        let (gs, us) = (gate.as_slice::<T>()?, up.as_slice::<T>()?);
        if g_rows.end() > gs.len() || u_rows.end() > us.len() || g_rows.rows != u_rows.rows {
            return Err(invalid(OP, "gate / up views do not match their storage"));
        }
        let w = g_rows.row_len;
        let mut out = vec![T::from_f32(0.0); g_rows.rows * w];
        if w == 0 {
            return Ok(T::to_cpu_storage_owned(out));
        }
        out.par_chunks_mut(w).with_min_len(MIN_ELEMS_PER_TASK / w + 1).enumerate().for_each(|(i, dst)| {
            for ((o, g), u) in dst.iter_mut().zip(&gs[g_rows.range(i)]).zip(&us[u_rows.range(i)]) {
                let g = g.to_f32();
                *o = T::from_f32(g / (1.0 + (-g).exp()) * u.to_f32());
            }
        });
        Ok(T::to_cpu_storage_owned(out))
    }
}

impl CustomOp2 for SiluAndMul {
    fn name(&self) -> &'static str {
        OP
    }

    fn cpu_fwd(
        &self,
        gate: &CpuStorage,
        g_l: &Layout,
        up: &CpuStorage,
        u_l: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        if gate.dtype() != up.dtype() {
            return Err(candle_core::Error::DTypeMismatchBinaryOp {
                lhs: gate.dtype(),
                rhs: up.dtype(),
                op: OP,
            });
        }
        let out = with_float!(gate.dtype(), OP, T => Self::run::<T>(gate, g_l, up, u_l))?;
        Ok((out, g_l.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        gate: &candle_core::CudaStorage,
        g_l: &Layout,
        up: &candle_core::CudaStorage,
        u_l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        crate::cuda::activation::silu_and_mul(gate, g_l, up, u_l)
    }
}

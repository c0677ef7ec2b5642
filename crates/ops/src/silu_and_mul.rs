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
        if let (Some(gs), Some(us)) = (T::as_f32(gs), T::as_f32(us)) {
            let mut out = vec![0f32; g_rows.rows * w];
            if w > 0 {
                out.par_chunks_mut(w).with_min_len(MIN_ELEMS_PER_TASK / w + 1).enumerate().for_each(
                    |(i, dst)| {
                        silu_mul_f32(&gs[g_rows.range(i)], &us[u_rows.range(i)], dst);
                    },
                );
            }
            return Ok(CpuStorage::F32(out));
        }
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

/// `out = silu(gate) * up` over f32 rows with a vectorised exponential (the libm call per
/// element was a few percent of a whole step), in the widest build the CPU runs.
fn silu_mul_f32(gate: &[f32], up: &[f32], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    match crate::simd::level() {
        // SAFETY: the CPU has the features each build enables (checked by `level`).
        crate::simd::Level::Avx512 => return unsafe { silu_mul_avx512(gate, up, out) },
        crate::simd::Level::Avx2 => return unsafe { silu_mul_avx2(gate, up, out) },
        crate::simd::Level::None => {}
    }
    silu_mul_portable(gate, up, out);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn silu_mul_avx512(gate: &[f32], up: &[f32], out: &mut [f32]) {
    silu_mul_portable(gate, up, out);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn silu_mul_avx2(gate: &[f32], up: &[f32], out: &mut [f32]) {
    silu_mul_portable(gate, up, out);
}

/// `x * sigmoid(x) * u` with `sigmoid(x) = 1 / (1 + e^-x)` for `x >= 0` and `e^x / (1 + e^x)`
/// below, so the exponential only sees `-|x| <= 0` (never overflows).
#[inline(always)]
fn silu_mul_portable(gate: &[f32], up: &[f32], out: &mut [f32]) {
    const CHUNK: usize = 64;
    let mut e = [0f32; CHUNK];
    for ((g, u), o) in gate.chunks(CHUNK).zip(up.chunks(CHUNK)).zip(out.chunks_mut(CHUNK)) {
        let e = &mut e[..g.len()];
        for (e, &x) in e.iter_mut().zip(g) {
            *e = -x.abs();
        }
        crate::simd::exp_nonpositive(e);
        for (((o, &x), &u), &e) in o.iter_mut().zip(g).zip(u).zip(e.iter()) {
            let numerator = if x >= 0.0 { 1.0 } else { e };
            *o = x * (numerator / (1.0 + e)) * u;
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every build of the f32 loop against f64 `x / (1 + e^-x) * u`, over the whole range the
    /// exponential splits into (both signs, tiny, huge, +inf and NaN inputs; -inf has no
    /// agreed answer: the limit 0, or NaN as `x / (1 + e^-x)` gives).
    #[test]
    fn f32_loops_match_f64_silu() {
        let mut gate: Vec<f32> = (0..4000).map(|i| (i as f32 - 2000.0) * 0.05).collect();
        gate.extend([0.0, -0.0, 1e-30, -1e-30, 88.0, -88.0, 200.0, -200.0, f32::INFINITY]);
        let up: Vec<f32> = (0..gate.len()).map(|i| 1.0 + (i % 7) as f32 * 0.25).collect();
        type Build = fn(&[f32], &[f32], &mut [f32]);
        let mut builds: Vec<(&str, Build)> =
            vec![("dispatched", silu_mul_f32), ("portable", silu_mul_portable)];
        #[cfg(target_arch = "x86_64")]
        {
            use crate::simd::{level, Level};
            fn avx2(g: &[f32], u: &[f32], o: &mut [f32]) {
                // SAFETY: only pushed when the CPU has AVX2 and FMA.
                unsafe { silu_mul_avx2(g, u, o) }
            }
            fn avx512(g: &[f32], u: &[f32], o: &mut [f32]) {
                // SAFETY: only pushed when the CPU has AVX-512F.
                unsafe { silu_mul_avx512(g, u, o) }
            }
            if level() != Level::None {
                builds.push(("avx2", avx2));
            }
            if level() == Level::Avx512 {
                builds.push(("avx512", avx512));
            }
        }
        for (name, f) in builds {
            let mut out = vec![0f32; gate.len()];
            f(&gate, &up, &mut out);
            for ((&o, &x), &u) in out.iter().zip(&gate).zip(&up) {
                let want = x as f64 / (1.0 + (-x as f64).exp()) * u as f64;
                if want.is_infinite() {
                    assert_eq!(o as f64, want, "{name}: silu({x})");
                } else {
                    assert!(
                        (o as f64 - want).abs() <= 1e-6 * want.abs().max(1.0),
                        "{name}: silu({x}) = {o}, want {want}"
                    );
                }
            }
            let mut nan = [0f32];
            f(&[f32::NAN], &[1.0], &mut nan);
            assert!(nan[0].is_nan(), "{name}");
        }
    }
}

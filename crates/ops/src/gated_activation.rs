//! The gated MLP activations in one pass: `silu(gate) * up` (Llama, Qwen, Mistral, Phi-3)
//! and `gelu_tanh(gate) * up` (Gemma), both as `gate * sigmoid(z) * up` through one vectorised
//! exponential: `z = gate` for SiLU, and for GELU's tanh form
//! `0.5 (1 + tanh(u)) = sigmoid(2u)` with `u = sqrt(2/pi) (gate + 0.044715 gate^3)`.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp2, Layout, Result, Shape, Tensor};

use crate::check::{self, invalid};
use crate::dtype::{check_float, with_float, Float};
use crate::par_rows::par_rows;

/// Which gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Activation {
    Silu,
    GeluTanh,
}

impl Activation {
    fn op(self) -> &'static str {
        match self {
            Activation::Silu => "silu_and_mul",
            Activation::GeluTanh => "gelu_tanh_and_mul",
        }
    }

    /// The argument `z` of the sigmoid in `x * sigmoid(z)`.
    #[inline(always)]
    fn sigmoid_arg(self, x: f32) -> f32 {
        match self {
            Activation::Silu => x,
            // 2 * sqrt(2 / pi) * (x + 0.044715 x^3).
            Activation::GeluTanh => 1.595_769 * (x + 0.044_715 * x * x * x),
        }
    }
}

/// Elements per rayon task at least, so small inputs stay on one thread.
const MIN_ELEMS_PER_TASK: usize = 1 << 14;

/// `silu(gate) * up` elementwise, with `silu(x) = x / (1 + e^-x)`, in f32.
///
/// Takes the two halves as separate tensors of the same shape and dtype (f32/f16/bf16). For a
/// fused `[T, 2 * I]` gate-up projection pass `narrow(-1, 0, I)` and `narrow(-1, I, I)`: views
/// with contiguous rows are read in place, without a copy. Returns a contiguous tensor.
pub fn silu_and_mul(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    gated(Activation::Silu, gate, up)
}

/// `gelu_tanh(gate) * up` elementwise, GELU's tanh approximation (candle's `gelu`, PyTorch's
/// `gelu(approximate="tanh")`), in f32; the same inputs as [`silu_and_mul`]. CPU only: on CUDA
/// it is an error (models use candle's ops there).
pub fn gelu_tanh_and_mul(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    gated(Activation::GeluTanh, gate, up)
}

fn gated(act: Activation, gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    let op = act.op();
    if gate.dims() != up.dims() {
        return Err(candle_core::Error::ShapeMismatchBinaryOp {
            lhs: gate.shape().clone(),
            rhs: up.shape().clone(),
            op,
        });
    }
    check_float(gate.dtype(), op)?;
    check::dtype_is(up, gate.dtype(), op)?;
    check::same_device(gate, up, op)?;
    gate.apply_op2_no_bwd(up, &GatedActivation(act))
}

struct GatedActivation(Activation);

impl GatedActivation {
    fn run<T: Float>(
        act: Activation,
        gate: &CpuStorage,
        g_l: &Layout,
        up: &CpuStorage,
        u_l: &Layout,
    ) -> Result<CpuStorage> {
        let op = act.op();
        // A 0-d tensor is one row of one element.
        let row_dims = g_l.dims().len().min(1);
        let g_rows = check::rows(g_l, row_dims, op)?;
        let u_rows = check::rows(u_l, row_dims, op)?;
        let (gs, us) = (gate.as_slice::<T>()?, up.as_slice::<T>()?);
        if g_rows.end() > gs.len() || u_rows.end() > us.len() || g_rows.rows != u_rows.rows {
            return Err(invalid(op, "gate / up views do not match their storage"));
        }
        let w = g_rows.row_len;
        let min_rows = MIN_ELEMS_PER_TASK / w.max(1) + 1;
        if let (Some(gs), Some(us)) = (T::as_f32(gs), T::as_f32(us)) {
            let out = par_rows(g_rows.rows, w, min_rows, 0f32, |i, dst| {
                gated_mul_f32(act, &gs[g_rows.range(i)], &us[u_rows.range(i)], dst);
            });
            return Ok(CpuStorage::F32(out));
        }
        let out = par_rows(g_rows.rows, w, min_rows, T::from_f32(0.0), |i, dst| {
            for ((o, g), u) in dst.iter_mut().zip(&gs[g_rows.range(i)]).zip(&us[u_rows.range(i)]) {
                let g = g.to_f32();
                *o = T::from_f32(g / (1.0 + (-act.sigmoid_arg(g)).exp()) * u.to_f32());
            }
        });
        Ok(T::to_cpu_storage_owned(out))
    }
}

/// `out = act(gate) * up` over f32 rows with a vectorised exponential (the libm call per
/// element was a few percent of a whole step; candle's GELU, through `tanh` and `expm1`, a
/// sixth of Gemma 3's), in the widest build the CPU runs.
fn gated_mul_f32(act: Activation, gate: &[f32], up: &[f32], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    match crate::simd::level() {
        // SAFETY: the CPU has the features each build enables (checked by `level`).
        crate::simd::Level::Avx512 => return unsafe { gated_mul_avx512(act, gate, up, out) },
        crate::simd::Level::Avx2 => return unsafe { gated_mul_avx2(act, gate, up, out) },
        crate::simd::Level::None => {}
    }
    gated_mul_portable(act, gate, up, out);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn gated_mul_avx512(act: Activation, gate: &[f32], up: &[f32], out: &mut [f32]) {
    gated_mul_portable(act, gate, up, out);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn gated_mul_avx2(act: Activation, gate: &[f32], up: &[f32], out: &mut [f32]) {
    gated_mul_portable(act, gate, up, out);
}

/// `x * sigmoid(z) * u` with `sigmoid(z) = 1 / (1 + e^-z)` for `z >= 0` and `e^z / (1 + e^z)`
/// below, so the exponential only sees `-|z| <= 0` (never overflows).
#[inline(always)]
fn gated_mul_portable(act: Activation, gate: &[f32], up: &[f32], out: &mut [f32]) {
    match act {
        Activation::Silu => gated_mul_loop(gate, up, out, |x| Activation::Silu.sigmoid_arg(x)),
        Activation::GeluTanh => gated_mul_loop(gate, up, out, |x| Activation::GeluTanh.sigmoid_arg(x)),
    }
}

/// The loop of [`gated_mul_portable`], built once per activation so each vectorises.
#[inline(always)]
fn gated_mul_loop(gate: &[f32], up: &[f32], out: &mut [f32], arg: impl Fn(f32) -> f32) {
    const CHUNK: usize = 64;
    let mut z = [0f32; CHUNK];
    let mut e = [0f32; CHUNK];
    for ((g, u), o) in gate.chunks(CHUNK).zip(up.chunks(CHUNK)).zip(out.chunks_mut(CHUNK)) {
        let (z, e) = (&mut z[..g.len()], &mut e[..g.len()]);
        for ((z, e), &x) in z.iter_mut().zip(e.iter_mut()).zip(g) {
            *z = arg(x);
            *e = -z.abs();
        }
        crate::simd::exp_nonpositive(e);
        for ((((o, &x), &u), &z), &e) in o.iter_mut().zip(g).zip(u).zip(z.iter()).zip(e.iter()) {
            let numerator = if z >= 0.0 { 1.0 } else { e };
            *o = x * (numerator / (1.0 + e)) * u;
        }
    }
}

impl CustomOp2 for GatedActivation {
    fn name(&self) -> &'static str {
        self.0.op()
    }

    fn cpu_fwd(
        &self,
        gate: &CpuStorage,
        g_l: &Layout,
        up: &CpuStorage,
        u_l: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (act, op) = (self.0, self.0.op());
        if gate.dtype() != up.dtype() {
            return Err(candle_core::Error::DTypeMismatchBinaryOp { lhs: gate.dtype(), rhs: up.dtype(), op });
        }
        let out = with_float!(gate.dtype(), op, T => Self::run::<T>(act, gate, g_l, up, u_l))?;
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
        match self.0 {
            Activation::Silu => crate::cuda::activation::silu_and_mul(gate, g_l, up, u_l),
            Activation::GeluTanh => Err(invalid(self.0.op(), "no CUDA kernel: use candle's gelu on CUDA")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// f64 references: `x / (1 + e^-x) * u`, and `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715
    /// x^3))) * u` as PyTorch writes GELU's tanh form.
    fn reference(act: Activation, x: f64, u: f64) -> f64 {
        match act {
            Activation::Silu => x / (1.0 + (-x).exp()) * u,
            Activation::GeluTanh => {
                let inner = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x);
                0.5 * x * (1.0 + inner.tanh()) * u
            }
        }
    }

    /// Every build of the f32 loop against f64, for both activations, over the whole range the
    /// exponential splits into (both signs, tiny, huge, +inf and NaN inputs; -inf has no
    /// agreed answer: the limit 0, or NaN as `x * sigmoid(z)` gives).
    #[test]
    fn f32_loops_match_f64_for_both_activations() {
        let mut gate: Vec<f32> = (0..4000).map(|i| (i as f32 - 2000.0) * 0.05).collect();
        gate.extend([0.0, -0.0, 1e-30, -1e-30, 88.0, -88.0, 200.0, -200.0, f32::INFINITY]);
        let up: Vec<f32> = (0..gate.len()).map(|i| 1.0 + (i % 7) as f32 * 0.25).collect();
        type Build = fn(Activation, &[f32], &[f32], &mut [f32]);
        let mut builds: Vec<(&str, Build)> =
            vec![("dispatched", gated_mul_f32), ("portable", gated_mul_portable)];
        #[cfg(target_arch = "x86_64")]
        {
            use crate::simd::{level, Level};
            fn avx2(a: Activation, g: &[f32], u: &[f32], o: &mut [f32]) {
                // SAFETY: only pushed when the CPU has AVX2 and FMA.
                unsafe { gated_mul_avx2(a, g, u, o) }
            }
            fn avx512(a: Activation, g: &[f32], u: &[f32], o: &mut [f32]) {
                // SAFETY: only pushed when the CPU has AVX-512F.
                unsafe { gated_mul_avx512(a, g, u, o) }
            }
            if level() != Level::None {
                builds.push(("avx2", avx2));
            }
            if level() == Level::Avx512 {
                builds.push(("avx512", avx512));
            }
        }
        for act in [Activation::Silu, Activation::GeluTanh] {
            for (name, f) in &builds {
                let mut out = vec![0f32; gate.len()];
                f(act, &gate, &up, &mut out);
                for ((&o, &x), &u) in out.iter().zip(&gate).zip(&up) {
                    let want = reference(act, x as f64, u as f64);
                    if want.is_infinite() {
                        assert_eq!(o as f64, want, "{name} {act:?}({x})");
                    } else {
                        assert!(
                            (o as f64 - want).abs() <= 1e-6 * want.abs().max(1.0),
                            "{name} {act:?}({x}) = {o}, want {want}"
                        );
                    }
                }
                let mut nan = [0f32];
                f(act, &[f32::NAN], &[1.0], &mut nan);
                assert!(nan[0].is_nan(), "{name} {act:?}");
            }
        }
    }

    #[test]
    fn gelu_op_matches_f64_and_candle_on_strided_halves_in_every_dtype() {
        use candle_core::{DType, Device, Tensor};
        // Deterministic values over -8..8 in both halves.
        let values: Vec<f32> = (0..5 * 64).map(|i| ((i * 37) % 321) as f32 * 0.05 - 8.0).collect();
        let fused = Tensor::from_vec(values, (5, 64), &Device::Cpu).unwrap();
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let fused = fused.to_dtype(dtype).unwrap();
            let (gate, up) = (fused.narrow(1, 0, 32).unwrap(), fused.narrow(1, 32, 32).unwrap());
            let got = gelu_tanh_and_mul(&gate, &up).unwrap().to_dtype(DType::F32).unwrap();
            let got = got.to_vec2::<f32>().unwrap();
            let f32s = |t: &Tensor| t.to_dtype(DType::F32).unwrap().to_vec2::<f32>().unwrap();
            let (g_in, u_in) = (f32s(&gate), f32s(&up));
            // The output's own rounding: f32 a few ulps, f16 and bf16 half an ulp of theirs.
            let rel = match dtype {
                DType::F32 => 1e-5,
                DType::F16 => 1e-3,
                _ => 8e-3,
            };
            for ((g, x), u) in got.iter().flatten().zip(g_in.iter().flatten()).zip(u_in.iter().flatten()) {
                let want = reference(Activation::GeluTanh, *x as f64, *u as f64);
                assert!((*g as f64 - want).abs() <= rel * want.abs() + 1e-6, "{dtype:?}: {g} vs {want}");
            }
            if dtype == DType::F32 {
                let candle = (gate.gelu().unwrap() * &up).unwrap().to_vec2::<f32>().unwrap();
                for (g, c) in got.iter().flatten().zip(candle.iter().flatten()) {
                    assert!((g - c).abs() <= 1e-5 * c.abs().max(1.0), "candle's gelu: {g} vs {c}");
                }
            }
        }
        let short = Tensor::zeros((5, 16), DType::F32, &Device::Cpu).unwrap();
        let gate = fused.narrow(1, 0, 32).unwrap();
        assert!(gelu_tanh_and_mul(&gate, &short).is_err());
    }
}

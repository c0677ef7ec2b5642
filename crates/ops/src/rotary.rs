//! `rotary_embedding`: applies rotary position embeddings to q and k at per-token positions,
//! with either pairing convention (GGUF/llama.cpp interleaved pairs or HF halves).
//!
//! The cos/sin tables come from [`crate::rotary_tables`]; each token looks up its own row, so a
//! mixed batch of sequences at different positions is one call.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp3, DType, Layout, Result, Shape, Storage, Tensor};

use crate::check::{self, invalid};
use crate::dtype::{with_float, Float};
use crate::par_rows::par_rows;

const OP: &str = "rotary_embedding";

/// Which elements of a head form the rotated pairs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RotaryStyle {
    /// Pairs `(2i, 2i + 1)`: GGUF files converted by llama.cpp (which permuted q/k weights).
    Interleaved,
    /// Pairs `(i, i + head_dim / 2)`: Hugging Face safetensors (`rotate_half`).
    Halves,
}

/// Rotary embedding for `q` `[num_tokens, num_heads, head_dim]` and `k`
/// `[num_tokens, num_kv_heads, head_dim]` at `positions` (u32 `[num_tokens]`).
///
/// `cos`/`sin` are f32 `[max_positions, head_dim / 2]` (contiguous); pair `i` of a head is rotated
/// by the angle whose cos/sin are at column `i` of the token's position row:
/// `(a, b) -> (a cos - b sin, a sin + b cos)`. Math is f32; returns `(q, k)` rotated, contiguous,
/// in their own dtypes (f32, f16 or bf16). A position `>= max_positions` is an error.
pub fn rotary_embedding(
    q: &Tensor,
    k: &Tensor,
    positions: &Tensor,
    cos: &Tensor,
    sin: &Tensor,
    style: RotaryStyle,
) -> Result<(Tensor, Tensor)> {
    let [num_tokens, _, head_dim] = check::dims::<3>(q)?;
    let [k_tokens, _, k_head_dim] = check::dims::<3>(k)?;
    if k_tokens != num_tokens || k_head_dim != head_dim {
        return Err(candle_core::Error::ShapeMismatchBinaryOp {
            lhs: q.shape().clone(),
            rhs: k.shape().clone(),
            op: OP,
        });
    }
    if head_dim % 2 == 1 {
        return Err(invalid(OP, format!("head_dim {head_dim} is odd")));
    }
    check::shape_is(positions, &[num_tokens], OP, "positions")?;
    check::dtype_is(positions, DType::U32, OP)?;
    let [max_positions, half] = check::dims::<2>(cos)?;
    if half != head_dim / 2 {
        return Err(invalid(OP, format!("cos has {half} columns, expected head_dim / 2 = {}", head_dim / 2)));
    }
    check::shape_is(sin, &[max_positions, half], OP, "sin")?;
    check::dtype_is(cos, DType::F32, OP)?;
    check::dtype_is(sin, DType::F32, OP)?;
    crate::dtype::check_float(q.dtype(), OP)?;
    crate::dtype::check_float(k.dtype(), OP)?;
    for t in [k, positions, cos, sin] {
        check::same_device(q, t, OP)?;
    }
    check::contiguous(cos, OP)?;
    check::contiguous(sin, OP)?;
    check::contiguous(positions, OP)?;
    let op = Rotary { positions, style };
    let q = q.apply_op3_no_bwd(cos, sin, &op)?;
    let k = k.apply_op3_no_bwd(cos, sin, &op)?;
    Ok((q, k))
}

/// The candle op: inputs (x, cos, sin); the positions tensor travels in the op (it is u32, so
/// it can never share storage with the float inputs whose locks candle holds).
struct Rotary<'a> {
    positions: &'a Tensor,
    style: RotaryStyle,
}

impl Rotary<'_> {
    fn apply<T: Float>(
        &self,
        x: &CpuStorage,
        x_l: &Layout,
        cos: &[f32],
        sin: &[f32],
        positions: &[u32],
    ) -> Result<CpuStorage> {
        let &[num_tokens, heads, head_dim] = x_l.dims() else {
            return Err(invalid(OP, "x must be [num_tokens, num_heads, head_dim]"));
        };
        let half = head_dim / 2;
        let max_positions = cos.len() / half.max(1);
        if let Some(&bad) = positions.iter().find(|&&p| p as usize >= max_positions) {
            return Err(candle_core::Error::InvalidIndex {
                op: OP,
                index: bad as usize,
                size: max_positions,
            });
        }
        let rows = check::rows(x_l, 2, OP)?;
        let src = x.as_slice::<T>()?;
        if rows.end() > src.len() || rows.rows != num_tokens || positions.len() != num_tokens {
            return Err(invalid(OP, "x view does not match its storage or positions"));
        }
        let row_len = heads * head_dim;
        let style = self.style;
        #[cfg(target_arch = "x86_64")]
        let wide = head_dim.is_multiple_of(32) && crate::simd::level() == crate::simd::Level::Avx512;
        let out =
            par_rows(num_tokens, row_len, (1 << 14) / row_len.max(1) + 1, T::from_f32(0.0), |t, dst| {
                let p = positions[t] as usize;
                let (c, s) = (&cos[p * half..(p + 1) * half], &sin[p * half..(p + 1) * half]);
                let x = &src[rows.range(t)];
                #[cfg(target_arch = "x86_64")]
                if let (true, Some(x), Some(dst)) = (wide, T::as_f32(x), T::as_f32_mut(dst)) {
                    // SAFETY: AVX-512F is present; rows are whole heads of `head_dim`, a
                    // multiple of 32, and `c`/`s` hold `head_dim / 2` values.
                    unsafe { rotate_row_avx512(x, dst, c, s, head_dim, style) };
                    return;
                }
                rotate_row(x, dst, c, s, head_dim, style);
            });
        Ok(T::to_cpu_storage_owned(out))
    }
}

/// One token's heads of `x` rotated into `dst` by its position's `c` and `s` (`head_dim / 2`
/// each), in f32.
fn rotate_row<T: Float>(x: &[T], dst: &mut [T], c: &[f32], s: &[f32], head_dim: usize, style: RotaryStyle) {
    let half = head_dim / 2;
    for (dst, x) in dst.chunks_exact_mut(head_dim).zip(x.chunks_exact(head_dim)) {
        for i in 0..half {
            let (ia, ib) = match style {
                RotaryStyle::Interleaved => (2 * i, 2 * i + 1),
                RotaryStyle::Halves => (i, i + half),
            };
            let (a, b) = (x[ia].to_f32(), x[ib].to_f32());
            dst[ia] = T::from_f32(a * c[i] - b * s[i]);
            dst[ib] = T::from_f32(a * s[i] + b * c[i]);
        }
    }
}

/// [`rotate_row`] for f32 with AVX-512, to the same bits: the same products, unfused, and the
/// same sums (`a c - b s` as `a c + b (-s)`, whose negation is exact; `a s + b c` as
/// `b c + a s`, which is commutative). A prefill's rotation was a scalar loop at about 2 cycles
/// per value.
///
/// # Safety
/// The CPU must have AVX-512F; `head_dim` is a multiple of 32, `x` and `dst` hold the same
/// number of whole heads and `c`, `s` at least `head_dim / 2` values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn rotate_row_avx512(
    x: &[f32],
    dst: &mut [f32],
    c: &[f32],
    s: &[f32],
    head_dim: usize,
    style: RotaryStyle,
) {
    use std::arch::x86_64::*;
    assert!(head_dim.is_multiple_of(32) && x.len() == dst.len() && x.len().is_multiple_of(head_dim));
    assert!(c.len() >= head_dim / 2 && s.len() >= head_dim / 2);
    let half = head_dim / 2;
    // SAFETY (whole body): every load and store stays inside `x`, `dst`, `c` and `s` by the
    // asserts above (16 lanes at offsets below `head_dim` of a head, or below `half` of c/s).
    unsafe {
        match style {
            RotaryStyle::Interleaved => {
                // Lanes 2i and 2i + 1 of a 16-lane chunk hold pair i: both take cos_i, and
                // sin_i with the even lane's sign flipped; the odd lane reads its partner.
                let dup = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
                let even_sign = _mm512_castsi512_ps(_mm512_maskz_set1_epi32(0x5555, i32::MIN));
                for (x, dst) in x.chunks_exact(head_dim).zip(dst.chunks_exact_mut(head_dim)) {
                    for k in (0..head_dim).step_by(16) {
                        let cs = _mm512_castps256_ps512(_mm256_loadu_ps(c.as_ptr().add(k / 2)));
                        let sn = _mm512_castps256_ps512(_mm256_loadu_ps(s.as_ptr().add(k / 2)));
                        let cc = _mm512_permutexvar_ps(dup, cs);
                        let ss = _mm512_xor_ps(_mm512_permutexvar_ps(dup, sn), even_sign);
                        let v = _mm512_loadu_ps(x.as_ptr().add(k));
                        let swapped = _mm512_permute_ps::<0b1011_0001>(v);
                        let r = _mm512_add_ps(_mm512_mul_ps(v, cc), _mm512_mul_ps(swapped, ss));
                        _mm512_storeu_ps(dst.as_mut_ptr().add(k), r);
                    }
                }
            }
            RotaryStyle::Halves => {
                for (x, dst) in x.chunks_exact(head_dim).zip(dst.chunks_exact_mut(head_dim)) {
                    for i in (0..half).step_by(16) {
                        let (cv, sv) =
                            (_mm512_loadu_ps(c.as_ptr().add(i)), _mm512_loadu_ps(s.as_ptr().add(i)));
                        let a = _mm512_loadu_ps(x.as_ptr().add(i));
                        let b = _mm512_loadu_ps(x.as_ptr().add(i + half));
                        let lo = _mm512_sub_ps(_mm512_mul_ps(a, cv), _mm512_mul_ps(b, sv));
                        let hi = _mm512_add_ps(_mm512_mul_ps(a, sv), _mm512_mul_ps(b, cv));
                        _mm512_storeu_ps(dst.as_mut_ptr().add(i), lo);
                        _mm512_storeu_ps(dst.as_mut_ptr().add(i + half), hi);
                    }
                }
            }
        }
    }
}

impl CustomOp3 for Rotary<'_> {
    fn name(&self) -> &'static str {
        OP
    }

    fn cpu_fwd(
        &self,
        x: &CpuStorage,
        x_l: &Layout,
        cos: &CpuStorage,
        cos_l: &Layout,
        sin: &CpuStorage,
        sin_l: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (c0, c1) = check::contiguous_range(cos_l, OP)?;
        let (s0, s1) = check::contiguous_range(sin_l, OP)?;
        let cos = &cos.as_slice::<f32>()?[c0..c1];
        let sin = &sin.as_slice::<f32>()?[s0..s1];
        let (storage, pos_l) = self.positions.storage_and_layout();
        let Storage::Cpu(pos) = &*storage else {
            return Err(candle_core::Error::DeviceMismatchBinaryOp {
                lhs: candle_core::DeviceLocation::Cpu,
                rhs: self.positions.device().location(),
                op: OP,
            });
        };
        let (p0, p1) = check::contiguous_range(pos_l, OP)?;
        let positions = &pos.as_slice::<u32>()?[p0..p1];
        let out = with_float!(x.dtype(), OP, T => self.apply::<T>(x, x_l, cos, sin, positions))?;
        Ok((out, x_l.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        x: &candle_core::CudaStorage,
        x_l: &Layout,
        cos: &candle_core::CudaStorage,
        cos_l: &Layout,
        sin: &candle_core::CudaStorage,
        sin_l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        crate::cuda::rotary::rotary(self.positions, self.style, x, x_l, cos, cos_l, sin, sin_l)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The AVX-512 rows have the scalar rows' bits, both styles, signed zeros included.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx512_rows_have_the_scalar_bits() {
        if !std::arch::is_x86_feature_detected!("avx512f") {
            return;
        }
        let mut state = 0x9e37_79b9_u32;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            (state as f32 / u32::MAX as f32 - 0.5) * 8.0
        };
        for head_dim in [32, 64, 128] {
            let heads = 3;
            let mut x: Vec<f32> = (0..heads * head_dim).map(|_| next()).collect();
            x[0] = -0.0;
            x[1] = 0.0;
            let c: Vec<f32> = (0..head_dim / 2).map(|_| next().cos()).collect();
            let mut s: Vec<f32> = (0..head_dim / 2).map(|_| next().sin()).collect();
            s[0] = 0.0;
            for style in [RotaryStyle::Interleaved, RotaryStyle::Halves] {
                let (mut want, mut got) = (vec![0f32; x.len()], vec![0f32; x.len()]);
                rotate_row(&x, &mut want, &c, &s, head_dim, style);
                // SAFETY: AVX-512F checked above; the shapes are whole heads.
                unsafe { rotate_row_avx512(&x, &mut got, &c, &s, head_dim, style) };
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "{style:?} head_dim {head_dim}");
            }
        }
    }
}

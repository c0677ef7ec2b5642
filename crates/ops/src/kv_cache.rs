//! `reshape_and_cache`: writes the new tokens' K and V rows into the paged caches, in place.
//!
//! Cache layout (see kernels/README.md): `[num_blocks, block_size, num_kv_heads, head_dim]`,
//! contiguous, so slot `s = block * block_size + row` is the `num_kv_heads * head_dim` elements
//! starting at `s * num_kv_heads * head_dim`.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, DType, InplaceOp3, Layout, Result, Tensor};

use crate::check::{self, invalid};
use crate::dtype::{with_float, Float};
use float8::F8E4M3;

const OP: &str = "reshape_and_cache";

/// The slot of a token that is written nowhere: a padding row of a batch replayed at a fixed
/// size (CUDA graphs).
pub const PADDING_SLOT: u32 = u32::MAX;

/// The per-tensor scales of one layer's FP8 KV cache: a K element is stored as the e4m3 code
/// nearest `k / scales.k` (saturating at ±448, never subnormal) and read back as
/// `scales.k * e4m3(code)`; V likewise. A float cache stores values as they are: its scales are
/// [`KvScales::UNIT`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KvScales {
    pub k: f32,
    pub v: f32,
}

impl KvScales {
    pub const UNIT: Self = Self { k: 1.0, v: 1.0 };

    /// Fails unless both scales are positive and finite, and unit for a cache of `cache` other
    /// than f8e4m3; the error names `op`.
    pub fn check_for(self, cache: DType, op: &'static str) -> Result<()> {
        if ![self.k, self.v].iter().all(|s| s.is_finite() && *s > 0.0) {
            return Err(invalid(op, format!("KV scales {self:?} must be positive and finite")));
        }
        if cache != DType::F8E4M3 && self != Self::UNIT {
            return Err(invalid(op, format!("KV scales {self:?} need an f8e4m3 cache, not {cache:?}")));
        }
        Ok(())
    }
}

impl Default for KvScales {
    fn default() -> Self {
        Self::UNIT
    }
}

/// Writes `k` and `v` (`[num_tokens, num_kv_heads, head_dim]`) into `k_cache` and `v_cache`
/// (`[num_blocks, block_size, num_kv_heads, head_dim]`, contiguous) at the slots in
/// `slot_mapping` (u32 `[num_tokens]`), in place. A float cache's values are stored unscaled;
/// see [`reshape_and_cache_scaled`] for an FP8 cache.
///
/// `k`/`v` must have the caches' dtype (f32, f16 or bf16), or, on the CPU, be f32 for an f16 or
/// bf16 cache: each value is then rounded to the nearest as it is copied (the bits of
/// `to_dtype`, without its pass over a strided view). They may be strided views whose rows
/// (one token's `num_kv_heads * head_dim` values) are contiguous. Every slot must be below
/// `num_blocks * block_size` or be [`PADDING_SLOT`] (a padding row, written nowhere); another
/// out-of-range slot is an error and then nothing is written. If a slot repeats, the later
/// token's row wins.
pub fn reshape_and_cache(
    k: &Tensor,
    v: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    slot_mapping: &Tensor,
) -> Result<()> {
    reshape_and_cache_scaled(k, v, k_cache, v_cache, slot_mapping, KvScales::UNIT)
}

/// [`reshape_and_cache`] into a cache of any dtype: also f8e4m3, whose codes are `k / scales.k`
/// and `v / scales.v` rounded to the nearest (see [`KvScales`]; each scale's reciprocal is
/// rounded to f32 once, and the division is a multiply by it). `k`/`v` may then be f32, f16 or
/// bf16.
pub fn reshape_and_cache_scaled(
    k: &Tensor,
    v: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    slot_mapping: &Tensor,
    scales: KvScales,
) -> Result<()> {
    let [num_blocks, block_size, kv_heads, head_dim] = check::dims::<4>(k_cache)?;
    check::shape_is(v_cache, k_cache.dims(), OP, "v_cache")?;
    let [num_tokens] = check::dims::<1>(slot_mapping)?;
    check::shape_is(k, &[num_tokens, kv_heads, head_dim], OP, "k")?;
    check::shape_is(v, &[num_tokens, kv_heads, head_dim], OP, "v")?;
    crate::dtype::check_cache(k_cache.dtype(), OP)?;
    check::dtype_is(v_cache, k_cache.dtype(), OP)?;
    scales.check_for(k_cache.dtype(), OP)?;
    let converted =
        k_cache.dtype() == DType::F8E4M3 || (k_cache.device().is_cpu() && k.dtype() == DType::F32);
    if converted {
        crate::dtype::check_float(k.dtype(), OP)?;
    } else {
        check::dtype_is(k, k_cache.dtype(), OP)?;
    }
    check::dtype_is(v, k.dtype(), OP)?;
    check::dtype_is(slot_mapping, DType::U32, OP)?;
    for t in [v_cache, k, v, slot_mapping] {
        check::same_device(k_cache, t, OP)?;
    }
    check::contiguous(k_cache, OP)?;
    check::contiguous(v_cache, OP)?;
    let op = |scale: f32| WriteKv {
        num_slots: num_blocks * block_size,
        row_len: kv_heads * head_dim,
        inv_scale: 1.0 / scale,
    };
    k_cache.inplace_op3(k, slot_mapping, &op(scales.k))?;
    v_cache.inplace_op3(v, slot_mapping, &op(scales.v))
}

/// Copies row `t` of the source into cache slot `slot_mapping[t]`, rounding f32 rows into a
/// narrower cache and encoding any float rows into an FP8 one.
struct WriteKv {
    num_slots: usize,
    /// Elements per slot: `num_kv_heads * head_dim`.
    row_len: usize,
    /// An FP8 cache's codes are the values times this (1 for a float cache).
    inv_scale: f32,
}

impl WriteKv {
    fn write<T: Float, S: Float>(
        &self,
        copy_row: impl Fn(&[S], &mut [T]),
        cache: &mut CpuStorage,
        cache_l: &Layout,
        src: &CpuStorage,
        src_l: &Layout,
        slots: &[u32],
    ) -> Result<()> {
        let (cache_start, cache_end) = check::contiguous_range(cache_l, OP)?;
        let rows = check::rows(src_l, 2, OP)?;
        if rows.rows != slots.len() || rows.row_len != self.row_len {
            return Err(invalid(OP, "source rows do not match slot_mapping and the cache row size"));
        }
        if cache_end - cache_start != self.num_slots * self.row_len {
            return Err(invalid(OP, "cache storage does not match its shape"));
        }
        // Validate every slot before writing any, so a bad batch leaves the cache untouched.
        if let Some(&bad) = slots.iter().find(|&&s| s as usize >= self.num_slots && s != PADDING_SLOT) {
            return Err(candle_core::Error::InvalidIndex {
                op: OP,
                index: bad as usize,
                size: self.num_slots,
            });
        }
        let src = src.as_slice::<S>()?;
        if rows.end() > src.len() {
            return Err(invalid(OP, "source view exceeds its storage"));
        }
        let dtype = cache.dtype();
        let cache = T::storage_vec_mut(cache).ok_or(candle_core::Error::DTypeMismatchBinaryOp {
            lhs: dtype,
            rhs: T::DTYPE,
            op: OP,
        })?;
        let cache = &mut cache[cache_start..cache_end];
        for (t, &slot) in slots.iter().enumerate().filter(|&(_, &s)| s != PADDING_SLOT) {
            let dst = slot as usize * self.row_len;
            copy_row(&src[rows.range(t)], &mut cache[dst..dst + self.row_len]);
        }
        Ok(())
    }
}

impl InplaceOp3 for WriteKv {
    fn name(&self) -> &'static str {
        OP
    }

    fn cpu_fwd(
        &self,
        cache: &mut CpuStorage,
        cache_l: &Layout,
        src: &CpuStorage,
        src_l: &Layout,
        slots: &CpuStorage,
        slots_l: &Layout,
    ) -> Result<()> {
        let (s0, s1) = check::contiguous_range(slots_l, OP)?;
        let slots = slots
            .as_slice::<u32>()?
            .get(s0..s1)
            .ok_or_else(|| invalid(OP, "slot_mapping view exceeds its storage"))?;
        if cache.dtype() == DType::F8E4M3 {
            let inv_scale = self.inv_scale;
            return with_float!(src.dtype(), OP, S => {
                let encode = |row: &[S], dst: &mut [F8E4M3]| {
                    for (d, &x) in dst.iter_mut().zip(row) {
                        *d = F8E4M3::from_bits(crate::fp8_e4m3::encode(x.to_f32() * inv_scale));
                    }
                };
                self.write::<F8E4M3, S>(encode, cache, cache_l, src, src_l, slots)
            });
        }
        match src.dtype() {
            dt if dt == cache.dtype() => with_float!(dt, OP, T => {
                self.write::<T, T>(|row: &[T], dst: &mut [T]| dst.copy_from_slice(row), cache, cache_l, src, src_l, slots)
            }),
            DType::F32 => with_float!(cache.dtype(), OP, T => {
                self.write::<T, f32>(T::from_f32_slice, cache, cache_l, src, src_l, slots)
            }),
            _ => Err(candle_core::Error::DTypeMismatchBinaryOp {
                lhs: cache.dtype(),
                rhs: src.dtype(),
                op: OP,
            }),
        }
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        cache: &mut candle_core::CudaStorage,
        cache_l: &Layout,
        src: &candle_core::CudaStorage,
        src_l: &Layout,
        slots: &candle_core::CudaStorage,
        slots_l: &Layout,
    ) -> Result<()> {
        crate::cuda::kv_cache::reshape_and_cache(
            self.num_slots,
            self.row_len,
            self.inv_scale,
            cache,
            cache_l,
            src,
            src_l,
            slots,
            slots_l,
        )
    }
}

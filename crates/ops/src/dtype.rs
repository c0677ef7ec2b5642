//! Floating-point storage types the CPU kernels accept (f32, f16, bf16) and their conversions.
//!
//! Every kernel does its math in f32; this module is the one place that knows how to turn a
//! storage slice into f32 and back, and how to pick the monomorphised kernel for a [`DType`].

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, DType, Result, WithDType};
use float8::F8E4M3;
use half::{bf16, f16, slice::HalfFloatSliceExt};

use crate::simd::MulAdd;

/// A 16-bit storage slice, for kernels that widen as they load (`vcvtph2ps`, a shift for bf16).
#[derive(Clone, Copy)]
pub(crate) enum Halves<'a> {
    F16(&'a [f16]),
    Bf16(&'a [bf16]),
}

impl Halves<'_> {
    pub(crate) fn len(&self) -> usize {
        match self {
            Halves::F16(s) => s.len(),
            Halves::Bf16(s) => s.len(),
        }
    }
}

/// A storage element type: read into f32 for math, written back rounded to nearest.
pub(crate) trait Float: WithDType {
    fn to_f32(self) -> f32;
    fn from_f32(v: f32) -> Self;

    /// Converts `src` into `dst` (same length).
    fn to_f32_slice(src: &[Self], dst: &mut [f32]);

    /// [`to_f32_slice`](Self::to_f32_slice) in a kernel built for `M`'s instruction set, which
    /// may widen f16 in hardware ([`MulAdd::widen_f16`]).
    #[inline(always)]
    fn to_f32_slice_in<M: MulAdd>(src: &[Self], dst: &mut [f32]) {
        Self::to_f32_slice(src, dst);
    }

    /// `src` itself when this type is f32, so readers can skip the conversion copy.
    fn as_f32(src: &[Self]) -> Option<&[f32]>;

    /// `src` as a 16-bit slice when this type is f16 or bf16.
    fn as_halves(_src: &[Self]) -> Option<Halves<'_>> {
        None
    }

    /// `dst` itself when this type is f32, so writers can take an f32-only fast path.
    fn as_f32_mut(_dst: &mut [Self]) -> Option<&mut [f32]> {
        None
    }

    /// Converts `src` into `dst` (same length), rounding to nearest.
    fn from_f32_slice(src: &[f32], dst: &mut [Self]);

    /// The mutable element vector of a storage of this type, if the storage has this type.
    fn storage_vec_mut(storage: &mut CpuStorage) -> Option<&mut Vec<Self>>;
}

impl Float for f32 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        v
    }
    #[inline(always)]
    fn to_f32_slice(src: &[Self], dst: &mut [f32]) {
        dst.copy_from_slice(src);
    }
    #[inline(always)]
    fn as_f32(src: &[Self]) -> Option<&[f32]> {
        Some(src)
    }
    #[inline(always)]
    fn as_f32_mut(dst: &mut [Self]) -> Option<&mut [f32]> {
        Some(dst)
    }
    fn from_f32_slice(src: &[f32], dst: &mut [Self]) {
        dst.copy_from_slice(src);
    }
    fn storage_vec_mut(storage: &mut CpuStorage) -> Option<&mut Vec<Self>> {
        match storage {
            CpuStorage::F32(v) => Some(v),
            _ => None,
        }
    }
}

impl Float for bf16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        bf16::from_f32(v)
    }
    // bf16 is the top half of an f32, so widening is a shift; written out (rather than via
    // half's slice helper) so it inlines and vectorises inside the kernels.
    #[inline(always)]
    fn to_f32_slice(src: &[Self], dst: &mut [f32]) {
        for (d, s) in dst.iter_mut().zip(src) {
            *d = f32::from_bits((s.to_bits() as u32) << 16);
        }
    }
    #[inline(always)]
    fn as_f32(_src: &[Self]) -> Option<&[f32]> {
        None
    }
    #[inline(always)]
    fn as_halves(src: &[Self]) -> Option<Halves<'_>> {
        Some(Halves::Bf16(src))
    }
    fn from_f32_slice(src: &[f32], dst: &mut [Self]) {
        dst.convert_from_f32_slice(src);
    }
    fn storage_vec_mut(storage: &mut CpuStorage) -> Option<&mut Vec<Self>> {
        match storage {
            CpuStorage::BF16(v) => Some(v),
            _ => None,
        }
    }
}

/// An f16 bit pattern widened exactly: the exponent and mantissa move into f32 position and
/// are rescaled by 2^112 (the difference of the exponent biases), which is exact for normal and
/// subnormal halves alike; infinities and NaNs keep an all-ones exponent.
#[inline(always)]
fn f16_bits_to_f32(h: u16) -> f32 {
    let h = u32::from(h);
    let sign = (h & 0x8000) << 16;
    let magnitude = h & 0x7fff;
    let scaled = f32::from_bits(magnitude << 13) * f32::from_bits(0x7780_0000);
    let bits = if magnitude >= 0x7c00 { (magnitude << 13) | 0x7f80_0000 } else { scaled.to_bits() };
    f32::from_bits(bits | sign)
}

impl Float for f16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
    // Integer and multiply steps that inline and vectorise in the attention kernel; half's
    // slice helper calls an out-of-line F16C routine per 8 values.
    #[inline(always)]
    fn to_f32_slice(src: &[Self], dst: &mut [f32]) {
        for (d, s) in dst.iter_mut().zip(src) {
            *d = f16_bits_to_f32(s.to_bits());
        }
    }
    #[inline(always)]
    fn to_f32_slice_in<M: MulAdd>(src: &[Self], dst: &mut [f32]) {
        M::widen_f16(src, dst);
    }
    #[inline(always)]
    fn as_f32(_src: &[Self]) -> Option<&[f32]> {
        None
    }
    #[inline(always)]
    fn as_halves(src: &[Self]) -> Option<Halves<'_>> {
        Some(Halves::F16(src))
    }
    fn from_f32_slice(src: &[f32], dst: &mut [Self]) {
        dst.convert_from_f32_slice(src);
    }
    fn storage_vec_mut(storage: &mut CpuStorage) -> Option<&mut Vec<Self>> {
        match storage {
            CpuStorage::F16(v) => Some(v),
            _ => None,
        }
    }
}

/// An FP8 KV cache's codes (`crate::fp8_e4m3`): read through the vectorised bit move, written
/// by Pagoda's encoder (saturating, never subnormal). A cache's scale is applied by its
/// readers and writers, not here.
impl Float for F8E4M3 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        let mut out = [0f32];
        crate::fp8_e4m3::widen_into(&[self], &mut out);
        out[0]
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        F8E4M3::from_bits(crate::fp8_e4m3::encode(v))
    }
    #[inline(always)]
    fn to_f32_slice(src: &[Self], dst: &mut [f32]) {
        crate::fp8_e4m3::widen_into(src, dst);
    }
    #[inline(always)]
    fn as_f32(_src: &[Self]) -> Option<&[f32]> {
        None
    }
    fn from_f32_slice(src: &[f32], dst: &mut [Self]) {
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = Self::from_f32(s);
        }
    }
    fn storage_vec_mut(storage: &mut CpuStorage) -> Option<&mut Vec<Self>> {
        match storage {
            CpuStorage::F8E4M3(v) => Some(v),
            _ => None,
        }
    }
}

/// True for the dtypes the kernels accept as float storage.
pub(crate) fn is_float(dtype: DType) -> bool {
    matches!(dtype, DType::F32 | DType::F16 | DType::BF16)
}

/// Fails with `UnsupportedDTypeForOp` unless `dtype` is f32, f16 or bf16.
pub(crate) fn check_float(dtype: DType, op: &'static str) -> Result<()> {
    if is_float(dtype) {
        Ok(())
    } else {
        Err(candle_core::Error::UnsupportedDTypeForOp(dtype, op))
    }
}

/// Fails with `UnsupportedDTypeForOp` unless `dtype` is one a KV cache may have: a float
/// dtype, or f8e4m3 (with per-tensor scales, `crate::KvScales`).
pub(crate) fn check_cache(dtype: DType, op: &'static str) -> Result<()> {
    if is_float(dtype) || dtype == DType::F8E4M3 {
        Ok(())
    } else {
        Err(candle_core::Error::UnsupportedDTypeForOp(dtype, op))
    }
}

/// Evaluates `$body` with the type alias `$t` bound to the Rust type of `$dtype` (f32, f16 or
/// bf16), or returns `UnsupportedDTypeForOp` for any other dtype.
macro_rules! with_float {
    ($dtype:expr, $op:expr, $t:ident => $body:expr) => {
        match $dtype {
            candle_core::DType::F32 => {
                type $t = f32;
                $body
            }
            candle_core::DType::F16 => {
                type $t = half::f16;
                $body
            }
            candle_core::DType::BF16 => {
                type $t = half::bf16;
                $body
            }
            other => Err(candle_core::Error::UnsupportedDTypeForOp(other, $op)),
        }
    };
}
pub(crate) use with_float;

/// Converts any float storage slice region to f32, whatever its dtype.
pub(crate) fn storage_to_f32(
    storage: &CpuStorage,
    start: usize,
    len: usize,
    op: &'static str,
) -> Result<Vec<f32>> {
    with_float!(storage.dtype(), op, T => {
        let src = storage.as_slice::<T>()?;
        let src = src.get(start..start + len).ok_or_else(|| {
            candle_core::Error::Msg(format!("{op}: storage region {start}..{} out of bounds", start + len))
        })?;
        // An f32 source is copied as is: no zeroed buffer to overwrite first.
        if let Some(f) = T::as_f32(src) {
            return Ok(f.to_vec());
        }
        let mut out = vec![0f32; len];
        T::to_f32_slice(src, &mut out);
        Ok(out)
    })
}

/// Packs f32 results into a storage of `dtype` (f32, f16 or bf16).
pub(crate) fn f32_to_storage(values: Vec<f32>, dtype: DType, op: &'static str) -> Result<CpuStorage> {
    if dtype == DType::F32 {
        return Ok(CpuStorage::F32(values));
    }
    with_float!(dtype, op, T => {
        let mut out = vec![T::from_f32(0.0); values.len()];
        T::from_f32_slice(&values, &mut out);
        Ok(T::to_cpu_storage_owned(out))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_widening_is_exact_for_every_bit_pattern() {
        let src: Vec<f16> = (0..=u16::MAX).map(f16::from_bits).collect();
        let mut dst = vec![0f32; src.len()];
        f16::to_f32_slice(&src, &mut dst);
        for (s, d) in src.iter().zip(&dst) {
            let want = s.to_f32();
            if want.is_nan() {
                assert!(d.is_nan(), "{:#06x}", s.to_bits());
            } else {
                assert_eq!(d.to_bits(), want.to_bits(), "{:#06x}", s.to_bits());
            }
        }
    }

    /// The hardware widening of AVX-512 kernels (`vcvtph2ps`) gives the portable one's bits for
    /// every f16, over whole vectors and over a tail.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn f16_widening_in_hardware_matches_the_portable_one() {
        use crate::simd::{level, Level, MulAdd, Separate, Wide};
        if level() != Level::Avx512 {
            return;
        }
        let src: Vec<f16> = (0..=u16::MAX).map(f16::from_bits).collect();
        for range in [0..src.len(), 3..40, 5..5] {
            let (mut hw, mut sw) = (vec![0f32; range.len()], vec![0f32; range.len()]);
            Wide::widen_f16(&src[range.clone()], &mut hw);
            Separate::widen_f16(&src[range.clone()], &mut sw);
            for ((h, w), s) in hw.iter().zip(&sw).zip(&src[range.clone()]) {
                assert!(h.to_bits() == w.to_bits() || (h.is_nan() && w.is_nan()), "{:#06x}", s.to_bits());
            }
        }
    }

    #[test]
    fn round_trips_through_each_float_type() {
        let values = vec![1.5f32, -2.25, 0.0, 1024.0];
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let storage = f32_to_storage(values.clone(), dtype, "test").unwrap();
            assert_eq!(storage.dtype(), dtype);
            assert_eq!(storage_to_f32(&storage, 1, 3, "test").unwrap(), values[1..].to_vec());
        }
    }

    #[test]
    fn rejects_non_float_dtypes() {
        assert!(check_float(DType::U32, "test").is_err());
        assert!(f32_to_storage(vec![1.0], DType::U8, "test").is_err());
        let storage = CpuStorage::U32(vec![1, 2]);
        assert!(storage_to_f32(&storage, 0, 2, "test").is_err());
    }

    #[test]
    fn bf16_widening_matches_half() {
        let values = [1.5f32, -2.0e-3, 3.0e38, f32::INFINITY, -0.0, 1.0e-40];
        let src: Vec<bf16> = values.iter().map(|&v| bf16::from_f32(v)).collect();
        let mut dst = [0f32; 6];
        bf16::to_f32_slice(&src, &mut dst);
        for (d, s) in dst.iter().zip(&src) {
            assert_eq!(d.to_bits(), s.to_f32().to_bits());
        }
        let mut nan = [0f32];
        bf16::to_f32_slice(&[bf16::NAN], &mut nan);
        assert!(nan[0].is_nan());
    }

    #[test]
    fn out_of_bounds_region_is_an_error() {
        let storage = CpuStorage::F32(vec![1.0, 2.0]);
        assert!(storage_to_f32(&storage, 1, 2, "test").is_err());
    }
}
